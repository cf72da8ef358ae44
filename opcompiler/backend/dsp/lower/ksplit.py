"""Lowering of the reduction-split fully connected layer (`split=k`) from its TVM schedule.

The schedule (`schedules/dsp/ksplit.py`) rfactors the matmul's K axis into one partial per
core and annotates the nests; this module walks the lowered TIR per core with the shared
`Lowerer` (copies, register-block micro-kernels) and adds what the split needs:

* `opc.dsp.rr` on the row-block loop: each iteration is one block of the reduction. Its first
  statement (the `opc.dsp.cores` loop over the K parts: this core's slice of A and B, the
  partial product in registers, the partial tile AM -> GSM) runs on every core, then a barrier;
  the rest (the P partial tiles GSM -> AM, the reduction and epilogue, the output AM -> DDR) on
  one core, round robin over the blocks; a barrier frees the GSM partials.
* `opc.dsp.resident` on a copy nest: the copy is issued only when its source or destination
  window differs from the last one this core issued for the nest (the weight slice stays in AM
  across the row blocks: it depends on the output-feature block and the K part only).
* `opc.dsp.op = "mk_red"`: the whole nest is one VPU pass adding the P partial tiles and
  applying the epilogue (`timing.mk_ew`); functional mode executes its blocks over the grid.
* a register block whose reduction range is empty (a K part past the end of K) still runs its
  init block and store: the partial tile is zero (one fill pass: no multiply-adds).
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from opcompiler.errors import OpcFailure
from opcompiler.sim.tir_expr import TIR

from ..timing import EPI_REGS, mk_ew, mk_out, sum_costs
from ..program import Op
from .eval import TirExec, ZeroState, buf_key, as_full, var_key, expr_vars
from .direct import EPI_BLOCKS, REDUCTIONS, Lowerer, blocks_in


def balance_parts(func, k: int, cores: int):
    """The index map of the K parts: part c covers [c*K//P, (c+1)*K//P) (sizes differ by one at
    most, as the FC libraries split a reduction) instead of TVM's split into parts of ceil(K/P)
    with the last one short or empty. Applied to the lowered function: every `kc * ceil(K/P)`
    (the first element of part kc) becomes `kc*K // P`, and every bound `... < K` of an index
    in part kc becomes `... < (kc+1)*K // P`. The buffers of a part keep their ceil(K/P) rows."""
    import tvm_ffi
    from tvm import tirx

    q = -(-k // cores)
    if q * cores == k or q == 1:
        return func  # equal parts already, or parts of one element (the same sizes as TVM's split)
    kc = _cores_var(func.body)

    def mentions(e) -> bool:
        found = []
        tvm_ffi.structural_map(e, (tirx.Var, lambda v: found.append(v.same_as(kc)) or v))
        return any(found)

    def start(e):
        if isinstance(e.b, tirx.IntImm) and int(e.b.value) == q and e.a.same_as(kc):
            dt = "int32"
            return tirx.FloorDiv(tirx.Mul(kc, tirx.const(k, dt)), tirx.const(cores, dt))
        return e

    def bound(e):
        if isinstance(e.b, tirx.IntImm) and int(e.b.value) == k and mentions(e.a):
            dt = "int32"
            nxt = tirx.FloorDiv(tirx.Mul(tirx.Add(kc, tirx.const(1, dt)), tirx.const(k, dt)), tirx.const(cores, dt))
            return tirx.LT(e.a, nxt)
        return e
    return tvm_ffi.structural_map(func, [(tirx.Mul, start), (tirx.LT, bound)])


def _cores_var(st):
    """The loop variable of the loop over the K parts (annotated opc.dsp.cores)."""
    if isinstance(st, TIR.For):
        if "opc.dsp.cores" in st.annotations:
            return st.loop_var
        return _cores_var(st.body)
    if isinstance(st, TIR.SBlockRealize):
        return _cores_var(st.block.body)
    if isinstance(st, TIR.SeqStmt):
        for x in st.seq:
            v = _cores_var(x)
            if v is not None:
                return v
    return None



class KsplitLowerer(Lowerer):
    """Per-core op lists of the rfactored fully connected layer."""

    def __init__(self, m, func, ddr_names: Mapping[str, str], ddr_shapes: Mapping[str, tuple], kv: int,
                 functional: bool):
        super().__init__(m, func, ddr_names, ddr_shapes, kv, False, False, functional)
        self.roles: dict[int, str] = {}
        self._scan_roles(func.body)

    # ---- dependency tags by the role of each on-chip buffer ---------------------------------
    def _scan_roles(self, st) -> None:
        """AM tiles: "p" the partial tile (copied to GSM), "r" the partials read back, "o" the
        output tile (copied to DDR), "w" the rest (weight slice, epilogue vectors)."""
        if isinstance(st, TIR.For):
            if st.annotations.get("opc.dsp.op") in ("dma",):
                _, _, store = self._nest(st)
                val = store.value
                src, dst = self._sp(buf_key(val)), self._sp(buf_key(store))
                if src[0] == "AM" and dst[0] == "GSM":
                    self.roles[buf_key(val)] = "p"
                elif src[0] == "GSM" and dst[0] == "AM":
                    self.roles[buf_key(store)] = "r"
                elif src[0] == "AM" and dst[0] == "DDR":
                    self.roles[buf_key(val)] = "o"
            self._scan_roles(st.body)
        elif isinstance(st, TIR.SBlockRealize):
            self._scan_roles(st.block.body)
        elif isinstance(st, TIR.SeqStmt):
            for x in st.seq:
                self._scan_roles(x)

    def _tag(self, bk: int, slot: int) -> str:
        sp = self._sp(bk)
        if sp[0] == "DDR":
            return "out" if sp[2] else ""
        if sp[0] == "SM":
            return "sm0"
        if sp[0] == "GSM":
            return "g"
        return self.roles.get(bk, "w")

    def _emit(self, op: Op, stage, where: int) -> None:
        """A copy out of the GSM partials waits on them (the shared Lowerer orders GSM reads by
        barriers only)."""
        if op.kind == "dma" and op.path.startswith("GSM->") and not op.reads:
            new = Op(op.kind, op.pipe, cycles=op.cycles, reads=("g",), writes=op.writes, nbytes=op.nbytes,
                     path=op.path, nruns=op.nruns, cost=op.cost, fn=op.fn, label=op.label)
            new.views = op.views
            op = self._intern(new)
        super()._emit(op, stage, where)

    # ---- walking ------------------------------------------------------------------------------
    def core_ops(self, core: int, cores: int, per_image: int = 1) -> list:
        self.core, self.cores, self.per_image = core, cores, per_image
        self.ops, self.pending, self.zeroed = [], [], {}
        self.blk = 0
        self.last: dict[int, tuple] = {}  # resident copy nest -> the windows last issued
        self._walk(self.func.body, {})
        return self.ops

    def _walk(self, st, E: dict, stage: list | None = None) -> None:
        if not isinstance(st, TIR.For):
            return super()._walk(st, E, stage)
        ann = st.annotations
        if "opc.dsp.rr" in ann:
            return self._rr(st, E)
        if ann.get("opc.dsp.op") == "mk_red":
            return self._mk_red(st, E)
        if ann.get("opc.dsp.op") == "mk":
            return self._mk_part(st, E)
        if ann.get("opc.dsp.op") == "dma" and "opc.dsp.resident" in ann:
            return self._resident(st, E)
        return super()._walk(st, E, stage)

    def _rr(self, st, E: dict) -> None:
        lo, ext = self._ev(st.min, E), self._ev(st.extent, E)
        for i in range(lo, lo + ext):
            E2 = {**E, var_key(st.loop_var): i}
            body = st.body
            if isinstance(body, TIR.SBlockRealize):
                if not self._ev(body.predicate, E2):
                    continue
                body = body.block.body
            seq = list(body.seq) if isinstance(body, TIR.SeqStmt) else [body]
            if not isinstance(seq[0], TIR.For) or "opc.dsp.cores" not in seq[0].annotations:
                raise OpcFailure("tir lowering: an opc.dsp.rr block must begin with the loop over the cores")
            self._walk(seq[0], E2)
            self.ops.append(Op("barrier", "sync", label="partials in GSM"))
            if self.blk % self.cores == self.core:
                for x in seq[1:]:
                    self._walk(x, E2)
            self.ops.append(Op("barrier", "sync", label="GSM partials consumed"))
            self.blk += 1

    def _resident(self, st, E: dict) -> None:
        """Issue the copy unless the outer values its window depends on are those of the last
        copy this core issued for the nest (nothing else writes its destination)."""
        sig = self._windows(st, E)
        if self.last.get(var_key(st)) != sig:
            self.last[var_key(st)] = sig
            self._dma(st, E, None)

    def _windows(self, st, E: dict) -> tuple:
        """The values of the outer variables the copy nest's indices and predicate mention."""
        k = ("resident", var_key(st))
        if k not in self._cache:
            loops, pred, store = self._nest(st)
            inner = {var_key(lp.loop_var) for lp in loops}
            vs = expr_vars(pred, set()) | expr_vars(store, set()) | expr_vars(store.value, set())
            for lp in loops:
                vs |= expr_vars(lp.extent, set()) | expr_vars(lp.min, set())
            self._cache[k] = tuple(sorted(vs - inner))
        return tuple(E.get(v) for v in self._cache[k])

    # ---- the partial product: register blocks ------------------------------------------------
    def _mk_part(self, st, E: dict) -> None:
        """Each iteration is one register block: its pixels and reduction steps are the values of
        the pixel loop and of the K loop that the update block's predicate keeps."""
        info = self._mk_static(st)
        kloop = self._k_loop(st)
        lo, ext = self._ev(st.min, E), self._ev(st.extent, E)
        pix, pe = info["pix"], int(info["pix"].extent)
        ke = self._ev(kloop.extent, E)
        calls = []
        for i in range(lo, lo + ext):
            E2 = {**E, var_key(st.loop_var): i}
            g = {**E2, var_key(pix.loop_var): np.arange(pe)}
            npix = int(np.count_nonzero(as_full(self._pred_at(info, g), (pe,)).astype(bool)))
            g = {**E2, var_key(kloop.loop_var): np.arange(ke)}
            steps = int(np.count_nonzero(as_full(self._pred_at(info, g), (ke,)).astype(bool)))
            if npix == 0 or steps == 0:
                continue
            key = ("part", npix, steps)
            if key not in self._costs:
                self._costs[key] = mk_out(self.m, npix, self.kv, steps, info["epi"])
            calls.append(self._costs[key])
        if calls:
            cost = sum_costs([(c, 1) for c in calls])
            f = self._exec_fn(st, E, len(calls))
            self.ops.append(self._intern(Op("vpu", "vpu", cycles=cost.cycles, reads=("sm0", "w"), writes=("p",),
                                            cost=cost, nruns=len(calls), fn=f, label="partial product")))
            return
        # an empty K part: the register blocks only run their init and store (a zero partial tile)
        npix = self._init_pixels(st, E)
        if npix:
            cyc = npix * self.kv  # one vector store per register of the tile
            f = self._exec_fn(st, E, 1)
            self.ops.append(self._intern(Op("fill", "vpu", cycles=cyc, writes=("p",), fn=f,
                                            label="zero partial",
                                            zeros=("AM", npix * self.kv * self.m.lanes, "vector"))))

    def _k_loop(self, st):
        """The reduction loop of the update block (the innermost loop around it)."""
        k = ("kloop", var_key(st))
        if k not in self._cache:
            self._cache[k] = [loops[-1] for x, loops in blocks_in(st) if x.block.name_hint in REDUCTIONS][0]
        return self._cache[k]

    def _init_pixels(self, st, E: dict) -> int:
        """Register-block pixels (over the whole nest) the init block's predicate keeps."""
        k = ("init", var_key(st))
        if k not in self._cache:
            found = [(loops, x) for x, loops in blocks_in(st) if x.block.name_hint.endswith("_init")]
            if not found:
                self._cache[k] = None
            else:
                loops, x = found[0]
                self._cache[k] = (loops[:2], self.comp.fn(x.predicate))
        got = self._cache[k]
        if got is None:
            return 0
        (outer, pix), fp = got
        lo, ext = self._ev(outer.min, E), self._ev(outer.extent, E)
        pe = self._ev(pix.extent, E)
        n = 0
        for i in range(lo, lo + ext):
            g = {**E, var_key(outer.loop_var): i, var_key(pix.loop_var): np.arange(pe)}
            n += int(np.count_nonzero(as_full(fp(ZeroState(g), None), (pe,)).astype(bool)))
        return n

    def _exec_fn(self, st, E: dict, n: int):
        if not self.fn:
            return None

        def f(mem, st=st, E=dict(E), n=n) -> int:
            TirExec(self, mem, 0).run(st, E)
            return n
        return f

    # ---- the reduction of the partials --------------------------------------------------------
    def _mk_red(self, st, E: dict) -> None:
        """One element-wise pass: P partial vectors added per output vector, the epilogue applied."""
        k = ("red", var_key(st))
        if k not in self._cache:
            names = [x.block.name_hint for x, _ in blocks_in(st)]
            preds = [x.predicate for x, _ in blocks_in(st) if x.block.name_hint == "matmul"]  # the K parts' sum
            self._cache[k] = (tuple(EPI_BLOCKS[n] for n in names if n in EPI_BLOCKS),
                              int(st.annotations["opc.dsp.parts"]), self.comp.fn(preds[0]))
        epi, nparts, fpred = self._cache[k]
        pe = self._ev(st.extent, E)
        g = {**E, var_key(st.loop_var): np.arange(pe)}
        rows = int(np.count_nonzero(as_full(fpred(ZeroState(g), None), (pe,)).astype(bool)))
        if rows == 0:
            return
        key = ("red", rows, epi, nparts)
        if key not in self._costs:
            fm = (nparts - 1) + ("bias" in epi)
            self._costs[key] = mk_ew(self.m, rows * self.kv, nparts, fm, int("relu" in epi),
                                     sum(EPI_REGS[e] for e in epi))
        cost = self._costs[key]
        self.ops.append(self._intern(Op("vpu", "vpu", cycles=cost.cycles, reads=("r", "w"), writes=("o",),
                                        cost=cost, nruns=1, fn=self._exec_fn(st, E, 1),
                                        label="reduce partials")))

