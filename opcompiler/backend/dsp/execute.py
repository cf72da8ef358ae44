"""The DSP's functional run: a program's values on the simulated memories.

`execute` runs a lowered program (`program.Program`) on flat DDR / GSM / AM / SM arrays (fresh
on-chip memory holds NaN: a kernel must initialize what it reads), core by core between
barriers, and tallies what it issued (`program.Counters`). A transfer's body copies its views;
a VPU pass's body is the lowering's (a micro-kernel's blocks) or a vector kernel run here by
`execute_pass`:

* `execute_pass` executes a `VKernel`'s instructions opcode by opcode (`program.SEM`): nothing
  here knows which operator a kernel computes. The outer loops of a nest are independent
  iterations, so each instruction is evaluated for all of them at once (numpy over the
  iterations x 32 lanes); the inner loops run one step at a time with their registers carried
  (accumulators). A nest marked `contract` whose body is only loads and multiply-accumulates of
  same-step loads (a GEMM micro-kernel) runs its inner loop at once instead: every load
  gathered over the steps at the addresses it would issue, each accumulator plus the sum of its
  products (float64, rounded once). `EXECUTED` counts the issue slots the execution used, per
  unit, independently of the timing; `OBSERVERS` see every kernel run (the functional clock,
  `fclock`, times them).

No cycles here: the timing model is `timing`, the functional clock `fclock`.
"""
from __future__ import annotations

import sys
from collections import defaultdict
from math import prod
from typing import Any, Callable, Sequence

import numpy as np
from tqdm import tqdm

from ...errors import OpcError, OpcFailure
from .machine import DspMachine
from .program import F32, SEM, Counters, Mem, Nest, Op, Program, VI, View, VKernel, host_bytes, slots, unit


