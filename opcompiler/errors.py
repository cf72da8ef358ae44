"""The two kinds of error opcompiler raises.

`OpcError` is the user's input being wrong (bad shape, dtype, target, knob, file): the CLI
prints its one-line message and exits 2. `OpcFailure` is ours (a kernel that computes a wrong
result, a simulator invariant broken): the CLI exits 1.
"""
from __future__ import annotations


class OpcError(ValueError):
    """Bad input or usage. The message names the argument, the value and what would work."""

    def __init__(self, message: str, *, arg: str | None = None, value: object = None, expected: str | None = None):
        if arg is not None:
            message = f"{arg}={value!r}: {message}" if value is not None else f"{arg}: {message}"
        if expected:
            message = f"{message} (expected {expected})"
        super().__init__(message)
        self.arg = arg
        self.value = value
        self.expected = expected


class CapacityError(OpcError):
    """A kernel's live buffers overflow a memory level, or violate its alignment."""

    def __init__(self, buffer: str, level: str, need_bytes: int, capacity_bytes: int, detail: str = ""):
        msg = (f"buffer {buffer!r} needs {need_bytes} B in {level} but only {capacity_bytes} B are available"
               + (f"; {detail}" if detail else "") + "; choose smaller tiles")
        super().__init__(msg)
        self.buffer, self.level, self.need_bytes, self.capacity_bytes = buffer, level, need_bytes, capacity_bytes


class OpcFailure(RuntimeError):
    """A failure of ours: a wrong result, a broken invariant. CLI exit code 1."""
