"""A workload: one op at one shape and dtype. Hashable; its `key()` is part of record keys.

The op a workload names is defined by the catalogue (`opcompiler.ops`), a layer above this one.
The catalogue hands itself here when it loads (`use_catalogue`), and every workload comes from
it (`opcompiler.ops.workload`), so the core modules that ask about a workload's op (config: its
bytes and anchor; the record store: its template family) read `catalogue()` without importing
upwards."""
from __future__ import annotations

import json
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping


@dataclass(frozen=True, kw_only=True)
class Workload:
    op: str
    params: tuple[tuple[str, Any], ...]  # sorted (name, value) pairs
    dtype: str

    @staticmethod
    def make(op: str, params: Mapping[str, Any], dtype: str) -> "Workload":
        return Workload(op=op, params=tuple(sorted(params.items())), dtype=dtype)

    @property
    def p(self) -> Mapping[str, Any]:
        return MappingProxyType(dict(self.params))

    def __getitem__(self, name: str) -> Any:
        return dict(self.params)[name]

    @property
    def layout(self) -> str:
        return str(dict(self.params).get("layout", ""))

    def key(self) -> dict[str, Any]:
        return {"op": self.op, "params": dict(self.params), "dtype": self.dtype}

    def key_str(self) -> str:
        return json.dumps(self.key(), sort_keys=True)

    def shape_str(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.params)


_CATALOGUE: Any = None


def use_catalogue(ops: Any) -> None:
    """Called by `opcompiler.ops` as it loads: the module whose `get_op` and `workload` answer for ops."""
    global _CATALOGUE
    _CATALOGUE = ops


def catalogue() -> Any:
    """The op catalogue (`opcompiler.ops`: `get_op(name)`, `workload(op, params, dtype=)`)."""
    if _CATALOGUE is None:
        raise RuntimeError("the op catalogue is not loaded: make workloads with opcompiler.ops.workload "
                           "(importing opcompiler.ops loads it)")
    return _CATALOGUE