class Memory:
    """The simulated memories: DDR regions by name, one GSM, per-core AM and SM (flat fp32)."""

    def __init__(self, m: DspMachine, ddr: dict[str, np.ndarray], ncores: int):
        self.ddr = ddr
        self.gsm = np.full(m.cap("GSM") // F32, np.nan, np.float32)
        # fresh on-chip memory holds garbage, not zeros: a kernel must initialize what it reads
        self.am = [np.full(m.cap("AM") // F32, np.nan, np.float32) for _ in range(ncores)]
        self.sm = [np.full(m.cap("SM") // F32, np.nan, np.float32) for _ in range(ncores)]
        self.core = 0

    def flat(self, space: tuple) -> np.ndarray:
        lv = space[0]
        if lv == "DDR":
            return self.ddr[space[1]]
        if lv == "GSM":
            return self.gsm
        return (self.am if lv == "AM" else self.sm)[self.core]

    def view(self, v: View) -> np.ndarray:
        arr = self.flat(v.space)
        last = v.offset + sum((s - 1) * st for s, st in zip(v.shape, v.strides)) if v.size else v.offset
        if v.offset < 0 or last >= arr.size:
            raise OpcFailure(f"access outside {v.space[0]}: offset {v.offset}, last {last}, size {arr.size}")
        return np.lib.stride_tricks.as_strided(arr[v.offset:], v.shape, tuple(s * F32 for s in v.strides))


PROGRESS_DELAY_S = 1.0  # a functional run still going after this long shows a progress bar (on a terminal)


def execute(m: DspMachine, prog: Program, inputs: Sequence[np.ndarray],
            record: Callable[[int, Op], None] | None = None) -> tuple[np.ndarray, Counters]:
    """Run the program on real values; cores run phase by phase between barriers (`record`,
    if given, sees every op a core executed and every barrier it reached)."""
    ddr = {name: np.full(int(np.prod(shape)), np.nan, np.float32) for name, shape in prog.ddr_tensors.items()}
    for name, x in zip(prog.inputs, inputs):
        ddr[name][...] = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    for prep in prog.prepare:
        prep(ddr)
    mem = Memory(m, ddr, len(prog.cores))
    counters = Counters()
    pos = [0] * len(prog.cores)
    total = sum(len(ops) for ops in prog.cores)
    # a large kernel takes seconds to minutes to execute (the 4096^3 GEMM's default issues 85,544
    # ops; MiniGo CONV3_RES at batch 768 issues 7,688 that take 18 s): a bar on a terminal once the
    # run has taken PROGRESS_DELAY_S (tqdm's delay), nothing when stderr is not a terminal
    bar = tqdm(total=total, desc="dsp-sim functional", unit="op", leave=False, delay=PROGRESS_DELAY_S,
               disable=None if sys.stderr.isatty() else True, file=sys.stderr)
    try:
        _execute_phases(prog, mem, counters, pos, record, bar)
    finally:
        bar.close()
    host_bytes(prog, counters)
    return ddr[prog.output].reshape(prog.out_shape).copy(), counters


def _execute_phases(prog: Program, mem: Memory, counters: Counters, pos: list[int],
                    record: Callable[[int, Op], None] | None, bar: tqdm) -> None:
    """Every core's ops, core by core up to its next barrier, until all are done."""
    while any(p < len(ops) for p, ops in zip(pos, prog.cores)):
        for c, ops in enumerate(prog.cores):
            mem.core = c
            start = pos[c]
            while pos[c] < len(ops):
                op = ops[pos[c]]
                pos[c] += 1
                if record is not None:
                    record(c, op)
                if op.kind == "barrier":
                    break
                if op.fn is None:
                    raise OpcFailure(f"op {op.kind} {op.label} has no functional body (built for timing only)")
                done = op.execute(mem)  # a VPU pass returns the micro-kernel calls it executed
                counters.add_op(op, 1, done if isinstance(done, int) else None)
            bar.update(pos[c] - start)


# ------------------------------------------------------------------ a vector kernel

EXECUTED: dict[str, int] = defaultdict(int)  # issue slots used by functional execution, per unit
# functional mode: callables shown every VKernel `execute` runs (the functional clock times them)
OBSERVERS: list = []


def _view(mem: Any, op: Mem, outer: tuple[int, ...], idx: tuple[int, ...], width: int) -> np.ndarray:
    no = len(outer)
    if len(op.steps) != no + len(idx):
        raise OpcError(f"operand {op} has {len(op.steps)} steps for a nest of {no}+{len(idx)} loops")
    off = op.base + sum(i * s for i, s in zip(idx, op.steps[no:]))
    return mem.view(View((op.level,), off, tuple(outer) + (width,), tuple(op.steps[:no]) + (op.lane,)))


def _exec(mem: Any, ins: VI, regs: dict, outer: tuple[int, ...], idx: tuple[int, ...], lanes: int) -> None:
    p = prod(outer)
    EXECUTED[unit(ins)] += p * slots(ins)
    if ins.op == "vld":
        regs[ins.dst] = np.array(_view(mem, ins.srcs[0], outer, idx, lanes), np.float32).reshape(p, lanes)
    elif ins.op == "sld":
        v = _view(mem, ins.srcs[0], outer, idx, 1)
        regs[ins.dst] = np.broadcast_to(np.array(v, np.float32).reshape(p, 1), (p, lanes))
    elif ins.op == "vst":
        src = regs[ins.srcs[0]]
        width = ins.lanes or lanes
        dst = _view(mem, ins.dst, outer, idx, width)
        dst[...] = np.broadcast_to(src, (p, lanes))[:, :width].reshape(dst.shape)
    else:
        args = [regs[s] if isinstance(s, str) else s for s in ins.srcs]
        regs[ins.dst] = np.broadcast_to(SEM[ins.op][1](*args), (p, lanes))


def _contraction(n: Nest) -> bool:
    """Whether the body is only loads (each register loaded once) and `vfma acc <- x * y + acc`
    with x, y loaded in the same step, every accumulator distinct, no loaded register read in
    `post` (then the inner loop is a sum over its steps)."""
    loads: set = set()
    accs: list = []
    for ins in n.body:
        if ins.op in ("vld", "sld") and isinstance(ins.dst, str) and ins.dst not in loads:
            loads.add(ins.dst)
        elif ins.op == "vfma" and len(ins.srcs) == 3 and ins.srcs[2] == ins.dst and \
                all(isinstance(x, str) and x in loads for x in ins.srcs[:2]):
            accs.append(ins.dst)
        else:
            return False
    reads_after = {x for ins in n.post for x in ins.srcs if isinstance(x, str)}
    return bool(accs) and len(set(accs)) == len(accs) and not (set(accs) & loads) and not (reads_after & loads)


def _exec_contraction(mem: Any, n: Nest, regs: dict, lanes: int) -> None:
    """The inner loop of a multiply-accumulate body, every step at once: each load gathered over
    all steps (its address advances by its inner steps), each accumulator += the sum over the
    steps of its two operands' product (float64, rounded to fp32 once at the end: the per-step
    fp32 rounding of the chip's FMA chain is not reproduced). The issue slots are counted as
    if stepped."""
    no, ni = len(n.outer), len(n.inner)
    p, steps = prod(n.outer), prod(n.inner)
    loaded: dict[str, np.ndarray] = {}
    for ins in n.body:
        EXECUTED[unit(ins)] += p * steps * slots(ins)
        if ins.op not in ("vld", "sld"):
            continue
        op = ins.srcs[0]
        if len(op.steps) != no + ni:
            raise OpcError(f"operand {op} has {len(op.steps)} steps for a nest of {no}+{ni} loops")
        width = lanes if ins.op == "vld" else 1
        v = mem.view(View((op.level,), op.base, tuple(n.outer) + tuple(n.inner) + (width,),
                          tuple(op.steps) + (op.lane,)))
        loaded[ins.dst] = np.array(v, np.float64).reshape(p, steps, width)
    fmas = [ins for ins in n.body if ins.op == "vfma"]
    xs = list(dict.fromkeys(i.srcs[0] for i in fmas))
    ys = list(dict.fromkeys(i.srcs[1] for i in fmas))
    if len(fmas) == len(xs) * len(ys) and all(loaded[x].shape[2] == 1 for x in xs):
        # scalars x vectors, every pair: one batched matrix product (x: rows, y: columns)
        a = np.stack([loaded[x][:, :, 0] for x in xs], axis=1)  # (p, nx, steps)
        b = np.concatenate([loaded[y] for y in ys], axis=2) if all(loaded[y].shape[2] == lanes for y in ys) else None
        if b is not None:
            prodm = np.matmul(a, b)  # (p, nx, ny * lanes)
            where = {(x, y): (i, j) for i, x in enumerate(xs) for j, y in enumerate(ys)}
            for ins in fmas:
                i, j = where[ins.srcs[:2]]
                acc = np.broadcast_to(regs[ins.dst], (p, lanes)).astype(np.float64)
                regs[ins.dst] = (acc + prodm[:, i, j * lanes:(j + 1) * lanes]).astype(np.float32)
            return
    for ins in fmas:  # the general case, one accumulator at a time
        x, y = loaded[ins.srcs[0]], loaded[ins.srcs[1]]
        acc = np.broadcast_to(regs[ins.dst], (p, lanes)).astype(np.float64)
        regs[ins.dst] = (acc + np.broadcast_to(x * y, (p, steps, lanes)).sum(axis=1)).astype(np.float32)


def execute_pass(mem: Any, k: VKernel, lanes: int) -> int:
    """Run the pass on the simulated memories; returns the number of loop nests executed."""
    for f in OBSERVERS:
        f(k)
    with np.errstate(all="ignore"):  # idle lanes compute on whatever the memory held; never stored
        for n in k.nests:
            if n.count == 0:
                continue
            regs: dict[str, np.ndarray] = {}
            zero = (0,) * len(n.inner)
            for ins in n.pre:
                _exec(mem, ins, regs, n.outer, zero, lanes)
            if n.contract and n.inner and _contraction(n):
                _exec_contraction(mem, n, regs, lanes)
            else:
                for idx in np.ndindex(*n.inner) if n.inner else [()]:
                    for ins in n.body:
                        _exec(mem, ins, regs, n.outer, idx, lanes)
            for ins in n.post:
                _exec(mem, ins, regs, n.outer, zero, lanes)
    return len(k.nests)
