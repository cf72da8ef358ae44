"""Schedule helpers shared by the CPU templates."""
from __future__ import annotations

import tvm
from tvm import te

from opcompiler.ops import get_op
from opcompiler.workload import Workload


def create_schedule(wl: Workload) -> tvm.s_tir.Schedule:
    ins, out = get_op(wl.op).compute(wl)
    func = te.create_prim_func([*ins, out]).with_attr("global_symbol", "main")
    return tvm.s_tir.Schedule(func)


def block_names(sch: tvm.s_tir.Schedule) -> list[str]:
    return [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]


def output_block(sch: tvm.s_tir.Schedule):
    (out,) = sch.get_output_blocks(sch.get_sblock("root"))
    return out


def inline_all_except(sch: tvm.s_tir.Schedule, keep: set[str]) -> None:
    """Inline every injective block not in `keep` and not the output (producers first)."""
    out_name = sch.get(output_block(sch)).name_hint
    for name in block_names(sch):
        if name in keep or name == out_name:
            continue
        sch.compute_inline(sch.get_sblock(name))


def divisors(n: int, limit: int | None = None) -> tuple[int, ...]:
    return tuple(d for d in range(1, n + 1) if n % d == 0 and (limit is None or d <= limit))


def near(values: tuple[int, ...], want: int) -> int:
    """The value closest to `want` (ties to the larger)."""
    return min(values, key=lambda v: (abs(v - want), -v))
