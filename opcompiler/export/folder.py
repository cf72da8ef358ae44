"""Write an export folder: compiled kernel (or simulator program), manifest, bindings.

    >>> from opcompiler.export import export
    >>> m = export(wl, load_target("cpu"), "best", to=("torch", "onnx"), out="out/conv")

Every export is verified before it is written out as done: the folder's own loader runs the
kernel on random inputs and the result is compared with the op's numpy reference.
"""
from __future__ import annotations

import hashlib
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from .. import records
from ..backend import Kernel, capabilities, get_backend
from ..config import choose
from ..errors import OpcError, OpcFailure
from ..ops import get_op
from ..target import Target
from ..template import get_template
from ..verify import compare
from ..workload import Workload
from .manifest import build_manifest, default_name, write_manifest
from .runtime import MANIFEST, load, read_manifest

BINDINGS = ("lib", "torch", "onnx")
_HERE = Path(__file__).resolve().parent
# Static modules copied into the folder under these names (they import each other relatively).
_COPIED = {"lib": {"runtime.py": "opc_runtime.py"},
           "torch": {"torch_binding.py": "opc_torch.py"},
           "onnx": {"onnx_runner.py": "opc_onnx.py"}}


@dataclass(frozen=True, kw_only=True)
class ResolvedConfig:
    """The knobs to build with and where they came from (for the manifest)."""

    config: dict[str, Any] | str | None  # knobs, a name the template knows ("paper"), or None (default)
    source: str
    record: dict[str, Any] | None = None


def parse_bindings(to: str | Sequence[str]) -> tuple[str, ...]:
    """`torch`, `onnx,torch` or a sequence -> validated names; `lib` is always included."""
    items = [t.strip() for t in (to.split(",") if isinstance(to, str) else to) if t.strip()]
    if not items:
        raise OpcError("no binding given", arg="--to", value=to, expected="torch, onnx or lib (comma-separated)")
    for t in items:
        if t not in BINDINGS:
            raise OpcError("unknown binding", arg="--to", value=t, expected="torch, onnx or lib (comma-separated)")
    return tuple(b for b in BINDINGS if b in items or b == "lib")


def resolve(wl: Workload, target: Target, config: Any) -> ResolvedConfig:
    """`best` -> the best verified record's config (template default when none); a name or knobs
    pass through to the backend's build, which checks them (`opcompiler.config`)."""
    c = choose(wl, target, config)
    rec = c.record
    record = None if rec is None else {"cycles": rec.cycles, "seconds": rec.seconds, "verified": rec.verified,
                                       "tuner": rec.tuner, "timestamp": rec.timestamp, "metrics": dict(rec.metrics)}
    return ResolvedConfig(config=c.spec, source=c.source, record=record)


def record_key(wl: Workload, target: Target, kernel: Kernel) -> dict[str, Any]:
    """The key the kernel's tuning records have (`opcompiler.records.record_key`)."""
    return records.record_key(wl, target, kernel.template, kernel.template_version)


def _check_out(out: Path) -> None:
    """Refuse a file, or a non-empty folder that is not an earlier export (checked before building)."""
    if out.exists() and not out.is_dir():
        raise OpcError("exists and is not a folder", arg="--out", value=str(out), expected="a new or empty folder")
    if out.is_dir() and any(out.iterdir()) and not (out / MANIFEST).is_file():
        raise OpcError("is a non-empty folder that is not an opcompiler export; refusing to write into it",
                       arg="--out", value=str(out), expected="a new or empty folder, or an earlier export")


def _prepare_out(out: Path) -> None:
    """Create `out`; in an earlier export, remove what it wrote (and nothing else)."""
    _check_out(out)
    if (out / MANIFEST).is_file():
        for p in out.iterdir():
            if p.name in ("__pycache__", "program") and p.is_dir():
                shutil.rmtree(p)
            elif p.is_file() and (p.suffix in (".so", ".py", ".json", ".onnx", ".toml", ".cu", ".txt")):
                p.unlink()
    out.mkdir(parents=True, exist_ok=True)


