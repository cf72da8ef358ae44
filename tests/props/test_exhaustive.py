"""Exhaustive up to a small size: every ew_chain step and every ordered pair of steps, and every
permutation of a transpose up to rank 5, on cpu, ascend-sim and dsp-sim, with values checked
against numpy (the dtype's tolerance, `opcompiler.verify.TOLERANCE`). Shapes are odd and hold a
size of 1, so no tile is ever full. Every failing case of a parameter is listed, with the command
that reproduces it."""
from __future__ import annotations

import itertools

import pytest

from .cases import STEP_TEXTS, TARGETS, Case, problem, run_case

DTYPE = {"cpu": "float32", "ascend-sim": "float16", "dsp-sim": "float32"}


def _failures(cases: list[Case]) -> list[str]:
    return [why for c in cases if (why := problem(c, run_case(c))) is not None]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("first", STEP_TEXTS)
def test_every_step_and_every_pair_of_steps(first, target):
    """On cpu, TVM's LLVM codegen compiles the TE compute whole, so a pair is no different in kind
    from one step: the pairs run on the simulators, whose lowerings select instructions per step."""
    chains = [first] + ([f"{first};{second}" for second in STEP_TEXTS] if target != "cpu" else [])
    cases = [Case("ew_chain", target, dict(n=1, c=3, h=2, w=5, layout=layout, chain=chain), DTYPE[target])
             for chain in chains for layout in (("NCHW", "NHWC") if chain == first else ("NCHW",))]
    bad = _failures(cases)
    assert not bad, f"{len(bad)} of {len(cases)} chains fail:\n" + "\n".join(bad)


DIMS = {2: (3, 5), 3: (2, 1, 5), 4: (2, 3, 1, 5), 5: (2, 1, 3, 2, 3)}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("rank", sorted(DIMS))
def test_every_permutation(rank, target):
    dims = "x".join(map(str, DIMS[rank]))
    cases = [Case("transpose", target, {"dims": dims, "perm": "".join(map(str, p))}, DTYPE[target])
             for p in itertools.permutations(range(rank))]
    bad = _failures(cases)
    assert not bad, f"{len(bad)} of {len(cases)} permutations fail:\n" + "\n".join(bad)
