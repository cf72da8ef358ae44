"""dsp-sim template for transpose (permute the axes of a tensor: ShuffleNet's channel shuffle,
NCHW <-> NHWC): pure data movement by strided DMA descriptors.

The permutation is first reduced to its canonical form: unit axes dropped, and axes that stay
neighbours in the same order merged (a channel shuffle 1x2x58x28x28 / 02134 becomes 2x58x784 /
102). The output is written contiguously, tile by tile: a tile is a box of the output (a range
of one output axis times every later output axis), and the input elements it needs are one
strided DMA view of the input (the strides are the input strides of the permuted axes), so
each tile is a single descriptor. The trailing input axes the permutation leaves in place form
contiguous runs (784 elements for the shuffle above); a permutation that moves the innermost
axis leaves runs of one element, which the DMA engine's strided descriptors still gather, at
`row_cycles` per run (the machine's figure): slower per byte, never refused.

Knobs: `path=ddr` issues one DDR -> DDR descriptor per tile (the shared DDR channel carries the
bytes twice, read and write); `path=am` gathers the tile DDR -> AM (strided) and writes it
AM -> DDR (contiguous), with `dbuf` two AM buffers so the next gather is issued before this
tile's write (each core's DMA engine is one in-order queue, so this only changes how the cores'
transfers interleave on the shared DDR channel); `tile` output elements per descriptor; `cores`
the cores the tiles are split over (contiguous shares). No VPU work.

`apply` is the TVM schedule of the op's compute (`move.transpose_schedule`: x and the output
reshaped to the canonical form, the split output axis and the axes before it fused into the
stage loop), lowered by the backend's data-movement lowering (`tir_move`).
"""
from __future__ import annotations

from math import prod
from typing import Any, Mapping

from opcompiler.backend.dsp.intrin import F32, machine
from opcompiler.ops.catalogue import transpose_dims
from opcompiler.target import Target
from opcompiler.template_base import Knob, Scheduled, Template
from opcompiler.workload import Workload

from . import move
from .common import refuse_invalid, require_fp32
from .stream import cores_knob, share

TILES = (256, 1024, 4096, 16384, 65536, 131072)