def _lowered_script(wl: Workload, target: Target, kernel: Kernel) -> str:
    """The scheduled TIR of a TVM-built kernel as TVMScript, for reading."""
    tmpl = get_template(get_op(wl.op).family, target.family)
    sch = tmpl.apply(wl, target, dict(kernel.config))
    mod = sch.mod if hasattr(sch, "mod") else sch
    return mod.script() if hasattr(mod, "script") else repr(mod)


def program_listing(kernel: Kernel, limit: int = 20000) -> str:
    """The simulator program the backend built, for reading: each core's (or core group's)
    listing, at most `limit` lines each (`opcompiler.sim.program.SimProgram.listing`)."""
    from ..sim.program import SimProgram
    art = kernel.artifact
    prog = art.get("program") if isinstance(art, dict) else getattr(art, "program", art)
    if not isinstance(prog, SimProgram):
        return repr(prog)[:limit] + "\n"
    head = f"# {kernel.template} v{kernel.template_version} on {kernel.target.name}, config {kernel.config}\n"
    return head + "".join(prog.listing(limit, core=c) for c in range(len(prog.streams())))


def _write_artifact(out: Path, wl: Workload, target: Target, kernel: Kernel) -> dict[str, Any]:
    art = kernel.artifact
    if target.is_simulator:
        prog = out / "program"
        prog.mkdir(exist_ok=True)
        shutil.copyfile(target.path, prog / "target.toml")
        (prog / "program.txt").write_text(program_listing(kernel))
        return {"kind": "simulator-program", "target_file": "program/target.toml",
                "listing": "program/program.txt",
                "how": ("the saved workload, config and target description are rebuilt through "
                        f"opcompiler's {target.family} simulator backend at load time (the same "
                        "template and config emit the same instruction program, listed in "
                        "program/program.txt) and run functionally: values plus simulated cycles; "
                        "needs opcompiler installed")}
    script = _lowered_script(wl, target, kernel)
    if not hasattr(art, "export_library"):
        raise OpcError(f"the {target.family} backend's kernels cannot be exported as a library",
                       arg="--target", value=target.name)
    tmp = out / "kernel.tmp.so"
    art.export_library(str(tmp))
    # Named by content: a process that loaded an earlier export of this folder has that file
    # dlopen-ed, and dlopen returns the cached old library for a reused path.
    lib = f"kernel_{hashlib.sha256(tmp.read_bytes()).hexdigest()[:12]}.so"
    tmp.replace(out / lib)
    (out / "kernel.tir.py").write_text(script)
    info: dict[str, Any] = {"kind": "tvm-library", "file": lib, "entry": "main",
                            "tir_script": "kernel.tir.py",
                            "how": "TVM export_library; tvm.runtime.load_module(file)[entry](*inputs, out)"}
    if ".cu" in capabilities(target).source_kinds:
        try:
            (out / "kernel.cu").write_text(art.mod.imports[0].inspect_source())
            info["source"] = "kernel.cu"
        except Exception:  # the source is for reading only; the library is what runs
            pass
    return info


def _verify(out: Path, wl: Workload, seed: int = 0) -> dict[str, Any]:
    """Run the folder through its own loader and compare with the numpy reference."""
    m = read_manifest(out)
    device = capabilities(m["target"]["family"]).rpc_device  # the TVM device the library runs on
    if m["artifact"]["kind"] == "tvm-library" and device not in (None, "cpu"):
        import tvm
        if not tvm.device(device, 0).exist:  # e.g. a CUDA export written on a host with no GPU
            return {"correct": None, "skipped": f"no {m['target']['family']} device on the exporting host"}
    op = get_op(wl.op)
    inputs = op.make_inputs(wl, seed)
    k = load(out)
    got = k(*inputs)
    ok, err = compare(got, op.reference(wl, inputs))
    res: dict[str, Any] = {"correct": bool(ok), "max_abs_err": float(err), "seed": seed,
                           "against": "opcompiler numpy reference"}
    if k.last_run.get("cycles") is not None:
        res["simulated_cycles"] = int(k.last_run["cycles"])
        res["simulated_seconds"] = float(k.last_run["seconds"])
    return res


