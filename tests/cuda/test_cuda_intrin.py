"""schedules/cuda/intrin.py: TVM's WMMA intrinsics imported with a light stack walk.

The light walk must give TVM's parser what `inspect.stack()` gives it (frame, file, line, function,
the current line); a plain import of the intrinsics takes most of a minute here, so the module
docstring's check that every registered intrinsic prints the same TVMScript both ways was run by
hand, and these tests pin the parts it rests on."""
from __future__ import annotations

import inspect

import pytest

from opcompiler.schedules.cuda import intrin


def _both():
    return inspect.stack(), intrin._light_stack()  # the same frames, walked both ways


def test_light_stack_matches_inspect_stack_on_every_frame_with_a_file():
    real, light = _both()
    assert len(light) == len(real) > 3
    for a, b in zip(light, real):
        assert a.frame is b.frame and a.function == b.function and a.filename == b.filename
        if a.function != "_both":  # the one frame whose instruction differs between the calls
            assert a.lineno == b.lineno and a.positions == b.positions
        if b.code_context and b.code_context[0]:  # frames with source on disk
            assert a.code_context == b.code_context and a.index == b.index


def test_the_decorator_line_tvm_reads_is_the_same():
    """TVM reads frames[2].code_context to tell a class-scope TVMScript function (is_defined_in_class)."""
    def deco(fn):
        return inspect.stack(), intrin._light_stack()

    @deco
    def f():
        pass

    real, light = f
    assert light[1].code_context == real[1].code_context  # the line applying the decorator
    assert "@deco" in light[1].code_context[0]


def test_the_entry_is_restored_and_the_wmma_group_is_registered():
    from tvm.s_tir import TensorIntrin
    from tvm.tirx.script.parser import entry

    with intrin.light_tvmscript_stack():
        assert entry.inspect.stack is intrin._light_stack
    assert entry.inspect is inspect
    group = intrin.get_wmma_intrin_group(load_scope="shared.dyn", store_scope="shared", in_dtype="float16",
                                         out_dtype="float32", trans_b=True)  # as schedules/cuda/gemm.py
    assert set(group) >= {"load_a", "load_b", "compute", "store"}
    for name in group.values():
        assert TensorIntrin.get(name) is not None


def test_the_entry_is_restored_when_parsing_fails():
    from tvm.tirx.script.parser import entry

    with pytest.raises(RuntimeError):
        with intrin.light_tvmscript_stack():
            raise RuntimeError("parse error")
    assert entry.inspect is inspect
