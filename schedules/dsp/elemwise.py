"""dsp-sim template for element-wise ops (relu, add, add_relu, bias_add, batch_norm and the fused
bn_relu of seed 004 §2.1.3): the tensor is cut into stages of whole pixels (NHWC: C channels
each, channels on the lanes, per-channel parameters held in registers) or whole planes (NCHW:
one channel each, the parameter loaded from SM and broadcast); stages are split across the
cores, DMAed DDR -> AM, processed by the VPU, DMAed back."""
from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from opcompiler.backend.dsp.core import mk_ew
from opcompiler.backend.dsp.machine import DspMachine, machine
from opcompiler.backend.dsp.program import F32, Allocator, Op, Program, View, dma_op
from opcompiler.errors import OpcError
from opcompiler.ops import get_op
from opcompiler.target import Target
from opcompiler.template_base import Knob, Template, register_template
from opcompiler.workload import Workload

from opcompiler.backend.dsp.assemble import assemble, host_ops, nbytes
from .chain import DspChain
from .concat import DspConcat
from .common import require_fp32
from opcompiler.backend.dsp.program import stage_order
from .pad import DspPad
from .slice import DspSlice
from .transpose import DspTranspose

# op -> (data inputs, per-channel parameter inputs, FMAC ops, vector-ALU ops) per vector
OPS = {
    "relu": (1, 0, 0, 1), "add": (2, 0, 1, 0), "bias_add": (1, 1, 1, 0), "batch_norm": (1, 2, 1, 0),
    "bn_relu": (1, 2, 1, 1), "add_relu": (2, 0, 1, 1),
}
TILES = (1024, 2048, 4096, 8192, 16384, 32768)
PARAM_REGS = 40  # registers the parameter pattern may take; beyond, parameters are reloaded per vector


def _shape(wl: Workload) -> tuple[int, int, int, int]:
    return wl["n"], wl["c"], wl["h"], wl["w"]


# ops of the family with their own template (one template is registered per family): the
# element-wise chain (VPU instruction streams, `chain.py`), concat (DMA only, `concat.py`) and
# explicit padding (`pad.py`), slice and transpose (strided DMA, `slice.py`, `transpose.py`)
DELEGATE: dict[str, Template] = {"ew_chain": DspChain(), "concat": DspConcat(), "pad": DspPad(),
                                 "slice": DspSlice(), "transpose": DspTranspose()}


def _kind(wl: Workload) -> tuple[int, int, int, int]:
    if wl.op not in OPS:  # e.g. ew_chain, concat: no VPU lowering (graphs fall back to the host)
        raise OpcError(f"no dsp element-wise lowering for {wl.op}", arg="op", value=wl.op,
                       expected=", ".join(list(OPS) + list(DELEGATE)))
    n_in, npar, fm, va = OPS[wl.op]
    if wl.op == "add_relu" and wl.p.get("bcast"):
        n_in, npar = 1, 1  # y is per channel: a parameter
    return n_in, npar, fm, va


