"""The backend interface: build, run (functional: values + time) and measure (time only) one kernel.

A backend is a small interface so the tuner, the CLI, graphs and export treat the CPU, CUDA
and the two simulators alike. Which backend serves a target is the registry's business
(`opcompiler.backend.get_backend`); what a family can do is declared in
`opcompiler.capabilities`. Every `build` resolves its config once, through `Backend.resolve`:
the off-chip check (`check_offchip`: the workload's tensors must fit the target's off-chip
memory), then `opcompiler.config.resolve` (always the template's `check`). `build` takes a spec
or a `Choice` that `resolve` returned, which it does not resolve again.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Sequence

import numpy as np

from ..capabilities import Capabilities, capabilities
from ..config import Choice, ConfigSpec, beyond_machine, resolve
from ..errors import OpcError
from ..target import Target
from ..template_base import Config, Template
from ..workload import Workload


@dataclass(kw_only=True)
class Kernel:
    """A built kernel: what was built (workload, template, config) and the backend's artifact."""

    workload: Workload
    target: Target
    template: str
    template_version: int
    config: dict[str, Any]
    artifact: Any = None  # backend-specific: a tvm Executable, a simulator program, ...
    info: dict[str, Any] = field(default_factory=dict)  # build facts worth reporting (e.g. layout handling)


@dataclass(kw_only=True)
class RunResult:
    """The outcome of one run. `seconds` is wall time on real devices, simulated time on simulators."""

    outputs: list[np.ndarray] | None
    seconds: float
    cycles: int | None = None
    metrics: dict[str, Any] = field(default_factory=dict)  # percent_of_peak, bound, bytes_by_level, pipe_ratios...


class Backend(ABC):
    """One target family's build / run / measure."""

    family: ClassVar[str]

    def __init__(self, target: Target):
        if target.family != self.family:
            raise OpcError(f"backend {type(self).__name__} ({self.family}) cannot serve target {target.name} "
                           f"of family {target.family}")
        self.target = target

    @property
    def capabilities(self) -> Capabilities:
        """What this backend's family can do (declared in `opcompiler.capabilities`)."""
        return capabilities(self.family)

    def template(self, wl: Workload) -> Template:
        """The template that schedules `wl` on this backend's family, from the core's registry (which
        loads the shipped templates on its first lookup: `opcompiler.template`; the backend sits
        below the templates and never imports them)."""
        from ..ops import get_op
        from ..template import get_template
        return get_template(get_op(wl.op).family, self.family)

    def check_offchip(self, wl: Workload) -> None:
        """Refuse, in one line and before anything is scheduled, a workload whose tensors do not fit
        the target's off-chip memory (`opcompiler.config.beyond_machine`)."""
        beyond_machine(wl, self.target)

    def resolve(self, wl: Workload, config: ConfigSpec | Choice) -> Choice:
        """The template, the full checked config and where it came from: the one resolution of a
        build (the off-chip check, then `opcompiler.config.resolve`). A `Choice` this returned
        passes through as it is."""
        if isinstance(config, Choice) and config.resolved:
            return config
        tmpl = self.template(wl)
        self.check_offchip(wl)  # a workload beyond off-chip memory is refused before any tiling is searched
        keep_heap()  # the template's TVM scheduling comes next
        return resolve(tmpl, wl, self.target, config, measured=lambda: self.measured(tmpl, wl))

    def measured(self, tmpl: Template, wl: Workload) -> Config | None:
        """`--config measured`, cuDNN's benchmark mode: the derived default's `MEASURED_TOP` best-
        predicted candidates are timed here (timing mode, tens of milliseconds each on the
        simulators) and the fastest is taken; the derived default where the template has no model."""
        from ..prior import measure_top

        key = (tmpl.name, tmpl.version, wl, self.target.digest)
        if key not in _MEASURED:
            got = measure_top(tmpl, wl, self.target, MEASURED_TOP, self)
            _MEASURED[key] = got[0] if got else None
        return _MEASURED[key]

    def schedule(self, wl: Workload, config: ConfigSpec | Choice) -> tuple[Template, Config, Any]:
        """(template, full config, scheduled IRModule) for the backends that compile through TVM."""
        chosen = self.resolve(wl, config)
        sch = chosen.template.apply(wl, self.target, chosen.config)
        return chosen.template, chosen.config, (sch.mod if hasattr(sch, "mod") else sch)

    @abstractmethod
    def build(self, wl: Workload, config: ConfigSpec | Choice = None) -> Kernel:
        """Schedule `wl` with its template and `config` (default when None; a resolved `Choice` as
        it is) and compile it. Raises OpcError (e.g. CapacityError) for a config that cannot work."""

    @abstractmethod
    def run(self, kernel: Kernel, inputs: Sequence[np.ndarray]) -> RunResult:
        """Execute with real values: outputs plus time (functional mode on simulators)."""

    @abstractmethod
    def measure(self, kernel: Kernel, inputs: Sequence[np.ndarray] | None = None) -> RunResult:
        """Time only, as fast as the backend can (timing mode on simulators; repeated runs on devices)."""


def device_args(wl: Workload, inputs: Sequence[np.ndarray], dev: Any) -> list:
    """Inputs checked against the op's signature and copied to `dev`, plus a zeroed output
    buffer (TVM kernels are destination-passing). A mismatch names expected and got."""
    from ..ops import get_op
    import tvm

    op = get_op(wl.op)
    specs = op.inputs(wl)
    if len(inputs) != len(specs):
        raise OpcError(f"{wl.op} takes {len(specs)} inputs, got {len(inputs)}")
    args = []
    for (name, shape, dt), x in zip(specs, inputs):
        if tuple(x.shape) != tuple(shape) or str(x.dtype) != dt:
            raise OpcError(f"input {name}: expected {dt}{list(shape)}, got {x.dtype}{list(x.shape)}")
        args.append(tvm.runtime.tensor(np.ascontiguousarray(x), dev))
    shape, dt = op.output_spec(wl)
    args.append(tvm.runtime.tensor(np.zeros(shape, dtype=dt), dev))
    return args


MEASURED_TOP = 8  # candidates `--config measured` times
_MEASURED: dict[tuple, Config | None] = {}

_HEAP = {"kept": False}


def keep_heap() -> None:
    """Let glibc keep freed heap memory for TVM's schedule primitives (once per process).

    A split that does not divide its loop, compute_at and reverse_compute_at ask TVM's analyzer
    for proofs its rewrite rules cannot make, and each such proof builds a Z3 context that
    allocates and frees about 8.5 MB. glibc serves a block that large by mmap and unmaps it on
    free, so every proof pays some 2,000 fresh page faults (about 10 ms). Serving blocks up to
    32 MB from the heap and trimming the heap only past 128 MB free lets later proofs reuse
    pages already mapped (a ResNet-50 3x3 conv's Ascend schedule: about 50 -> 30 ms, measured
    with `benchmarks/sim_speed.py`). Results are not affected (allocation only). It changes the
    process's malloc settings: only on glibc, and not at all with OPCOMPILER_KEEP_HEAP=0
    (`settings.keep_heap`)."""
    if _HEAP["kept"]:
        return
    _HEAP["kept"] = True
    import platform

    from ..settings import keep_heap as wanted

    if not wanted() or platform.libc_ver()[0] != "glibc":
        return
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    mallopt(m_mmap_threshold, 32 << 20)
    mallopt(m_trim_threshold, 128 << 20)
