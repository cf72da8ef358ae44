"""dsp-sim templates for row reductions (reduce_sum, reduce_max, reduce_mean over the last axis of (m, n))
and row softmax, both lowered from the TVM schedule of the op's compute (`reduce_tir.py`,
`softmax_tir.py`) by the backend's vector-nest lowering (`backend/dsp/tir_vector.py`).

Rows are independent. A stage is a block of `rows` rows, DMAed DDR -> AM with the row pitch
padded to a multiple of 32 x `acc` (the pad columns hold the reduction's identity, written by
vector stores once per buffer: the DMA never writes them); blocks are split over the cores. Per
row the VPU walks the row's vectors with `acc` independent accumulators (more of them hide the
FMAC / ALU latency of the accumulation chain), combines them, and reduces the 32 lanes by
log2(32) rotate-and-combine steps (the VPEs' shuffle network). reduce_* store one lane per row;
reduce_mean then multiplies the block's row sums by 1/n (one vector pass over them, in place).
Softmax makes three passes over the block: the row max (to an AM scratch), e = exp(x - max)
into the e tile with its running sum (exp is the VPU's Cody-Waite + polynomial sequence) and
1 / sum (reciprocal estimate + Newton steps), and e * (1 / sum) in place; the tile is DMAed
AM -> DDR.
"""
from __future__ import annotations

from typing import Any, Mapping

from opcompiler.backend.dsp.intrin import F32, DspMachine, machine
from opcompiler.errors import OpcError
from opcompiler.target import Target
from opcompiler.template_base import Knob, Scheduled, Template, register_template
from opcompiler.workload import Workload

from .common import capacity_why, refuse_invalid, require_fp32
from .reduce_tir import scheduled
from .softmax_tir import scheduled as softmax_scheduled
from .stream import cdiv, cores_knob, share

ROWS = (1, 2, 4, 8, 16, 32, 64, 128)
ACC = (1, 2, 4, 8)


class _Geo:
    def __init__(self, m: DspMachine, wl: Workload, cfg: Mapping[str, Any]):
        self.m_, self.n = wl["m"], wl["n"]
        self.L = m.lanes
        self.acc = int(cfg["acc"])
        self.npad = cdiv(self.n, self.L * self.acc) * self.L * self.acc
        self.rows = max(1, min(int(cfg["rows"]), self.m_))
        self.nbuf = 1 + int(cfg["dbuf"])
        self.softmax = wl.op == "softmax"
        self.mean = wl.op == "reduce_mean"

    def items(self) -> list[tuple[int, int]]:
        return [(r0, min(self.rows, self.m_ - r0)) for r0 in range(0, self.m_, self.rows)]

    @staticmethod
    def key(it: tuple[int, int]) -> int:
        return it[1]

    def am_elems(self) -> int:
        tile = self.rows * self.npad
        if self.softmax:
            return self.nbuf * 2 * tile + 2 * self.rows * self.L
        return self.nbuf * (tile + (2 if self.mean else 1) * self.rows)  # mean: the sums, then the means


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
        return capacity_why(m, {"AM": g.am_elems() * F32})

    def features(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> dict[str, float]:
        m = machine(target)
        g = _Geo(m, wl, config)
        items = g.items()
        out = g.m_ * g.n if g.softmax else g.m_
        return {"ddr_bytes": float((g.m_ * g.n + out) * F32), "stages": float(len(items)),
                "work_per_core": len(items) / max(1, min(config["cores"], len(items))),
                "am_occupancy": g.am_elems() * F32 / m.cap("AM"), "lane_use": g.n / g.npad,
                "vectors_per_row": g.npad / g.L}

    def apply(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> Scheduled:
        """The TVM schedule of the op's compute (`reduce_tir.py` / `softmax_tir.py`), lowered by
        the DSP backend."""
        self._check_wl(wl, target)
        refuse_invalid(self, wl, target, config)
        m = machine(target)
        g = _Geo(m, wl, config)
        shares = share(g.items(), int(config["cores"]), m.cores)  # cores with equal item keys time alike
        return (softmax_scheduled if g.softmax else scheduled)(wl, target, config, g, shares)


@register_template
class DspReduce(_RowTemplate):
    """reduce_sum / reduce_max / reduce_mean over the last axis on the VPU."""

    name = "dsp.reduce"
    op_families = ("reduce",)
    ops = ("reduce_sum", "reduce_max", "reduce_mean")


@register_template
class DspSoftmax(_RowTemplate):
    """Row softmax on the VPU (max, exp + sum, scale)."""

    name = "dsp.softmax"
    op_families = ("softmax",)
    ops = ("softmax",)
