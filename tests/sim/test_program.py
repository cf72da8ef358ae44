"""One program container (`opcompiler.sim.program.SimProgram`) both machines' programs are, its
listing, and `opcompiler run --listing` (issue 24, item 2)."""
from __future__ import annotations

import pytest

from opcompiler.backend import get_backend
from opcompiler.cli import main
from opcompiler.ops import workload
from opcompiler.sim.program import Repeat, SimProgram, expand
from opcompiler.target import load_target


def _program(target: str, op: str, shape: str, dtype: str):
    k = get_backend(load_target(target)).build(workload(op, shape, dtype=dtype), None)
    art = k.artifact
    return art["program"] if isinstance(art, dict) else art.program


def test_both_machines_programs_are_one_container_with_one_listing():
    asc = _program("ascend-sim", "add", "n=32,c=64,h=56,w=56", "float16")
    dsp = _program("dsp-sim", "matmul", "m=256,n=256,k=256", "float32")
    for prog in (asc, dsp):
        assert isinstance(prog, SimProgram) and isinstance(prog.info, dict)
        text = prog.listing(limit=12)
        lines = text.splitlines()
        assert lines[0].startswith("# core") and lines[-1] == "# ... (the first 12 lines)"
        body = [ln for ln in lines if not ln.startswith("#")]
        assert len(body) == 12
        assert len(prog.listing().splitlines()) > 12  # no limit: the whole program
    # Ascend: pipes, operands with their levels, bytes, the machine's declared cycles (none for GM transfers)
    text = asc.listing(limit=12)
    assert "MTE2  datamove" in text and "@GM -> " in text and "nbytes=" in text
    vec = next(ln for ln in text.splitlines() if " vec." in ln)
    ins = next(i for i in asc.instrs if type(i).__name__ == "Vec")
    assert f"cycles={ins.cost_cycles(asc.machine)}" in vec
    gm = next(ln for ln in text.splitlines() if "path=GM->" in ln)
    assert "cycles=" not in gm
    assert asc.high_water and "# high water: UB" in text
    # DSP: units, transfer paths, a VPU pass's scheduled cycles
    text = dsp.listing()
    assert "path=DDR->" in text and " vpu " in text and "cycles=" in text
    assert f"{len(expand(dsp.instructions(0)))} instructions" in text.splitlines()[0]


def test_a_repeat_block_is_listed_once_with_its_count():
    class Ins:
        def __init__(self, kind, pipe):
            self.kind, self.pipe, self.reads, self.writes, self.cycles = kind, pipe, ("a",), ("b",), 5

    class P(SimProgram):
        def __init__(self, ops):
            self.ops, self.info = ops, {}

        def streams(self):
            return [("core 0", self.ops)]

        def declared_cycles(self, ins):
            return ins.cycles

    x, y, z = Ins("dma", "dma"), Ins("vpu", "vpu"), Ins("barrier", "sync")
    text = P([x, Repeat((x, y), 100), z]).listing()
    lines = text.splitlines()
    assert lines[0] == "# core 0: 202 instructions"
    assert lines[2].strip() == "repeat x100 {" and lines[5].strip() == "}"
    assert lines[3].split()[:3] == ["1", "dma", "dma"] and "a -> b" in lines[3] and "cycles=5" in lines[3]
    assert lines[6].split()[:3] == ["201", "sync", "barrier"]


def test_run_listing_prints_core0s_program(capsys):
    assert main(["run", "add", "--target", "ascend-sim", "--shape", "n=32,c=64,h=56,w=56", "--timing-only",
                 "--listing", "5"]) == 0
    out = capsys.readouterr().out
    tail = out[out.index("# core 0"):].splitlines()
    assert len([ln for ln in tail if not ln.startswith("#")]) == 5 and "MTE2" in tail[2]


def test_run_listing_is_for_simulator_targets():
    assert main(["run", "add", "--target", "cpu", "--listing"]) == 2


@pytest.mark.parametrize("n", ["0", "-3"])
def test_run_listing_wants_a_positive_count(n):
    assert main(["run", "add", "--target", "ascend-sim", "--listing", n]) == 2
