"""Worker processes import the installed opcompiler, whatever directory the user stands in.

The forkserver behind the measuring workers starts as `python -c ...`, which would put the
current directory first on `sys.path`, and preloads opcompiler from there. Here the current
directory holds a copy of the `opcompiler/` sources without `schedules`, `targets` and
`tuning_logs`: the source tree as it was when those existed only through `package-dir`, which
made every trial typed in the clone's root crash. A measurement that succeeds proves the
workers never imported it. They also see no current directory on `sys.path`."""
from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import os, sys
    from opcompiler.ops import workload
    from opcompiler.target import load_target
    from opcompiler.tune.measure import BackendSpec, Measurer
    if __name__ == "__main__":
        wl = workload("add", "n=1,c=4,h=4,w=4", dtype="float32")
        with Measurer(BackendSpec(target=load_target("cpu")), workers=1, timeout=120) as m:
            r = m.measure(wl, [{}], verify=True)[0]
        print("RESULT", r.status, r.verified, r.error)
        with Measurer(BackendSpec(target=load_target("cpu"), factory="probe_path:probe_path"),
                      workers=1, timeout=120) as m:
            print("PATH", m.measure(wl, [{}])[0].error)
""")

# A `BackendSpec.factory` beside the script (its folder is on the workers' `sys.path`, the current
# directory is not): a backend whose every build fails with "clean" when the worker's `sys.path`
# holds neither '' nor the current directory and its opcompiler was not imported from the current
# directory; else with what is wrong.
PROBE = textwrap.dedent("""
    import sys
    from pathlib import Path

    def probe_path(target):
        import opcompiler
        package = Path(opcompiler.__file__).resolve().parent  # the opcompiler this worker imported
        cwd = Path.cwd().resolve()
        bad = [p for p in sys.path if p in ("", ".") or Path(p).resolve() == cwd]
        if package.is_relative_to(cwd):
            bad.append(f"opcompiler from {package}")

        class Probe:
            def build(self, wl, config):
                raise RuntimeError("clean" if not bad else f"not clean: {bad}")
        return Probe()
""")


def test_workers_ignore_a_shadowing_package_in_the_current_directory(tmp_path):
    import shutil
    from pathlib import Path

    import opcompiler
    shadow = tmp_path / "cwd" / "opcompiler"
    shutil.copytree(Path(opcompiler.__file__).parent, shadow, symlinks=True,
                    ignore=shutil.ignore_patterns("schedules", "targets", "tuning_logs", "__pycache__"))
    script = tmp_path / "bin" / "measure_here.py"
    script.parent.mkdir()
    script.write_text(SCRIPT)
    (script.parent / "probe_path.py").write_text(PROBE)
    out = subprocess.run([sys.executable, str(script)], cwd=shadow.parent, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT")][0]
    assert line == "RESULT ok True ", line
    path = [x for x in out.stdout.splitlines() if x.startswith("PATH")][0]
    assert path == "PATH build: RuntimeError: clean", path


def test_cli_from_the_clone_root_imports_a_complete_package():
    """`python -m opcompiler` from the repository root imports the source tree; it must be the
    whole package (schedules, targets, shipped records), as installed."""
    import opcompiler
    root = __import__("pathlib").Path(opcompiler.__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-m", "opcompiler", "targets"], cwd=root, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "ascend910-sim" in out.stdout and "ft-m7032-dsp-sim" in out.stdout
