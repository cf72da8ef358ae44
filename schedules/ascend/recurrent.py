"""LSTM and GRU on the AI Core: the whole recurrence in one kernel, the cell's state never leaving the core.

    FOR batch tile (Bp/bt of them; groups of `hidden_split` cores take them in turn)
      init  h0 rows GM -> L1; the carried state (c0 for an LSTM, h0 for a GRU) GM -> UB -> fp32
            (per hidden tile); bias GM -> UB (fp32, once); this core's weight columns GM -> L1
            once (FRACTAL_Z) when they fit beside the rest, else streamed per tile
      FOR step s (input position t-1 .. 0 when reverse)
        x    x_s rows GM -> L1 (two slots: the next step's load overlaps this one)
        FOR hidden tile j of this core (4 hn gate columns of hidden units j*hn ..)
          cell  x_s W_j^T + h_{s-1} R_j^T on the cube (K chunks through L0A / L0B, one L0C
                accumulator), L0C -> UB fp32, + bias, the gates on the vector unit (sigmoid =
                1 / (1 + exp(-x)), tanh = 2 sigmoid(2x) - 1): LSTM c = f c + i c~, h = o tanh(c);
                GRU n = tanh(n_x + r n_h), h = n + z (h - n); h fp16 UB -> GM (Y) and, without a
                hidden split, UB -> L1 (the 910's UB -> L1 path) for the next step's h R^T
        sync (hidden_split > 1) SyncAll, then the batch tile's whole h_s Y GM -> L1

GM traffic: X, W, R, B, h0 (c0) read once each (W and R resident; streamed: once a step), Y
written once, and with a hidden split h_s read back once a step by each core of the group:
no gate ever leaves the core. The kernel is a TIR loop nest of stage events
(`T.call_packed(EVENT, ...)`), turned into instructions by the backend's lowering "recurrent"
(`opcompiler/backend/ascend/lower/recurrent.py`). GM layouts (host-side): X (t, Bp, Ip) fp16;
W, R as FRACTAL_Z of W^T / R^T with the gate columns regrouped per hidden tile (LSTM
[i | o | f | c], GRU [z | r | n_x | n_h], W's n_h and R's n_x columns zero); B fp32 per packed
column; h0, c0 (Bp, Hp) fp16; Y (t, Bp, Hp) fp16; all zero-padded to 16.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

import opcompiler.backend.ascend.intrin as intrin
from opcompiler.ops import get_op
from opcompiler.target import Target
from opcompiler.template_base import HostLayout, Knob, Scheduled, register_template
from opcompiler.workload import Workload

from .common import AscendTemplate, ceil_div, core_values, pad_to


def dims(wl: Workload) -> tuple[int, int, int]:
    """(Ip, Hp, 16-padded batch)."""
    return ceil_div(wl["i"], 16) * 16, ceil_div(wl["h"], 16) * 16, ceil_div(wl["b"], 16) * 16


def k_chunk(bt: int, g: int, kmax: int, l0a: int, l0b: int) -> int:
    """The K columns of one cube pass: two slots of (bt x kc) in L0A and (kc x g) in L0B."""
    kc = 16
    while kc * 2 <= kmax and 2 * bt * kc * 4 <= l0a and 2 * kc * 2 * g * 2 <= l0b:
        kc *= 2
    return kc


def weight_share(hp: int, hn: int, hs: int) -> int:
    """Hidden tiles of the core with the most (the first of its hidden-split group)."""
    return ceil_div(hp // hn, hs)


def recurrent_buffers(wl: Workload, cfg: Mapping, caps: Mapping[str, int]) -> tuple[list, int, bool]:
    """((level, name, bytes) the lowering allocates in order, the K chunk, weights resident):
    a core holds its hidden tiles' weight columns (all of them without a hidden split)."""
    ip, hp, _ = dims(wl)
    bt, hn, hs = cfg["batch_tile"], cfg["hidden_tile"], cfg.get("hidden_split", 1)
    g = 4 * hn
    kc = k_chunk(bt, g, max(ip, hp), caps["L0A"], caps["L0B"])
    l1 = [("L1", f"h_L1_{s}", bt * hp * 2) for s in range(2)] + [("L1", f"x_L1_{s}", bt * ip * 2) for s in range(2)]
    used = sum(n for _, _, n in l1)
    share = weight_share(hp, hn, hs) * g
    resident = used + (ip + hp) * share * 2 <= caps["L1"]
    if resident:
        l1 += [("L1", "W_L1", ip * share * 2), ("L1", "R_L1", hp * share * 2)]
    else:
        l1 += [("L1", f"w_L1_{s}", kc * g * 2) for s in range(2)]
    out = l1 + [("L0A", f"a_L0A_{s}", bt * kc * 2) for s in range(2)]
    out += [("L0B", f"b_L0B_{s}", kc * g * 2) for s in range(2)]
    out += [("L0C", f"g_L0C_{s}", g * bt * 4) for s in range(2)]
    out += [("UB", "gates_UB", bt * g * 4), ("UB", "c_UB", hp * bt * 4), ("UB", "bias_UB", 4 * hp * 4),
            ("UB", "c16_UB", bt * hp * 2)] + [("UB", f"h16_UB_{s}", bt * hn * 2) for s in range(2)]
    return out, kc, resident


