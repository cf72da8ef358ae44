"""dsp-sim templates for row reductions (reduce_sum, reduce_max over the last axis of (m, n))
and row softmax. reduce_* are lowered from the TVM schedule of the op's compute (`reduce_tir.py`)
by the backend's lane-reduction lowering (`backend/dsp/tir_vector.py`); softmax is still spelled
out here as VPU instruction streams.

Rows are independent. A stage is a block of `rows` rows, DMAed DDR -> AM with the row pitch
padded to a multiple of 32 x `acc` (the pad columns hold the reduction's identity, -inf or 0,
written by vector stores once per buffer: the DMA never writes them); blocks are split over the
cores. Per row the VPU walks the row's vectors with `acc` independent accumulators (more of them
hide the FMAC / ALU latency of the accumulation chain), combines them, and reduces the 32 lanes
by log2(32) rotate-and-combine steps (the VPEs' shuffle network), leaving the result in every
lane. reduce_* store one lane per row. Softmax makes three passes over the block: the row max
(stored to an AM scratch), e = exp(x - max) into the output tile with its running sum (exp is
the VPU's Cody-Waite + polynomial sequence), 1 / sum (reciprocal estimate + Newton steps), and
e * (1 / sum) in place; the output tile is DMAed AM -> DDR.
"""
from __future__ import annotations

from typing import Any, Mapping

from opcompiler.backend.dsp import vector as vx
from opcompiler.backend.dsp.machine import DspMachine, machine
from opcompiler.backend.dsp.program import F32, Allocator, Op, Program, View, dma_op
from opcompiler.backend.dsp.vector import Mem, Nest, VI, VKernel
from opcompiler.errors import OpcError
from opcompiler.ops import get_op
from opcompiler.target import Target
from opcompiler.template_base import Knob, Template, register_template
from opcompiler.workload import Workload

from opcompiler.backend.dsp.assemble import assemble, host_ops, nbytes
from .common import require_fp32
from .reduce_tir import build_program
from .stream import cdiv, cores_knob, fill_kernel, group_key, share, stream, vpu_op

ROWS = (1, 2, 4, 8, 16, 32, 64, 128)
ACC = (1, 2, 4, 8)
IDENT = {"reduce_sum": 0.0, "reduce_max": -float("inf"), "softmax": -float("inf")}


class _Geo:
    def __init__(self, m: DspMachine, wl: Workload, cfg: Mapping[str, Any]):
        self.m_, self.n = wl["m"], wl["n"]
        self.L = m.lanes
        self.acc = int(cfg["acc"])
        self.npad = cdiv(self.n, self.L * self.acc) * self.L * self.acc
        self.rows = max(1, min(int(cfg["rows"]), self.m_))
        self.nbuf = 1 + int(cfg["dbuf"])
        self.softmax = wl.op == "softmax"

    def items(self) -> list[tuple[int, int]]:
        return [(r0, min(self.rows, self.m_ - r0)) for r0 in range(0, self.m_, self.rows)]

    @staticmethod
    def key(it: tuple[int, int]) -> int:
        return it[1]

    def am_elems(self) -> int:
        tile = self.rows * self.npad
        if self.softmax:
            return self.nbuf * 2 * tile + 2 * self.rows * self.L
        return self.nbuf * (tile + self.rows)


