"""dsp-sim template for grouped and depthwise convolution (groups > 1), NCHW / OIHW, as VPU
instruction streams (dispatched to by `dsp.direct_conv2d`, whose K-on-the-lanes direct
convolution needs every output channel to read every input channel).

An item is (image, block of `planes` output channels, block of `rows` output rows); items are
split over the cores. A block holds whole groups when a group has at most `planes` output
channels (depthwise: `planes` channels, each its own group), else a slice of one group. Per item
the input planes of the block's groups are DMAed DDR -> AM (rows with the halo; zero padding
columns written by vector stores once per buffer, zero rows when the item needs them), the
weights (and bias / BN parameters) sit in SM: all of them for the whole kernel
(`w_path=resident`) or the block's, fetched per item (`w_path=stage`).

Output columns sit on the 32 lanes. A register block is `rb` output rows x 32 columns of one
output channel: for each input channel of its group (the sequential inner loop, accumulators
carried), every input row the block needs is loaded once per column tap (a vector load with lane
stride `stride`) and multiplied by the tap's weight (an SM scalar broadcast) into the
accumulators of the output rows that use it; larger `rb` reuses each loaded row for more
outputs (R x S weight registers + rb accumulators must fit the register file). The epilogue
(bias, BN scale/shift, ReLU) runs on the accumulators, which are stored to the AM output tile
and DMAed AM -> DDR.
"""
from __future__ import annotations

from typing import Any, Mapping

from opcompiler.backend.dsp.machine import DspMachine, machine
from opcompiler.backend.dsp.program import F32, Allocator, Op, Program, View, dma_op
from opcompiler.backend.dsp.vector import Mem, Nest, VI, VKernel
from opcompiler.errors import OpcError
from opcompiler.ops import get_op
from opcompiler.ops.catalogue import conv_out_hw
from opcompiler.target import Target
from opcompiler.template_base import Knob, Template
from opcompiler.workload import Workload

from opcompiler.backend.dsp.assemble import assemble, host_ops, nbytes
from .stream import cdiv, cores_knob, fill_kernel, group_key, share, stream, vpu_op

EPI = {"conv2d": (), "conv2d_bias_relu": ("bias", "relu"), "conv2d_bn_relu": ("bn", "relu"), "conv2d_bn": ("bn",)}
PARAMS = {"bias": ("bias",), "bn": ("scale", "shift")}
PLANES = (1, 2, 4, 8, 16, 32, 64)
ROWS = (1, 2, 4, 7, 8, 14, 16, 28, 32, 56)
RB = (1, 2, 3, 4, 6, 8)
X_REGS = 4  # input vectors in flight per register block (names rotate)


