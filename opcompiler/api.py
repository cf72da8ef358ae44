"""The Python entry points behind the CLI: resolve, build, run, verify, report.

Importing this module loads every shipped template (`opcompiler.schedules`), as the CLI does,
so whatever a user imported before, every template is there."""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .backend import Kernel, RunResult, get_backend
from .config import choose, parse_config
from .errors import OpcFailure
from .ops import default_dtype, get_op, workload
from .target import Target, load_target
from .template import get_template
from .verify import compare
from .workload import Workload


def resolve_config(wl: Workload, target: Target, config: Any) -> dict[str, Any] | None:
    """`best` -> the best verified record's knobs (None, the template default, when there is none);
    other specs pass through to the backend's `build`, which resolves and checks them."""
    return choose(wl, target, config).spec


def build(wl: Workload, target: Target, config: Any = None) -> Kernel:
    backend = get_backend(target)
    return backend.build(wl, resolve_config(wl, target, config))


def run_op(op: str, target: str | Target = "cpu", *, shape: str | Mapping[str, Any] | None = None,
           preset: str | None = None, batch: int | None = None, dtype: str | None = None,
           config: Any = None, seed: int = 0, backend: Any = None, verify: bool = True) -> dict[str, Any]:
    """Build `op` for `target`, run it on random inputs, check against numpy, and report.
    `backend` overrides the target's own (e.g. an `opcompiler.rpc.RpcBackend`). With `verify`
    False the kernel is only timed (`Backend.measure`: a simulator's timing mode, which does not
    execute it; a device runs it) and the report's `correct` is None."""
    tgt = target if isinstance(target, Target) else load_target(target)
    wl = workload(op, shape, preset=preset, batch=batch, dtype=dtype or default_dtype(op, tgt))
    d = get_op(op)
    backend = backend or get_backend(tgt)
    chosen = choose(wl, tgt, parse_config(config) if isinstance(config, str) else config)
    kernel = backend.build(wl, chosen.spec)
    if not verify:  # (no inputs made: a measuring device makes its own)
        return report(wl, tgt, kernel, backend.measure(kernel), None, None, config_source=chosen.source)
    inputs = d.make_inputs(wl, seed)
    res: RunResult = backend.run(kernel, inputs)
    ref = d.reference(wl, inputs)
    if res.outputs is None:
        raise OpcFailure(f"backend {tgt.name} returned no outputs for {op}")
    ok, err = compare(res.outputs[0], ref)
    return report(wl, tgt, kernel, res, ok, err, config_source=chosen.source)


def run_unfused(wl: Workload, target: str | Target, inputs: list[np.ndarray], config: Any = None
                ) -> tuple[np.ndarray, list[tuple[Workload, RunResult]]]:
    """Run `wl`'s op-by-op sequence, each op its own kernel with its output in global memory.
    Returns the final output and each step's (workload, result)."""
    tgt = target if isinstance(target, Target) else load_target(target)
    backend = get_backend(tgt)
    values = {f"in{i}": x for i, x in enumerate(inputs)}
    steps = []
    out = None
    for i, step in enumerate(get_op(wl.op).unfused(wl)):
        swl = workload(step.op, dict(step.params), dtype=wl.dtype)
        kernel = backend.build(swl, resolve_config(swl, tgt, config))
        specs = get_op(step.op).inputs(swl)
        # a step may view its producer's buffer in another shape (matmul (m, n) as NHWC): free in GM
        args = [values[name].reshape(spec[1]) for name, spec in zip(step.inputs, specs)]
        res = backend.run(kernel, args)
        out = values[f"s{i}"] = res.outputs[0]
        steps.append((swl, res))
    shape, _ = get_op(wl.op).output_spec(wl)
    return out.reshape(shape), steps


def report(wl: Workload, target: Target, kernel: Kernel, res: RunResult, correct: bool | None,
           max_abs_err: float | None, config_source: str = "") -> dict[str, Any]:
    """The run's report; `correct` / `max_abs_err` None when the outputs were not checked."""
    d = get_op(wl.op)
    flops = d.flops(wl)
    out: dict[str, Any] = {
        "op": wl.op, "target": target.name, "shape": dict(wl.params), "dtype": wl.dtype,
        "template": kernel.template, "config": kernel.config, "config_source": config_source,
        "correct": None if correct is None else bool(correct), "max_abs_err": max_abs_err,
        "seconds": res.seconds, "flops": flops, "gflops": flops / res.seconds / 1e9 if res.seconds > 0 else 0.0,
    }
    if res.cycles is not None:
        out["cycles"] = int(res.cycles)
    out.update(res.metrics)
    out.update({k: v for k, v in kernel.info.items() if k not in out})
    return out


__all__ = ["run_op", "build", "parse_config", "resolve_config", "report", "get_template"]
