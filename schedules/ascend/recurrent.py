"""LSTM on the AI Core: the whole recurrence in one kernel, the cell's state never leaving the core.

    FOR batch tile (Bp/bt of them, split over `block_dim` cores; each tile independent)
      init  h0 rows GM -> L1;  c0 GM -> UB -> fp32 (per hidden tile);  bias GM -> UB (fp32, once);
            W and R GM -> L1 once (FRACTAL_Z) when they fit beside the rest, else streamed per tile
      FOR step t
        x    x_t rows GM -> L1 (two slots: the next step's load overlaps this one)
        FOR hidden tile j (4 hn gate columns: i, o, f, c of hidden units j*hn ..)
          cell  x_t W_j^T + h_{t-1} R_j^T on the cube (K chunks through L0A / L0B, one L0C
                accumulator), L0C -> UB fp32, + bias, sigmoid (1 / (1 + exp(-x))) on all four,
                tanh = 2 sigmoid(2x) - 1 on the c gate, c = f c + i c~, h = o tanh(c) on the
                vector unit; h fp16 UB -> GM (Y) and UB -> L1 (the 910's UB -> L1 path), where
                the next step's h R^T reads it through L0A

GM traffic: X, W, R, B, h0, c0 read once each (W and R resident; streamed: once a step), Y written
once; nothing else. The kernel is a TIR loop nest of stage events (`T.call_packed(EVENT, ...)`),
turned into instructions by the backend's lowering "lstm" (`opcompiler/backend/ascend/tir_lstm.py`).
GM layouts (host-side): X (t, Bp, Ip) fp16; W, R as FRACTAL_Z of W^T / R^T with the 4h gate
columns regrouped per hidden tile [tile j: i | o | f | c]; B = Wb + Rb fp32 in that order;
h0, c0 (Bp, Hp) fp16; Y (t, Bp, Hp) fp16; all zero-padded to 16.
"""
from __future__ import annotations

from typing import Any, Mapping

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


def lstm_buffers(wl: Workload, cfg: Mapping, caps: Mapping[str, int]) -> tuple[list, int, bool]:
    """((level, name, bytes) the lowering allocates in order, the K chunk, weights resident)."""
    ip, hp, _ = dims(wl)
    bt, hn = cfg["batch_tile"], cfg["hidden_tile"]
    g = 4 * hn
    kc = k_chunk(bt, g, max(ip, hp), caps["L0A"], caps["L0B"])
    l1 = [("L1", f"h_L1_{s}", bt * hp * 2) for s in range(2)] + [("L1", f"x_L1_{s}", bt * ip * 2) for s in range(2)]
    used = sum(n for _, _, n in l1)
    resident = used + (ip + hp) * 4 * hp * 2 <= caps["L1"]
    if resident:
        l1 += [("L1", "W_L1", ip * 4 * hp * 2), ("L1", "R_L1", hp * 4 * hp * 2)]
    else:
        l1 += [("L1", f"w_L1_{s}", kc * g * 2) for s in range(2)]
    out = l1 + [("L0A", f"a_L0A_{s}", bt * kc * 2) for s in range(2)]
    out += [("L0B", f"b_L0B_{s}", kc * g * 2) for s in range(2)]
    out += [("L0C", f"g_L0C_{s}", g * bt * 4) for s in range(2)]
    out += [("UB", "gates_UB", bt * g * 4), ("UB", "c_UB", hp * bt * 4), ("UB", "bias_UB", 4 * hp * 4),
            ("UB", "c16_UB", bt * hp * 2)] + [("UB", f"h16_UB_{s}", bt * hn * 2) for s in range(2)]
    return out, kc, resident


def kernel(nb: int, t: int, nj: int):
    """The loop nest: batch tiles, steps, hidden tiles (a PrimFunc of stage events)."""
    import tvm
    from tvm import tirx

    bi, s, j = tirx.Var("bi", "int32"), tirx.Var("s", "int32"), tirx.Var("j", "int32")

    def ev(tag: str, *args) -> Any:
        return tirx.Evaluate(tirx.call_packed(intrin.EVENT, tag, bi, *args))

    cells = tirx.For(j, 0, nj, tirx.ForKind.SERIAL, ev("cell", s, j))
    steps = tirx.For(s, 0, t, tirx.ForKind.SERIAL, tirx.SeqStmt([ev("x", s), cells]))
    tiles = tirx.For(bi, 0, nb, tirx.ForKind.SERIAL, tirx.SeqStmt([ev("init"), steps]))
    func = tirx.PrimFunc([tirx.Var(n, "handle") for n in ("X", "W", "R", "B", "H0", "C0", "Y")], tiles).with_attr(
        "global_symbol", "lstm")
    return tvm.IRModule({"lstm": func}), []


