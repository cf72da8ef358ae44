"""dsp-sim template for the element-wise family: one registered template that dispatches by op.

relu, add, add_relu, bias_add, batch_norm and the fused bn_relu of seed 004 §2.1.3 are fixed step
chains, and ew_chain spells its chain out: both are TVM schedules of the op's compute (`chain.py`:
the tensor cut into stages of pixels / planes, split across the cores, DMAed
DDR -> AM, computed in AM, DMAed back) lowered by the DSP backend to vector instructions
(its `tir_vector`). Explicit padding (`pad.py`), slice and transpose
(strided DMA, `slice.py`, `transpose.py`) and concat (DMA only, `concat.py`) are TVM schedules of
their computes too (`move.py`), lowered to DMA descriptors and fills (the backend's `tir_move`).
"""
from __future__ import annotations

from typing import Any, Mapping

from opcompiler.errors import OpcError
from opcompiler.ops import get_op
from opcompiler.target import Target
from opcompiler.template_base import Knob, Scheduled, Template, register_template
from opcompiler.workload import Workload

from .chain import DspChain
from .common import require_fp32
from .concat import DspConcat
from .pad import DspPad
from .slice import DspSlice
from .transpose import DspTranspose

_CHAIN = DspChain()
# one template is registered per family; these carry the family's data movements, and every op
# with a chain in the catalogue (`OpDef.chain`) runs as a chain
DELEGATE: dict[str, Template] = {"concat": DspConcat(), "pad": DspPad(), "slice": DspSlice(),
                                 "transpose": DspTranspose()}


def _of(wl: Workload) -> Template:
    if wl.op in DELEGATE:
        return DELEGATE[wl.op]
    if get_op(wl.op).chain:
        return _CHAIN
    raise OpcError(f"no dsp element-wise lowering for {wl.op}", arg="op", value=wl.op,
                   expected="an op with a chain in the catalogue, or " + ", ".join(DELEGATE))


@register_template
class DspElemwise(Template):
    """Element-wise ops on the VPU (step chains), and the family's DMA-only ops."""

    name = "dsp.elemwise"
    op_families = ("elemwise",)
    target_family = "dsp"
    # v2: single-step ops execute VPU instructions (the chain lowering); v3: chains are lowered from
    # their TVM schedule (identical programs, except a per-channel multiply feeding a per-channel
    # add, e.g. ew_chain scale;bias, is one FMA)
    version = 3

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        return _of(wl).space(wl, target)

    def default(self, wl: Workload, target: Target) -> dict[str, Any]:
        return _of(wl).default(wl, target)

    def paper(self, wl: Workload, target: Target) -> dict[str, Any]:
        t = _of(wl)
        if t is not _CHAIN:
            raise OpcError(f"no paper schedule for {wl.op} (seed 004 has none)", arg="--config", value="paper",
                           expected="default, best or a JSON object of knobs")
        require_fp32(wl, target)
        return t.paper(wl, target)

    def check(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> str | None:
        return _of(wl).check(wl, target, config)

    def apply(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> Scheduled:
        return _of(wl).apply(wl, target, config)

    def features(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> dict[str, float]:
        return _of(wl).features(wl, target, config)