def canonical(dims: tuple[int, ...], perm: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(input dims, permutation) with unit axes dropped and axes adjacent in both input and
    output (in the same order) merged. The identity becomes ((total,), (0,))."""
    keep = [a for a in range(len(dims)) if dims[a] > 1]
    if not keep:
        return (1,), (0,)
    rank_of = {a: i for i, a in enumerate(keep)}
    d = [dims[a] for a in keep]
    p = [rank_of[a] for a in perm if a in rank_of]
    # merge: output axis i+1 follows output axis i in the input too
    groups: list[list[int]] = []  # in output order, lists of consecutive input axes
    for a in p:
        if groups and groups[-1][-1] + 1 == a:
            groups[-1].append(a)
        else:
            groups.append([a])
    order = sorted(range(len(groups)), key=lambda g: groups[g][0])  # groups in input order
    new_in = tuple(prod(d[a] for a in groups[g]) for g in order)
    pos = {g: i for i, g in enumerate(order)}
    return new_in, tuple(pos[g] for g in range(len(groups)))


class _Geo:
    """The output tiles of a transpose: items (source offset, output offset, count along the
    split axis), and the strided views they move."""

    def __init__(self, wl: Workload, tile: int):
        self.dims, self.perm = transpose_dims(wl)
        self.total = prod(self.dims)
        d, p = canonical(self.dims, self.perm)
        self.cd, self.cp = d, p
        r = len(d)
        istr = [prod(d[a + 1:]) for a in range(r)]
        self.out = tuple(d[a] for a in p)  # output dims (canonical)
        self.sstr = tuple(istr[a] for a in p)  # input stride of each output axis
        # the run the permutation leaves contiguous (elements), for reports
        self.run = d[-1] if p[-1] == r - 1 else 1
        tile = max(1, int(tile))
        # split axis j: a tile covers output axes j+1.. fully and `cnt` indices of axis j
        j = r - 1
        while j > 0 and prod(self.out[j:]) <= tile:
            j -= 1
        inner = prod(self.out[j + 1:])
        self.j = j
        self.cnt = max(1, min(self.out[j], tile // inner))
        self.inner = inner
        self.tile = self.cnt * inner  # elements of a full tile (the buffer size)

    def items(self) -> list[tuple[int, int, int]]:
        j, out, sstr = self.j, self.out, self.sstr
        outer = out[:j]
        ostr = [prod(out[i + 1:]) for i in range(len(out))]
        res = []
        for flat in range(prod(outer)):
            idx, rem = [], flat
            for dd in reversed(outer):
                idx.append(rem % dd)
                rem //= dd
            idx.reverse()
            s_off = sum(i * s for i, s in zip(idx, sstr))
            o_off = sum(i * s for i, s in zip(idx, ostr))
            for s in range(0, out[j], self.cnt):
                n = min(self.cnt, out[j] - s)
                res.append((s_off + s * sstr[j], o_off + s * ostr[j], n))
        return res

    def views(self, it: tuple[int, int, int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The input window of an item: its shape and (strided) input strides."""
        _, _, n = it
        return (n,) + self.out[self.j + 1:], (self.sstr[self.j],) + self.sstr[self.j + 1:]


def _runs(shape: tuple[int, ...], strides: tuple[int, ...]) -> int:
    """Contiguous runs of a DMA descriptor reading the strided window into a contiguous tile: the
    innermost dims contiguous in the source merge."""
    expect = 1
    for d in range(len(shape) - 1, -1, -1):
        if strides[d] != expect:
            return prod(shape[:d + 1])
        expect *= shape[d]
    return 1


class DspTranspose(Template):
    """Transpose by strided DMA (dispatched to by `dsp.elemwise`)."""

    name = "dsp.transpose"
    op_families = ("elemwise",)
    target_family = "dsp"
    version = 1

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        require_fp32(wl, target)
        transpose_dims(wl)
        return [Knob("path", ("ddr", "am"), "one strided DDR -> DDR descriptor per tile, or gathered into AM and "
                     "written out contiguously"),
                Knob("tile", TILES, "output elements per tile (a box: a range of one output axis x the later axes)"),
                Knob("dbuf", (1, 0), "two AM buffers (path=am)"), cores_knob(machine(target))]

    def default(self, wl: Workload, target: Target) -> dict[str, Any]:
        """DDR -> DDR descriptors on every core; the largest tile that still gives each core at
        least two tiles and an even share (the busiest core within 5 % of the mean), else the
        most even; tiles of 1024 elements at least (a descriptor's start-up is 300 cycles)."""
        m = machine(target)
        total = prod(transpose_dims(wl)[0])
        cfg = {"path": "ddr", "tile": TILES[0], "dbuf": 1, "cores": m.cores}
        spread = {}
        for t in sorted((t for t in TILES if t >= 1024), reverse=True):
            items = _Geo(wl, t).items()
            busiest = max(sum(it[2] for it in s) for s in share(items, m.cores, m.cores)) * _Geo(wl, t).inner
            spread[t] = busiest / (total / m.cores)
            if len(items) >= 2 * m.cores and spread[t] <= 1.05:
                return dict(cfg, tile=t)
        return dict(cfg, tile=min(spread, key=lambda t: (round(spread[t], 2), -t)))

    def check(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> str | None:
        m = machine(target)
        if config["path"] == "am":
            g = _Geo(wl, int(config["tile"]))
            need = (1 + int(config["dbuf"])) * g.tile * F32
            if need > m.cap("AM"):
                return f"AM needs {need} B > {m.cap('AM')} B"
        return None

    def features(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> dict[str, float]:
        g = _Geo(wl, int(config["tile"]))
        items = g.items()
        nruns = _runs(*g.views(items[0])) * len(items)
        return {"ddr_bytes": float(2 * g.total * F32), "transfers": float(len(items)), "dma_runs": float(nruns),
                "run_elems": float(g.run), "work_per_core": len(items) / max(1, min(config["cores"], len(items)))}

    def apply(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> Scheduled:
        require_fp32(wl, target)
        refuse_invalid(self, wl, target, config)
        m = machine(target)
        g = _Geo(wl, int(config["tile"]))
        shares = share(g.items(), int(config["cores"]), m.cores)
        staged = config["path"] == "am"
        return move.scheduled(
            wl, target, config, (g.j, g.cnt, staged), staged and bool(config["dbuf"]), shares, lambda it: it[2],
            {"path": config["path"], "canonical": f"{'x'.join(map(str, g.cd))} / {''.join(map(str, g.cp))}",
             "run_elems": g.run, "tiles": sum(len(s) for s in shares)})