def gate_order(h: int, hp: int, hn: int) -> np.ndarray:
    """Source row (of the 4h ONNX gate rows, -1: padding) of each packed gate column: hidden tile
    j holds [i | o | f | c] for hidden units j*hn .. j*hn + hn."""
    out = np.full(4 * hp, -1, np.int64)
    for j in range(hp // hn):
        for gi in range(4):
            for u in range(hn):
                unit = j * hn + u
                if unit < h:
                    out[j * 4 * hn + gi * hn + u] = gi * h + unit
    return out


def scheduled(wl: Workload, target: Target, cfg: Mapping) -> Scheduled:
    t, b, i, h = (wl[k] for k in ("t", "b", "i", "h"))
    ip, hp, _ = dims(wl)
    bt, hn = cfg["batch_tile"], cfg["hidden_tile"]
    bp = ceil_div(b, bt) * bt
    nb, nj = bp // bt, hp // hn
    caps = {lv: intrin.figures(target).level(lv).capacity for lv in ("L1", "L0A", "L0B")}
    bufs, kc, resident = lstm_buffers(wl, cfg, caps)
    order = gate_order(h, hp, hn)

    def fz(m: np.ndarray, k: int) -> np.ndarray:  # (4h, k) rows -> FRACTAL_Z of its transpose
        full = np.zeros((4 * hp, k), np.float16)
        full[order >= 0, :m.shape[1]] = m[order[order >= 0]]
        return np.ascontiguousarray(full.reshape(4 * hp // 16, 16, k // 16, 16).transpose(2, 0, 1, 3))

    def pack(inputs: list[np.ndarray]) -> dict[str, np.ndarray]:
        x, w, r, bias, h0, c0 = inputs
        bsum = bias[0, :4 * h].astype(np.float32) + bias[0, 4 * h:].astype(np.float32)
        bb = np.zeros(4 * hp, np.float32)
        bb[order >= 0] = bsum[order[order >= 0]]
        st = lambda a: pad_to(pad_to(a[0], 0, bp), 1, hp).astype(np.float16)  # noqa: E731
        return {"X": np.ascontiguousarray(pad_to(pad_to(x, 1, bp), 2, ip).astype(np.float16)),
                "W": fz(w[0].astype(np.float16), ip), "R": fz(r[0].astype(np.float16), hp), "B": bb,
                "H0": np.ascontiguousarray(st(h0)), "C0": np.ascontiguousarray(st(c0))}

    def unpack(y: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(y[:, :b, :h])

    key = ("ascend.lstm", nb, t, nj)
    params = {"t": t, "ip": ip, "hp": hp, "bp": bp, "bt": bt, "hn": hn, "kc": kc, "resident": resident,
              "block_dim": cfg["block_dim"]}
    return Scheduled(
        lowering="lstm", key=key, module=lambda: kernel(nb, t, nj), params=params,
        host=HostLayout(pack=pack, unpack=unpack, out_name="Y", out_shape=(t, bp, hp), out_dtype="float16"),
        buffers=bufs, flops=get_op(wl.op).flops(wl),
        info={"gm_layouts": {"X": "ND (t, Bp, Ip)", "W": "FRACTAL_Z of W^T, gate columns per hidden tile",
                             "R": "FRACTAL_Z of R^T, gate columns per hidden tile", "B": "fp32 Wb + Rb",
                             "H0": "ND (Bp, Hp)", "C0": "ND (Bp, Hp)", "Y": "ND (t, Bp, Hp)"},
              "weights": "resident in L1" if resident else "streamed from GM every step", "k_chunk": kc})


def _divisor_tiles(extent: int, cap: int) -> tuple[int, ...]:
    return tuple(v for v in range(16, min(extent, cap) + 1, 16) if extent % v == 0 and (v & (v - 1) == 0 or v == extent))


@register_template
class AscendLstm(AscendTemplate):
    """Batch tiles over the cores, each running all steps with its h in L1 / L0A and c in UB."""

    name = "ascend.lstm.fused"
    op_families = ("recurrent",)
    version = 1

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        _, hp, b16 = dims(wl)
        bts = tuple(v for v in (16, 32, 64, 128) if v <= b16) or (16,)
        return [
            Knob("batch_tile", bts, "batch rows per tile (multiple of 16); the tiles are split over the cores"),
            Knob("hidden_tile", tuple(v for v in (16, 32, 64, 128) if hp % v == 0) or (16,),
                 "hidden units per cell pass (their 4 gates' columns: one L0C tile)"),
            Knob("block_dim", tuple(reversed(core_values(target))), "AI cores the batch tiles are split over"),
        ]

    def check(self, wl: Workload, target: Target, config: Mapping) -> str | None:
        if wl.dtype != "float16":
            return f"ascend lstm runs its products on the cube, which takes float16 here, not {wl.dtype}"
        return super().check(wl, target, config)

    def buffers(self, wl: Workload, target: Target, config: Mapping) -> list[tuple[str, str, int]]:
        caps = {lv: intrin.figures(target).level(lv).capacity for lv in ("L1", "L0A", "L0B")}
        return lstm_buffers(wl, config, caps)[0]

    def preferred(self, wl: Workload, target: Target) -> list[dict]:
        """Batch tiles of 16 (the most cores), hidden tiles of 64 (whole 64-lane fp32 repeats)."""
        sp = {k.name: k.values for k in self.space(wl, target)}
        out = []
        for bt in sp["batch_tile"]:
            for hn in sp["hidden_tile"]:
                rank = (bt, abs(np.log2(hn / 64)))
                out.append((rank, {"batch_tile": bt, "hidden_tile": hn, "block_dim": target.cores}))
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
        return {"tiles": tiles, "active_cores": min(config["block_dim"], tiles), "steps": wl["t"],
                "hidden_tiles": hp // config["hidden_tile"], "weight_bytes": (ip + hp) * 8 * hp}