class _RowTemplate(Template):
    target_family = "dsp"
    version = 1
    ops: tuple[str, ...] = ()

    def _check_wl(self, wl: Workload, target: Target) -> None:
        require_fp32(wl, target)
        if wl.op not in self.ops:
            raise OpcError(f"no {self.name} lowering for {wl.op}", arg="op", value=wl.op, expected=", ".join(self.ops))

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        self._check_wl(wl, target)
        return [Knob("rows", tuple(v for v in ROWS if v <= wl["m"]) or (1,), "rows per stage"),
                Knob("acc", ACC, "independent accumulators per row (hide the accumulation latency)"),
                Knob("dbuf", (1, 0), "double-buffer the AM tiles"), cores_knob(machine(target))]

    def default(self, wl: Workload, target: Target) -> dict[str, Any]:
        m = machine(target)
        knobs = {k.name: k.values for k in self.space(wl, target)}
        cfg: dict[str, Any] = {}
        for rows in sorted(knobs["rows"], reverse=True):
            if cdiv(wl["m"], rows) < min(2 * m.cores, wl["m"]):
                continue
            for acc in (4, 2, 1):
                cfg = {"rows": rows, "acc": acc, "dbuf": 1, "cores": m.cores}
                if self.check(wl, target, cfg) is None:
                    return cfg
        return {"rows": 1, "acc": 1, "dbuf": 1, "cores": m.cores}

    def check(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> str | None:
        m = machine(target)
        g = _Geo(m, wl, config)
        am = g.am_elems() * F32
        if am > m.cap("AM"):
            return f"AM needs {am} B > {m.cap('AM')} B"
        return None

    def features(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> dict[str, float]:
        m = machine(target)
        g = _Geo(m, wl, config)
        items = g.items()
        out = g.m_ * g.n if g.softmax else g.m_
        return {"ddr_bytes": float((g.m_ * g.n + out) * F32), "stages": float(len(items)),
                "work_per_core": len(items) / max(1, min(config["cores"], len(items))),
                "am_occupancy": g.am_elems() * F32 / m.cap("AM"), "lane_use": g.n / g.npad,
                "vectors_per_row": g.npad / g.L}

    def apply(self, wl: Workload, target: Target, config: Mapping[str, Any], functional: bool = False) -> Program:
        self._check_wl(wl, target)
        why = self.check(wl, target, config)
        if why:
            raise OpcError(f"config cannot run: {why}", arg="--config", value=dict(config))
        m = machine(target)
        op = get_op(wl.op)
        g = _Geo(m, wl, config)
        shares = share(g.items(), int(config["cores"]), m.cores)
        out_shape = tuple(int(v) for v in op.output_spec(wl)[0])
        cache: dict = {}

        def core_ops(core: int) -> list[Op]:
            items = shares[core]
            if not items:
                return []
            am = Allocator("AM", m.cap("AM"), 128)
            ib = [am.alloc(f"row tile[{b}]", g.rows * g.npad) for b in range(g.nbuf)]
            if g.softmax:
                ob = [am.alloc(f"output tile[{b}]", g.rows * g.npad) for b in range(g.nbuf)]
                scratch = (am.alloc("row max", g.rows * g.L), am.alloc("row 1/sum", g.rows * g.L))
            else:
                ob = [am.alloc(f"row results[{b}]", g.rows) for b in range(g.nbuf)]
                scratch = (0, 0)

            def stage(it, slot, first):
                return self._stage(m, g, wl.op, it, slot, first, ib[slot], ob[slot], scratch, functional)

            return stream(items, g.nbuf, functional, stage, g.key, cache)

        ddr = {"x": (g.m_, g.n), "out": out_shape}
        hpre, hpost = host_ops(m, [("x", nbytes(ddr["x"]))], [("out", nbytes(out_shape))], [])
        return assemble(m, functional=functional, cores=m.cores, core_ops=core_ops,
                        group_key=lambda c: group_key(shares[c], g.key), pre=[], post=[], host_pre=hpre,
                        host_post=hpost, ddr_tensors=ddr, inputs=["x"], output="out", out_shape=out_shape,
                        flops=op.flops(wl), cores_used=sum(1 for s in shares if s),
                        info={"layout_change": "none", "lane_use": round(g.n / g.npad, 4)})

    def _stage(self, m, g: _Geo, opname: str, it, slot, first, ib, ob, scratch, fn):
        r0, nr = it
        L, A = g.L, g.acc
        tin, tpad, tout = f"in{slot}", f"pad{slot}", f"out{slot}"
        ins: list[Op] = []
        if first and g.npad > g.n:
            k = fill_kernel(IDENT[opname], ib + g.n, (1, g.rows, g.npad - g.n), (0, g.npad), L, "identity padding")
            ins.append(vpu_op(m, k, (), (tpad,), fn, "identity fill"))
        ins.append(dma_op(m, View(("DDR", "x"), r0 * g.n, (nr, g.n), (g.n, 1)), View(("AM",), ib, (nr, g.n), (g.npad, 1)),
                          (), (tin,), fn, "x DDR->AM"))
        J = g.npad // (L * A)
        row = lambda base, a: Mem("AM", base + a * L, (g.npad, A * L))  # noqa: E731
        if opname == "softmax":
            mx, rs = scratch
            nests = [_reduce_nest(nr, J, A, "vmax", IDENT[opname], ib, g.npad, L, VI("vst", Mem("AM", mx, (L,)), ("s0",))),
                     Nest(outer=(nr,), inner=(J,),
                          pre=(VI("vld", "mx", (Mem("AM", mx, (L, 0)),)),) + tuple(VI("vmov", f"s{a}", (0.0,))
                                                                                  for a in range(A)),
                          body=tuple(ins_ for a in range(A) for ins_ in (
                              [VI("vld", "x", (row(ib, a),)), VI("vsub", "x", ("x", "mx"))]
                              + vx.emit_exp("x", "e", "r", "n")
                              + [VI("vst", row(ob, a), ("e",)), VI("vadd", f"s{a}", (f"s{a}", "e"))])),
                          post=tuple(_combine("vadd", A) + vx.emit_hreduce("vadd", "s0", "t", L)
                                     + vx.emit_rcp("s0", "y", "t") + [VI("vst", Mem("AM", rs, (L, 0)), ("y",))])),
                     Nest(outer=(nr,), inner=(J,), pre=(VI("vld", "rs", (Mem("AM", rs, (L, 0)),)),),
                          body=tuple(ins_ for a in range(A) for ins_ in (
                              VI("vld", "e", (row(ob, a),)), VI("vmul", "e", ("e", "rs")), VI("vst", row(ob, a), ("e",)))))]
            osrc = View(("AM",), ob, (nr, g.n), (g.npad, 1))
            odst = View(("DDR", "out"), r0 * g.n, (nr, g.n), (g.n, 1))
        else:  # reduce_sum / reduce_max: DspReduce lowers the TVM schedule (reduce_tir.py)
            raise OpcError(f"{opname} is lowered from its TVM schedule (dsp.reduce)", arg="op", value=opname)
        kern = VKernel(tuple(nests), opname)
        comp = [vpu_op(m, kern, (tin, tpad), (tout,), fn, f"{opname} {nr} rows")]
        outs = [dma_op(m, osrc, odst, (tout,), ("out",), fn, "y AM->DDR")]
        return ins, comp, outs


def _combine(op: str, A: int) -> list[VI]:
    """s0 <- s0 op s1 op ... (a tree over the accumulators)."""
    out, k = [], 1
    while k < A:
        out += [VI(op, f"s{a}", (f"s{a}", f"s{a + k}")) for a in range(0, A, 2 * k)]
        k *= 2
    return out


def _reduce_nest(nr: int, J: int, A: int, op: str, ident: float, ib: int, npad: int, L: int, store: VI) -> Nest:
    """Per row: A accumulators over the row's vectors, combined, lanes reduced, `store`d (the
    store's Mem has one step: per row)."""
    body = tuple(i for a in range(A) for i in (VI("vld", f"x{a}", (Mem("AM", ib + a * L, (npad, A * L)),)),
                                              VI(op, f"s{a}", (f"s{a}", f"x{a}"))))
    st = store.dst
    store = VI(store.op, Mem(st.level, st.base, st.steps + (0,), st.lane), store.srcs, store.lanes)
    return Nest(outer=(nr,), inner=(J,), pre=tuple(VI("vmov", f"s{a}", (ident,)) for a in range(A)), body=body,
                post=tuple(_combine(op, A) + vx.emit_hreduce(op, "s0", "t", L) + [store]))


@register_template
class DspReduce(_RowTemplate):
    """reduce_sum / reduce_max over the last axis on the VPU."""

    name = "dsp.reduce"
    op_families = ("reduce",)
    ops = ("reduce_sum", "reduce_max")

    def apply(self, wl: Workload, target: Target, config: Mapping[str, Any], functional: bool = False,
              tamper=None, vtamper=None) -> Program:
        """The program lowered from the TVM schedule of the op's compute (`reduce_tir.py`);
        `tamper` / `vtamper` (tests only) rewrite a DMA view / a vector kernel."""
        self._check_wl(wl, target)
        why = self.check(wl, target, config)
        if why:
            raise OpcError(f"config cannot run: {why}", arg="--config", value=dict(config))
        m = machine(target)
        g = _Geo(m, wl, config)
        shares = share(g.items(), int(config["cores"]), m.cores)  # cores with equal item keys time alike
        return build_program(wl, target, config, functional, g, shares, lambda c: group_key(shares[c], g.key),
                             tamper, vtamper)


@register_template
class DspSoftmax(_RowTemplate):
    """Row softmax on the VPU (max, exp + sum, scale)."""

    name = "dsp.softmax"
    op_families = ("softmax",)
    ops = ("softmax",)
