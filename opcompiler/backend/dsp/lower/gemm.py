"""Lowering of the blocked GEMM (the dsp matmul template's `algo=gemm`) from its TVM schedule.

The schedule (`schedules/dsp/gemm.py`) tiles C[M, N] = A[M, K] @ B[K, N] (+ bias, ReLU) the way
the FT-M7032 GEMM libraries do and annotates the loops; this module walks the lowered TIR per core
with the shared `Lowerer`'s pieces (compiled index expressions, copy windows) and adds:

* `opc.dsp.blocks` on the loop over the C blocks: iteration b runs on core b % cores, in rounds of
  `cores` consecutive blocks (so the cores of a round mostly share their B panel). The C block's
  accumulator tile stays in AM over the whole reduction.
* `opc.dsp.kblock` on the K-block loop; a copy DDR -> `local.GSM` under it is the cluster's: in
  each K step every core DMAs its slice of the rows of every distinct B panel of the round (the
  panel named by the copy's source window), then a barrier publishes them; the GSM buffer is held
  once per panel and twice over (K step t + 2 is written while step t is read).
* `opc.dsp.stage` on the A-stage loop: A rows DDR -> `local.SM`, then one VPU pass.
* `opc.dsp.op = "mk_gemm"` on the register-block loop, with `opc.dsp.ax` naming the loops under it
  (`vb` vector blocks, `ki` reduction steps, `pr` rows, `vl` lanes): the nest becomes vector
  instructions (`program.Nest`): per register block of `pr` rows x `vl / 32` vectors, the
  accumulators loaded from the C tile (set to zero where the init block runs, i.e. the first K
  block), then per reduction step the B vectors (AM), the A scalars (SM, broadcast) and the FMAs,
  then the stores. Addresses are the block's index expressions, affine in the loops (checked).
  Rows, columns and steps past the edges (the block predicate) shorten the nest as tails.
* Element-wise epilogue nests after the K loop (bias, ReLU) are fused into the register blocks of
  the last K block (applied before the store) and their tiles share the accumulator's AM (each
  element is read and written at the same index); the output tile leaves AM -> DDR stage by stage
  of the last K block.
* `opc.dsp.tiles` on the block loop: the on-chip tiles' shapes (rows x pitch) the template lays
  out (TVM's compaction over-approximates the regions of a split that does not divide). A tile
  of more dimensions leads with unit ones (batch_matmul: the batch, one per C block).

The program order is the libraries' software pipeline: B for the next K step into the other AM
buffer while this step computes, B slices for step i + 2 into GSM after this step's first A
stage, the next A stage one stage ahead of the VPU (with `dbuf`), output rows leaving as soon as
their last pass is done.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from opcompiler.errors import OpcFailure
from opcompiler.sim.tir_expr import TIR


from .. import timing as tm
from ..program import VI, Allocator, Mem, Nest, Op, VKernel, compress
from .direct import EPI_BLOCKS, Lowerer
from .eval import buf_key, as_full, loop_grid, var_key, expr_vars


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def register_nests(lanes: int, pw: int, kv: int, rows: int, cols: int, steps: int, first: bool,
                   epi: tuple[str, ...], a, b, c, bias=None) -> tuple[Nest, ...]:
    """The vector nests of one VPU pass over `rows` x `cols` of the C tile for `steps` reduction
    steps, in register blocks of `pw` rows x `kv` vectors (tails for the rest). `a`, `b`, `c`,
    `bias`: functions (row block, vector block, row in the block, vector in the block) ->
    (address, its steps along (row blocks, vector blocks, reduction steps), lane stride), from
    the operands' index expressions."""
    nvec = cdiv(cols, lanes)
    out = []
    rfull, rtail = divmod(rows, pw)
    cfull, ctail = divmod(nvec, kv)
    for nr, pw_, rb in ((rfull, pw, 0), (1 if rtail else 0, rtail, rfull)):
        for nc, kv_, vb in ((cfull, kv, 0), (1 if ctail else 0, ctail, cfull)):
            if not (nr and nc and pw_ and kv_):
                continue
            acc = [[f"c{p}_{v}" for v in range(kv_)] for p in range(pw_)]
            cmem = [[Mem("AM", *c(rb, vb, p, v)) for v in range(kv_)] for p in range(pw_)]
            pre = tuple(VI("vmov", acc[p][v], (0.0,)) if first else VI("vld", acc[p][v], (cmem[p][v],))
                        for p in range(pw_) for v in range(kv_))
            body = tuple(VI("vld", f"b{v}", (Mem("AM", *b(rb, vb, 0, v)),)) for v in range(kv_))
            body += tuple(VI("sld", f"a{p}", (Mem("SM", *a(rb, vb, p, 0)),)) for p in range(pw_))
            body += tuple(VI("vfma", acc[p][v], (f"a{p}", f"b{v}", acc[p][v])) for p in range(pw_) for v in range(kv_))
            post: tuple = ()
            for e in epi:
                if e == "bias":
                    post += tuple(VI("vld", f"bias{v}", (Mem("AM", *bias(rb, vb, 0, v)),)) for v in range(kv_))
                    post += tuple(VI("vadd", acc[p][v], (acc[p][v], f"bias{v}")) for p in range(pw_) for v in range(kv_))
                elif e == "relu":
                    post += tuple(VI("vmax", acc[p][v], (acc[p][v], 0.0)) for p in range(pw_) for v in range(kv_))
                else:
                    raise OpcFailure(f"tir lowering: no fused {e} epilogue in the GEMM register blocks")
            post += tuple(VI("vst", cmem[p][v], (acc[p][v],)) for p in range(pw_) for v in range(kv_))
            out.append(Nest(outer=(nr, nc), inner=(steps,), pre=pre, body=body, post=post, contract=True))
    return tuple(out)


