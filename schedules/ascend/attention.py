"""Attention on the AI Core, flash style: the scores of one query tile never leave the core.

    FOR query tile (b*h*sq/q_tile of them, split over `block_dim` cores)
      Q tile GM -> UB (x scale) -> L1 -> L0A;  m = -1e30, l = 0, O = 0 in UB
      FOR key / value tile (causal: only those at or left of the diagonal)
        qk   K tile GM -> L1 -> L0B;  S = Q K^T on the cube (L0C, fp32)
        sm   S L0C -> UB;  mask;  online softmax in fp32 on the vector unit
             (m' = max(m, rowmax S), alpha = exp(m - m'), P = exp(S - m'), l = alpha l + rowsum P)
        pv   P fp16 UB -> L1 -> L0A (the 910's UB -> L1 path);  V tile GM -> L1 -> L0B;  O_j = P V
        acc  O_j L0C -> UB;  O = alpha O + O_j
      O / l -> fp16 -> GM

The kernel is a TIR loop nest written here (as TVM's flash-attention kernels are written in
TIR): the tile loops, the causal bound of the key loop, and with `double_buffer` the stages
skewed into a software pipeline, qk of tile j+2 and acc of tile j around sm / pv of tile j+1,
so the cube works on the next tiles while the vector unit does the softmax. Each stage is one
`T.call_packed(EVENT, stage, bh, q0, k0)`; the backend's lowering "attention"
(`opcompiler/backend/ascend/lower/attention.py`) turns each into its instructions.
GM layouts (host-side): Q and O ND (b*h, sq, d), or with layout=sbhd (sq, b*h, d), a head's rows
read and written by strided DMA; K as FRACTAL_Z of K^T and V as FRACTAL_Z,
the mask fp16, all zero-padded to 16; a constant causal band fp32.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

import opcompiler.backend.ascend.intrin as intrin
from opcompiler.ops import get_op
from opcompiler.ops.catalogue.attention import NEG, attention_scale, mask_batches, seq_first
from opcompiler.target import Target
from opcompiler.template_base import HostLayout, Knob, Scheduled, register_template
from opcompiler.workload import Workload

from .common import AscendTemplate, ceil_div, core_values, pad_to, tile_values


def _dims(wl: Workload) -> tuple[int, int, int, int]:
    """(b*h, sq, skv, d) padded to 16."""
    return (wl["b"] * wl["h"], ceil_div(wl["sq"], 16) * 16, ceil_div(wl["skv"], 16) * 16, ceil_div(wl["d"], 16) * 16)


def attention_buffers(wl: Workload, cfg: Mapping) -> list[tuple[str, str, int]]:
    """(level, name, bytes) the lowering allocates, in its order (the capacity check)."""
    _, _, _, dp = _dims(wl)
    mq, nk, sl = cfg["q_tile"], cfg["kv_tile"], 2 if cfg["double_buffer"] else 1
    mb, causal = mask_batches(wl), bool(wl.p.get("causal"))
    out = [("L1", "q_L1", mq * dp * 2)]
    out += [("L1", f"k_L1_{s}", nk * dp * 2) for s in range(sl)] + [("L1", f"v_L1_{s}", nk * dp * 2) for s in range(sl)]
    out += [("L1", f"p_L1_{s}", mq * nk * 2) for s in range(sl)]
    out += [("L0A", "q_L0A", mq * dp * 2)] + [("L0A", f"p_L0A_{s}", mq * nk * 2) for s in range(sl)]
    out += [("L0B", "k_L0B", nk * dp * 2), ("L0B", "v_L0B", nk * dp * 2)]
    out += [("L0C", f"s_L0C_{s}", nk * mq * 4) for s in range(sl)] + [("L0C", f"o_L0C_{s}", dp * mq * 4)
                                                                        for s in range(sl)]
    out += [("UB", f"p_UB_{s}", mq * nk * 2) for s in range(sl)] + [("UB", "s_UB", mq * nk * 4)]
    out += [("UB", "o_UB", mq * dp * 4), ("UB", "ot_UB", mq * dp * 4), ("UB", "out_UB", mq * dp * 2)]
    out += [("UB", "fold_UB", mq * 64 * 4)] if dp < 64 else []
    out += [("UB", "row_UB", mq * 4)]
    out += [("UB", f"m_UB_{s}", mq * 4) for s in range(2)] + [("UB", f"alpha_UB_{s}", mq * 4) for s in range(2)]
    out += [("UB", "l_UB", mq * 4), ("UB", "bcast_UB", mq * 32)]
    if mb:
        out.append(("UB", "mask_UB", mq * nk * 2))
    if mb or causal:
        out.append(("UB", "band_UB", mq * nk * 4))
    return out


def kernel(bh: int, nq: int, nkv: int, mq: int, nk: int, sq: int, causal: bool, skew: bool):
    """The flash-attention loop nest (a PrimFunc of stage events; see the module docstring)."""
    import tvm
    from tvm import tirx

    t, j = tirx.Var("t", "int32"), tirx.Var("j", "int32")
    b_h, q0 = t // nq, (t % nq) * mq
    n_t = tirx.min(nkv, (tirx.min(q0 + mq, sq) - 1) // nk + 1) if causal else tirx.const(nkv, "int32")

    def ev(tag: str, *args) -> Any:
        return tirx.Evaluate(tirx.call_packed(intrin.EVENT, tag, b_h, q0, *args))

    def when(cond, *stmts) -> Any:
        return tirx.IfThenElse(cond, tirx.SeqStmt(list(stmts)) if len(stmts) > 1 else stmts[0], None)

    if skew:  # stage s of tile j runs in iteration j + s: qk (0), sm + pv (1), acc (2)
        body = tirx.SeqStmt([when(j < n_t, ev("qk", j * nk)),
                             when(tirx.all(j >= 1, j <= n_t), ev("sm", (j - 1) * nk), ev("pv", (j - 1) * nk)),
                             when(j >= 2, ev("acc", (j - 2) * nk))])
        kv = tirx.For(j, 0, n_t + 2, tirx.ForKind.SERIAL, body)
    else:
        kv = tirx.For(j, 0, n_t, tirx.ForKind.SERIAL,
                      tirx.SeqStmt([ev(tag, j * nk) for tag in ("qk", "sm", "pv", "acc")]))
    tiles = tirx.For(t, 0, bh * nq, tirx.ForKind.SERIAL, tirx.SeqStmt([ev("q"), kv, ev("out")]))
    func = tirx.PrimFunc([tirx.Var(n, "handle") for n in ("Q", "K", "V", "O")], tiles).with_attr(
        "global_symbol", "attention")
    return tvm.IRModule({"attention": func}), []


def scheduled(wl: Workload, target: Target, cfg: Mapping) -> Scheduled:
    b, h, sq, skv, d = (wl[k] for k in ("b", "h", "sq", "skv", "d"))
    bh, sqp, skvp, dp = _dims(wl)
    mq, nk = cfg["q_tile"], cfg["kv_tile"]
    nq, nkv = ceil_div(sqp, mq), ceil_div(skvp, nk)
    causal, skew, mb = bool(wl.p.get("causal")), bool(cfg["double_buffer"]), mask_batches(wl)
    d1, s1 = dp // 16, skvp // 16

    sf = seq_first(wl)

    def heads_first(x: np.ndarray, s: int) -> np.ndarray:  # K, V: the host packs FRACTAL_Z from either layout
        return x.reshape(s, bh, d).transpose(1, 0, 2) if sf else x.reshape(bh, s, d)

    def pack(inputs: list[np.ndarray]) -> dict[str, np.ndarray]:
        if sf:  # Q stays sequence first in GM: the kernel reads a head's rows with a strided DMA
            q = pad_to(pad_to(inputs[0].reshape(sq, bh, d), 0, sqp), 2, dp).astype(np.float16)
        else:
            q = pad_to(pad_to(inputs[0].reshape(bh, sq, d), 1, sqp), 2, dp).astype(np.float16)
        k = pad_to(pad_to(heads_first(inputs[1], skv), 1, skvp), 2, dp).astype(np.float16)
        v = pad_to(pad_to(heads_first(inputs[2], skv), 1, skvp), 2, dp).astype(np.float16)
        gm = {"Q": np.ascontiguousarray(q),
              "K": np.ascontiguousarray(k.reshape(bh, s1, 16, d1, 16).transpose(0, 3, 1, 2, 4)),
              "V": np.ascontiguousarray(v.reshape(bh, s1, 16, d1, 16).transpose(0, 1, 3, 4, 2))}
        if mb:
            gm["M"] = np.ascontiguousarray(pad_to(pad_to(inputs[3], 1, sqp), 2, skvp).astype(np.float16))
        if causal:
            i, c = np.arange(mq)[:, None], np.arange(mq + 2 * nk)[None, :]
            gm["T"] = np.where(c - i > nk, np.float32(NEG), np.float32(0))
        return gm

    def unpack(o: np.ndarray) -> np.ndarray:
        if sf:
            return np.ascontiguousarray(o[:sq, :, :d].reshape(sq, b, h, d))
        return np.ascontiguousarray(o[:, :sq, :d].reshape(b, h, sq, d))

    key = ("ascend.attention", bh, nq, nkv, mq, nk, sq, causal, skew)
    params = {"seq_first": sf, "bh": bh, "sqp": sqp, "skvp": skvp, "dp": dp, "mq": mq, "nk": nk, "slots": 2 if skew else 1,
              "sq": sq, "skv": skv, "heads": h, "mask_batches": mb, "causal": causal,
              "scale": attention_scale(wl), "block_dim": cfg["block_dim"]}
    return Scheduled(
        lowering="attention", key=key, module=lambda: kernel(bh, nq, nkv, mq, nk, sq, causal, skew),
        params=params, host=HostLayout(pack=pack, unpack=unpack, out_name="O",
                                       out_shape=(sqp, bh, dp) if sf else (bh, sqp, dp), out_dtype="float16"),
        buffers=attention_buffers(wl, cfg), flops=get_op(wl.op).flops(wl),
        info={"gm_layouts": {"Q": f"ND {'(sq, b*h, d)' if sf else '(b*h, sq, d)'} padded to 16",
                             "K": "FRACTAL_Z of K^T (b*h, D1, SKV1, 16, 16)", "V": "FRACTAL_Z (b*h, SKV1, D1, 16, 16)",
                             "O": f"ND {'(sq, b*h, d)' if sf else '(b*h, sq, d)'}"},
              "scores_in_gm_bytes": 0, "pipeline": "skewed (qk j+2 | sm, pv j+1 | acc j)" if skew else "in order"})


@register_template
class AscendAttention(AscendTemplate):
    """q / kv tiles through L1, L0A/L0B, the cube, L0C and UB; online softmax on the vector unit."""

    name = "ascend.attention.flash"
    op_families = ("attention",)
    version = 1

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        _, sqp, skvp, _ = _dims(wl)
        return [
            Knob("q_tile", tile_values(sqp, 16, 256), "query rows per tile (multiple of 16)"),
            Knob("kv_tile", tile_values(skvp, 16, 512), "key / value rows per tile (multiple of 16)"),
            Knob("double_buffer", (1, 0), "two slots per stage buffer and the stages skewed as a software pipeline"),
            Knob("block_dim", tuple(reversed(core_values(target))), "AI cores the query tiles are split over"),
        ]

    def check(self, wl: Workload, target: Target, config: Mapping) -> str | None:
        if wl.dtype != "float16":
            return f"ascend attention runs its products on the cube, which takes float16 here, not {wl.dtype}"
        return super().check(wl, target, config)

    def buffers(self, wl: Workload, target: Target, config: Mapping) -> list[tuple[str, str, int]]:
        return attention_buffers(wl, config)

    def preferred(self, wl: Workload, target: Target) -> list[dict]:
        """Query tiles small enough that every core gets one, then key tiles near 128 (a row
        instruction's start-up spread over 128 lanes' repeats), then query tiles near 128: at
        b=1, h=16, sq=skv=2048, d=128 the first that fits (64 x 128) is what `tune --trials 128`
        found best."""
        sp = {k.name: k.values for k in self.space(wl, target)}
        bh, sqp, _, _ = _dims(wl)
        out = []
        for mq in sp["q_tile"]:
            for nk in sp["kv_tile"]:
                tiles = bh * ceil_div(sqp, mq)
                rank = (-min(tiles, target.cores), abs(np.log2(nk / 128)), abs(np.log2(mq / 128)), -mq)
                out.append((rank, {"q_tile": mq, "kv_tile": nk, "double_buffer": 1, "block_dim": target.cores}))
        return [c for _, c in sorted(out, key=lambda x: x[0])]

    def apply(self, wl: Workload, target: Target, config: Mapping) -> Any:
        from opcompiler.errors import OpcError

        why = self.check(wl, target, config)
        if why is not None and wl.dtype != "float16":
            raise OpcError(why, arg="--dtype", value=wl.dtype, expected="float16")
        return scheduled(wl, target, config)

    def features(self, wl: Workload, target: Target, config: Mapping) -> dict[str, float]:
        config = self.config(wl, target, config)
        bh, sqp, skvp, dp = _dims(wl)
        mq, nk = config["q_tile"], config["kv_tile"]
        tiles = bh * ceil_div(sqp, mq)
        cores = min(config["block_dim"], tiles)
        kv_steps = ceil_div(skvp, nk)
        return {"tiles": tiles, "active_cores": cores, "tiles_per_core": ceil_div(tiles, cores), "kv_steps": kv_steps,
                "gm_read_bytes": tiles * kv_steps * nk * dp * 4 + bh * sqp * dp * 2,
                "score_tile_elems": mq * nk, "vector_per_cube": 32 / dp, "double_buffer": config["double_buffer"]}