def kernel(nb: int, t: int, nj: int, exchange: bool):
    """The loop nest: batch tiles, steps, hidden tiles, and with `exchange` (hidden tiles split
    over cores) a `sync` stage after each step's cells (a PrimFunc of stage events)."""
    import tvm
    from tvm import tirx

    bi, s, j = tirx.Var("bi", "int32"), tirx.Var("s", "int32"), tirx.Var("j", "int32")

    def ev(tag: str, *args) -> Any:
        return tirx.Evaluate(tirx.call_packed(intrin.EVENT, tag, bi, *args))

    cells = tirx.For(j, 0, nj, tirx.ForKind.SERIAL, ev("cell", s, j))
    body = [ev("x", s), cells] + ([ev("sync", s)] if exchange else [])
    steps = tirx.For(s, 0, t, tirx.ForKind.SERIAL, tirx.SeqStmt(body))
    tiles = tirx.For(bi, 0, nb, tirx.ForKind.SERIAL, tirx.SeqStmt([ev("init"), steps]))
    func = tirx.PrimFunc([tirx.Var(n, "handle") for n in ("X", "W", "R", "B", "H0", "C0", "Y")], tiles).with_attr(
        "global_symbol", "recurrent")
    return tvm.IRModule({"recurrent": func}), []


# The four column groups of a hidden tile, as the ONNX gate (row block) each holds, per operand
# (None: zero columns). LSTM: i, o, f, c~ from W and R alike. GRU: z, r, then the candidate's
# input half from W only and its recurrent half from R only, so one accumulator holds both and
# the cell can apply the reset gate to the recurrent half (linear_before_reset).
GROUPS = {"lstm": ((0, 1, 2, 3), (0, 1, 2, 3)), "gru": ((0, 1, 2, None), (0, 1, None, 2))}