class GemmLowerer(Lowerer):
    """Per-core op lists of the blocked GEMM (see the module docstring)."""

    def __init__(self, m, func, ddr_names: Mapping[str, str], ddr_shapes: Mapping[str, tuple], dbuf: bool,
                 functional: bool):
        super().__init__(m, func, ddr_names, ddr_shapes, 0, dbuf, False, functional)
        self.memo: dict[tuple, Op] = {}  # timing mode: ops of one kind and shape share one object
        self.costs: dict[tuple, tm.MkCost] = {}  # pass shape -> its cycles
        self._block_info()

    # ---- the loop structure ------------------------------------------------------------------
    def _scan(self) -> None:
        """Find the annotated loops, the copy nests and the epilogue nests; give buffers roles."""
        self.loops: dict[str, object] = {}
        self.copies: list = []  # copy nests: (role, loop)
        self.allocs: dict[int, object] = {}
        stores: dict[str, object] = {}

        def visit(st) -> None:
            if isinstance(st, TIR.For):
                ann = st.annotations
                for k in ("opc.dsp.blocks", "opc.dsp.kblock", "opc.dsp.stage"):
                    if k in ann:
                        self.loops[k.split(".")[-1]] = st
                if "opc.dsp.ax" in ann:
                    self.loops[str(ann["opc.dsp.ax"])] = st
                op = ann.get("opc.dsp.op")
                if op == "dma":
                    self.copies.append(st)
                    return
                if op == "mk_gemm":
                    self.loops["mk"] = st
                visit(st.body)
            elif isinstance(st, TIR.SBlockRealize):
                blk = st.block
                for b in blk.alloc_buffers:
                    self.allocs[buf_key(b)] = b
                if blk.name_hint in EPI_BLOCKS or blk.name_hint == "matmul":
                    stores[blk.name_hint] = (st, blk.body)
                visit(blk.body)
            elif isinstance(st, TIR.SeqStmt):
                for x in st.seq:
                    visit(x)
            elif isinstance(st, TIR.IfThenElse):
                visit(st.then_case)
        visit(self.func.body)
        for k in ("blocks", "kblock", "stage", "mk"):
            if k not in self.loops:
                raise OpcFailure(f"tir lowering: the GEMM schedule has no opc.dsp.{k} loop")
        self.mm = stores.get("matmul")
        if self.mm is None:
            raise OpcFailure("tir lowering: the GEMM schedule has no matmul block")
        self.epi_blocks = [(n, stores[n]) for n in EPI_BLOCKS if n in stores]

    def _allocate(self) -> None:
        """The tiles in the order (and at the offsets) of the libraries' layout: the C tile, the B
        tiles and the bias vector in AM, the A stages in SM, two sets of B panels in GSM."""
        self._scan()
        params = {var_key(p): p.name for p in self.func.params}
        w_param = var_key(self.func.params[1])
        bias_param = var_key(self.func.params[2]) if len(self.func.params) == 4 else None
        tiles = {str(k): tuple(int(x) for x in v) for k, v in self.loops["blocks"].annotations["opc.dsp.tiles"].items()}
        role: dict[int, str] = {}
        self.copy_role: dict[int, str] = {}
        for lp in self.copies:
            _, _, store = self._nest(lp)
            src, dst = buf_key(store.value), buf_key(store)
            dscope = "DDR" if dst in params else self.allocs[dst].scope()
            if dscope == "local.SM":
                role[dst], r = "a", "a"
            elif dscope == "local.GSM":
                role[dst], r = "g", "g"
            elif dscope == "local.AM":
                r = "bias" if src == bias_param else "b"
                role[dst] = r
                if r == "b" and src != w_param and self.allocs.get(src) is None:
                    raise OpcFailure("tir lowering: a GEMM B tile must come from B or its GSM panel")
            elif dscope == "DDR":
                r = "c"
            else:
                raise OpcFailure(f"tir lowering: a GEMM copy into {dscope}")
            self.copy_role[var_key(lp)] = r
        roles = set(self.copy_role.values())
        if not {"a", "b", "c"} <= roles:
            raise OpcFailure("tir lowering: the GEMM schedule needs the A, B and output copies")
        _, mm_body = self.mm
        acc = buf_key(self._store(mm_body))
        role[acc] = "acc"
        for _, (_, body) in self.epi_blocks:  # element-wise: in place in the C tile
            role[buf_key(self._store(body))] = "acc"
        nbuf = self.nbuf
        am, sm = Allocator("AM", self.m.cap("AM"), 128), Allocator("SM", self.m.cap("SM"), 8)
        gsm = Allocator("GSM", self.m.cap("GSM"), 64)
        size = {r: int(np.prod(tiles[r])) for r in tiles}
        base = {"acc": (am.alloc("C tile", size["acc"]),)}
        base["b"] = tuple(am.alloc(f"B tile[{i}]", size["b"]) for i in range(nbuf))
        if "bias" in roles:
            base["bias"] = (am.alloc("bias", size["bias"]),)
        base["a"] = tuple(sm.alloc(f"A stage[{i}]", size["a"]) for i in range(nbuf))
        self.gsm_alloc, self.gsm_size = gsm, size.get("b", 0)
        self.role = role
        self.base_of = base
        self.lead: dict[int, int] = {}  # unit dimensions leading a tile (a batch_matmul block's batch)
        for bk, b in self.allocs.items():
            r = role.get(bk)
            if r is None:
                raise OpcFailure(f"tir lowering: buffer {b.name} has no place in the GEMM")
            self.names[bk] = b.name
            tile = tiles["b" if r == "g" else r]
            self.lead[bk] = len(b.shape) - len(tile)
            if self.lead[bk] < 0 or any(int(x) != 1 for x in b.shape[:self.lead[bk]]):
                raise OpcFailure(f"tir lowering: buffer {b.name} {tuple(b.shape)} is not its tile {tile}")
            self.shapes[bk] = (1,) * self.lead[bk] + tile
            self.space[bk] = (r,)

    def _store(self, body):
        """The last store of a block body (after the init `if` the lowering put first)."""
        while isinstance(body, TIR.SeqStmt):
            body = body.seq[-1]
        if not isinstance(body, TIR.BufferStore):
            raise OpcFailure(f"tir lowering: expected a store in the GEMM block, found {type(body).__name__}")
        return body

    def _base(self, bk: int, slot: int) -> tuple[tuple, int]:
        sp = self._sp(bk)
        if sp[0] == "DDR":
            return ("DDR", sp[1]), 0
        r = sp[0]
        if r == "g":
            return ("GSM",), self._gsm_base(slot)
        level = "SM" if r == "a" else "AM"
        offs = self.base_of[r]
        return (level,), offs[slot % len(offs)]

    def _gsm_base(self, slot: int) -> int:
        """GSM panel buffer `slot` (K-step parity x panels + panel; `_block_info` allocates them)."""
        return self.gsm_bases[slot]

    # ---- copy windows --------------------------------------------------------------------------
    def _copy_static(self, lp):
        k = ("copy", var_key(lp))
        if k not in self._cache:
            loops, pred, store = self._nest(lp)
            load = store.value
            if not isinstance(load, TIR.TensorLoad):
                raise OpcFailure(f"tir lowering: a GEMM copy must copy a buffer, found {load}")
            c = self.comp
            self._cache[k] = (loops, c.fn(pred), c.flat_fn(buf_key(store), store.indices),
                              c.flat_fn(buf_key(load), load.indices), buf_key(store), buf_key(load))
        return self._cache[k]

    def _box(self, lp, E: dict, limit: tuple | None = None) -> tuple | None:
        """The copied box of a copy nest at E ((lo, hi) per loop): the predicate along each loop
        from the corner (a product of intervals; checked on the whole grid once per box shape),
        within `limit`: (lo, hi) or None per dimension of the on-chip tile (`_copy_dims` maps the
        loops to them), the part of the tile its consumer or producer touches (TVM's regions of a
        split that does not divide over-approximate it)."""
        loops, fpred, *_ = self._copy_static(lp)
        lo = [0] * len(loops)
        ext = [int(x.extent) for x in loops]
        limit = tuple(limit or ())
        dims = self._copy_dims(lp)
        for d in range(len(loops)):
            lim = limit[dims[d]] if dims[d] < len(limit) else None
            if lim is not None:
                lo[d], ext[d] = max(lo[d], lim[0]), min(ext[d], lim[1])
        box = []
        for d, x in enumerate(loops):
            at = {**E, **{var_key(y.loop_var): lo[i] for i, y in enumerate(loops)}}
            at[var_key(x.loop_var)] = np.arange(lo[d], ext[d])
            ok = as_full(fpred(at, None), (max(0, ext[d] - lo[d]),)).astype(bool)
            n = int(np.count_nonzero(ok))
            if n == 0:
                return None
            if not ok[:n].all():
                raise OpcFailure("tir lowering: a GEMM copy window is not a box")
            box.append((lo[d], lo[d] + n))
        box = tuple(box)
        ck = ("box", var_key(lp), tuple(b - a for a, b in box))
        if ck not in self._checked:
            self._checked.add(ck)
            g = loop_grid([(x.loop_var, e - a) for x, a, e in zip(loops, lo, ext)], E)
            for x, a in zip(loops, lo):
                g[var_key(x.loop_var)] = g[var_key(x.loop_var)] + a
            mask = as_full(fpred(g, None), tuple(e - a for a, e in zip(lo, ext))).astype(bool)
            want = np.zeros_like(mask)
            want[tuple(slice(a - l0, b - l0) for (a, b), l0 in zip(box, lo))] = True
            if not np.array_equal(mask, want):
                raise OpcFailure("tir lowering: a GEMM copy window is not a box")
        return box

    def _copy_dims(self, lp) -> list[int]:
        """Which dimension of the on-chip tile each loop of a copy nest walks (TVM drops the loop
        of a dimension of one element, e.g. the rows of a one-row tile)."""
        k = ("dims", var_key(lp))
        if k not in self._cache:
            loops, _, store = self._nest(lp)
            onchip = store if self._sp(buf_key(store))[0] != "DDR" else store.value
            lead = self.lead.get(buf_key(onchip), 0)  # the tile's dimensions are counted after its unit lead
            dims = []
            for d, x in enumerate(loops):
                at = [i for i, e in enumerate(onchip.indices) if var_key(x.loop_var) in expr_vars(e, set())]
                if not at and int(x.extent) == 1:  # a unit loop the schedule added back (a tile of one
                    dims.append(len(onchip.indices))  # element, e.g. n=1's bias): no dimension, no limit
                    continue
                if len(at) != 1 or at[0] < lead:
                    raise OpcFailure(f"tir lowering: copy loop {x.loop_var.name} must walk one dimension of the tile")
                dims.append(at[0] - lead)
            self._cache[k] = dims
        return self._cache[k]

    def _copy(self, lp, E: dict, reads: tuple, writes: tuple, slots: tuple[int, int], label: str,
              limit: tuple | None = None) -> Op | None:
        """One DMA of the copy nest at E (within `limit`): source / destination tiles at `slots`."""
        loops, _, fdst, fsrc, bdst, bsrc = self._copy_static(lp)
        box = self._box(lp, E, limit)
        if box is None:
            return None
        ext = [(x.loop_var, int(x.extent)) for x in loops]
        sspace, sbase = self._base(bsrc, slots[0])
        dspace, dbase = self._base(bdst, slots[1])
        sv = self._view(var_key(lp), sspace, sbase, fsrc, E, ext, box)
        dv = self._view(var_key(lp), dspace, dbase, fdst, E, ext, box)
        return self._copy_op(bsrc, bdst, sv, dv, reads, writes, label)

    # ---- per block -------------------------------------------------------------------------------
    def _block_info(self) -> None:
        """Per C block: its stages (rows each) and columns (the values the matmul block's
        predicate keeps), its B panel (the source column of its B copy); per K block its steps."""
        L = self.loops
        role = {r: [lp for lp in self.copies if self.copy_role[var_key(lp)] == r] for r in ("a", "b", "g", "bias", "c")}
        self.a_copy, self.b_copy, self.out_copy = role["a"][0], role["b"][0], role["c"][0]
        self.g_copy = role["g"][0] if role["g"] else None
        self.bias_copy = role["bias"][0] if role["bias"] else None
        bsrc = self.g_copy if self.g_copy is not None else self.b_copy
        vb, vk, vs = (var_key(L[k].loop_var) for k in ("blocks", "kblock", "stage"))
        self.vars = (vb, vk, vs)
        nblk, self.nk, nst = int(L["blocks"].extent), int(L["kblock"].extent), int(L["stage"].extent)
        info = self._gemm_static()
        self.cols: list[int] = []
        self.panel: list[int] = []
        self.stages: list[list[tuple[int, int, int]]] = []  # (stage, first row, rows)
        fsrc = self._copy_static(bsrc)[3]
        corner = {var_key(x.loop_var): 0 for x in self._nest(bsrc)[0]}
        for b in range(nblk):
            st, r0 = [], 0
            for s in range(nst):
                rows, cols, _ = self._counts(info, {vb: b, vk: 0, vs: s})
                if rows:
                    st.append((s, r0, rows))
                    r0 += rows
            if not st:
                raise OpcFailure("tir lowering: a GEMM C block with no rows")
            self.stages.append(st)
            self.cols.append(self._counts(info, {vb: b, vk: 0, vs: st[0][0]})[1])
            self.panel.append(int(fsrc({vb: b, vk: 0, vs: 0, **corner}, None)))
        self.shape = [(sum(n for _, _, n in st), c) for st, c in zip(self.stages, self.cols)]
        self.kk = [self._counts(info, {vb: 0, vk: t, vs: self.stages[0][0][0]})[2] for t in range(self.nk)]
        # the K blocks whose passes start from zero: where the reduction's init block runs
        zero = {info["rb"]: 0, **{v: 0 for v, _ in info["ax"].values() if v is not None}}
        self.first = [info["init"] is not None and bool(info["init"]({vb: 0, vk: t, vs: 0, **zero}, None))
                      for t in range(self.nk)]
        cores = self.m.cores
        self.rounds = [list(range(i, min(i + cores, nblk))) for i in range(0, nblk, cores)]
        self.gsm_bases: list[int] = []
        self.npanels = max((len({self.panel[b] for b in r}) for r in self.rounds), default=1)
        if self.g_copy is not None:
            self.gsm_bases = [self.gsm_alloc.alloc(f"B panel[{i}]", self.gsm_size) for i in range(2 * self.npanels)]

    def group_key(self, core: int) -> tuple:
        """What a core's timing depends on: its blocks' shapes round by round and its slices of the
        B panels it brings into GSM."""
        cores = self.m.cores
        return (tuple(self.shape[r[core]] if core < len(r) else None for r in self.rounds),
                tuple((core + 1) * kk // cores - core * kk // cores for kk in sorted(set(self.kk))))

    # ---- the micro-kernel pass -------------------------------------------------------------------
    def _gemm_static(self) -> dict:
        k = ("mk_gemm",)
        if k in self._cache:
            return self._cache[k]
        L = self.loops
        mk = L["mk"]
        rb_var = var_key(mk.loop_var)
        ax = {a: (var_key(L[a].loop_var) if a in L else None, int(L[a].extent) if a in L else 1)
              for a in ("vb", "ki", "pr", "vl")}
        realize, body = self.mm
        store = self._store(body)
        loads = {}

        def find(e) -> None:
            if isinstance(e, TIR.TensorLoad):
                loads[self.role.get(buf_key(e))] = e
                return
            for attr in ("a", "b"):
                if hasattr(e, attr):
                    find(getattr(e, attr))
        find(store.value)
        if "a" not in loads or "b" not in loads:
            raise OpcFailure("tir lowering: the GEMM block must multiply the A stage by the B tile")
        init = body.seq[0] if isinstance(body, TIR.SeqStmt) else None
        c = self.comp
        info = {"rb": rb_var, "ax": ax, "pred": c.fn(realize.predicate),
                "init": c.fn(init.condition) if init is not None and isinstance(init, TIR.IfThenElse) else None,
                "fa": c.flat_fn(buf_key(loads["a"]), loads["a"].indices),
                "fb": c.flat_fn(buf_key(loads["b"]), loads["b"].indices),
                "fc": c.flat_fn(buf_key(store), store.indices), "acc": buf_key(store), "ab": buf_key(loads["a"]),
                "bb": buf_key(loads["b"]), "epi": tuple(EPI_BLOCKS[n] for n, _ in self.epi_blocks)}
        if "bias" in info["epi"]:
            _, (erz, ebody) = next(x for x in self.epi_blocks if x[0] == "matmul_bias")
            est = self._store(ebody)
            bl = [x for x in (est.value.a, est.value.b) if isinstance(x, TIR.TensorLoad)
                  and self.role.get(buf_key(x)) == "bias"]
            if not bl:
                raise OpcFailure("tir lowering: the bias epilogue must read the bias tile")
            info["fbias"] = c.flat_fn(buf_key(bl[0]), bl[0].indices)
            info["bias_b"] = buf_key(bl[0])
            info["facc_epi"] = c.flat_fn(buf_key(est), est.indices)
            # the epilogue's loops: (row, column) over the tile
            info["epi_loops"] = self._epi_loops(erz)
        self._cache[k] = info
        return info

    def _epi_loops(self, realize) -> list:
        """The loop variables of the bias epilogue nest (the loops its block is under)."""
        found = []

        def visit(st, loops) -> bool:
            if isinstance(st, TIR.For):
                return visit(st.body, loops + [st])
            if isinstance(st, TIR.SBlockRealize):
                if st.same_as(realize):
                    found.extend(loops)
                    return True
                return visit(st.block.body, loops)
            if isinstance(st, TIR.SeqStmt):
                return any(visit(x, loops) for x in st.seq)
            return False
        visit(self.loops["blocks"].body, [])
        return [lp for lp in found if "opc.dsp.op" not in lp.annotations][-2:]

    def _counts(self, info, E: dict) -> tuple[int, int, int]:
        """(rows, columns, reduction steps) of the pass at E: the values of the register-block
        loops that the block predicate keeps (a prefix of each)."""
        ax, rb = info["ax"], info["rb"]
        ext_rb = int(self.loops["mk"].extent)

        def count(axes: list[tuple[int | None, int]]) -> int:
            at = dict(E)
            at.update({rb: 0, **{v: 0 for v, _ in ax.values() if v is not None}})
            shape = tuple(e for _, e in axes)
            for d, (v, e) in enumerate(axes):
                if v is not None:
                    at[v] = np.arange(e).reshape([-1 if i == d else 1 for i in range(len(axes))])
            ok = as_full(info["pred"](at, None), shape).astype(bool).ravel()
            n = int(np.count_nonzero(ok))
            if not ok[:n].all():
                raise OpcFailure("tir lowering: the GEMM register blocks' valid region is not a prefix")
            return n
        rows = count([(rb, ext_rb), ax["pr"]])
        cols = count([ax["vb"], ax["vl"]])
        steps = count([ax["ki"]])
        return rows, cols, steps

    def _kernel(self, E: dict, a_slot: int, b_slot: int, last: bool, counts: tuple[int, int, int]) -> VKernel:
        """The pass at E: `counts` are its (rows, columns, steps), as `_counts` finds them."""
        info = self._gemm_static()
        rows, cols, steps = counts
        ax, rb = info["ax"], info["rb"]
        zero = {rb: 0, **{v: 0 for v, _ in ax.values() if v is not None}}
        first = self.first[E[self.vars[1]]]
        L = self.m.lanes
        pw, kv = ax["pr"][1], ax["vl"][1] // L
        names = ("rb", "vb", "pr", "vl", "ki")
        var = {"rb": rb, **{a: ax[a][0] for a in ("vb", "pr", "vl", "ki")}}

        def affine(f, bk: int, slot: int):
            _, base = self._base(bk, slot)
            at0 = {**E, **zero}
            f0 = int(f(at0, None))
            d = {}
            for n in names:
                if var[n] is None:
                    d[n] = 0
                    continue
                at = dict(at0)
                at[var[n]] = 1
                d[n] = int(f(at, None)) - f0
            return base + f0, d
        a0, da = affine(info["fa"], info["ab"], a_slot)
        b0, db = affine(info["fb"], info["bb"], b_slot)
        c0, dc = affine(info["fc"], info["acc"], 0)
        self._check_affine(info, E, zero)

        def a(r, v, p, _w):
            return a0 + r * da["rb"] + v * da["vb"] + p * da["pr"], (da["rb"], da["vb"], da["ki"]), 0

        def b(r, v, _p, w):
            return b0 + r * db["rb"] + v * db["vb"] + w * L * db["vl"], (db["rb"], db["vb"], db["ki"]), db["vl"]

        def c(r, v, p, w):
            return c0 + r * dc["rb"] + v * dc["vb"] + p * dc["pr"] + w * L * dc["vl"], (dc["rb"], dc["vb"], 0), dc["vl"]
        bias = None
        epi = info["epi"] if last else ()
        if "bias" in epi:
            bias = self._bias_affine(info, E, zero, c0, dc)
        nests = register_nests(L, pw, kv, rows, cols, steps, first, epi, a, b, c, bias)
        return VKernel(nests, f"gemm {rows}x{cols}x{steps}")

    def _bias_affine(self, info, E: dict, zero: dict, c0: int, dc: dict):
        """The bias vector's address for a C element: the epilogue nest's bias index at the
        epilogue iteration that reads that element of the tile."""
        loops = info["epi_loops"]
        if len(loops) > 2:
            raise OpcFailure("tir lowering: the bias epilogue must be a (row, column) nest")
        at = {**E, **{var_key(x.loop_var): 0 for x in loops}}
        b0 = int(info["fbias"](at, None))
        # TVM drops the row loop of a one-row tile and the column loop of a one-column tile (n=1):
        # the loop the bias index moves with is the column loop, the other the row loop
        vc = vr = None
        for x in loops:
            if int(info["fbias"]({**at, var_key(x.loop_var): 1}, None)) != b0:
                vc = var_key(x.loop_var) if vc is None else None
            else:
                vr = var_key(x.loop_var) if vr is None else None
        if len(loops) != (vc is not None) + (vr is not None):
            raise OpcFailure("tir lowering: the bias epilogue must be a (row, column) nest")
        e0 = int(info["facc_epi"](at, None))
        de_row = int(info["facc_epi"]({**at, vr: 1}, None)) - e0 if vr is not None else 1 << 40
        de = int(info["facc_epi"]({**at, vc: 1}, None)) - e0 if vc is not None else 1
        db = int(info["fbias"]({**at, vc: 1}, None)) - b0 if vc is not None else 0  # one column: one bias value
        _, base = self._base(info["bias_b"], 0)
        acc_base = self._base(info["acc"], 0)[1]
        L = self.m.lanes

        def bias(r, v, _p, w):
            x = c0 - acc_base + r * dc["rb"] + v * dc["vb"] + w * L * dc["vl"]  # the C element's offset in the tile
            col = (x - e0) % de_row // de  # the epilogue iteration's column that reads it
            return base + b0 + col * db, (0, dc["vb"] // de * db, 0), dc["vl"] // de * db
        return bias

    def _check_affine(self, info, E: dict, zero: dict) -> None:
        """The operands' index expressions are affine over the register-block loops (checked on
        the first pass: the loops' extents and the expressions are the same for every pass, and
        functional mode's values against numpy catch an address that moves otherwise)."""
        ck = ("mk_affine",)
        if ck in self._checked:
            return
        self._checked.add(ck)
        ax, rb = info["ax"], info["rb"]
        loops = [(rb, int(self.loops["mk"].extent))] + [(v, e) for v, e in ax.values() if v is not None]
        g = dict(E)
        n = len(loops)
        for d, (v, e) in enumerate(loops):
            g[v] = np.arange(e).reshape([-1 if i == d else 1 for i in range(n)])
        shape = tuple(e for _, e in loops)
        for f in (info["fa"], info["fb"], info["fc"]):
            full = as_full(f(g, None), shape)
            at0 = {**E, **zero}
            f0 = int(f(at0, None))
            rebuilt = np.full(shape, f0)
            for d, (v, e) in enumerate(loops):
                step = int(f({**at0, v: 1}, None)) - f0 if e > 1 else 0
                rebuilt = rebuilt + np.arange(e).reshape([-1 if i == d else 1 for i in range(n)]) * step
            if not np.array_equal(full, rebuilt):
                raise OpcFailure("tir lowering: a GEMM operand index is not affine in the register blocks")

    # ---- one core's program --------------------------------------------------------------------
    def _op(self, key: tuple, make) -> Op | None:
        if self.fn:
            return make()
        if key not in self.memo:
            self.memo[key] = make()
        return self.memo[key]

    def core_ops(self, core: int) -> list:
        cores, nbuf = self.m.cores, self.nbuf
        vb, vk, vs = self.vars
        gsm_mode = self.g_copy is not None
        steps = [(r, t) for r in range(len(self.rounds)) for t in range(self.nk)]
        out: list[tuple] = []

        def mine(r: int) -> int | None:
            rnd = self.rounds[r]
            return rnd[core] if core < len(rnd) else None

        def panels(r: int) -> list[int]:
            return sorted({self.panel[b] for b in self.rounds[r]})

        def a_dma(r: int, t: int, s: int, ns: int, slot: int) -> Op:
            b = mine(r)
            return self._op(("a", slot, ns, self.kk[t]), lambda: self._copy(
                self.a_copy, {vb: b, vk: t, vs: s}, (), (f"a{slot}",), (0, slot), "A stage DDR->SM", ((0, ns),)))

        def b_to_gsm(i: int) -> list[Op]:
            if not gsm_mode:
                return []
            r, t = steps[i]
            kk = self.kk[t]
            lo, hi = core * kk // cores, (core + 1) * kk // cores
            ops = []
            for p, src in enumerate(panels(r)):
                if hi <= lo:
                    continue
                b = next(x for x in self.rounds[r] if self.panel[x] == src)
                op = self._op(("bg", i % 2, p, hi - lo, self.shape[b][1]), lambda b=b, p=p: self._copy(
                    self.g_copy, {vb: b, vk: t, vs: 0}, (), (f"g{i % 2}",), (0, (i % 2) * self.npanels + p),
                    "B slice DDR->GSM", ((lo, hi), (0, self.cols[b]))))
                if op is not None:
                    ops.append(op)
            return ops

        def b_to_am(i: int) -> list[Op]:
            r, t = steps[i]
            b = mine(r)
            if b is None:
                return []
            slot, nv = i % nbuf, self.shape[b][1]
            if gsm_mode:
                p = panels(r).index(self.panel[b])
                return [self._op(("ba", slot, i % 2, p, self.kk[t], nv), lambda: self._copy(
                    self.b_copy, {vb: b, vk: t, vs: 0}, (f"g{i % 2}",), (f"b{slot}",), ((i % 2) * self.npanels + p, slot),
                    "B block GSM->AM", (None, (0, nv))))]
            return [self._op(("bd", slot, self.kk[t], nv), lambda: self._copy(
                self.b_copy, {vb: b, vk: t, vs: 0}, (), (f"b{slot}",), (0, slot), "B block DDR->AM", (None, (0, nv))))]

        def bias_dma(r: int) -> list[Op]:
            b = mine(r)
            if self.bias_copy is None or b is None:
                return []
            return [self._op(("bias", self.shape[b][1]), lambda: self._copy(
                self.bias_copy, {vb: b, vk: 0, vs: 0}, (), ("bias",), (0, 0), "bias -> AM", ((0, self.cols[b]),)))]

        def c_out(r: int, s0: int, ns: int) -> Op:
            b = mine(r)
            return self._op(("c", s0, ns, self.shape[b][1]), lambda: self._copy(
                self.out_copy, {vb: b, vk: 0, vs: 0}, (f"c{s0}",), ("out",), (0, 0), "C rows AM->DDR",
                ((s0, s0 + ns), (0, self.cols[b]))))

        def vpu(i: int, s: int, s0: int, ns: int, slot: int) -> Op:
            r, t = steps[i]
            b = mine(r)
            last = t == self.nk - 1
            bslot = i % nbuf
            reads = (f"a{slot}", f"b{bslot}") + (("bias",) if last and self.bias_copy is not None else ())

            def make():
                k = self._kernel({vb: b, vk: t, vs: s}, slot, bslot, last, (ns, self.cols[b], self.kk[t]))
                ck = (ns, self.cols[b], self.kk[t], self.first[t], last)  # the cost does not depend on addresses
                if ck not in self.costs:
                    self.costs[ck] = tm.kernel_cost(self.m, k)
                return self._vpu_op(k, reads, (f"c{s0}",), k.label, self.costs[ck])
            return self._op(("v", slot, bslot, s0, ns, self.shape[b][1], self.kk[t], self.first[t], last), make)

        # A stages in issue order, with their SM buffers
        pending_a = [(r, t, s, s0, ns) for r, t in steps if mine(r) is not None
                     for s, s0, ns in self.stages[mine(r)]]
        a_slot = {st: i % nbuf for i, st in enumerate(pending_a)}
        a_iter = iter(pending_a)
        nxt = [next(a_iter, None)]

        def issue_a() -> list[Op]:
            st = nxt[0]
            if st is None:
                return []
            nxt[0] = next(a_iter, None)
            r, t, s, _, ns = st
            return [a_dma(r, t, s, ns, a_slot[st])]

        n = len(steps)
        head: list[Op] = []
        if gsm_mode:
            head += b_to_gsm(0)
            head.append(Op("barrier", "sync", label="B K-block 0 in GSM"))
        head += bias_dma(steps[0][0]) + b_to_am(0)
        if gsm_mode and n > 1:
            head += b_to_gsm(1)
        if self.dbuf:
            head += issue_a()  # the first A stage; later ones go one stage ahead of the VPU
        if gsm_mode:
            head.append(Op("barrier", "sync", label="B K-block 1 in GSM"))
        out.append(tuple(head))
        for i, (r, t) in enumerate(steps):
            ops: list[Op] = []
            if i + 1 < n and self.dbuf:
                ops += b_to_am(i + 1)  # next K block's B into the other AM buffer, during this one
            # K step i+2's B slice goes into the GSM buffer every core finished reading before the
            # last barrier; issued after this step's first stage, so the DMA queue first fetches
            # what the VPU needs next
            to_gsm = b_to_gsm(i + 2) if gsm_mode and i + 2 < n else []
            b = mine(r)
            for j, (s, s0, ns) in enumerate(self.stages[b] if b is not None else []):
                ops += issue_a()  # dbuf: the next stage's A (other SM buffer); else this stage's
                ops.append(vpu(i, s, s0, ns, a_slot[(r, t, s, s0, ns)]))
                if t == self.nk - 1:
                    ops.append(c_out(r, s0, ns))  # final rows leave while the next stage computes
                if j == 0:
                    ops += to_gsm
                    to_gsm = []
            ops += to_gsm  # (a core without a block this round)
            if i + 1 < n:
                if not self.dbuf:
                    ops += b_to_am(i + 1)
                if steps[i + 1][1] == 0:
                    ops += bias_dma(steps[i + 1][0])  # after the last reads of this block's bias
                if gsm_mode:
                    ops.append(Op("barrier", "sync", label="B K-block in GSM"))
            out.append(tuple(ops))
        if self.fn:
            return [op for blk in out for op in blk]
        return compress(out, (2, 1))
