"""Shared by the dsp templates whose work is cut into items the cores share, each item one stage
of the backend's vector / move lowering: pooling, grouped convolution, element-wise chains,
softmax, reductions, slice / pad / transpose / concat.

Each such template cuts its work into items, gives every core a contiguous share of them
(`cores` knob: how many cores take part), and schedules each item as one stage: DMA-in (DDR ->
AM / SM) plus constant fills, one VPU pass, DMA-out; with `dbuf` two buffers alternate and the
next stage's DMA-in is issued before this stage's VPU pass. In timing mode cores with the same
sequence of item keys (`group_key`) are simulated once with a multiplicity.
"""
from __future__ import annotations

from typing import Any, Callable, Hashable, Mapping, Sequence

from opcompiler.backend.dsp.intrin import F32, DspMachine, machine
from opcompiler.ops import get_op
from opcompiler.template_base import Knob, Scheduled
from opcompiler.workload import Workload

from .common import refuse_invalid


def cores_knob(m: DspMachine) -> Knob:
    vals = tuple(v for v in (8, 4, 2, 1) if v <= m.cores)
    if m.cores not in vals:
        vals = (m.cores,) + vals
    return Knob("cores", vals, "cores the items are split over (contiguous shares)")


def share(items: Sequence, ncores: int, total_cores: int) -> list[list]:
    """Contiguous, balanced shares of the items for the first `ncores` cores; the rest idle."""
    k = max(1, min(ncores, total_cores))
    out = [list(items[c * len(items) // k:(c + 1) * len(items) // k]) for c in range(k)]
    return out + [[] for _ in range(total_cores - k)]


def geo_shares(tpl: Any, wl: Workload, target: Any, config: Mapping[str, Any],
               geo: Callable[[DspMachine, Workload, Mapping[str, Any]], Any]) -> tuple[DspMachine, Any, list[list]]:
    """An item-stream template's config, refused (an OpcError) where its check fails, as the
    machine, the geometry `geo(m, wl, config)` and the cores' shares of its items (cores with
    equal item keys time alike)."""
    refuse_invalid(tpl, wl, target, config)
    m = machine(target)
    g = geo(m, wl, config)
    return m, g, share(g.items(), int(config["cores"]), m.cores)


def group_key(items: Sequence, key: Callable[[Any], Hashable]) -> Hashable:
    return tuple(key(it) for it in items)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class RowBlocks:
    """A row op's geometry (`reduce`, `norm`): `m_` rows of `n` elements in blocks of `rows` rows
    (the items: (first row, rows), keyed by their rows), each row padded to `npad`, whole groups
    of `acc` vectors; `nbuf` buffers per tile."""

    def __init__(self, m: DspMachine, nrows: int, n: int, cfg: Mapping[str, Any]):
        self.m_, self.n = nrows, n
        self.L = m.lanes
        self.acc = int(cfg["acc"])
        self.npad = cdiv(self.n, self.L * self.acc) * self.L * self.acc
        self.rows = max(1, min(int(cfg["rows"]), self.m_))
        self.nbuf = 1 + int(cfg["dbuf"])

    def items(self) -> list[tuple[int, int]]:
        return [(r0, min(self.rows, self.m_ - r0)) for r0 in range(0, self.m_, self.rows)]

    @staticmethod
    def key(it: tuple[int, int]) -> int:
        return it[1]

    def am_elems(self) -> int:
        raise NotImplementedError

    def features(self, m: DspMachine, cores: Any, ddr_bytes: float) -> dict[str, float]:
        """The template's features (`item_features`'s, then the lanes the rows use)."""
        return item_features(m, self, self.items(), cores, ddr_bytes, lane_use=self.n / self.npad,
                             vectors_per_row=self.npad / self.L)


def item_features(m: DspMachine, g: Any, items: Sequence, cores: Any, ddr_bytes: float,
                  **more: float) -> dict[str, float]:
    """The features an item-stream template starts with: `ddr_bytes`, the stages (`items`), each
    core's share of them over `cores` cores and the AM the geometry `g` takes; then its own."""
    return {"ddr_bytes": ddr_bytes, "stages": float(len(items)),
            "work_per_core": len(items) / max(1, min(cores, len(items))),
            "am_occupancy": g.am_elems() * F32 / m.cap("AM"), **more}


def row_default(tpl: Any, wl: Workload, target: Any, m: DspMachine, nrows: int, rows: Sequence[int],
                accs: Sequence[int]) -> dict[str, Any]:
    """A row template's default: the largest block of `rows` that still gives every core two
    stages of the `nrows` rows, with the first of `accs` that passes the template's check."""
    for r in sorted(rows, reverse=True):
        if cdiv(nrows, r) < min(2 * m.cores, nrows):
            continue
        for acc in accs:
            cfg = {"rows": r, "acc": acc, "dbuf": 1, "cores": m.cores}
            if tpl.check(wl, target, cfg) is None:
                return cfg
    return {"rows": 1, "acc": 1, "dbuf": 1, "cores": m.cores}


def scheduled(lowering: str, wl: Workload, config: Mapping[str, Any], m: DspMachine, key: tuple,
              module: Callable[[], Any], shares: Sequence[Sequence] | None, item_key: Callable[[Any], Hashable],
              info: Mapping[str, Any], args: Mapping | None = None, cores_used: int | None = None,
              ddr: Mapping[str, tuple] | None = None, **params: Any) -> Scheduled:
    """The Scheduled of an item-stream template: the op's inputs and output in DDR as the catalogue
    gives them (the function's parameters in order, the last one the output, unless `args` names
    them), `cores` cores taking contiguous shares of the items (`shares`, keyed per core by
    `item_key` so cores with equal keys are timed once), double buffering as `dbuf` says. `ddr`:
    the DDR tensors as the kernel views them, when not the catalogue's shapes (inputs, then "out")."""
    op = get_op(wl.op)
    specs = op.inputs(wl)
    if ddr is None:
        ddr = {nm: tuple(s) for nm, s, _ in specs}
        ddr["out"] = tuple(int(v) for v in op.output_spec(wl)[0])
        specs = [(nm, s) for nm, s, _ in specs]
    else:
        ddr = {nm: tuple(s) for nm, s in ddr.items()}
        specs = [(nm, s) for nm, s in ddr.items() if nm != "out"]
    out_shape = ddr["out"]
    if args is None:
        args = {i: nm for i, (nm, _) in enumerate(specs)}
        args[-1] = "out"
    if cores_used is None and shares is not None:
        cores_used = sum(1 for s in shares if s)
    return Scheduled(lowering, key=key, module=module, flops=op.flops(wl), info=dict(info),
                     params={"inputs": tuple((nm, tuple(s)) for nm, s in specs), "ddr": ddr, "out_shape": out_shape,
                             "args": dict(args), "dbuf": bool(config["dbuf"]),
                             "cores": max(1, min(int(config.get("cores", m.cores)), m.cores)),
                             "group_keys": tuple(group_key(shares[c], item_key) for c in range(m.cores))
                             if shares is not None else None,
                             "cores_used": cores_used, **params})
