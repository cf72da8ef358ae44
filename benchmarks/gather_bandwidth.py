"""Gather (embedding lookup) bandwidth on ascend-sim: how close a lookup of n rows from a large
fp16 table gets to the GM read bandwidth of the target file (issue 34's goal: 4,096 rows of 512
fp16 values from a 1M-row table at >= 50 % of it).

For each size: the template's default config, timed in timing mode (no values: a 1M-row table
is never allocated), and

    rows        indices looked up (n)
    row B       bytes per row (cols x 2)
    cycles      the simulated kernel, launch included
    GB/s        the rows' bytes read / time (clock from the target file)
    % GM read   of the target file's HBM bandwidth ([[memory]] HBM bandwidth_gbps)
    floor       launch + (rows per core) x (the GM -> UB path's fixed latency per DMA): the least
                any kernel issuing one DMA per row can take, since each core's MTE2 pipe runs its
                DMAs in order and every DMA pays that latency (the simulator's DMA cost:
                latency + bytes / rate + bursts)
    floor %     the bandwidth at that floor, % of the HBM figure: the ceiling for a row-per-DMA
                gather at this size

Why the floor is what it is: an MTE2 DMA pays the GM latency before its data lands, and a pipe's
DMAs run in order. Huawei's own open cycle model of the Atlas A2/A3 (910B/910C) core charges it
the same way: hicann/pypto framework/src/cost_model/simulation_ca/A2A3/model/pipe.cpp,
CalcMovOutUb (GM -> UB) sets `endTime = module_.back()->endTime + movdelay` while an earlier DMA
is in flight, movdelay = transfer + ddrRdLatency_ (307 + 4 cycles at 1.85 GHz), so back-to-back
row DMAs complete one latency apart. A row-per-DMA gather of 1 KiB rows therefore cannot reach
half the HBM bandwidth on such a core; longer rows amortise the latency better (the 4,096 x
2,048-column line: 27 %).

    python benchmarks/gather_bandwidth.py [--target ascend-sim] [--json]
"""
from __future__ import annotations

import argparse
import json
import math

TABLE_ROWS = 1 << 20
SIZES = ((1024, 512), (4096, 64), (4096, 512), (4096, 2048), (16384, 512))  # (rows looked up, cols)
GOAL = (4096, 512)


def measure(target_name: str = "ascend-sim", sizes=SIZES, table_rows: int = TABLE_ROWS) -> list[dict]:
    import opcompiler.schedules  # noqa: F401  (the shipped templates)
    from opcompiler.backend import get_backend
    from opcompiler.backend.ascend.machine import _machine
    from opcompiler.ops import workload
    from opcompiler.target import load_target

    tgt = load_target(target_name)
    be = get_backend(tgt)
    m = _machine(tgt)
    lat = m.path("GM", "UB").latency_cycles
    out = []
    for n, cols in sizes:
        wl = workload("gather", f"rows={table_rows},cols={cols},n={n},idx=int64", dtype="float16")
        k = be.build(wl, "default")
        cycles = int(be.measure(k).cycles)
        nbytes = n * cols * 2
        cores = min(int(k.config["block_dim"]), tgt.cores, n)
        floor = m.launch_cycles + math.ceil(n / cores) * lat
        gbps = nbytes / (cycles / m.clock_ghz)
        out.append({"rows": n, "row_bytes": cols * 2, "table_rows": table_rows, "config": dict(k.config),
                    "cycles": cycles, "gbps": gbps, "pct_gm_read": 100.0 * gbps / m.offchip_gbps,
                    "floor_cycles": floor, "floor_pct": 100.0 * nbytes / (floor / m.clock_ghz) / m.offchip_gbps,
                    "hbm_gbps": m.offchip_gbps, "dma_latency": lat, "goal": (n, cols) == GOAL})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="ascend-sim")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    rows = measure(a.target)
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    r0 = rows[0]
    print(f"gather on {a.target}, fp16, a {r0['table_rows']:,}-row table, template default config; GM read "
          f"bandwidth (HBM) {r0['hbm_gbps']:.0f} GB/s, GM -> UB latency {r0['dma_latency']} cycles per DMA")
    print(f"{'rows':>7} {'row B':>6} {'cycles':>9} {'GB/s':>7} {'% GM read':>9} {'floor':>8} {'floor %':>7}  config")
    for r in rows:
        cfg = ",".join(f"{k}={v}" for k, v in r["config"].items())
        mark = "  <- goal (>= 50 %)" if r["goal"] else ""
        print(f"{r['rows']:>7} {r['row_bytes']:>6} {r['cycles']:>9,} {r['gbps']:>7.1f} {r['pct_gm_read']:>8.1f}% "
              f"{r['floor_cycles']:>8,} {r['floor_pct']:>6.1f}%  {cfg}{mark}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
