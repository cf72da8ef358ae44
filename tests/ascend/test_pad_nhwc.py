"""pad in NHWC on ascend-sim: the same move as NCHW's with the tensor viewed as (n, h, w*c) (a
padded row is wp pixels of c channels) instead of (n*c, h, w). It was refused ("the ascend pad
kernel pads NCHW planes") although cpu ran it; the property tests found the hole.
Values against numpy, exactly (a copy and a fill)."""
from __future__ import annotations

import pytest

from opcompiler.api import run_op


@pytest.mark.parametrize("shape", ["n=1,c=1,h=1,w=1,pt=0,pl=0,pb=0,pr=0", "n=1,c=3,h=4,w=5,pt=1,pl=2,pb=0,pr=1",
                                   "n=2,c=16,h=7,w=7,pt=1,pl=1,pb=1,pr=1", "n=1,c=17,h=9,w=3,pt=2,pl=0,pb=1,pr=2",
                                   "n=1,c=64,h=56,w=56,pt=1,pl=1,pb=1,pr=1"])
@pytest.mark.parametrize("fill,dtype", [("zero", "float16"), ("lowest", "float32")])
def test_nhwc_pad_matches_numpy(shape, fill, dtype):
    rep = run_op("pad", "ascend-sim", shape=f"{shape},fill={fill},layout=NHWC", dtype=dtype)
    assert rep["correct"] is True and rep["max_abs_err"] == 0, rep


def test_nhwc_pad_moves_the_same_bytes_as_nchw():
    """Same tensor, same padding: both layouts read x once and write y once, no more."""
    common = "n=1,c=8,h=6,w=6,pt=1,pl=1,pb=1,pr=1,fill=zero"
    a = run_op("pad", "ascend-sim", shape=common + ",layout=NHWC", dtype="float16")
    b = run_op("pad", "ascend-sim", shape=common + ",layout=NCHW", dtype="float16")
    assert a["correct"] and b["correct"]
    for r in (a, b):  # x: 8*6*6 fp16 read once; y: 8*8*8 fp16 written once
        assert r["bytes_by_level"]["GM_read"] == 8 * 6 * 6 * 2 and r["bytes_by_level"]["GM_write"] == 8 * 8 * 8 * 2
