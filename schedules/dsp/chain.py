"""dsp-sim template for element-wise ops: a chain of steps in one kernel, as VPU instructions.

relu, add, add_relu, bias_add, batch_norm and bn_relu are fixed chains (`chain_of`); ew_chain
spells its chain out.

Steps (the ew_chain vocabulary, `opcompiler.ops.catalogue._chain_apply`): relu, sigmoid,
clip:LO:HI, affine:A:B, pow:P (x > 0), add / mul with a full-shape operand, bias / scale / bn with per-channel
operands. Each step is a few vector instructions on a register holding 32 elements of x
(`emit_steps`): relu is a vector max, clip a min and a max, affine and bn one FMA, sigmoid
1 / (1 + exp(-x)) and pow exp(P ln x) through the VPU's exp, log and reciprocal sequences
(`vector.emit_exp`, `emit_log`, `emit_rcp`); full-shape operands are vector loads of their own AM tiles.

The tensor is cut into stages of about `tile` elements, split over the cores, DMAed DDR -> AM
(x and each full-shape operand), computed in place and DMAed back. How elements map to lanes
depends on where per-channel operands vary:

* no per-channel step: the flat tensor, 32 consecutive elements per vector;
* NCHW with per-channel steps: whole planes (or chunks of one plane when a plane exceeds the
  tile), each plane padded to a multiple of 32 in AM; the plane's parameters are SM scalars
  broadcast to the lanes (`sld`);
* NHWC with per-channel steps: blocks of pixels, each pixel's C channels padded to a multiple of
  32 in AM; the parameters are AM vectors (channels on the lanes).
"""
from __future__ import annotations

from typing import Any, Mapping

from opcompiler.backend.dsp import vector as vx
from opcompiler.backend.dsp.machine import DspMachine, machine
from opcompiler.backend.dsp.program import F32, Allocator, Op, Program, View, dma_op
from opcompiler.backend.dsp.vector import Mem, Nest, VI, VKernel
from opcompiler.errors import OpcError
from opcompiler.ops import get_op
from opcompiler.ops.catalogue import _CHAIN_EXTRA, _chain_steps
from opcompiler.target import Target
from opcompiler.template_base import Knob, Template
from opcompiler.workload import Workload

from opcompiler.backend.dsp.assemble import assemble, host_ops, nbytes
from .common import require_fp32
from .stream import cdiv, cores_knob, group_key, share, stream, vpu_op

TILES = (1024, 2048, 4096, 8192, 16384, 32768)
# the family's single-step ops as chains over the same inputs (x, then each step's operands)
FIXED_CHAINS = {"relu": "relu", "add": "add", "bias_add": "bias", "batch_norm": "bn", "bn_relu": "bn;relu"}


def chain_of(wl: Workload) -> list[tuple[str, tuple[float, ...]]]:
    """The op as a step chain: ew_chain spells it out; relu, add, add_relu, bias_add,
    batch_norm and bn_relu are fixed chains (add_relu with a per-channel y is bias;relu)."""
    if wl.op == "ew_chain":
        return _chain_steps(wl)
    if wl.op == "add_relu":
        text = "bias;relu" if wl.p.get("bcast") else "add;relu"
    elif wl.op in FIXED_CHAINS:
        text = FIXED_CHAINS[wl.op]
    else:
        raise OpcError(f"no dsp element-wise chain for {wl.op}", arg="op", value=wl.op,
                       expected="ew_chain, " + ", ".join(FIXED_CHAINS) + " or add_relu")
    return [(name, ()) for name in text.split(";")]