def export(wl: Workload, target: Target, config: Any = "default", *, to: str | Sequence[str] = "lib",
           out: str | Path, name: str | None = None, progress: bool = True) -> dict[str, Any]:
    """Build `wl` for `target` with `config` and write a self-contained export folder at `out`.

    Returns the manifest. Raises OpcError for bad input, OpcFailure if the exported kernel
    does not match the reference."""
    bindings = parse_bindings(to)
    out = Path(out)
    name = name or default_name(wl)
    if not name.isidentifier():
        raise OpcError("must be a Python identifier (it becomes torch.ops.opcompiler.<name>)", arg="--name",
                       value=name, expected="letters, digits and _ , not starting with a digit")
    if "onnx" in bindings:
        from .onnx_model import check_supported
        check_supported(wl)
    _check_out(out)
    bar = tqdm(total=4, desc=f"export {wl.op}", unit="step", disable=not progress, leave=False)
    rc = resolve(wl, target, config)
    bar.set_postfix_str("build")
    kernel = get_backend(target).build(wl, rc.config)
    bar.update(1)
    _prepare_out(out)  # only once the build succeeded: a failed build leaves an earlier export intact
    bar.set_postfix_str("write kernel")
    art = _write_artifact(out, wl, target, kernel)
    for b in bindings:
        for src, dst in _COPIED[b].items():
            shutil.copyfile(_HERE / src, out / dst)
    bar.update(1)
    bar.set_postfix_str("bindings")
    manifest = build_manifest(name=name, wl=wl, target=target, kernel=kernel, config_source=rc.source,
                              record=rc.record, record_key=record_key(wl, target, kernel), artifact=art,
                              bindings=list(bindings), verification={})
    write_manifest(out, manifest)
    if "onnx" in bindings:
        from .onnx_model import write_models
        manifest["onnx"] = write_models(out, manifest)
    (out / "__init__.py").write_text(_init_source(manifest))
    bar.update(1)
    bar.set_postfix_str("verify")
    manifest["verification"] = v = _verify(out, wl)
    write_manifest(out, manifest)  # a wrong kernel stays on disk for inspection, marked correct: false
    bar.update(1)
    bar.close()
    if v["correct"] is False:
        raise OpcFailure(f"exported {wl.op} kernel in {out} computed a wrong result (max abs error "
                         f"{v['max_abs_err']:.3g}); manifest.json records it as not correct")
    return manifest


def _init_source(m: dict[str, Any]) -> str:
    """The folder's __init__.py: `kernel` (numpy callable), and the torch op when exported for torch."""
    lines = [
        f'"""opcompiler export: {m["op"]} ({m["dtype"]}, {m["layout"] or "-"}) for {m["target"]["name"]}.',
        "",
        "Import this folder as a package (sys.path.insert(0, <parent>); import <folder>) or with",
        "opcompiler.export.import_folder(path). `kernel(*numpy_inputs)` runs it"
        + ("; importing registers torch.ops.opcompiler." + m["name"] if "torch" in m["bindings"] else "") + ".",
        '"""',
        "from pathlib import Path as _Path",
        "",
        "from .opc_runtime import KernelInputError, load",
        "",
        "FOLDER = _Path(__file__).resolve().parent",
        "kernel = load(FOLDER)",
        "manifest = kernel.manifest",
    ]
    if "torch" in m["bindings"]:
        lines += ["", "from . import opc_torch as torch_binding  # noqa: E402",
                  "", "op = torch_binding.register(kernel)",
                  "OpcConvBnReLU = torch_binding.OpcConvBnReLU",
                  "OpcModule = torch_binding.OpcModule"]
    if "onnx" in m["bindings"]:
        lines += ["", "from . import opc_onnx as onnx_runner  # noqa: E402",
                  "MODEL = FOLDER / " + repr(m["onnx"]["model"]),
                  "UNFUSED_MODEL = FOLDER / " + repr(m["onnx"]["unfused_model"])]
    return "\n".join(lines) + "\n"
