"""The FT-M7032 DSP cluster as the simulator sees it, read from the target description.

Nothing here hard-codes a chip: every figure comes from `targets/ft-m7032-dsp-sim.toml` (or a
user's variant, e.g. a 4-core cluster), so a different cluster is a different file.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...errors import OpcError
from ...sim.buffers import Level
from ...sim.clock import Clocked
from ...sim.machine import levels as memory_levels, load, source_target as loaded_from
from ...target import Target

F32 = 4  # bytes of the one element type the VPEs compute in (float32)

LEVELS = ("DDR", "GSM", "AM", "SM")


@dataclass(frozen=True, kw_only=True)
class DspMachine(Clocked):
    """Figures of one cluster (per core unless noted), in cycles and bytes (`cores`, `clock_hz`
    and the clock helpers come from the simulator core's `Clocked`)."""

    name: str
    peak_flops_per_cycle: float  # fp32, per core
    capacity: tuple[tuple[str, int], ...]  # bytes per level (GSM shared by the cluster; AM, SM per core)
    lanes: int  # fp32 elements per vector instruction (VPEs x lanes per VPE)
    registers: int  # vector registers
    fmac_units: int
    fmac_latency: int
    branch_latency: int
    ldst_per_cycle: int  # AM <-> register vector loads/stores per cycle
    sld_per_cycle: int  # SM scalar loads (+ broadcast) per cycle
    vld_latency: int
    sld_latency: int
    valu_per_cycle: int
    valu_latency: int
    dma_bytes_per_cycle: float  # per core DMA engine
    dma_startup: int
    dma_row_cycles: int
    dma_paths: frozenset[str]
    ddr_bytes_per_cycle: float  # shared by the cluster
    gsm_bytes_per_cycle: float  # shared by the cluster
    ddr_latency: int
    gsm_latency: int
    data_mode: str
    launch_cycles: int
    host_copy_bytes_per_cycle: float
    host_copy_overhead_cycles: int
    # host-side replication of W per core (w_path=host_copies): by default it costs what any
    # host copy costs; a target may give it its own rate and per-call cost (extra.host_replicate_gbps,
    # extra.host_replicate_overhead_us; the CONV1 analysis in docs/fidelity.md)
    host_replicate_bytes_per_cycle: float = 0.0  # 0: as host_copy_bytes_per_cycle
    host_replicate_overhead_cycles: int = 0
    levels: tuple[Level, ...] = ()  # DDR, GSM, AM, SM with the target's capacity and alignment

    def cap(self, level: str) -> int:
        return dict(self.capacity)[level]

    def level(self, name: str) -> Level:
        """A memory level as the simulator core sees it (`program.Allocator.of(m.level("AM"))`)."""
        for lv in self.levels:
            if lv.name == name:
                return lv
        raise OpcError(f"dsp target {self.name} has no memory level {name}", expected=", ".join(LEVELS))

    @property
    def peak_flops(self) -> float:
        return self.peak_flops_per_cycle * self.clock_hz


def _f(d, key: str, what: str) -> float:
    try:
        return float(d[key])
    except KeyError:
        raise OpcError(f"dsp target is missing {what}.{key}") from None


def machine(target: Target) -> DspMachine:
    """Read (once per description: the simulator core's loader) the cluster figures of a dsp-family target."""
    return load(target, _read, str(target.extra.get("data_mode", "shared")))


def source_target(m: DspMachine) -> Target | None:
    """The target description machine `m` was read from (None for a machine built elsewhere)."""
    return loaded_from(m)


def _read(target: Target) -> DspMachine:
    if target.family != "dsp":
        raise OpcError(f"target {target.name} is not a dsp target", arg="--target", value=target.name)
    vpe, dma, ex = target.unit("vpe"), target.unit("dma"), target.extra
    clock = target.clock_ghz * 1e9
    mem = {m.name: m for m in target.memories}
    for lv in LEVELS:
        if lv not in mem:
            raise OpcError(f"dsp target {target.name} lacks memory level {lv}", expected=", ".join(LEVELS))
    mode = str(ex.get("data_mode", "shared"))
    if mode not in ("shared", "copy"):
        raise OpcError("unknown data mode", arg="--dsp-mode", value=mode, expected="shared or copy")
    per_cycle = lambda gbps: gbps * 1e9 / clock  # noqa: E731
    return DspMachine(
        name=target.name, cores=target.cores, clock_hz=clock,
        peak_flops_per_cycle=float(target.peak_flops_per_cycle.get("float32", 0.0)),
        capacity=tuple((lv, mem[lv].capacity_bytes) for lv in LEVELS),
        levels=tuple(memory_levels(target, LEVELS).values()),
        lanes=int(_f(vpe, "count", "units.vpe") * _f(vpe, "lanes_fp32", "units.vpe")),
        registers=int(_f(vpe, "registers", "units.vpe")),
        fmac_units=int(_f(vpe, "fmac_units", "units.vpe")),
        fmac_latency=int(_f(vpe, "fmac_latency", "units.vpe")),
        branch_latency=int(vpe.get("branch_latency", 7)),
        ldst_per_cycle=int(_f(vpe, "vector_ldst_per_cycle", "units.vpe")),
        sld_per_cycle=int(_f(vpe, "scalar_loads_per_cycle", "units.vpe")),
        vld_latency=max(1, mem["AM"].latency_cycles), sld_latency=max(1, mem["SM"].latency_cycles),
        valu_per_cycle=int(vpe.get("valu_per_cycle", 1)), valu_latency=int(vpe.get("valu_latency", 2)),
        dma_bytes_per_cycle=_f(dma, "bytes_per_cycle", "units.dma"),
        dma_startup=int(_f(dma, "startup_cycles", "units.dma")),
        dma_row_cycles=int(dma.get("row_cycles", 0)),
        dma_paths=frozenset(dma.get("paths", ())),
        ddr_bytes_per_cycle=per_cycle(mem["DDR"].bandwidth_gbps),
        gsm_bytes_per_cycle=per_cycle(mem["GSM"].bandwidth_gbps),
        ddr_latency=mem["DDR"].latency_cycles, gsm_latency=mem["GSM"].latency_cycles,
        data_mode=mode,
        launch_cycles=int(float(ex.get("launch_overhead_us", 0.0)) * 1e-6 * clock),
        host_copy_bytes_per_cycle=per_cycle(float(ex.get("host_copy_gbps", 1.0))),
        host_copy_overhead_cycles=int(float(ex.get("host_copy_overhead_us", 0.0)) * 1e-6 * clock),
        host_replicate_bytes_per_cycle=per_cycle(float(ex["host_replicate_gbps"])) if "host_replicate_gbps" in ex else 0.0,
        host_replicate_overhead_cycles=int(float(ex.get("host_replicate_overhead_us", 0.0)) * 1e-6 * clock),
    )