def emit_steps(steps: list[tuple[str, tuple[float, ...]]], fulls: list[Mem], chans: list[Mem], chan_load: str,
               x: str = "x") -> list[VI]:
    """The vector instructions of a step chain applied to register x. `fulls`: the full-shape
    operands' vectors, `chans`: the per-channel operands (loaded with `chan_load`: sld or vld)."""
    out: list[VI] = []
    fi = ci = 0
    for name, args in steps:
        if name == "relu":
            out.append(VI("vmax", x, (x, 0.0)))
        elif name == "sigmoid":  # 1 / (1 + exp(-x))
            out.append(VI("vmul", "t", (x, -1.0)))
            out += vx.emit_exp("t", "e", "r", "n")
            out.append(VI("vadd", "e", ("e", 1.0)))
            out += vx.emit_rcp("e", x, "t")
        elif name == "clip":
            out += [VI("vmin", x, (x, args[1])), VI("vmax", x, (x, args[0]))]
        elif name == "affine":
            out.append(VI("vfma", x, (x, args[0], args[1])))
        elif name == "pow":  # x ** P = exp(P ln x), x > 0
            out += vx.emit_log(x, "t", "n")
            out.append(VI("vmul", "t", ("t", args[0])))
            out += vx.emit_exp("t", x, "r", "n")
        elif name in ("add", "mul"):
            out += [VI("vld", f"f{fi % 2}", (fulls[fi],)), VI("vadd" if name == "add" else "vmul", x, (x, f"f{fi % 2}"))]
            fi += 1
        elif name in ("bias", "scale"):
            out += [VI(chan_load, "p", (chans[ci],)), VI("vadd" if name == "bias" else "vmul", x, (x, "p"))]
            ci += 1
        elif name == "bn":
            out += [VI(chan_load, "ps", (chans[ci],)), VI(chan_load, "pb", (chans[ci + 1],)),
                    VI("vfma", x, (x, "ps", "pb"))]
            ci += 2
        else:
            raise OpcError(f"no VPU lowering for element-wise step {name}", arg="chain", value=name)
    return out


