"""Attention on the DSP cluster, flash style: the scores of a query tile never leave AM.

    FOR query tile (b*h*ceil(sq/q_tile) of them, contiguous shares over `cores` cores)
      q    Q tile DDR -> AM transposed (Q^T: head-dim rows x query lanes), x scale
      FOR key / value tile (causal: only those at or left of the diagonal)     [opc.dsp.stage]
        kv   K, V tiles DDR -> SM (the products' broadcast scalars); mask tile DDR -> AM
        qk   S^T = K Q^T on the VPEs (register blocks of key rows x query vectors)
        sm   online softmax in fp32 down the key rows, per query lane: + mask, + causal band,
             m' = max(m, max S), alpha = exp(m - m'), P = exp(S - m') in place, l = alpha l + sum P
        pv   O^T = alpha O^T + V^T P^T (register blocks of head-dim rows x query vectors)
      out  O^T / l, AM -> DDR transposed

The query rows are on the 32 lanes: the running max, the sum and alpha of a tile are vectors,
and the softmax's row reductions are element-wise chains down the key rows. Q^T, O^T, m, l and
the score tile stay in AM over the whole key loop; K and V stream through SM, double-buffered
with `dbuf` (the next tile's copies issued before this tile's passes; Q^T and O^T get two slots
by query tile, so the next tile's Q^T arrives and the last tile's O leaves while the VPEs work).
The kernel is a TIR loop nest of stage events, as the ascend-sim flash kernel's: each stage one
`T.call_packed(EVENT, stage, bh, q0[, k0])`; the backend's lowering "attention"
(`opcompiler/backend/dsp/lower/attention.py`) turns each into its DMA descriptors and vector
instructions. A mask is relaid once, by the cores, to (skv, mask batches, sq) so its tiles are
row runs in the transposed orientation. layout=sbhd (Q, K, V, O sequence first) reads and writes
a head's rows at their pitch. fp32 only (the VPEs' type: a declared limit for float16).
"""
from __future__ import annotations

from typing import Any, Mapping

from opcompiler.backend.dsp.intrin import ALIGN, CORES, EVENT, F32, STAGE, machine
from opcompiler.ops import get_op
from opcompiler.ops.catalogue.attention import attention_scale, mask_batches, seq_first
from opcompiler.target import Target
from opcompiler.template_base import Knob, Scheduled, Template, register_template
from opcompiler.workload import Workload

from .common import capacity_why, refuse_invalid, require_fp32
from .stream import cdiv, cores_knob

Q_TILES = (32, 64, 96, 128, 192, 256, 384, 512)  # query rows per tile: multiples of the 32 lanes
KV_TILES = (8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512)  # key / value rows per tile


def _dims(wl: Workload) -> tuple[int, int, int, int]:
    return wl["b"] * wl["h"], wl["sq"], wl["skv"], wl["d"]


def band_extent(mq: int, nk: int) -> tuple[int, int]:
    """(x0, elements) of the causal band table (the lowering's `band_extent`)."""
    x0 = mq + nk
    return x0, cdiv(x0 + mq + nk, 32) * 32


def attention_buffers(wl: Workload, cfg: Mapping[str, Any]) -> list[tuple[str, str, int]]:
    """(level, name, bytes) the lowering allocates, in its order (the capacity check)."""
    _, _, _, d = _dims(wl)
    mq, nk, sl = int(cfg["q_tile"]), int(cfg["kv_tile"]), 2 if cfg["dbuf"] else 1
    out = [("AM", f"qT_AM_{s}", d * mq * F32) for s in range(sl)] + [("AM", f"oT_AM_{s}", d * mq * F32)
                                                                      for s in range(sl)]
    out += [("AM", "s_AM", nk * mq * F32)] + [("AM", f"m_AM_{s}", mq * F32) for s in range(2)]
    out += [("AM", "l_AM", mq * F32), ("AM", "alpha_AM", mq * F32)]
    if mask_batches(wl):
        out += [("AM", f"mask_AM_{s}", nk * mq * F32) for s in range(sl)]
    if wl.p.get("causal"):
        out.append(("AM", "band_AM", band_extent(mq, nk)[1] * F32))
    out += [("SM", f"k_SM_{s}", nk * d * F32) for s in range(sl)] + [("SM", f"v_SM_{s}", nk * d * F32)
                                                                      for s in range(sl)]
    return out


def footprint(wl: Workload, cfg: Mapping[str, Any]) -> dict[str, int]:
    """The bytes each level's buffers reach, placed in order at the level's alignment."""
    top = {"AM": 0, "SM": 0}
    for level, _, nbytes in attention_buffers(wl, cfg):
        top[level] = cdiv(top[level], ALIGN[level]) * ALIGN[level] + nbytes
    return top


