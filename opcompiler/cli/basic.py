"""`opcompiler ops`, `opcompiler targets`, `opcompiler run`."""
from __future__ import annotations

import argparse

from ..capabilities import capabilities
from ..errors import OpcFailure
from ..ops import PRESETS, default_dtype, op_infos, ordered_params, shape_text, workload
from ..ops.limits import limits_of
from ..target import builtin_targets
from .common import add_workload_args, emit_json, fmt_si, preset_name, shape_label, shape_note


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ops", help="list operators and shape presets")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_ops)
    p = sub.add_parser("targets", help="list targets")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_targets)
    p = sub.add_parser("run", help="build, run, verify and report one operator")
    add_workload_args(p)
    p.add_argument("--dsp-mode", choices=("shared", "copy"), default=None,
                   help="dsp-sim only: operands already in DSP-visible DDR (shared, default) or copied (copy)")
    p.add_argument("--rpc", help="HOST:PORT:KEY of a TVM RPC tracker: run on the device it hands out (cpu, cuda)")
    p.add_argument("--timing-only", action="store_true",
                   help="time the kernel without checking its values (on the simulators it is not executed: "
                        "timing mode only; a 4096^3 GEMM's functional run on dsp-sim takes minutes)")
    p.add_argument("--listing", nargs="?", type=int, const=LISTING_LINES, default=None, metavar="N",
                   help="simulator targets: also print the first N lines (default "
                        f"{LISTING_LINES}) of core 0's program: one instruction a line with its pipe, "
                        "operands, bytes and declared cycles")
    p.set_defaults(func=cmd_run)


LISTING_LINES = 40


def cmd_ops(args: argparse.Namespace) -> int:
    ops = op_infos()  # the TVM-free index (the catalogue itself when the index is stale)
    if args.json:
        emit_json({"ops": [{"name": n, "family": o.family, "summary": o.summary, "dtypes": list(o.dtypes),
                            "defaults": dict(o.defaults), "shape_keys": list(o.keys),
                            "unsupported": [{"family": lim.family, "what": lim.text, "why": lim.why}
                                            for lim in limits_of(n)]} for n, o in sorted(ops.items())],
                   "presets": {k: dict(v) for k, v in PRESETS.items()}})
        return 0
    width = max(len(n) for n in ops)
    for n, o in sorted(ops.items()):
        print(f"{n:<{width}}  {o.summary}  [{', '.join(o.dtypes)}]")
        print(f"{'':<{width}}    --shape " + ",".join(f"{k}={v}" for k, v in o.defaults.items()))
        for lim in limits_of(n):
            print(f"{'':<{width}}    not on {lim.family}: {lim.text} ({lim.why})")
    print("\n--shape keys not given keep the defaults above (or the preset's values with --preset); "
          "a note on stderr names them.")
    print("\npresets (--preset NAME or --shape NAME):")
    for k, v in PRESETS.items():
        print(f"  {k:<26} " + ",".join(f"{a}={b}" for a, b in v.items()))
    return 0


