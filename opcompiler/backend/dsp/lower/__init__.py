"""The DSP's lowering: a dsp template's `Scheduled` -> the cluster `Program` the dsp-sim backend runs.

A dsp template's `apply` returns `opcompiler.template_base.Scheduled`: a lazily built, annotated
TVM schedule of the op's own compute (`module()`, cached here by `key`), the name of the lowering
that walks it, and plain facts in `params` (the DDR tensors and which function parameter reads
which, the layout changes the cores make before / after, how the cores share the work). This
module picks the Lowerer by `lowering`, walks the lowered function once per core, and assembles
the program (relayouts, host work, core groups); the backend decides functional or timing.

    lowering   Lowerer (lower/<module>)       what the schedule is
    direct     direct.Lowerer                 direct convolution / fully connected (split=items)
    gemm       gemm.GemmLowerer               the blocked GEMM
    ksplit     ksplit.KsplitLowerer           fully connected with the reduction split (split=k)
    vector     vector.VecLowerer              element-wise chains, pooling, reductions, softmax
    gconv      gconv.GConvLowerer             grouped / depthwise convolution
    move       move.MoveLowerer               slice, pad, transpose, concat (DMA only)
    attention  attention.AttentionLowerer     flash attention (a TIR nest of stage events)
    gather     gather.GatherLowerer           embedding lookup (index tile to SM, a row DMA per index)
    recurrent  recurrent.RecurrentLowerer     the fused LSTM / GRU cell (a TIR nest of stage events)
    fm         fm.FmLowerer                   fm_interaction (a tile of samples in AM, both field sums per vector)

`params` (all plain data):
  inputs      ((name, shape), ...) of the op's inputs (host copies in copy mode, `Program.inputs`)
  ddr         {name: shape} of every DDR tensor (the inputs, "out", the relayouts' destinations)
  out_shape   the output's shape (DDR tensor "out")
  args        {parameter index or name: DDR name}: which DDR tensor a function parameter is
              (a parameter not named keeps its own name)
  pre, post   ((src, dst, shape, strides, leader_only), ...): DDR -> DDR relayouts by the cores
  cores       the cores that take part (vector / gconv / move: the others idle)
  group_keys  one key per core: cores with equal keys are timed once, with a multiplicity (gemm:
              its Lowerer's own keys)
  k           ksplit: the reduction's length, its parts balanced as c*K//P (`REWRITES`)
  cores_used  the cores with work ("split": the ones the lowering's split loop gives some)
  dbuf, kv, tile_tags, gsm_reread, per_image, replicate, tables: the Lowerer's own facts
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opcompiler.errors import OpcFailure
from opcompiler.target import Target
from opcompiler.template_base import Scheduled

from .assemble import Relayout, assemble, host_ops, nbytes
from ..machine import DspMachine, machine
from ..program import Program
from .gconv import GConvLowerer
from .gemm import GemmLowerer
from .ksplit import KsplitLowerer, balance_parts
from .direct import Lowerer, lowered
from .move import MoveLowerer
from .vector import VecLowerer

_FUNCS: dict[tuple, Any] = {}  # (lowering, key) -> the lowered function: schedule once per process


def lowered_func(sched: Scheduled, target: Target | None = None):
    """The lowered TIR of a scheduled config (cached per process by its key): TVM's passes, then
    the lowering's own rewrite (`REWRITES`)."""
    key = (sched.lowering, sched.key)
    if sched.key and key in _FUNCS:
        return _FUNCS[key]
    if sched.module is None:
        raise OpcFailure(f"dsp lowering {sched.lowering!r}: the Scheduled has no module")
    built = sched.module()
    func = lowered(built[0] if isinstance(built, tuple) else built)
    rewrite = REWRITES.get(sched.lowering)
    if rewrite is not None:
        func = rewrite(func, sched.params, target)
    if sched.key:
        if len(_FUNCS) >= 256:  # a tuning run sees many configs; keep the cache bounded
            _FUNCS.clear()
        _FUNCS[key] = func
    return func


def _ddr_names(func, args: dict) -> dict[str, str]:
    """Function parameter name -> DDR name (`args` by position, negative from the end, or by name;
    a position past the parameters names none)."""
    names = [p.name for p in func.params]
    return {(names[a] if isinstance(a, int) else a): dn for a, dn in args.items()
            if not isinstance(a, int) or -len(names) <= a < len(names)}


def _shares(low: Lowerer, k: int, cores: int) -> Callable[[int], list]:
    return lambda c: low.core_ops(c, k, 1) if c < k else []


def _direct(m: DspMachine, func, p: dict, ddr: dict, names: dict, fn: bool):
    core_names, replicate, prepare = {}, [], []
    wname = p.get("replicate")
    if wname:  # W replicated by the host, one DDR copy per core (seed 004)
        for c in range(m.cores):
            ddr[f"{wname}@core{c}"] = ddr[wname]
        replicate = [(f"W for core {c}", nbytes(ddr[wname])) for c in range(m.cores)]
        prepare = [lambda d, n=m.cores: [d[f"{wname}@core{c}"].__setitem__(Ellipsis, d[wname]) for c in range(n)]]
        core_names = {func.params[1].name: lambda c: f"{wname}@core{c}"}
    low = Lowerer(m, func, names, ddr, p["kv"], bool(p["dbuf"]), bool(p["gsm_reread"]), fn, core_names)
    per_image = p["per_image"]
    return low, (lambda c: low.core_ops(c, m.cores, per_image)), None, replicate, prepare