def kernel(bh: int, nq: int, nkv: int, mq: int, nk: int, sq: int, causal: bool):
    """The flash-attention loop nest: a PrimFunc of stage events (see the module docstring)."""
    import tvm
    from tvm import tirx

    t, j = tirx.Var("t", "int32"), tirx.Var("j", "int32")
    b_h, q0 = t // nq, (t % nq) * mq
    n_t = tirx.min(nkv, (tirx.min(q0 + mq, sq) - 1) // nk + 1) if causal else tirx.const(nkv, "int32")

    def ev(tag: str, *args) -> Any:
        return tirx.Evaluate(tirx.call_packed(EVENT, tag, b_h, q0, *args))

    kv = tirx.For(j, 0, n_t, tirx.ForKind.SERIAL, tirx.SeqStmt([ev(tag, j * nk) for tag in ("kv", "qk", "sm", "pv")]),
                  annotations={STAGE: 1})
    tiles = tirx.For(t, 0, bh * nq, tirx.ForKind.SERIAL, tirx.SeqStmt([ev("q"), kv, ev("out")]),
                     annotations={CORES: 1})
    func = tirx.PrimFunc([tirx.Var(n, "handle") for n in ("Q", "K", "V", "O")], tiles).with_attr(
        "global_symbol", "main")
    return tvm.IRModule({"main": func})


def _tile_values(n: int, values: tuple[int, ...], step: int) -> tuple[int, ...]:
    """The values below n, and the first one covering n (rounded up to `step`)."""
    cover = cdiv(n, step) * step
    return tuple(v for v in values if v < cover) + tuple(v for v in values if v >= cover)[:1]


STEP_CYCLES = 300  # a key / value step's fixed VPU cost in `estimate`: its passes' starts and drains


def estimate(m, wl: Workload, cfg: Mapping[str, Any]) -> float:
    """A rough cycle estimate of the DSP part (the default's ranking, not the simulator): the
    busiest of a core's VPU work (the two products at the FMACs' rate, the softmax's vector-ALU
    chain, per key row and query vector; a fixed cost a step), its DMA engine's time (a start-up
    per copy, bytes, contiguous runs) and the cluster's DDR bytes at the channel's rate; plus
    what nothing overlaps: the mask's relayout, a core's first Q^T and K / V copies and its last
    O^T write-back."""
    bh, sq, skv, d = _dims(wl)
    mq, nk = int(cfg["q_tile"]), int(cfg["kv_tile"])
    nq, nkv = cdiv(sq, mq), cdiv(skv, nk)
    causal, mb, sf = bool(wl.p.get("causal")), mask_batches(wl), seq_first(wl)
    k = max(1, min(int(cfg["cores"]), m.cores))
    n = bh * nq
    run, fixed, bpc = m.dma_row_cycles, m.dma_startup + m.ddr_latency, m.dma_bytes_per_cycle
    worst, ddr = 0.0, 0.0
    for c in range(k):
        vpu = dma = exposed = 0.0
        mine = range(c * n // k, (c + 1) * n // k)
        for i, t in enumerate(mine):
            q0 = (t % nq) * mq
            rows = min(mq, sq - q0)
            nv = cdiv(rows, m.lanes)
            steps = min(nkv, (q0 + rows - 1) // nk + 1) if causal else nkv
            keys = min(skv, steps * nk)
            vpu += keys * nv * (2 * d / m.fmac_units + 5) + 2 * d * nv + steps * STEP_CYCLES
            per_copy = (2 + (mb > 0)) * fixed
            kv_bytes = (2 * keys * d + (keys * rows if mb else 0)) * F32
            dma += 2 * (fixed + rows * d * run) + steps * per_copy + kv_bytes / bpc
            dma += keys * run * ((2 if sf else 0) + (mb > 0))
            ddr += 2 * rows * d * F32 + kv_bytes
            if i == 0:
                exposed += fixed + rows * d * run + per_copy + kv_bytes / steps / bpc
            if i == len(mine) - 1:
                exposed += fixed + rows * d * run
        worst = max(worst, max(vpu, dma) + exposed)
    relayout = mb * sq * skv * (run + 2 * F32 / bpc) / m.cores + fixed if mb else 0.0
    if mb:
        ddr += 2 * mb * sq * skv * F32
    return max(worst, ddr / m.ddr_bytes_per_cycle / 0.85) + relayout


@register_template
class DspAttention(Template):
    """Q^T, O^T and the statistics resident in AM, K / V streamed through SM, S on the VPEs."""

    name = "dsp.attention.flash"
    op_families = ("attention",)
    target_family = "dsp"
    version = 1

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        require_fp32(wl, target)
        m = machine(target)
        _, sq, skv, _ = _dims(wl)
        kvs = tuple(v for v in KV_TILES if v < skv) + ((skv,) if skv <= KV_TILES[-1] else (KV_TILES[-1],))
        return [
            Knob("q_tile", _tile_values(sq, Q_TILES, m.lanes), "query rows per tile (on the lanes: a multiple of 32)"),
            Knob("kv_tile", kvs, "key / value rows per tile (the SM stage)"),
            Knob("dbuf", (1, 0), "two slots for K / V / mask tiles and for Q^T / O^T: copies overlap the VPU"),
            cores_knob(m),
        ]

    def tiles(self, wl: Workload, cfg: Mapping[str, Any]) -> int:
        bh, sq, _, _ = _dims(wl)
        return bh * cdiv(sq, int(cfg["q_tile"]))

    def check(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> str | None:
        if wl.dtype != "float32":
            return f"the DSP's VPEs compute fp32, not {wl.dtype}"
        return capacity_why(machine(target), footprint(wl, config))

    def default(self, wl: Workload, target: Target) -> dict[str, Any]:
        """Double-buffered, every core taking part; the tiles with the least `estimate` (the busiest
        core's VPU work and exposed copies against its DMA engine and the cluster's DDR bytes:
        larger query tiles read K and V fewer times, smaller ones expose less of their first
        and last transposed copies), then the largest key / value tile (fewer steps)."""
        m = machine(target)
        sp = {k.name: k.values for k in self.space(wl, target)}
        best, rank = None, None
        for dbuf in (1, 0):
            for mq in sp["q_tile"]:
                for nk in sp["kv_tile"]:
                    cfg = {"q_tile": mq, "kv_tile": nk, "dbuf": dbuf, "cores": m.cores}
                    if self.check(wl, target, cfg) is not None:
                        continue
                    r = (estimate(m, wl, cfg), -nk, mq)
                    if rank is None or r < rank:
                        best, rank = cfg, r
            if best is not None:
                return best
        return {"q_tile": sp["q_tile"][0], "kv_tile": sp["kv_tile"][0], "dbuf": 0, "cores": m.cores}

    def apply(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> Scheduled:
        require_fp32(wl, target)
        refuse_invalid(self, wl, target, config)
        m = machine(target)
        b, h, sq, skv, d = (wl[k] for k in ("b", "h", "sq", "skv", "d"))
        bh = b * h
        mq, nk = int(config["q_tile"]), int(config["kv_tile"])
        nq, nkv = cdiv(sq, mq), cdiv(skv, nk)
        causal, mb = bool(wl.p.get("causal")), mask_batches(wl)
        cores = max(1, min(int(config["cores"]), m.cores))
        tiles = bh * nq
        op = get_op(wl.op)
        inputs = [(nm, tuple(s)) for nm, s, _ in op.inputs(wl)]
        out_shape = tuple(int(x) for x in op.output_spec(wl)[0])  # (b, h, sq, d), or (sq, b, h, d) with layout=sbhd
        ddr = {nm: s for nm, s in inputs}
        ddr["out"] = out_shape
        pre = ()
        if mb:  # the mask relaid once to (skv, mask batches, sq): its tiles are row runs of S^T's orientation
            ddr["maskT"] = (skv, mb, sq)
            pre = (("mask", "maskT", (skv, mb, sq), (1, sq * skv, skv), False),)
        key = ("dsp.attention", bh, nq, nkv, mq, nk, sq, causal)
        params = {"inputs": tuple(inputs), "ddr": ddr, "out_shape": out_shape, "args": {}, "pre": pre,
                  "seq_first": seq_first(wl),
                  "bh": bh, "sq": sq, "skv": skv, "d": d, "heads": h, "mq": mq, "nk": nk, "dbuf": bool(config["dbuf"]),
                  "causal": causal, "mask_batches": mb, "scale": attention_scale(wl), "cores": cores, "tiles": tiles,
                  "cores_used": min(cores, tiles)}
        return Scheduled(
            lowering="attention", key=key, module=lambda: kernel(bh, nq, nkv, mq, nk, sq, causal), params=params,
            buffers=attention_buffers(wl, config), flops=op.flops(wl),
            info={"ddr_layouts": {"q, k, v, out": "(s, b, h, d) as given: a head's rows strided" if seq_first(wl)
                                  else "(b, h, s, d) as given", "mask": "relaid to (skv, mask batches, sq)"},
                  "scores_in_ddr_bytes": 0,
                  "pipeline": "K/V/mask double-buffered, next Q^T and last O^T overlapped" if config["dbuf"]
                  else "single-buffered"})

    def features(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> dict[str, float]:
        m = machine(target)
        config = self.config(wl, target, config)
        bh, sq, skv, d = _dims(wl)
        mq, nk = int(config["q_tile"]), int(config["kv_tile"])
        tiles = self.tiles(wl, config)
        cores = min(int(config["cores"]), tiles)
        fp = footprint(wl, config)
        return {"tiles": tiles, "active_cores": cores, "tiles_per_core": cdiv(tiles, cores),
                "kv_steps": cdiv(skv, nk), "ddr_kv_bytes": tiles * skv * d * 2 * F32,
                "lane_use": sq / (cdiv(sq, mq) * mq), "am_occupancy": fp["AM"] / m.cap("AM"),
                "sm_occupancy": fp["SM"] / m.cap("SM"), "transposed_elems": bh * sq * d * 2}
