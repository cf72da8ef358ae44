"""Vector nests of lowered TIR -> VPU vector kernels (`vector.VKernel`), the TBE `emit_insn` way.

A template marks a loop nest `opc.dsp.op = "vec"` (`schedules/dsp/chain_tir.py`): a perfect nest
over one block storing one expression into an AM tile. The nest becomes one VPU pass, one
`vector.Nest`:

* the innermost loop is the lanes: cut into vectors of `lanes` elements (the last one of a row
  computes whole lanes; stores write whole vectors, so AM tiles get one vector of slack); the
  other loops are the nest's independent outer iterations. The block predicate gives the box
  of iterations that exist (tails of the tensor);
* every buffer access becomes a `Mem`: its flat index evaluated at the box's corner and one step
  along each loop gives base, steps and the lane stride (checked affine over the box). A load
  whose index does not move along the lanes is a scalar: an `sld` from SM, broadcast;
* the stored expression is decomposed into vector instructions, recognised from its nodes:
  loads (`vld` / `sld`), `max(x, c)` -> vmax, `min` -> vmin, `a * b + c` -> one vfma (when b and c
  are both immediates or both per-channel operands), `+`, `-`, `*` -> vadd / vsub / vmul,
  `exp`, `log` and `1 / x` -> the VPU math-library sequences (`vector.emit_exp`, `emit_log`,
  `emit_rcp`), constants as immediates. Inner nodes live in temporaries taken from a pool
  (freed when their last reader has issued; a one-instruction node overwrites an operand that
  dies there); the second operand of a binary node, when it is a load, gets a register named by
  its role (full-shape vectors alternate f0 / f1, a per-channel operand p), an FMA's two
  per-channel operands two temporaries: the registers a nest writes bound how many of its
  iterations are in flight, so names are reused as a VPU programmer would;
* functional mode executes the kernel (`vector.execute`) on the simulated memories; its cycles
  come from list-scheduling the same instructions (`vector.kernel_cost`).

`VecLowerer` is the DSP lowering (`tir_lower.Lowerer`) for kernels made of such nests: buffers
keep the strides the schedule gave them (`storage_align`: each plane / pixel starts a vector),
an AM tile gets one vector of slack, a vector nest's result takes the AM tile of an operand that
dies there (computed in place, as the chip's kernels do), copies from DDR into AM are a stage's
DMA-in. Anything it cannot map is a one-line OpcFailure naming the nest.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from opcompiler.errors import OpcFailure

from . import vector as vx
from .machine import DspMachine
from .program import Allocator, Op
from .tir_eval import _bkey, _boxes, _full, _grid, _key
from .tir_lower import Lowerer

VEC = "vec"  # the opc.dsp.op value of a vector nest


class VecLowerer(Lowerer):
    """The Lowerer of kernels whose VPU passes are vector nests (element-wise chains)."""

    def __init__(self, m: DspMachine, func, ddr_names: Mapping[str, str], ddr_shapes: Mapping[str, tuple],
                 dbuf: bool, functional: bool, tamper: Callable | None = None,
                 vtamper: Callable[[vx.VKernel], vx.VKernel] | None = None):
        """`vtamper`: tests only, rewrites each vector kernel before it is executed."""
        self.bstrides: dict[int, tuple[int, ...]] = {}
        self.vtamper = vtamper
        super().__init__(m, func, ddr_names, ddr_shapes, 1, dbuf, False, functional, tamper)

    # ---- buffers --------------------------------------------------------------------------
    def _strides(self, bk: int) -> tuple[int, ...]:
        st = self.bstrides.get(bk)
        return st if st is not None else super()._strides(bk)

    def _allocate(self) -> None:
        """SM / AM buffers (twice in a double-buffered stage) with their strides; AM tiles with a
        vector of slack; a vector nest's result in place of an operand tile that dies there."""
        L = self.m.lanes
        am, sm = Allocator("AM", self.m.cap("AM"), 128), Allocator("SM", self.m.cap("SM"), 8)
        found: list[tuple[Any, bool]] = []
        reads: dict[int, int] = {}  # buffer -> statements reading it
        vec_io: list[tuple[int, list[int]]] = []  # per vector nest: (stored buffer, loaded buffers)
        self.has_shared = False

        def loads(e, acc: list) -> list:
            name = type(e).__name__
            if name in ("BufferLoad", "TensorLoad"):
                acc.append(_bkey(e))
            for attr in ("a", "b", "value", "condition", "true_value", "false_value"):
                if hasattr(e, attr) and not isinstance(getattr(e, attr), (int, float, str)):
                    loads(getattr(e, attr), acc)
            for x in getattr(e, "args", ()):
                loads(x, acc)
            return acc

        def visit(st, in_stage: bool, vec: bool) -> None:
            name = type(st).__name__
            if name == "SBlockRealize":
                for b in st.block.alloc_buffers:
                    found.append((b, in_stage))
                visit(st.block.body, in_stage, vec)
            elif name == "For":
                if st.annotations.get("opc.dsp.op") == "dma_shared":
                    raise OpcFailure("tir lowering: vector kernels have no shared (GSM) copies")
                vec = vec or st.annotations.get("opc.dsp.op") == VEC
                visit(st.body, in_stage or "opc.dsp.stage" in st.annotations, vec)
            elif name == "SeqStmt":
                for x in st.seq:
                    visit(x, in_stage, vec)
            elif name == "IfThenElse":
                visit(st.then_case, in_stage, vec)
            elif name == "BufferStore":
                ls = loads(st.value, [])
                for b in set(ls):
                    reads[b] = reads.get(b, 0) + 1
                if vec:
                    vec_io.append((_bkey(st), ls))
        visit(self.func.body, False, False)
        info: dict[int, tuple] = {}
        for b, in_stage in found:
            shape = tuple(int(x) for x in b.shape)
            bk = _bkey(b)
            self.shapes[bk] = shape
            self.names[bk] = b.name
            strides = tuple(int(s) for s in b.strides) if len(b.strides) else None
            if strides is not None:
                self.bstrides[bk] = strides
            size = shape[0] * strides[0] if strides and shape else int(np.prod(shape))
            info[bk] = (b.scope(), shape, strides, size, in_stage)
        alias: dict[int, int] = {}
        for out, ins in vec_io:  # in place: an operand tile of the same layout that only this nest reads
            if out not in info or info[out][0] != "local.AM":
                continue
            for i in ins:
                if i in info and i not in alias.values() and reads.get(i) == 1 and info[i][:3] == info[out][:3] \
                        and info[i][4] == info[out][4]:
                    alias[out] = i
                    break
        for bk, (scope, shape, strides, size, in_stage) in info.items():
            if bk in alias:
                continue
            if scope == "local.AM":
                size = -(-size // L) * L + (L if in_stage else 0)
                alloc = am
            elif scope == "local.SM":
                alloc = sm
            else:
                raise OpcFailure(f"tir lowering: buffer {self.names[bk]} in scope {scope!r} has no place in a "
                                 "vector kernel (local.AM or local.SM)")
            n = self.nbuf if in_stage else 1
            offs = tuple(alloc.alloc(f"{self.names[bk]}[{i}]", size) for i in range(n))
            self.space[bk] = (scope.split(".")[1], offs, in_stage)
        for out, i in alias.items():
            self.space[out] = self.space[i]

    # ---- stages ---------------------------------------------------------------------------
    def _emit(self, op: Op, stage: list | None, where: int) -> None:
        """A copy from off-chip into AM inside a stage is its DMA-in (the base class counts only
        SM destinations as inputs: its AM tiles are outputs)."""
        if stage is not None and where == 2 and op.kind == "dma" and op.path.split("->")[1] in ("AM", "SM") \
                and op.path.split("->")[0] in ("DDR", "GSM"):
            where = 0
        super()._emit(op, stage, where)

    def _merge_vpu(self, calls: list, slot: int) -> Op:
        if not all(isinstance(c, Op) for c in calls):
            return super()._merge_vpu(calls, slot)
        if len(calls) == 1:
            return calls[0]
        raise OpcFailure("tir lowering: a stage holds more than one vector nest (one VPU pass per stage)")

    # ---- vector nests -----------------------------------------------------------------------
    def _vec(self, st, E: dict, stage: list | None) -> None:
        nest = _static(self, st)
        ext = [(lp.loop_var, self._ev(lp.extent, E)) for lp in nest.loops]
        shape = tuple(e for _, e in ext)
        g = _grid(ext, E)
        valid = _full(nest.pred(g, None), shape).astype(bool) if nest.pred is not None else np.ones(shape, bool)
        boxes = _boxes(valid)
        if not boxes:
            return
        if len(boxes) > 1 or any(a != 0 for a, _ in boxes[0]):
            raise OpcFailure(f"tir lowering: {nest.name}: the iterations that exist are not one box from 0")
        box = tuple(b for _, b in boxes[0])
        slot = E.get("slot", 0)
        L = self.m.lanes
        mems = [self._mem(nest, a, E, ext, box, slot) for a in nest.accesses]
        outer = tuple(box[:-1]) + (-(-box[-1] // L),)
        body = []
        for ins in nest.code:
            dst = mems[ins.dst[1]] if isinstance(ins.dst, tuple) else ins.dst
            srcs = tuple(mems[s[1]] if isinstance(s, tuple) and s[0] == "mem" else s for s in ins.srcs)
            body.append(vx.VI(ins.op, dst, srcs))
        kern = vx.VKernel((vx.Nest(outer=outer, post=tuple(body)),), nest.name)
        if self.vtamper is not None:
            kern = self.vtamper(kern)
        cost = vx.kernel_cost(self.m, kern)
        fn = (lambda mem, k=kern: vx.execute(mem, k, L)) if self.fn else None
        def tag(bk: int) -> str:  # a buffer outside the stage was written with the first slot's tag
            return self._tag(bk, slot if self._sp(bk)[2] else 0)
        rd = tuple(dict.fromkeys(t for t in (tag(a[0]) for a in nest.accesses[1:]) if t))
        wr = (tag(nest.accesses[0][0]),)
        op = Op("vpu", "vpu", cycles=cost.cycles, reads=rd, writes=wr, cost=cost, nruns=len(kern.nests), fn=fn,
                label=f"{nest.name}: {int(np.prod(box))} elements")
        self._emit(self._intern(op), stage, 1)

    def _mem(self, nest: "_Nest", acc: tuple, E: dict, ext: list, box: tuple, slot: int) -> vx.Mem:
        """The access as a vector operand: base and steps from its flat index at the box's corner
        and one step along each loop (checked affine over the box)."""
        bk, fflat, lvl = acc
        keys = [_key(v) for v, _ in ext]
        at = {**E, **dict.fromkeys(keys, 0)}
        off = int(fflat(at, None))
        strides = []
        for k in keys:
            at[k] = 1
            strides.append(int(fflat(at, None)) - off)
            at[k] = 0
        ck = ("vec", nest.name, bk, box)
        if self.fn or ck not in self._checked:
            self._checked.add(ck)
            g = _grid([(v, n) for (v, _), n in zip(ext, box)], E)
            flat = _full(fflat(g, None), box)
            rebuilt = off + sum(np.arange(n).reshape([-1 if i == d else 1 for i in range(len(box))]) * s
                                for d, (n, s) in enumerate(zip(box, strides)))
            if not np.array_equal(flat, _full(rebuilt, box)):
                raise OpcFailure(f"tir lowering: {nest.name}: the index of {self.names.get(bk)} is not affine")
        space, base = self._base(bk, slot)
        if space[0] != lvl:
            raise OpcFailure(f"tir lowering: {nest.name}: {self.names.get(bk)} is in {space[0]}, not {lvl}")
        lane = strides[-1]
        return vx.Mem(lvl, base + off, tuple(strides[:-1]) + (lane * self.m.lanes,), lane)


class _Nest:
    """What one vector nest lowers to, whatever the enclosing iteration: its loops, predicate,
    accesses (buffer, flat index function, level; the store first) and instructions (with
    ("mem", access) placeholders)."""

    def __init__(self, name: str, loops: list, pred, accesses: list, code: list):
        self.name, self.loops, self.pred, self.accesses, self.code = name, loops, pred, accesses, code


def _static(low: VecLowerer, st) -> _Nest:
    k = ("vec", _key(st))
    if k in low._cache:
        return low._cache[k]
    loops, pred, s = [], None, st
    while True:
        name = type(s).__name__
        if name == "For":
            loops.append(s)
            s = s.body
        elif name == "SBlockRealize":
            if pred is not None:
                raise OpcFailure(f"tir lowering: vector nest over {st.loop_var.name}: nested blocks")
            pred = s.predicate
            s = s.block.body
        elif name == "BufferStore":
            break
        else:
            raise OpcFailure(f"tir lowering: vector nest over {st.loop_var.name} must be loops over one store, "
                             f"found {name}")
    label = f"vector nest over {', '.join(lp.loop_var.name for lp in loops)} ({low.names.get(_bkey(s), '?')})"
    sel = _Select(low, label, s)
    sel.run()
    pf = None if pred is None or (type(pred).__name__ == "IntImm" and int(pred.value)) else low.comp.fn(pred)
    nest = _Nest(label, loops, pf, sel.accesses, sel.code)
    low._cache[k] = nest
    return nest


POOL = "pool"  # an operand register taken from the temporaries (an FMA's per-channel operands)
_ARITH = {"Add": "vadd", "Sub": "vsub", "Mul": "vmul", "Max": "vmax", "Min": "vmin"}
_COMMUTES = {"Add", "Mul", "Max", "Min"}


class _Select:
    """Instruction selection for one stored expression (see the module docstring)."""

    def __init__(self, low: VecLowerer, name: str, store):
        self.low, self.name, self.store = low, name, store
        self.out_shape = low.shapes.get(_bkey(store))
        self.accesses: list[tuple] = []
        self.code: list[vx.VI] = []
        self.live: list[str] = []  # pool temporaries in use
        self.made = 0
        self.fulls = 0

    def fail(self, what: str) -> OpcFailure:
        return OpcFailure(f"tir lowering: {self.name}: {what}")

    def run(self) -> None:
        self.access(self.store, store=True)
        r = self.reg(self.store.value)
        self.code.append(vx.VI("vst", ("mem", 0), (r,)))

    # registers
    def temp(self) -> str:
        names = [f"v{i}" for i in range(self.made + 1)]
        r = next(n for n in names if n not in self.live)
        self.made = max(self.made, int(r[1:]) + 1)
        self.live.append(r)
        return r

    def free(self, r) -> None:
        if r in self.live:
            self.live.remove(r)

    def access(self, e, store: bool = False) -> tuple:
        bk = _bkey(e)
        sp = self.low._sp(bk)
        if sp[0] not in ("AM", "SM"):
            raise self.fail(f"{'writes' if store else 'reads'} {self.low.names.get(bk)} in {sp[0]}: vector "
                            "instructions address AM and SM (cache_read / cache_write it there)")
        if store and sp[0] != "AM":
            raise self.fail("stores go to AM")
        self.accesses.append((bk, self.low.comp.flat_fn(bk, e.indices), sp[0]))
        return ("mem", len(self.accesses) - 1)

    def load(self, e, dst: str) -> str:
        m = self.access(e)
        self.code.append(vx.VI("sld" if self.accesses[m[1]][2] == "SM" else "vld", dst, (m,)))
        return dst

    @staticmethod
    def const(e) -> float | None:
        name = type(e).__name__
        if name in ("FloatImm", "IntImm"):
            return float(e.value)
        if name == "Cast" and type(e.value).__name__ in ("FloatImm", "IntImm"):
            return float(e.value.value)
        return None

    def is_load(self, e) -> bool:
        return type(e).__name__ in ("BufferLoad", "TensorLoad")

    def full(self, e) -> bool:
        return self.low.shapes.get(_bkey(e)) == self.out_shape

    def operand(self, e, role: str | None = None) -> Any:
        """The second operand of a node: an immediate, a load into its role register, or a
        subexpression in a temporary."""
        c = self.const(e)
        if c is not None:
            return c
        if self.is_load(e):
            if self.full(e):
                self.fulls += 1
                return self.load(e, f"f{(self.fulls - 1) % 2}")
            return self.load(e, self.temp() if role == POOL else role or "p")
        return self.reg(e)

    def into(self, src: str) -> str:
        """The destination of a one-instruction node reading `src`: src itself when it is a
        temporary (it dies here), else a new temporary."""
        return src if src in self.live else self.temp()

    def reg(self, e) -> str:
        """Instructions leaving e's value in a register (a temporary) it returns."""
        name = type(e).__name__
        if self.is_load(e):
            return self.load(e, self.temp())
        if name == "Cast":
            if str(e.dtype) != "float32" or str(e.value.dtype) != "float32":
                raise self.fail(f"no conversion {e.value.dtype} -> {e.dtype} on the VPU (fp32 only)")
            return self.reg(e.value)
        if self.const(e) is not None:
            r = self.temp()
            self.code.append(vx.VI("vmov", r, (self.const(e),)))
            return r
        if name == "Call":
            op = e.op.name
            if op in ("tirx.exp", "tirx.log"):
                src = self.reg(e.args[0])
                dst = self.temp()
                self.code += vx.emit_exp(src, dst, "r", "n") if op == "tirx.exp" else vx.emit_log(src, dst, "n")
                self.free(src)
                return dst
            raise self.fail(f"no vector instruction for {op}")
        if name == "Div":
            if self.const(e.a) == 1.0:
                return self.rcp(e.b)
            c = self.const(e.b)
            if c is not None and c != 0.0:
                src = self.reg(e.a)
                dst = self.into(src)
                self.code.append(vx.VI("vmul", dst, (src, 1.0 / c)))
                return dst
            src = self.reg(e.a)
            r = self.rcp(e.b)
            dst = self.into(src)
            self.code.append(vx.VI("vmul", dst, (src, r)))
            self.free(r)
            return dst
        if name not in _ARITH:
            raise self.fail(f"no vector instruction for {name} ({e})")
        a, b = e.a, e.b
        if name in _COMMUTES and self.const(a) is not None:
            a, b = b, a
        if self.const(a) is not None:  # c - x
            if name != "Sub":
                raise self.fail(f"constant expression not folded: {e}")
            src = self.reg(b)
            dst = self.into(src)
            self.code += [vx.VI("vmul", dst, (src, -1.0)), vx.VI("vadd", dst, (dst, self.const(a)))]
            return dst
        if name == "Add" and type(b).__name__ == "Mul" and type(a).__name__ != "Mul":
            a, b = b, a
        if name == "Add" and type(a).__name__ == "Mul" and self.fma(a.b, b):
            src = self.reg(a.a)
            m = self.operand(a.b, POOL)
            c = self.operand(b, POOL)
            dst = self.into(src)
            self.code.append(vx.VI("vfma", dst, (src, m, c)))
            for r in (m, c):
                if isinstance(r, str):
                    self.free(r)
            return dst
        src = self.reg(a)
        y = self.operand(b)
        dst = self.into(src)
        self.code.append(vx.VI(_ARITH[name], dst, (src, y)))
        if isinstance(y, str):
            self.free(y)
        return dst

    def fma(self, m, c) -> bool:
        """a * m + c is one FMA when m and c are both immediates or both per-channel loads."""
        if self.const(m) is not None and self.const(c) is not None:
            return True
        return self.is_load(m) and self.is_load(c) and not self.full(m) and not self.full(c)

    def rcp(self, d) -> str:
        src = self.reg(d)
        dst, scratch = self.temp(), self.temp()
        self.code += vx.emit_rcp(src, dst, scratch)
        self.free(scratch)
        self.free(src)
        return dst
