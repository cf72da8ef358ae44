"""dsp-sim template for the conv2d family (conv2d, conv2d_bias(_relu), conv2d_bn(_relu), and the
residual epilogues conv2d_bias_add(_relu), conv2d_bn_add_relu): the
VPE-vectorized direct convolution of seed 004 Algorithm 3, generalized (see `direct.py`: its
geometry, cost and TVM schedule, shared with the fully connected layer)."""
from __future__ import annotations

from typing import Any, Mapping

from opcompiler.backend.dsp.intrin import machine
from opcompiler.errors import OpcError
from opcompiler.ops import get_op
from opcompiler.ops.catalogue import conv_out_hw, conv_out_shape
from opcompiler.target import Target
from opcompiler.template_base import Knob, Scheduled, register_template
from opcompiler.workload import Workload

from .common import epilogue_steps, require_fp32
from .direct import ConvSpec, DirectConfig, DirectTemplate, check, tiles_fit
from .grouped import DspGroupedConv

# the epilogue steps (`opcompiler.ops.steps`) the direct convolution lowers, in its order and its
# names: a conv2d-family op runs here when its catalogue entry's `epilogue` is made of them ("add",
# conv + eltwise: the residual's tile staged DDR -> AM beside the input rows, added in the epilogue;
# "hardswish": x * (clip(x + 3, 0, 6) / 6) on the accumulators, the clip in a temporary register)
EPI_STEPS = {"bias": "bias", "bn": "bn", "add": "res", "relu": "relu", "hardswish": "hswish"}
PW = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 14, 16, 19)
ROWS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 19)
COLS = (1, 2, 4, 8, 12, 16, 28, 32, 56)


_DEFAULTS: dict[tuple, dict[str, Any]] = {}  # (workload, target) -> default config