def cmd_targets(args: argparse.Namespace) -> int:
    ts = builtin_targets()
    if args.json:
        emit_json([{"name": t.name, "family": t.family, "aliases": list(t.aliases), "description": t.description,
                    "cores": t.cores, "clock_ghz": t.clock_ghz} for t in ts.values()])
        return 0
    width = max(len(n) for n in ts)
    for t in ts.values():
        alias = f" (alias {', '.join(t.aliases)})" if t.aliases else ""
        print(f"{t.name:<{width}}  [{t.family}] {t.description}{alias}")
    for note in dict.fromkeys(capabilities(t).auto_target_note for t in ts.values()):  # one line per family that has one
        if note:
            print(f"\n{note}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from ..target import load_target
    target = load_target(args.target)
    if args.dsp_mode is not None:
        from dataclasses import replace
        from types import MappingProxyType
        if "data_mode" not in capabilities(target).run_options:
            from ..errors import OpcError
            raise OpcError("only applies to dsp targets", arg="--dsp-mode", value=args.dsp_mode)
        target = replace(target, extra=MappingProxyType({**target.extra, "data_mode": args.dsp_mode}))
    if args.listing is not None and (not target.is_simulator or args.listing < 1):
        from ..errors import OpcError
        raise OpcError("lists a simulator program: a simulator target and N >= 1", arg="--listing",
                       value=args.listing if target.is_simulator else target.name)
    from ..api import run_workload  # (with it every template, and TVM: after the arguments are checked)
    from ..rpc import backend_for_run
    wl = workload(args.op, args.shape, preset=args.preset, batch=args.batch,  # a bad shape fails before the note
                  dtype=args.dtype or default_dtype(args.op, target))
    shape_note(args)
    backend = backend_for_run(target, args.rpc)
    if args.listing is not None:
        from ..api import get_backend
        backend = _KeepKernel(backend or get_backend(target))
    rep = run_workload(wl, target, config=args.config, backend=backend, verify=not args.timing_only)
    if args.listing is not None:
        rep["listing"] = program_listing(backend.kernel, args.listing)
    rep["shape"] = ordered_params(rep["op"], rep["shape"])
    if preset_name(args):
        rep["preset"] = preset_name(args)
    if args.json:
        emit_json(rep)
    else:
        print_report(rep, shape_label(rep["op"], rep["shape"], args))
        if "listing" in rep:
            print("\n" + rep["listing"], end="")
    if rep["correct"] is False:
        raise OpcFailure(f"{rep['op']} on {rep['target']} computed a wrong result (max abs error "
                         f"{rep['max_abs_err']:.3g})")
    return 0


class _KeepKernel:
    """A backend that keeps the kernel it builds (for `--listing`); everything else is the backend's."""

    def __init__(self, backend):
        self._backend, self.kernel = backend, None

    def __getattr__(self, name: str):
        return getattr(self._backend, name)

    def build(self, *args, **kwargs):
        self.kernel = self._backend.build(*args, **kwargs)
        return self.kernel


def program_listing(kernel, lines: int) -> str:
    """The first `lines` lines of core 0's program of a simulator kernel (`SimProgram.listing`)."""
    from ..sim.program import SimProgram
    art = kernel.artifact
    prog = art.get("program") if isinstance(art, dict) else getattr(art, "program", None)
    if not isinstance(prog, SimProgram):
        raise OpcFailure(f"{kernel.target.name} keeps no simulator program to list")
    return prog.listing(limit=lines)


def print_report(rep: dict, shape: str | None = None) -> None:
    """The run report; `shape` as the CLI labels it (the op's key order, the preset's name)."""
    shape = shape or shape_text(rep["op"], rep["shape"], rep.get("preset"))
    print(f"{rep['op']} on {rep['target']}  {rep['dtype']}  {shape}")
    print(f"  template {rep['template']}  config {rep['config']} ({rep['config_source']})")
    if rep["correct"] is None:
        print("  correct: not checked (--timing-only)")
    else:
        print(f"  correct: {'yes' if rep['correct'] else 'NO'} (max abs err {rep['max_abs_err']:.3g})")
    line = f"  time: {rep['seconds'] * 1e3:.4g} ms"
    if "cycles" in rep:
        line += f" ({rep['cycles']:,} cycles)"
    print(line + f"   {fmt_si(rep['flops'] / rep['seconds'] if rep['seconds'] else 0, 'FLOPS')}")
    if "percent_of_peak" in rep:
        roof = f" ({rep['percent_of_roofline']:.1f} % of that roofline)" if "percent_of_roofline" in rep else ""
        print(f"  {rep['percent_of_peak']:.1f} % of peak, bound by {rep.get('bound', '?')}{roof}")
    if rep.get("pipe_ratios"):
        print("  pipe busy: " + "  ".join(f"{k} {v:.2f}" for k, v in rep["pipe_ratios"].items()))
    if rep.get("bytes_by_level"):
        print("  bytes: " + "  ".join(f"{k} {fmt_si(v, 'B')}" for k, v in rep["bytes_by_level"].items()))
