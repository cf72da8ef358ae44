"""A workload: one op at one shape and dtype. Hashable; its `key()` is part of record keys."""
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