@register_template
class DspDirectConv2d(DirectTemplate):
    """Direct NHWC convolution: batch (or row blocks) across cores, K on the vector lanes,
    pw x kv register blocks over the R x S x C loop, DDR -> SM input rows, AM weights."""

    name = "dsp.direct_conv2d"
    op_families = ("conv2d",)
    version = 2  # v2: one route, TVM's scheduled TIR lowered by the backend (the `lowering` knob is gone)
    # groups > 1 (depthwise, grouped): output channels cannot share the lanes' input scalars;
    # those workloads go to the grouped template (`grouped.py`, with its own TVM schedule)
    grouped = DspGroupedConv()

    def spec(self, wl: Workload, target: Target) -> ConvSpec:
        require_fp32(wl, target)
        p = wl.p
        if p["groups"] != 1:
            raise OpcError("the dsp direct convolution supports groups=1 only", arg="groups", value=p["groups"],
                           expected="1")
        epi = epilogue_steps(wl, EPI_STEPS, "direct-conv")
        ho, wo = conv_out_hw(wl)
        return ConvSpec(n=p["n"], h=p["h"], w=p["w"], c=p["c"], k=p["k"], r=p["r"], s=p["s"], stride=p["stride"],
                        pad=p["pad"], dil=p["dilation"], ho=ho, wo=wo, epi=epi, layout=p["layout"])

    def space(self, wl: Workload, target: Target) -> list[Knob]:
        if wl.p["groups"] != 1:
            return self.grouped.space(wl, target)
        sp = self.spec(wl, target)
        lanes = machine(target).lanes
        kvmax = max(1, min(4, -(-sp.k // lanes)))
        return [
            Knob("pw", tuple(v for v in PW if v <= max(sp.wo * sp.ho, 1)) or (1,), "output pixels per register block"),
            Knob("kv", tuple(range(1, kvmax + 1)), "vectors of 32 output channels per register block"),
            Knob("rows", tuple(v for v in ROWS if v <= sp.ho) or (1,), "output rows per DMA stage"),
            Knob("cols", tuple(sorted({v for v in COLS if v < sp.wo} | {sp.wo}, reverse=True)),
                 "output columns per DMA stage (narrower tiles when wide input rows overflow SM)"),
            Knob("order", ("out", "ws"), "out: accumulate in registers; ws: the paper's weight-stationary pass"),
            Knob("dbuf", (1, 0), "double-buffer SM/AM tiles so DMA overlaps the VPU"),
            Knob("w_path", ("gsm", "ddr", "host_copies"), "how weights reach each core's AM"),
            Knob("out_path", ("ddr", "gsm"), "AM -> DDR, or AM -> GSM -> DDR as in the paper"),
            Knob("split", ("items", "batch"), "cores take (image, row block) items, or whole images"),
        ]

    def default(self, wl: Workload, target: Target) -> dict[str, Any]:
        if wl.p["groups"] != 1:
            return self.grouped.default(wl, target)
        # every config resolution starts from the default, and finding it builds a program:
        # once per workload and target description
        key = (wl.op, tuple(sorted(wl.params)), wl.dtype, getattr(target, "digest", target.name))
        if key not in _DEFAULTS:
            if len(_DEFAULTS) >= 256:
                _DEFAULTS.clear()
            _DEFAULTS[key] = self._default(wl, target)
        return dict(_DEFAULTS[key])

    def _default(self, wl: Workload, target: Target) -> dict[str, Any]:
        sp = self.spec(wl, target)
        knobs = {k.name: k.values for k in self.space(wl, target)}
        kvs = sorted((v for v in knobs["kv"] if v <= 2), reverse=True)
        cfg: dict[str, Any] = {}
        for cols in knobs["cols"]:
            for kv in kvs:
                for pw in (10, 9, 8, 6, 4, 2, 1):
                    for rows in (1, 2):
                        for dbuf in (1, 0):
                            cfg = {"pw": min(pw, max(knobs["pw"])), "kv": kv, "rows": min(rows, sp.ho), "cols": cols,
                                   "order": "out", "dbuf": dbuf, "w_path": "gsm", "out_path": "ddr", "split": "items"}
                            if self.check(wl, target, cfg) is None and self._tir_fits(wl, target, cfg):
                                return cfg
        # none of the preferred shapes fits (wide rows of many channels): the first config of the
        # whole space, narrowest tiles first, that fits and builds; a workload nothing fits is
        # beyond the machine, said in one line
        fits = sorted((c for c in self.iter_space(wl, target) if self.check(wl, target, c) is None),
                      key=lambda c: (-c["cols"] * c["rows"] * c["pw"] * c["kv"], c["dbuf"] == 0))
        for c in fits[:16]:
            if self._tir_fits(wl, target, c):
                return c
        why = self.check(wl, target, {**cfg, "pw": 1, "kv": 1, "rows": 1, "cols": min(knobs["cols"]), "dbuf": 0})
        raise OpcError(f"{wl.op} does not fit {target.name} with any tiling of {self.name}: even one output "
                       f"row of one column {why or 'does not build'}", arg="--shape",
                       expected="fewer input channels or a narrower image")

    def _tir_fits(self, wl: Workload, target: Target, cfg: Mapping[str, Any]) -> bool:
        """Whether this config's tiles fit as TVM compacts them: a staged tile is compacted to
        the region its loops can touch, which with a row split that does not divide the output
        can exceed the tile `check` counts (the compacted schedule is cached, so the build that
        follows the default's search schedules nothing again)."""
        return tiles_fit(wl, target, cfg)

    def paper(self, wl: Workload, target: Target) -> dict[str, Any]:
        """Algorithm 3 as written: whole images per core, all of K on the lanes, one output pixel
        at a time, a weight-stationary pass per input channel with partial sums in AM, the
        output through GSM, W replicated per core, no double buffering; the image is staged
        into SM whole when it fits, else in the largest row blocks that fit."""
        if wl.p["groups"] != 1:
            raise OpcError("no paper schedule for grouped convolution (seed 004 has none)", arg="--config",
                           value="paper", expected="default, best or a JSON object of knobs")
        sp = self.spec(wl, target)
        m = machine(target)
        kv = max(1, -(-sp.k // m.lanes))
        cfg = {"pw": 1, "kv": kv, "rows": sp.ho, "cols": sp.wo, "order": "ws", "dbuf": 0,
               "w_path": "host_copies" if sp.layout == "NHWC" else "ddr", "out_path": "gsm", "split": "batch"}
        while cfg["rows"] > 1 and check(m, sp, DirectConfig.of(cfg)) is not None:
            cfg["rows"] -= 1
        while cfg["cols"] > 1 and check(m, sp, DirectConfig.of(cfg)) is not None:
            cfg["cols"] -= 1
        return cfg

    def check(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> str | None:
        if wl.p["groups"] != 1:
            return self.grouped.check(wl, target, config)
        sp = self.spec(wl, target)
        cf = DirectConfig.of(config)
        if cf.w_path == "host_copies" and sp.layout != "NHWC":
            return "w_path=host_copies replicates HWIO weights on the host; use gsm or ddr for NCHW"
        return check(machine(target), sp, cf)

    def apply(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> Scheduled:
        """This config's TVM schedule (`direct.conv_schedule`; groups > 1: `grouped.gconv_schedule`)."""
        if wl.p["groups"] != 1:
            return self.grouped.apply(wl, target, config)
        return super().apply(wl, target, config)

    def features(self, wl: Workload, target: Target, config: Mapping[str, Any]) -> dict[str, float]:
        if wl.p["groups"] != 1:
            return self.grouped.features(wl, target, config)
        return super().features(wl, target, config)

    def tensors(self, wl: Workload, sp: ConvSpec) -> tuple[dict, dict, list, list, tuple]:
        """(lowering names, DDR tensors, pre relayouts, post relayouts, output shape)."""
        nchw = sp.layout == "NCHW"
        names = {"data": "data_nhwc" if nchw else "data", "weight": "weight_hwio" if nchw else "weight",
                 "out": "out_nhwc" if nchw else "out", "bias": "bias", "bn": "scale,shift"}
        ddr = {n: s for n, s, _ in get_op(wl.op).inputs(wl)}
        out_shape = conv_out_shape(wl)
        ddr["out"] = out_shape
        pre: list[tuple] = []
        post: list[tuple] = []
        if nchw:
            c, h, w = sp.c, sp.h, sp.w
            ddr["data_nhwc"] = (sp.n, h, w, c)
            pre.append(("data", "data_nhwc", (sp.n, h, w, c), (c * h * w, w, 1, h * w), False))
            ddr["weight_hwio"] = (sp.r, sp.s, c, sp.k)
            pre.append(("weight", "weight_hwio", (sp.r, sp.s, c, sp.k), (sp.s, 1, sp.r * sp.s, c * sp.r * sp.s), True))
            ddr["out_nhwc"] = (sp.n, sp.ho, sp.wo, sp.k)
            post.append(("out_nhwc", "out", out_shape, (sp.ho * sp.wo * sp.k, 1, sp.wo * sp.k, sp.k), False))
            if "res" in sp.epi:  # the residual is read in the output's (NHWC) layout
                names["residual"] = "residual_nhwc"
                ddr["residual_nhwc"] = (sp.n, sp.ho, sp.wo, sp.k)
                pre.append(("residual", "residual_nhwc", (sp.n, sp.ho, sp.wo, sp.k),
                            (sp.k * sp.ho * sp.wo, sp.wo, 1, sp.ho * sp.wo), False))
        return names, ddr, pre, post, out_shape
