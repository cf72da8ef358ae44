"""The Python entry points behind the CLI: resolve, build, run, verify, report.

Importing this module makes every shipped template available, as the CLI does: the template
registry loads `opcompiler.schedules` on its first lookup (`settings.template_loader`, which the
package installs), whatever a user imported before."""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .backend import Kernel, RunResult, get_backend
from .config import Choice, parse_config
from .errors import OpcFailure
from .ops import default_dtype, get_op, workload
from .target import Target, load_target
from .template import get_template
from .verify import compare
from .workload import Workload


def resolve_config(wl: Workload, target: Target, config: Any) -> Choice:
    """The config `config` means for `wl` on `target`, resolved once (`Backend.resolve`: record,
    inherited or derived default, and which; the template's check): a `Choice` that `build` and
    `Backend.build` take as it is."""
    return get_backend(target).resolve(wl, parse_config(config) if isinstance(config, str) else config)


def build(wl: Workload, target: Target, config: Any = None) -> Kernel:
    backend = get_backend(target)
    return backend.build(wl, backend.resolve(wl, parse_config(config) if isinstance(config, str) else config))


def run_op(op: str, target: str | Target = "cpu", *, shape: str | Mapping[str, Any] | None = None,
           preset: str | None = None, batch: int | None = None, dtype: str | None = None,
           config: Any = None, seed: int = 0, backend: Any = None, verify: bool = True) -> dict[str, Any]:
    """Build `op` for `target`, run it on random inputs, check against numpy, and report
    (`run_workload` of the workload `shape`, `preset`, `batch` and `dtype` make)."""
    tgt = target if isinstance(target, Target) else load_target(target)
    dtype = dtype or default_dtype(op, tgt)
    wl = workload(op, shape, preset=preset, batch=batch, dtype=dtype)
    return run_workload(wl, tgt, config=config, seed=seed, backend=backend, verify=verify)


def run_workload(wl: Workload, target: Target, *, config: Any = None, seed: int = 0, backend: Any = None,
                 verify: bool = True) -> dict[str, Any]:
    """Build `wl` for `target`, run it on random inputs, check against numpy, and report. The
    config is resolved once (`Backend.resolve`: record, inherited or derived default, and which)
    and built as resolved. `backend` overrides the target's own (e.g. an
    `opcompiler.rpc.RpcBackend`). With `verify` False the kernel is only timed
    (`Backend.measure`: a simulator's timing mode, which does not execute it; a device runs it)
    and the report's `correct` is None."""
    d = get_op(wl.op)
    backend = backend or get_backend(target)
    chosen = backend.resolve(wl, parse_config(config) if isinstance(config, str) else config)
    kernel = backend.build(wl, chosen)
    ok = err = None
    if verify:
        inputs = d.make_inputs(wl, seed)
        res: RunResult = backend.run(kernel, inputs)
        if res.outputs is None:
            raise OpcFailure(f"backend {target.name} returned no outputs for {wl.op}")
        ok, err = compare(res.outputs[0], d.reference(wl, inputs))
    else:  # (no inputs made: a measuring device makes its own)
        res = backend.measure(kernel)
    return report(wl, target, kernel, res, ok, err, config_source=chosen.source, flops=d.flops(wl))


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
        kernel = backend.build(swl, backend.resolve(swl, parse_config(config) if isinstance(config, str) else config))
        specs = get_op(step.op).inputs(swl)
        # a step may view its producer's buffer in another shape (matmul (m, n) as NHWC): free in GM
        args = [values[name].reshape(spec[1]) for name, spec in zip(step.inputs, specs)]
        res = backend.run(kernel, args)
        out = values[f"s{i}"] = res.outputs[0]
        steps.append((swl, res))
    shape, _ = get_op(wl.op).output_spec(wl)
    return out.reshape(shape), steps


def report(wl: Workload, target: Target, kernel: Kernel, res: RunResult, correct: bool | None,
           max_abs_err: float | None, *, flops: int, config_source: str = "") -> dict[str, Any]:
    """The run's report; `correct` / `max_abs_err` None when the outputs were not checked; `flops`
    the op's count for `wl`."""
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


__all__ = ["run_op", "run_workload", "build", "parse_config", "resolve_config", "report", "get_template"]