def gate_order(h: int, hp: int, hn: int, groups: Sequence = (0, 1, 2, 3)) -> np.ndarray:
    """Source row (of the ONNX gate rows, -1: zero) of each packed gate column: hidden tile j
    holds four column groups for hidden units j*hn .. j*hn + hn, group k from gate groups[k]."""
    out = np.full(4 * hp, -1, np.int64)
    for j in range(hp // hn):
        for gi, src in enumerate(groups):
            if src is None:
                continue
            for u in range(hn):
                unit = j * hn + u
                if unit < h:
                    out[j * 4 * hn + gi * hn + u] = src * h + unit
    return out


def scheduled(wl: Workload, target: Target, cfg: Mapping) -> Scheduled:
    t, b, i, h = (wl[k] for k in ("t", "b", "i", "h"))
    cell = wl.op
    ip, hp, _ = dims(wl)
    bt, hn, hs = cfg["batch_tile"], cfg["hidden_tile"], cfg.get("hidden_split", 1)
    bp = ceil_div(b, bt) * bt
    nb, nj = bp // bt, hp // hn
    caps = {lv: intrin.figures(target).level(lv).capacity for lv in ("L1", "L0A", "L0B")}
    bufs, kc, resident = recurrent_buffers(wl, cfg, caps)
    wgroups, rgroups = GROUPS[cell]
    worder, rorder = gate_order(h, hp, hn, wgroups), gate_order(h, hp, hn, rgroups)

    def fz(m: np.ndarray, k: int, order: np.ndarray) -> np.ndarray:  # (G h, k) rows -> FRACTAL_Z of its transpose
        full = np.zeros((4 * hp, k), np.float16)
        full[order >= 0, :m.shape[1]] = m[order[order >= 0]]
        return np.ascontiguousarray(full.reshape(4 * hp // 16, 16, k // 16, 16).transpose(2, 0, 1, 3))

    def packed_bias(bias: np.ndarray) -> np.ndarray:
        ng = 4 if cell == "lstm" else 3
        wb, rb = bias[0, :ng * h].astype(np.float32), bias[0, ng * h:].astype(np.float32)
        bb = np.zeros(4 * hp, np.float32)
        if cell == "lstm":
            bb[worder >= 0] = (wb + rb)[worder[worder >= 0]]
            return bb
        for j in range(nj):  # [z | r | n_x | n_h]: Wb + Rb, Wb + Rb, Wb_n, Rb_n
            for u in range(hn):
                unit = j * hn + u
                if unit >= h:
                    continue
                base = j * 4 * hn + u
                bb[base], bb[base + hn] = wb[unit] + rb[unit], wb[h + unit] + rb[h + unit]
                bb[base + 2 * hn], bb[base + 3 * hn] = wb[2 * h + unit], rb[2 * h + unit]
        return bb

    def pack(inputs: list[np.ndarray]) -> dict[str, np.ndarray]:
        x, w, r, bias, h0 = inputs[:5]
        st = lambda a: pad_to(pad_to(a[0], 0, bp), 1, hp).astype(np.float16)  # noqa: E731
        out = {"X": np.ascontiguousarray(pad_to(pad_to(x, 1, bp), 2, ip).astype(np.float16)),
               "W": fz(w[0].astype(np.float16), ip, worder), "R": fz(r[0].astype(np.float16), hp, rorder),
               "B": packed_bias(bias), "H0": np.ascontiguousarray(st(h0))}
        if cell == "lstm":
            out["C0"] = np.ascontiguousarray(st(inputs[5]))
        return out

    def unpack(y: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(y[:, :b, :h])

    key = ("ascend.recurrent", nb, t, nj, hs > 1)
    params = {"cell": cell, "t": t, "ip": ip, "hp": hp, "bp": bp, "bt": bt, "hn": hn, "kc": kc,
              "resident": resident, "hs": hs, "reverse": int(dict(wl.params).get("reverse", 0)),
              "block_dim": cfg["block_dim"]}
    layouts = {"X": "ND (t, Bp, Ip)", "W": "FRACTAL_Z of W^T, gate columns per hidden tile",
               "R": "FRACTAL_Z of R^T, gate columns per hidden tile", "B": "fp32, per packed gate column",
               "H0": "ND (Bp, Hp)", "Y": "ND (t, Bp, Hp)"}
    if cell == "lstm":
        layouts["C0"] = "ND (Bp, Hp)"
    return Scheduled(
        lowering="recurrent", key=key, module=lambda: kernel(nb, t, nj, hs > 1), params=params,
        host=HostLayout(pack=pack, unpack=unpack, out_name="Y", out_shape=(t, bp, hp), out_dtype="float16"),
        buffers=bufs, flops=get_op(wl.op).flops(wl),
        info={"gm_layouts": layouts, "hidden_split": hs,
              "weights": "resident in L1" if resident else "streamed from GM every step", "k_chunk": kc})


def _divisor_tiles(extent: int, cap: int) -> tuple[int, ...]:
    return tuple(v for v in range(16, min(extent, cap) + 1, 16) if extent % v == 0 and (v & (v - 1) == 0 or v == extent))


@register_template
class AscendRecurrent(AscendTemplate):
    """One persistent kernel for the whole recurrence (lstm, gru): batch tiles over groups of
    cores; within a group the hidden tiles are split over `hidden_split` cores, each holding its
    weight columns in L1, and the step's h is exchanged through GM behind a SyncAll."""

    name = "ascend.recurrent.fused"
    op_families = ("recurrent",)
    version = 2

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        _, hp, b16 = dims(wl)
        bts = tuple(v for v in (16, 32, 64, 128) if v <= b16) or (16,)
        hns = tuple(v for v in (16, 32, 64, 128) if hp % v == 0) or (16,)
        return [
            Knob("batch_tile", bts, "batch rows per tile (multiple of 16); the tiles are split over the cores"),
            Knob("hidden_tile", hns, "hidden units per cell pass (their 4 column groups: one L0C tile)"),
            Knob("hidden_split", tuple(v for v in (1, 2, 4, 8, 16, 32) if v <= target.cores and v <= hp // min(hns)),
                 "cores sharing a batch tile, each with its hidden tiles' weights; h exchanged per step"),
            Knob("block_dim", tuple(reversed(core_values(target))), "AI cores the batch tiles are split over"),
        ]

    def check(self, wl: Workload, target: Target, config: Mapping) -> str | None:
        if wl.dtype != "float16":
            return f"ascend {wl.op} runs its products on the cube, which takes float16 here, not {wl.dtype}"
        if wl.op == "gru" and not int(dict(wl.params).get("lbr", 1)):
            return ("ascend gru applies the reset gate to h R_n^T after the product (linear_before_reset=1, "
                    "what torch exports); lbr=0 needs r before the product: run it on cpu")
        _, hp, _ = dims(wl)
        hs = config.get("hidden_split", 1)
        if hs > 1 and hp // config["hidden_tile"] < hs:
            return f"hidden_split {hs} > the {hp // config['hidden_tile']} hidden tiles"
        if hs > config["block_dim"]:
            return f"hidden_split {hs} > block_dim {config['block_dim']}: the cores sharing a tile run at once"
        return super().check(wl, target, config)

    def buffers(self, wl: Workload, target: Target, config: Mapping) -> list[tuple[str, str, int]]:
        caps = {lv: intrin.figures(target).level(lv).capacity for lv in ("L1", "L0A", "L0B")}
        return recurrent_buffers(wl, config, caps)[0]

    def preferred(self, wl: Workload, target: Target) -> list[dict]:
        """Every core busy first (batch tiles x hidden split up to the core count), then the
        weights resident in L1 (no stream from GM every step), then the fewest cores sharing
        a tile (one exchange less), hidden tiles of 64 (whole 64-lane fp32 repeats)."""
        sp = {k.name: k.values for k in self.space(wl, target)}
        caps = {lv: intrin.figures(target).level(lv).capacity for lv in ("L1", "L0A", "L0B")}
        _, hp, b16 = dims(wl)
        out = []
        for bt in sp["batch_tile"]:
            nb = ceil_div(b16, bt)
            for hn in sp["hidden_tile"]:
                for hs in sp["hidden_split"]:
                    if hs > 1 and hp // hn < hs:
                        continue
                    cfg = {"batch_tile": bt, "hidden_tile": hn, "hidden_split": hs, "block_dim": target.cores}
                    active = min(nb, target.cores // hs) * hs
                    resident = recurrent_buffers(wl, cfg, caps)[2]
                    rank = (not resident, -active, hs, abs(np.log2(hn / 64)), bt)
                    out.append((rank, cfg))
        return [c for _, c in sorted(out, key=lambda x: x[0])]

    def apply(self, wl: Workload, target: Target, config: Mapping) -> Any:
        from opcompiler.errors import OpcError

        if wl.dtype != "float16":
            raise OpcError(self.check(wl, target, config), arg="--dtype", value=wl.dtype, expected="float16")
        return scheduled(wl, target, config)

    def features(self, wl: Workload, target: Target, config: Mapping) -> dict[str, float]:
        config = self.config(wl, target, config)
        ip, hp, b16 = dims(wl)
        tiles = ceil_div(b16, config["batch_tile"])
        hs = config.get("hidden_split", 1)
        return {"tiles": tiles, "active_cores": min(config["block_dim"] // hs, tiles) * hs, "steps": wl["t"],
                "hidden_tiles": hp // config["hidden_tile"], "hidden_split": hs, "weight_bytes": (ip + hp) * 8 * hp}
