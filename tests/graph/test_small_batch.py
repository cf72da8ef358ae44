"""MiniGo at batch 1 on dsp-sim (issue 29 item 1): its heads end in a one-feature fully connected
layer (value, n=1) and a one-element sigmoid chain, which crashed the DSP schedules (a copy nest
of one element has no loop of its own). `compare` runs the fused, unfused and cost-chosen plans
and checks each against onnxruntime."""
from __future__ import annotations

from opcompiler.cli import main


def test_minigo_batch1_compare_dsp(models, capsys):
    assert main(["compare", str(models["minigo"]), "--target", "dsp-sim", "--batch", "1"]) == 0
    out = capsys.readouterr().out
    for plan in ("unfused", "fused", "cost"):
        assert f"{plan} vs onnxruntime: OK" in out


def test_minigo_batch1_compare_ascend(models, capsys):
    """The same on ascend-sim (the default target): the one-element sigmoid chain builds (unit
    loops kept at compute_at; it crashed emit_insn) and every plan matches onnxruntime."""
    assert main(["compare", str(models["minigo"]), "--target", "ascend-sim", "--batch", "1"]) == 0
    out = capsys.readouterr().out
    for plan in ("unfused", "fused", "cost"):
        assert f"{plan} vs onnxruntime: OK" in out