@register_template
class DspElemwise(Template):
    """Element-wise ops and fused BN+ReLU on the VPU, stages of pixels / planes across cores."""

    name = "dsp.elemwise"
    op_families = ("elemwise",)
    target_family = "dsp"
    version = 1

    def _check_op(self, wl: Workload, target: Target) -> None:
        require_fp32(wl, target)
        if wl.op not in OPS:
            raise OpcError(f"no dsp element-wise lowering for {wl.op}", arg="op", value=wl.op,
                           expected=", ".join(list(OPS) + list(DELEGATE)))

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        if wl.op in DELEGATE:
            return DELEGATE[wl.op].space(wl, target)
        self._check_op(wl, target)
        return [Knob("tile", TILES, "elements per DMA stage (rounded to whole pixels / planes)"),
                Knob("dbuf", (1, 0), "double-buffer the AM tiles"),
                Knob("split", ("items", "batch"), "stages across cores, or whole images per core (paper)")]

    def default(self, wl: Workload, target: Target) -> dict[str, Any]:
        if wl.op in DELEGATE:
            return DELEGATE[wl.op].default(wl, target)
        for tile in (8192, 4096, 2048, 1024):
            cfg = {"tile": tile, "dbuf": 1, "split": "items"}
            if self.check(wl, target, cfg) is None:
                return cfg
        return cfg

    def paper(self, wl: Workload, target: Target) -> dict[str, Any]:
        """Seed 004 §2.1.3: images across the cores, one image per stage, no double buffering."""
        if wl.op in DELEGATE:
            raise OpcError(f"no paper schedule for {wl.op} (seed 004 has none)", arg="--config", value="paper",
                           expected="default, best or a JSON object of knobs")
        n, c, h, w = _shape(wl)
        img = c * h * w
        tile = max([t for t in TILES if t <= img] or [TILES[0]])
        cfg = {"tile": tile, "dbuf": 0, "split": "batch"}
        return cfg

    def _seg(self, wl: Workload) -> int:
        n, c, h, w = _shape(wl)
        return c if wl.layout == "NHWC" else h * w

    def _footprint(self, m: DspMachine, wl: Workload, cfg: Mapping[str, Any]) -> int:
        n_in, npar, _, _ = _kind(wl)
        seg = self._seg(wl)
        tile = max(1, cfg["tile"] // seg) * seg
        return ((n_in + 1) * (1 + cfg["dbuf"]) * tile + npar * wl["c"]) * F32

    def check(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> str | None:
        if wl.op in DELEGATE:
            return DELEGATE[wl.op].check(wl, target, config)
        m = machine(target)
        need = self._footprint(m, wl, config)
        if need > m.cap("AM"):
            return f"AM needs {need} B > {m.cap('AM')} B"
        return None

    def _vec_cost(self, m: DspMachine, wl: Workload, elems: int, segs: int):
        n_in, npar, fm, va = _kind(wl)
        c = wl["c"]
        if wl.layout == "NHWC":
            pattern = npar * (math.lcm(c, m.lanes) // m.lanes) if npar else 0
            if pattern > PARAM_REGS:
                return mk_ew(m, -(-elems // m.lanes), n_in + npar, fm, va, 0), 1
            return mk_ew(m, -(-elems // m.lanes), n_in, fm, va, pattern), 1
        per_plane = mk_ew(m, -(-(elems // segs) // m.lanes), n_in, fm, va, npar)
        return per_plane, segs

    def apply(self, wl: Workload, target: Target, config: Mapping[str, Any], functional: bool = False) -> Program:
        """Lower to the cluster program (timing-only ops unless `functional`)."""
        if wl.op in DELEGATE:
            return DELEGATE[wl.op].apply(wl, target, config, functional)
        self._check_op(wl, target)
        m = machine(target)
        op = get_op(wl.op)
        why = self.check(wl, target, config)
        if why:
            raise OpcError(f"config cannot run: {why}", arg="--config", value=dict(config))
        n, c, h, w = _shape(wl)
        in_specs = op.inputs(wl)
        n_in, npar, _, _ = _kind(wl)
        data_names = [nm for nm, _, _ in in_specs][:n_in]
        par_names = [nm for nm, _, _ in in_specs][n_in:]
        total = n * c * h * w
        seg = self._seg(wl)
        per = max(1, config["tile"] // seg)
        tile = per * seg
        nsegs = total // seg
        segs_img = (c * h * w) // seg
        if config["split"] == "batch":
            imgs = [range(k * n // m.cores, (k + 1) * n // m.cores) for k in range(m.cores)]
            items = [[(i * segs_img + s0, min(per, segs_img - s0)) for i in ir for s0 in range(0, segs_img, per)]
                     for ir in imgs]
        else:
            allit = [(s0, min(per, nsegs - s0)) for s0 in range(0, nsegs, per)]
            items = [allit[k * len(allit) // m.cores:(k + 1) * len(allit) // m.cores] for k in range(m.cores)]
        nbuf = 1 + config["dbuf"]
        cost_cache: dict[int, Any] = {}
        nchw = wl.layout == "NCHW"

        def core_ops(core: int) -> list[Op]:
            if not items[core]:
                return []
            am = Allocator("AM", m.cap("AM"), 128)
            bufs = [[am.alloc(f"x{j}[{b}]", tile) for j in range(n_in)] for b in range(nbuf)]
            outs = [am.alloc(f"y[{b}]", tile) for b in range(nbuf)]
            ops: list[Op] = []
            par_off = []
            for j, pn in enumerate(par_names):
                lv = "SM" if nchw else "AM"
                off = am.alloc(pn, c) if not nchw else j * c
                par_off.append((lv, off))
                ops.append(dma_op(m, View(("DDR", pn), 0, (c,), (1,)), View((lv,), off, (c,), (1,)), (), ("w",),
                                  functional, f"{pn} -> {lv}"))
            stages = []
            for i, (s0, ns) in enumerate(items[core]):
                slot = i % nbuf
                e0, ne = s0 * seg, ns * seg
                ins = [dma_op(m, View(("DDR", dn), e0, (ne,), (1,)), View(("AM",), bufs[slot][j], (ne,), (1,)), (),
                              (f"x{slot}",), functional, f"{dn} DDR->AM") for j, dn in enumerate(data_names)]
                if ns not in cost_cache:
                    cost_cache[ns] = self._vec_cost(m, wl, ne, ns)
                cost, times = cost_cache[ns]
                from opcompiler.backend.dsp.core import MkCost
                tot = MkCost(cycles=cost.cycles * times, fmas=cost.fmas * times, vldst=cost.vldst * times,
                             slds=cost.slds * times, valu=cost.valu * times)
                fn = self._fn(wl, [bufs[slot][j] for j in range(n_in)], outs[slot], par_off, e0, ne) if functional else None
                comp = [Op("vpu", "vpu", cycles=tot.cycles, reads=(f"x{slot}", "w"), writes=(f"y{slot}",), cost=tot,
                           nruns=times, fn=fn, label=f"{wl.op} {ne} elements")]
                out = [dma_op(m, View(("AM",), outs[slot], (ne,), (1,)), View(("DDR", "out"), e0, (ne,), (1,)),
                              (f"y{slot}",), ("out",), functional, "y AM->DDR")]
                stages.append((ins, comp, out))
            return ops + stage_order(stages, nbuf > 1, functional)

        out_shape = tuple(int(v) for v in op.output_spec(wl)[0])
        ddr = {nm: s for nm, s, _ in in_specs}
        ddr["out"] = out_shape
        hpre, hpost = host_ops(m, [(nm, nbytes(s)) for nm, s, _ in in_specs], [("out", nbytes(out_shape))], [])
        return assemble(m, functional=functional, cores=m.cores, core_ops=core_ops,
                        group_key=lambda k: tuple(ns for _, ns in items[k]), pre=[], post=[],
                        host_pre=hpre, host_post=hpost, ddr_tensors=ddr, inputs=[nm for nm, _, _ in in_specs],
                        output="out", out_shape=out_shape, flops=op.flops(wl),
                        cores_used=sum(1 for it in items if it), info={"layout_change": "none"})

    def _fn(self, wl: Workload, xoffs: list[int], yoff: int, par_off: list[tuple[str, int]], e0: int, ne: int):
        n, c, h, w = _shape(wl)
        nchw = wl.layout == "NCHW"
        opname = wl.op
        bcast = bool(wl.p.get("bcast"))

        def run(mem) -> None:
            xs = [mem.view(View(("AM",), o, (ne,), (1,))) for o in xoffs]
            idx = np.arange(e0, e0 + ne)
            ch = (idx // (h * w)) % c if nchw else idx % c
            ps = [mem.view(View((lv,), off, (c,), (1,)))[ch] for lv, off in par_off]
            x = xs[0]
            if opname == "relu":
                y = np.maximum(x, 0)
            elif opname == "add":
                y = x + xs[1]
            elif opname == "add_relu":
                y = np.maximum(x + (ps[0] if bcast else xs[1]), 0)
            elif opname == "bias_add":
                y = x + ps[0]
            elif opname == "batch_norm":
                y = x * ps[0] + ps[1]
            else:  # bn_relu
                y = np.maximum(x * ps[0] + ps[1], 0)
            mem.view(View(("AM",), yoff, (ne,), (1,)))[...] = y
        return run

    def features(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> dict[str, float]:
        if wl.op in DELEGATE:
            return DELEGATE[wl.op].features(wl, target, config)
        m = machine(target)
        n, c, h, w = _shape(wl)
        n_in, npar, fm, va = _kind(wl)
        total = n * c * h * w
        seg = self._seg(wl)
        tile = max(1, config["tile"] // seg) * seg
        stages = -(-total // tile)
        return {"ddr_bytes": float((n_in + 1) * total * F32), "am_occupancy": self._footprint(m, wl, config) / m.cap("AM"),
                "stages": float(stages), "work_per_core": stages / min(m.cores, stages),
                "arith_intensity": (fm + va) / ((n_in + 1) * F32), "tile_elems": float(tile)}