class _Geo:
    def __init__(self, m: DspMachine, wl: Workload, cfg: Mapping[str, Any]):
        p = wl.p
        self.n, self.c, self.h, self.w, self.k = p["n"], p["c"], p["h"], p["w"], p["k"]
        self.R, self.S, self.st, self.pad, self.dil, self.groups = p["r"], p["s"], p["stride"], p["pad"], \
            p["dilation"], p["groups"]
        self.cg, self.kg = self.c // self.groups, self.k // self.groups
        self.ho, self.wo = conv_out_hw(wl)
        self.epi = EPI[wl.op]
        self.pnames = [nm for e in self.epi for nm in PARAMS.get(e, ())]
        self.taps = self.R * self.S
        self.L = L = m.lanes
        self.nv = cdiv(self.wo, L)
        self.OW = self.nv * L
        self.Wr = max(self.w + 2 * self.pad, (self.OW - 1) * self.st + (self.S - 1) * self.dil + 1)
        planes = max(1, int(cfg["planes"]))
        if self.kg <= planes:  # whole groups per block
            self.gb, self.kpg = max(1, min(planes // self.kg, self.groups)), self.kg
        else:  # a slice of one group
            self.gb, self.kpg = 1, planes
        self.KP, self.CIN = self.gb * self.kpg, self.gb * self.cg
        self.rows = max(1, min(int(cfg["rows"]), self.ho))
        self.rb = max(1, min(int(cfg["rb"]), self.rows))
        self.IR = self.ir(self.rows)
        self.PP, self.OP = self.IR * self.Wr, self.rows * self.OW
        self.nbuf = 1 + int(cfg["dbuf"])
        self.resident = cfg["w_path"] == "resident"
        self.wblk = self.KP * self.cg * self.taps  # weights of one block

    def ir(self, nr: int) -> int:
        return (nr - 1) * self.st + (self.R - 1) * self.dil + 1

    def blocks(self) -> list[tuple[int, int, int]]:
        """(first output channel, groups in the block, output channels per group in the block)."""
        if self.kg <= self.KP:
            return [(g0 * self.kg, min(self.gb, self.groups - g0), self.kg) for g0 in range(0, self.groups, self.gb)]
        return [(g * self.kg + q, 1, min(self.kpg, self.kg - q)) for g in range(self.groups)
                for q in range(0, self.kg, self.kpg)]

    def items(self) -> list[tuple]:
        return [(b, k0, gbn, kpg, y0, min(self.rows, self.ho - y0)) for b in range(self.n)
                for k0, gbn, kpg in self.blocks() for y0 in range(0, self.ho, self.rows)]

    def key(self, it: tuple) -> tuple:
        _, _, gbn, kpg, y0, nr = it
        iy0 = y0 * self.st - self.pad
        lo, hi = max(0, iy0), min(self.h, iy0 + self.ir(nr))
        return (gbn, kpg, nr, lo - iy0, hi - lo)

    def am_elems(self) -> int:
        return self.nbuf * (self.CIN * self.PP + self.L * self.st + self.KP * self.OP)

    def sm_elems(self) -> int:
        if self.resident:
            return self.k * self.cg * self.taps + len(self.pnames) * self.k
        return self.nbuf * (self.wblk + len(self.pnames) * self.KP)

    def regs(self) -> int:
        return self.rb + self.taps + X_REGS + len(self.pnames)


class DspGroupedConv(Template):
    """Grouped / depthwise NCHW convolution on the VPU (dispatched to by `dsp.direct_conv2d`)."""

    name = "dsp.grouped_conv2d"
    op_families = ("conv2d",)
    target_family = "dsp"
    version = 1

    def _check_wl(self, wl: Workload, target: Target) -> None:
        from .common import require_fp32
        require_fp32(wl, target)
        if wl.layout != "NCHW":
            raise OpcError("the dsp grouped / depthwise convolution is NCHW (output columns on the lanes)",
                           arg="layout", value=wl.layout, expected="NCHW (or groups=1)")
        if wl.op not in EPI:
            raise OpcError(f"no dsp grouped-conv lowering for {wl.op}", arg="op", value=wl.op, expected=", ".join(EPI))

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        self._check_wl(wl, target)
        m = machine(target)
        ho, _ = conv_out_hw(wl)
        return [Knob("planes", tuple(v for v in PLANES if v <= wl["k"]) or (1,), "output channels per stage"),
                Knob("rows", tuple(sorted({v for v in ROWS if v < ho} | {ho})), "output rows per stage"),
                Knob("rb", tuple(v for v in RB if v <= ho) or (1,), "output rows per register block"),
                Knob("w_path", ("resident", "stage"), "all weights in SM for the kernel, or the block's per stage"),
                Knob("dbuf", (1, 0), "double-buffer the AM / SM tiles so DMA overlaps the VPU"),
                cores_knob(m)]

    def default(self, wl: Workload, target: Target) -> dict[str, Any]:
        m = machine(target)
        knobs = {k.name: k.values for k in self.space(wl, target)}
        cfg: dict[str, Any] = {}
        for dbuf in (1, 0):
            for rows in sorted(knobs["rows"], reverse=True):
                for planes in sorted(knobs["planes"], reverse=True):
                    for w_path in ("resident", "stage"):
                        cfg = {"planes": planes, "rows": rows, "rb": max(v for v in knobs["rb"] if v <= 4),
                               "w_path": w_path, "dbuf": dbuf, "cores": m.cores}
                        g = _Geo(m, wl, cfg)
                        if len(g.items()) < min(2 * m.cores, wl["n"] * wl["k"] * cdiv(g.ho, rows)):
                            continue
                        if self.check(wl, target, cfg) is None:
                            return cfg
        return {**cfg, "planes": 1, "rows": 1, "rb": 1}

    def check(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> str | None:
        m = machine(target)
        g = _Geo(m, wl, config)
        am, sm = g.am_elems() * F32, g.sm_elems() * F32
        if am > m.cap("AM"):
            return f"AM needs {am} B > {m.cap('AM')} B"
        if sm > m.cap("SM"):
            return f"SM needs {sm} B (weights, w_path={config['w_path']}) > {m.cap('SM')} B"
        if g.regs() > m.registers:
            return f"register block needs {g.regs()} vector registers > {m.registers}"
        return None

    def features(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> dict[str, float]:
        m = machine(target)
        g = _Geo(m, wl, config)
        items = g.items()
        ddr_in = sum(gbn * g.cg * min(g.h, g.ir(nr)) * g.w for _, _, gbn, _, _, nr in items) * F32
        ddr_w = (g.k * g.cg * g.taps) * F32 * (1 if g.resident else len(items) / max(1, len(g.blocks())))
        ddr_out = g.n * g.k * g.ho * g.wo * F32
        rows_loaded = g.ir(g.rb)
        return {"ddr_bytes": float(ddr_in + ddr_w + ddr_out), "stages": float(len(items)),
                "work_per_core": len(items) / max(1, min(config["cores"], len(items))),
                "am_occupancy": g.am_elems() * F32 / m.cap("AM"), "sm_occupancy": g.sm_elems() * F32 / m.cap("SM"),
                "reg_occupancy": g.regs() / m.registers, "loads_per_fma": rows_loaded * g.S / (g.rb * g.taps),
                "lane_use": g.wo / g.OW}

    def apply(self, wl: Workload, target: Target, config: Mapping[str, Any], functional: bool = False) -> Program:
        self._check_wl(wl, target)
        why = self.check(wl, target, config)
        if why:
            raise OpcError(f"config cannot run: {why}", arg="--config", value=dict(config))
        m = machine(target)
        op = get_op(wl.op)
        g = _Geo(m, wl, config)
        shares = share(g.items(), int(config["cores"]), m.cores)
        npar = len(g.pnames)
        cache: dict = {}

        def core_ops(core: int) -> list[Op]:
            items = shares[core]
            if not items:
                return []
            am = Allocator("AM", m.cap("AM"), 128)
            sm = Allocator("SM", m.cap("SM"), 8)
            ib = [am.alloc(f"input tile[{b}]", g.CIN * g.PP + g.L * g.st) for b in range(g.nbuf)]
            ob = [am.alloc(f"output tile[{b}]", g.KP * g.OP) for b in range(g.nbuf)]
            ops: list[Op] = []
            if g.resident:
                wsm = [sm.alloc("weights", g.k * g.cg * g.taps)] * g.nbuf
                psm = [[sm.alloc(nm, g.k) for nm in g.pnames]] * g.nbuf
                ops.append(dma_op(m, View(("DDR", "weight"), 0, (g.k * g.cg * g.taps,), (1,)),
                                  View(("SM",), wsm[0], (g.k * g.cg * g.taps,), (1,)), (), ("const",), functional,
                                  "W DDR->SM"))
                for nm, off in zip(g.pnames, psm[0]):
                    ops.append(dma_op(m, View(("DDR", nm), 0, (g.k,), (1,)), View(("SM",), off, (g.k,), (1,)), (),
                                      ("const",), functional, f"{nm} DDR->SM"))
            else:
                wsm = [sm.alloc(f"weights[{b}]", g.wblk) for b in range(g.nbuf)]
                psm = [[sm.alloc(f"{nm}[{b}]", g.KP) for nm in g.pnames] for b in range(g.nbuf)]

            def stage(it, slot, first):
                return self._stage(m, g, it, slot, first, ib[slot], ob[slot], wsm[slot], psm[slot], functional)

            return ops + stream(items, g.nbuf, functional, stage, g.key, cache)

        specs = op.inputs(wl)
        out_shape = (g.n, g.k, g.ho, g.wo)
        ddr = {nm: s for nm, s, _ in specs}
        ddr["out"] = out_shape
        hpre, hpost = host_ops(m, [(nm, nbytes(s)) for nm, s, _ in specs], [("out", nbytes(out_shape))], [])
        return assemble(m, functional=functional, cores=m.cores, core_ops=core_ops,
                        group_key=lambda c: group_key(shares[c], g.key), pre=[], post=[], host_pre=hpre,
                        host_post=hpost, ddr_tensors=ddr, inputs=[nm for nm, _, _ in specs], output="out",
                        out_shape=out_shape, flops=op.flops(wl), cores_used=sum(1 for s in shares if s),
                        info={"layout_change": "none", "lane_use": round(g.wo / g.OW, 4), "groups": g.groups,
                              "params": npar})

    def _stage(self, m, g: _Geo, it, slot, first, ib, ob, wsm, psm, fn):
        b, k0, gbn, kpg, y0, nr = it
        kp = gbn * kpg
        ci0 = (k0 // g.kg) * g.cg
        cin = gbn * g.cg
        iy0 = y0 * g.st - g.pad
        ir = g.ir(nr)
        lo, hi = max(0, iy0), min(g.h, iy0 + ir)
        tin, tpad, tw, tout = f"in{slot}", f"pad{slot}", f"w{slot}", f"out{slot}"
        ins: list[Op] = []
        fills = []
        if first and g.pad:
            fills += [((0, 0), (g.CIN, g.IR, g.pad)), ((0, g.pad + g.w), (g.CIN, g.IR, g.pad))]
        if lo > iy0:
            fills.append(((0, 0), (cin, lo - iy0, g.Wr)))
        if iy0 + ir > hi:
            fills.append(((hi - iy0, 0), (cin, iy0 + ir - hi, g.Wr)))
        for (r0, c0), shape in fills:
            k = fill_kernel(0.0, ib + r0 * g.Wr + c0, shape, (g.PP, g.Wr), g.L, "conv padding")
            ins.append(vpu_op(m, k, (), (tpad,), fn, "zero padding"))
        if g.resident:
            w0, p0 = wsm + k0 * g.cg * g.taps, [p + k0 for p in psm]
            wtag = "const"
        else:
            w0, p0, wtag = wsm, psm, tw
            nw = kp * g.cg * g.taps
            ins.append(dma_op(m, View(("DDR", "weight"), k0 * g.cg * g.taps, (nw,), (1,)), View(("SM",), wsm, (nw,), (1,)),
                              (), (tw,), fn, "W block DDR->SM"))
            for nm, off in zip(g.pnames, psm):
                ins.append(dma_op(m, View(("DDR", nm), k0, (kp,), (1,)), View(("SM",), off, (kp,), (1,)), (), (tw,), fn,
                                  f"{nm} block DDR->SM"))
        src = View(("DDR", "data"), ((b * g.c + ci0) * g.h + lo) * g.w, (cin, hi - lo, g.w), (g.h * g.w, g.w, 1))
        dst = View(("AM",), ib + (lo - iy0) * g.Wr + g.pad, (cin, hi - lo, g.w), (g.PP, g.Wr, 1))
        ins.append(dma_op(m, src, dst, (), (tin,), fn, "I DDR->AM"))
        nests = []
        full, tail = divmod(nr, g.rb)
        if full:
            nests.append(self._nest(g, (gbn, kpg, full, g.nv), g.rb, ib, ob, w0, p0))
        if tail:
            nests.append(self._nest(g, (gbn, kpg, 1, g.nv), tail, ib + full * g.rb * g.st * g.Wr, ob + full * g.rb * g.OW,
                                    w0, p0))
        kern = VKernel(tuple(nests), "grouped conv")
        comp = [vpu_op(m, kern, (tin, tpad, wtag, "const"), (tout,), fn, f"conv {kp} ch x {nr} rows")]
        osrc = View(("AM",), ob, (kp, nr, g.wo), (g.OP, g.OW, 1))
        odst = View(("DDR", "out"), ((b * g.k + k0) * g.ho + y0) * g.wo, (kp, nr, g.wo), (g.ho * g.wo, g.wo, 1))
        return ins, comp, [dma_op(m, osrc, odst, (tout,), ("out",), fn, "O AM->DDR")]

    def _nest(self, g: _Geo, outer: tuple[int, int, int, int], rb: int, ib: int, ob: int, w0: int, p0: list[int]
              ) -> Nest:
        """One register block per outer iteration (group, channel in group, row block, column vector);
        the inner loop runs over the group's input channels."""
        L, st, dil, W, taps = g.L, g.st, g.dil, g.Wr, g.taps
        kpg = outer[1]
        ch = kpg * g.cg * taps  # SM weights between groups of the block
        pre = tuple(VI("vmov", f"acc{j}", (0.0,)) for j in range(rb))
        body: list[VI] = []
        loaded: set[tuple[int, int]] = set()
        nx = 0
        # input row t serves output row j with tap rr when t == j*stride + rr*dilation
        uses: dict[int, list[tuple[int, int]]] = {}
        for j in range(rb):
            for rr in range(g.R):
                uses.setdefault(j * st + rr * dil, []).append((j, rr))
        for t in sorted(uses):
            for ss in range(g.S):
                xr = f"x{nx % X_REGS}"
                nx += 1
                body.append(VI("vld", xr, (Mem("AM", ib + t * W + ss * dil, (g.cg * g.PP, 0, g.rb * st * W, L * st, g.PP),
                                               st),)))
                for j, rr in uses[t]:
                    wr = f"w{rr}_{ss}"
                    if (rr, ss) not in loaded:
                        loaded.add((rr, ss))
                        body.append(VI("sld", wr, (Mem("SM", w0 + rr * g.S + ss, (ch, g.cg * taps, 0, 0, taps), 0),)))
                    body.append(VI("vfma", f"acc{j}", (xr, wr, f"acc{j}")))
        post: list[VI] = []
        pregs = []
        for i, nm in enumerate(g.pnames):
            post.append(VI("sld", f"p{i}", (Mem("SM", p0[i], (kpg, 1, 0, 0, 0), 0),)))
            pregs.append(f"p{i}")
        for j in range(rb):
            a = f"acc{j}"
            pi = 0
            for e in g.epi:
                if e == "bias":
                    post.append(VI("vadd", a, (a, pregs[pi])))
                    pi += 1
                elif e == "bn":
                    post.append(VI("vfma", a, (a, pregs[pi], pregs[pi + 1])))
                    pi += 2
                elif e == "relu":
                    post.append(VI("vmax", a, (a, 0.0)))
            post.append(VI("vst", Mem("AM", ob + j * g.OW, (kpg * g.OP, g.OP, g.rb * g.OW, L, 0)), (a,)))
        return Nest(outer=outer, inner=(g.cg,), pre=pre, body=tuple(body), post=tuple(post))
