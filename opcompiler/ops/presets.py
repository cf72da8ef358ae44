"""Named shape presets and `key=value` shape parsing."""
from __future__ import annotations

from types import MappingProxyType
from typing import Any, Mapping

from ..errors import OpcError


def _conv(c, h, k, r, stride=1, pad=None, n=1, w=None, layout="NCHW"):
    return {"n": n, "c": c, "h": h, "w": w or h, "k": k, "r": r, "s": r, "stride": stride,
            "pad": r // 2 if pad is None else pad, "dilation": 1, "groups": 1, "layout": layout}


# ResNet-50 v1.5 convolution layers (batch 1; --batch overrides), NCHW.
_RESNET50 = {
    "resnet50.conv1": _conv(3, 224, 64, 7, stride=2, pad=3),
    "resnet50.res2_1x1a": _conv(64, 56, 64, 1),
    "resnet50.res2_3x3": _conv(64, 56, 64, 3),
    "resnet50.res2_1x1b": _conv(64, 56, 256, 1),
    "resnet50.res2_1x1c": _conv(256, 56, 64, 1),
    "resnet50.res3_1x1a": _conv(256, 56, 128, 1),
    "resnet50.res3_3x3s2": _conv(128, 56, 128, 3, stride=2),
    "resnet50.res3_3x3": _conv(128, 28, 128, 3),
    "resnet50.res3_1x1b": _conv(128, 28, 512, 1),
    "resnet50.res3_down": _conv(256, 56, 512, 1, stride=2),
    "resnet50.res4_1x1a": _conv(512, 28, 256, 1),
    "resnet50.res4_3x3": _conv(256, 14, 256, 3),
    "resnet50.res4_1x1b": _conv(256, 14, 1024, 1),
    "resnet50.res5_1x1a": _conv(1024, 14, 512, 1),
    "resnet50.res5_3x3": _conv(512, 7, 512, 3),
    "resnet50.res5_1x1b": _conv(512, 7, 2048, 1),
}

# MiniGo layers of seed 004 Table 1, NHWC, batch 96 as in the paper's Table 3 (--batch overrides).
_MINIGO = {
    "minigo.conv3_init": _conv(13, 19, 64, 3, n=96, layout="NHWC"),
    "minigo.conv3_res": _conv(64, 19, 64, 3, n=96, layout="NHWC"),
    "minigo.conv1_policy": _conv(64, 19, 2, 1, n=96, layout="NHWC"),
    "minigo.conv1_value": _conv(64, 19, 1, 1, n=96, layout="NHWC"),
    "minigo.fc1": {"m": 96, "k": 722, "n": 362},
    "minigo.fc2": {"m": 96, "k": 361, "n": 64},
    "minigo.fc3": {"m": 96, "k": 64, "n": 1},
}

_MATMUL = {
    "seed.matmul_16x256x1024": {"m": 16, "k": 256, "n": 1024},  # seed 000 §6.3.1, Fig. 14
    "resnet50.fc": {"m": 1, "k": 2048, "n": 1000},
}

PRESETS: Mapping[str, Mapping[str, Any]] = MappingProxyType({**_RESNET50, **_MINIGO, **_MATMUL})
BATCH_KEY = {"conv": "n", "matmul": "m"}


def parse_shape(text: str) -> dict[str, Any]:
    """`n=1,c=64,h=56` -> {"n": 1, "c": 64, "h": 56}; values that are not ints stay strings."""
    out: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "=" not in part:
            raise OpcError(f"shape item {part!r} is not key=value", arg="--shape", value=text,
                           expected="e.g. n=1,c=64,h=56,w=56,k=64,r=3,s=3 or a preset name (opcompiler ops)")
        k, v = (x.strip() for x in part.split("=", 1))
        if not k:
            raise OpcError(f"shape item {part!r} has no key", arg="--shape", value=text)
        try:
            out[k] = int(v)
        except ValueError:
            out[k] = v
    return out


def preset(name: str) -> dict[str, Any]:
    try:
        return dict(PRESETS[name])
    except KeyError:
        raise OpcError("unknown preset", arg="--preset", value=name,
                       expected="one of " + ", ".join(sorted(PRESETS))) from None