def _gemm(m: DspMachine, func, p: dict, ddr: dict, names: dict, fn: bool):
    low = GemmLowerer(m, func, names, ddr, bool(p["dbuf"]), fn)
    return low, low.core_ops, low.group_key, [], []


def _ksplit(m: DspMachine, func, p: dict, ddr: dict, names: dict, fn: bool):
    low = KsplitLowerer(m, func, names, ddr, p["kv"], fn)
    return low, (lambda c: low.core_ops(c, m.cores)), None, [], []


def _vector(m: DspMachine, func, p: dict, ddr: dict, names: dict, fn: bool):
    low = VecLowerer(m, func, names, _tir_shapes(func, names), bool(p["dbuf"]), fn, tile_tags=bool(p.get("tile_tags")))
    prepare = []
    if p.get("tables"):  # constants the lowering computed (pooling's divisors), filled by the host
        for nm, v in low.tables.items():
            ddr[nm] = v.shape

            def fill(d, nm=nm, v=v):
                d[nm][...] = v
            prepare.append(fill)
    return low, _shares(low, p["cores"], m.cores), None, [], prepare


def _gconv(m: DspMachine, func, p: dict, ddr: dict, names: dict, fn: bool):
    low = GConvLowerer(m, func, names, _tir_shapes(func, names), bool(p["dbuf"]), fn)
    return low, _shares(low, p["cores"], m.cores), None, [], []


def _move(m: DspMachine, func, p: dict, ddr: dict, names: dict, fn: bool):
    low = MoveLowerer(m, func, names, _tir_shapes(func, names), bool(p["dbuf"]), fn)
    return low, _shares(low, p["cores"], m.cores), None, [], []


def _tir_shapes(func, names: dict) -> dict:
    return {names.get(p.name, p.name): tuple(int(s) for s in p.shape) for p in func.params}


# the K parts of split=k balanced as c*K//P (the module's TVM split makes parts of ceil(K/P));
# the cores are the target's (part of the key: ksplit's schedule has one part per core)
REWRITES: dict[str, Callable] = {"ksplit": lambda f, p, t: balance_parts(f, p["k"], machine(t).cores)}

LOWERINGS: dict[str, Callable] = {"direct": _direct, "gemm": _gemm, "ksplit": _ksplit, "vector": _vector,
                                  "gconv": _gconv, "move": _move}


def _attention(m: DspMachine, func, p: dict, ddr: dict, names: dict, fn: bool):
    from .attention import AttentionLowerer

    low = AttentionLowerer(m, func, p, fn)
    return low, low.core_ops, low.group_key, [], []


LOWERINGS["attention"] = _attention


def _gather(m: DspMachine, func, p: dict, ddr: dict, names: dict, fn: bool):
    from .gather import make

    return make(m, func, p, ddr, names, fn)


LOWERINGS["gather"] = _gather


def _recurrent(m: DspMachine, func, p: dict, ddr: dict, names: dict, fn: bool):
    from .recurrent import RecurrentLowerer

    low = RecurrentLowerer(m, func, p, fn)
    return low, low.core_ops, low.group_key, [], []


LOWERINGS["recurrent"] = _recurrent


def _fm(m: DspMachine, func, p: dict, ddr: dict, names: dict, fn: bool):
    from .fm import make

    return make(m, func, p, ddr, names, fn)


LOWERINGS["fm"] = _fm


def lower(sched: Scheduled, target: Target, functional: bool) -> Program:
    """The cluster program of a scheduled template config (see the module docstring): functional
    (every op executes on the simulated memories) or timing (cores with equal keys once)."""
    if not isinstance(sched, Scheduled):
        raise OpcFailure(f"a dsp template's apply returns a Scheduled, not {type(sched).__name__}")
    make = LOWERINGS.get(sched.lowering)
    if make is None:
        raise OpcFailure(f"dsp-sim has no lowering {sched.lowering!r} (it has {', '.join(LOWERINGS)})")
    m = machine(target)
    p = dict(sched.params)
    func = lowered_func(sched, target)
    ddr = {n: tuple(s) for n, s in p["ddr"].items()}
    names = _ddr_names(func, p.get("args", {}))
    low, core_ops, group_key, replicate, prepare = make(m, func, p, ddr, names, functional)
    if group_key is None:
        keys = tuple(p["group_keys"])
        group_key = keys.__getitem__
    cores_used = p.get("cores_used")
    if cores_used is None or cores_used == "split":  # the cores the lowering's split loop gives work
        k, se = p["cores"], low._split_extent(func.body)
        cores_used = sum(1 for c in range(k) if se is None or (c + 1) * se // k > c * se // k)
    pre = [Relayout(*r) for r in p.get("pre", ())]
    post = [Relayout(*r) for r in p.get("post", ())]
    inputs = [(n, tuple(s)) for n, s in p["inputs"]]
    out_shape = tuple(p["out_shape"])
    hpre, hpost = host_ops(m, [(n, nbytes(s)) for n, s in inputs], [("out", nbytes(out_shape))], replicate)
    return assemble(m, functional=functional, cores=m.cores, core_ops=core_ops, group_key=group_key, pre=pre,
                    post=post, host_pre=hpre, host_post=hpost, ddr_tensors=ddr, inputs=[n for n, _ in inputs],
                    output="out", out_shape=out_shape, prepare=prepare, flops=sched.flops, cores_used=cores_used,
                    info=dict(sched.info))


__all__ = ["LOWERINGS", "lower", "lowered_func"]