class _Geo:
    def __init__(self, m: DspMachine, wl: Workload, cfg: Mapping[str, Any]):
        p = wl.p
        self.n, self.c, self.h, self.w = p["n"], p["c"], p["h"], p["w"]
        self.hw = self.h * self.w
        self.total = self.n * self.c * self.hw
        self.steps = chain_of(wl)
        self.batch = cfg.get("split", "items") == "batch"
        kinds = [k for name, _ in self.steps for k in _CHAIN_EXTRA[name]]
        self.nfull, self.nchan = kinds.count("full"), kinds.count("chan")
        self.L = L = m.lanes
        self.mode = "flat" if not self.nchan else ("plane" if wl.layout == "NCHW" else "pixel")
        self.tile = int(cfg["tile"])
        self.nbuf = 1 + int(cfg["dbuf"])
        if self.mode == "flat":
            self.unit, self.pitch, self.per = 1, 1, max(L, self.tile // L * L)
            self.buf = self.per
        elif self.mode == "plane":
            hwp = cdiv(self.hw, L) * L
            if hwp <= self.tile:
                self.per, self.chunk, self.pitch = max(1, self.tile // hwp), self.hw, hwp  # planes per stage
            else:
                self.per, self.chunk, self.pitch = 1, max(L, self.tile // L * L), 0  # one chunk of a plane
            self.buf = self.per * (self.pitch or self.chunk)
        else:
            self.pitch = cdiv(self.c, L) * L
            self.per = max(1, self.tile // self.pitch)  # pixels per stage
            self.buf = self.per * self.pitch

    def items(self) -> list[tuple]:
        if self.mode == "flat" and self.batch:  # whole images per core: stages never cross an image
            img = self.c * self.hw
            return [(e0, min(self.per, (b + 1) * img - e0)) for b in range(self.n)
                    for e0 in range(b * img, (b + 1) * img, self.per)]
        if self.mode == "flat":
            return [(e0, min(self.per, self.total - e0)) for e0 in range(0, self.total, self.per)]
        if self.mode == "plane":
            if self.pitch:
                return [(b, c0, min(self.per, self.c - c0), 0, self.hw) for b in range(self.n)
                        for c0 in range(0, self.c, self.per)]
            return [(b, c, 1, s0, min(self.chunk, self.hw - s0)) for b in range(self.n) for c in range(self.c)
                    for s0 in range(0, self.hw, self.chunk)]
        npix = self.n * self.hw
        if self.batch:
            return [(p0, min(self.per, (b + 1) * self.hw - p0)) for b in range(self.n)
                    for p0 in range(b * self.hw, (b + 1) * self.hw, self.per)]
        return [(p0, min(self.per, npix - p0)) for p0 in range(0, npix, self.per)]

    def image(self, it: tuple) -> int:
        if self.mode == "plane":
            return it[0]
        return it[0] // (self.c * self.hw) if self.mode == "flat" else it[0] // self.hw

    def shares(self, cores: int, total_cores: int) -> list[list]:
        """Items per core: contiguous balanced shares, or whole images per core (split=batch)."""
        items = self.items()
        if not self.batch:
            return share(items, cores, total_cores)
        k = max(1, min(cores, total_cores))
        out: list[list] = [[] for _ in range(total_cores)]
        for it in items:
            b = self.image(it)
            out[next(c for c in range(k) if b < (c + 1) * self.n // k)].append(it)
        return out

    def key(self, it: tuple) -> tuple:
        return it[1:2] if self.mode != "plane" else (it[2], it[4])

    def am_elems(self) -> int:
        par = self.nchan * self.pitch if self.mode == "pixel" else 0
        return self.nbuf * (1 + self.nfull) * (self.buf + self.L) + par

    def sm_elems(self) -> int:
        return self.nchan * self.c if self.mode == "plane" else 0


class DspChain(Template):
    """ew_chain and the single-step element-wise ops on the VPU (dispatched to by `dsp.elemwise`)."""

    name = "dsp.ew_chain"
    op_families = ("elemwise",)
    target_family = "dsp"
    version = 1

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        require_fp32(wl, target)
        chain_of(wl)
        return [Knob("tile", TILES, "elements per DMA stage (rounded to whole planes / pixels with per-channel steps)"),
                Knob("dbuf", (1, 0), "double-buffer the AM tiles"), cores_knob(machine(target)),
                Knob("split", ("items", "batch"), "stages across cores, or whole images per core (seed 004 §2.1.3)")]

    def paper(self, wl: Workload, target: Target) -> dict[str, Any]:
        """Seed 004 §2.1.3: images across the cores, one image per stage (the largest tile that
        fits it), no double buffering."""
        if wl.op == "ew_chain":
            raise OpcError("no paper schedule for ew_chain (seed 004 has none)", arg="--config", value="paper",
                           expected="default, best or a JSON object of knobs")
        m = machine(target)
        img = wl["c"] * wl["h"] * wl["w"]
        cfg = {"tile": TILES[0], "dbuf": 0, "cores": m.cores, "split": "batch"}
        for tile in sorted((t for t in TILES if t <= max(img, TILES[0])), reverse=True):
            cfg["tile"] = tile
            if self.check(wl, target, cfg) is None:
                break
        return cfg

    def default(self, wl: Workload, target: Target) -> dict[str, Any]:
        m = machine(target)
        g = _Geo(m, wl, {"tile": TILES[0], "dbuf": 0})
        cfg: dict[str, Any] = {}
        for tile in sorted(TILES, reverse=True):
            cfg = {"tile": tile, "dbuf": 1, "cores": m.cores, "split": "items"}
            # at least two stages per core when the tensor allows it
            if g.total // tile < 2 * m.cores and tile > TILES[0]:
                continue
            if self.check(wl, target, cfg) is None:
                return cfg
        return cfg

    def check(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> str | None:
        m = machine(target)
        g = _Geo(m, wl, config)
        am, sm = g.am_elems() * F32, g.sm_elems() * F32
        if am > m.cap("AM"):
            return f"AM needs {am} B > {m.cap('AM')} B"
        if sm > m.cap("SM"):
            return f"SM needs {sm} B (per-channel operands) > {m.cap('SM')} B"
        return None

    def features(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> dict[str, float]:
        m = machine(target)
        g = _Geo(m, wl, config)
        items = g.items()
        return {"ddr_bytes": float((2 + g.nfull) * g.total * F32), "stages": float(len(items)),
                "work_per_core": len(items) / max(1, min(config.get("cores", m.cores), len(items))),
                "am_occupancy": g.am_elems() * F32 / m.cap("AM"), "steps": float(len(g.steps)),
                "lane_use": (g.hw / g.pitch) if g.mode == "plane" and g.pitch else
                (g.c / g.pitch if g.mode == "pixel" else 1.0)}

    def apply(self, wl: Workload, target: Target, config: Mapping[str, Any], functional: bool = False) -> Program:
        require_fp32(wl, target)
        why = self.check(wl, target, config)
        if why:
            raise OpcError(f"config cannot run: {why}", arg="--config", value=dict(config))
        m = machine(target)
        op = get_op(wl.op)
        g = _Geo(m, wl, config)
        specs = op.inputs(wl)
        names = [nm for nm, _, _ in specs]
        kinds = ["x"] + [k for name, _ in g.steps for k in _CHAIN_EXTRA[name]]
        fulls = [nm for nm, k in zip(names, kinds) if k == "full"]
        chans = [nm for nm, k in zip(names, kinds) if k == "chan"]
        shares = g.shares(int(config.get("cores", m.cores)), m.cores)
        cache: dict = {}

        def core_ops(core: int) -> list[Op]:
            items = shares[core]
            if not items:
                return []
            am = Allocator("AM", m.cap("AM"), 128)
            bufs = [[am.alloc(f"{nm} tile[{b}]", g.buf + g.L) for nm in ["x"] + fulls] for b in range(g.nbuf)]
            ops: list[Op] = []
            par: list[int] = []
            for j, nm in enumerate(chans):
                if g.mode == "plane":
                    off, lv = j * g.c, "SM"
                else:
                    off, lv = am.alloc(f"{nm} vectors", g.pitch), "AM"
                par.append(off)
                ops.append(dma_op(m, View(("DDR", nm), 0, (g.c,), (1,)), View((lv,), off, (g.c,), (1,)), (),
                                  ("const",), functional, f"{nm} DDR->{lv}"))

            def stage(it, slot, first):
                return self._stage(m, g, it, slot, [names[0]] + fulls, bufs[slot], par, functional)

            return ops + stream(items, g.nbuf, functional, stage, g.key, cache)

        out_shape = tuple(int(v) for v in op.output_spec(wl)[0])
        ddr = {nm: s for nm, s, _ in specs}
        ddr["out"] = out_shape
        hpre, hpost = host_ops(m, [(nm, nbytes(s)) for nm, s, _ in specs], [("out", nbytes(out_shape))], [])
        return assemble(m, functional=functional, cores=m.cores, core_ops=core_ops,
                        group_key=lambda c: group_key(shares[c], g.key), pre=[], post=[], host_pre=hpre,
                        host_post=hpost, ddr_tensors=ddr, inputs=names, output="out", out_shape=out_shape,
                        flops=op.flops(wl), cores_used=sum(1 for s in shares if s),
                        info={"layout_change": "none", "lanes": g.mode})

    def _views(self, g: _Geo, it: tuple, base: int) -> tuple[tuple, View, int]:
        """(DDR offset, shape, strides), the AM view, and (outer dims) for one item."""
        L = g.L
        if g.mode == "flat":
            e0, ne = it
            return (e0, (ne,), (1,)), View(("AM",), base, (ne,), (1,)), (cdiv(ne, L),)
        if g.mode == "plane":
            b, c0, nc, s0, ns = it
            pitch = g.pitch or g.chunk
            return (((b * g.c + c0) * g.hw + s0), (nc, ns), (g.hw, 1)), View(("AM",), base, (nc, ns), (pitch, 1)), \
                (nc, cdiv(ns, L))
        p0, np_ = it
        return (p0 * g.c, (np_, g.c), (g.c, 1)), View(("AM",), base, (np_, g.c), (g.pitch, 1)), (np_, cdiv(g.c, L))

    def _stage(self, m, g: _Geo, it, slot, tensors, bufs, par, fn):
        L = g.L
        tag = f"in{slot}"
        ins: list[Op] = []
        for nm, base in zip(tensors, bufs):
            (off, shape, strides), amv, outer = self._views(g, it, base)
            ins.append(dma_op(m, View(("DDR", nm), off, shape, strides), amv, (), (tag,), fn, f"{nm} DDR->AM"))
        (off, shape, strides), amv, outer = self._views(g, it, bufs[0])
        if g.mode == "flat":
            steps, chan_load = (L,), "sld"
            chans = []
        elif g.mode == "plane":
            steps, chan_load = (g.pitch or g.chunk, L), "sld"
            c0 = it[1]
            chans = [Mem("SM", p + c0, (1, 0), 0) for p in par]
        else:
            steps, chan_load = (g.pitch, L), "vld"
            chans = [Mem("AM", p, (0, L), 1) for p in par]
        fulls = [Mem("AM", b, steps) for b in bufs[1:]]
        body = [VI("vld", "x", (Mem("AM", bufs[0], steps),))]
        body += emit_steps(g.steps, fulls, chans, chan_load)
        body.append(VI("vst", Mem("AM", bufs[0], steps), ("x",)))
        kern = VKernel((Nest(outer=outer, post=tuple(body)),), "ew_chain")
        comp = [vpu_op(m, kern, (tag, "const"), (tag,), fn, f"chain {amv.size} elements")]
        outs = [dma_op(m, amv, View(("DDR", "out"), off, shape, strides), (tag,), ("out",), fn, "y AM->DDR")]
        return ins, comp, outs
