"""The simulators against published measurements no parameter was fitted to (the `held-out` rows
of opcompiler/calibration/published.json): case, published, simulated, error %, and the mean
absolute error (MAE) per simulator.

Each case runs the simulator with the schedule its document describes, named in the
`schedule` column:
  * seed 004 Table 3 operators: the paper's schedule (`--config paper`: Algorithm 3 for the
    convolutions, Algorithm 2 for FC, the fused BN+ReLU pass), the same call the paper times
    (launch, host work, DSP kernel), in shared mode (DSP+SMP) or copy mode (DSP-SMP);
  * AIBench: its microbenchmark kernels as its public generators write them (the matrix unit
    fed from L1, the vector unit on UB-resident operands), throughput per busy cycle of the
    unit the figure is about (M or V pipe), times the 32 cores at 1 GHz.
No case uses a tuned schedule. Cases off by more than 2x carry a written cause (CAUSES); rows
that cannot be simulated say why (NOT_SIMULATED).

    python benchmarks/fidelity.py            # the table (about 20 s)
    python benchmarks/fidelity.py --json     # one JSON object per case
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable

from opcompiler.backend import get_backend
from opcompiler.calibration import figure, held_out_rows
from opcompiler.ops import workload
from opcompiler.target import Target, load_target

CHIPS = {"ascend910": "ascend-sim", "ft_m7032": "dsp-sim"}


# --- the cases -----------------------------------------------------------------------------------

def _dsp_call_ms(op: str, shape: str, batch: int, mode: str, target: Target | None = None) -> float:
    t = target or load_target("dsp-sim")
    if mode != "shared":
        t = dataclasses.replace(t, extra=MappingProxyType({**t.extra, "data_mode": mode}))
    be = get_backend(t)
    total = 0.0
    for part in shape.split(" + "):  # "FC1 ~ FC3" is the three layers' calls together
        if part.startswith("minigo."):
            wl = workload(op, preset=part, batch=batch)
        else:
            wl = workload(op, part)
        total += be.measure(be.build(wl, "paper")).seconds * 1e3
    return total


def _seed004(row: dict, target: Target | None = None) -> Callable[[], float]:
    return lambda: _dsp_call_ms(row["op"], row["shape"], row["batch"], row["data_mode"], target)


def candidate_target() -> tuple[Target, float]:
    """The CONV1 candidate fix (README, Fidelity), not shipped: the host's per-core copies of W
    cost their bytes at a rate of their own and no fixed per-call cost (host_copy_overhead_us = 0
    too); the rate is fitted, like the shipped figures, to CONV3_RES at batch 96 (4.02 ms, a
    `fit` row), so CONV3_RES stays where it is. Returns (target, fitted GB/s)."""
    base = load_target("dsp-sim")
    pub_ms = figure("ft_m7032", "forward ms, copy mode", use="fit")["conv3_res"][1]

    def variant(gbps: float) -> Target:
        extra = {**base.extra, "host_copy_overhead_us": 0.0, "host_replicate_gbps": gbps, "host_replicate_overhead_us": 0.0}
        return dataclasses.replace(base, extra=MappingProxyType(extra), digest=f"{base.digest}-conv1-candidate-{gbps:.6g}")

    free = _dsp_call_ms("conv2d", "minigo.conv3_res", 96, "shared", variant(1e9))  # replication ~ free
    w_bytes = 3 * 3 * 64 * 64 * 4 * base.cores  # W of CONV3_RES, one copy per core
    gbps = w_bytes / ((pub_ms - free) * 1e-3) / 1e9
    return variant(gbps), gbps


def _ascend_machine():
    from opcompiler.backend.ascend.machine import _machine
    t = load_target("ascend-sim")
    return t, _machine(t)


def aibench_cube(m1: int, k1: int, n1: int, loops: int = 100) -> tuple[float, dict]:
    """AIBench's L1-resident matmul loop (operator_generate/矩阵matmul相关测试generate): per
    iteration two tik.matmul calls of (m1*16) x (k1*16) x (n1*16) on the same L1 operands, the
    second accumulating. On the 910 a tik.matmul is Load2D A and B (L1 -> L0A / L0B) and one MMAD.
    Returns (chip TFLOPS per busy cube cycle, pipe busy cycles)."""
    from opcompiler.backend.ascend.builder import KernelBuilder
    from opcompiler.backend.ascend.scheduler import schedule
    t, m = _ascend_machine()
    kb = KernelBuilder(m)
    a1 = kb.alloc("L1", "input_r_cb", (m1, k1, 16, 16), "float16")
    b1 = kb.alloc("L1", "matrix_cb", (k1, n1, 16, 16), "float16")
    a0 = kb.alloc("L0A", "a_l0a", (m1, k1, 16, 16), "float16")
    b0 = kb.alloc("L0B", "b_l0b", (k1, n1, 16, 16), "float16")
    c0 = kb.alloc("L0C", "dst_r_cb_out", (n1, m1 * 16, 16), "float32")
    for _ in range(loops):
        for init in (True, False):
            kb.data_move(a0, (), a1, ())
            kb.data_move(b0, (), b1, ())
            kb.mmad(c0, a0, b0, m1, k1, n1, init=init)
        kb.loop()
    timing = schedule(kb.finish())
    flops = 2 * loops * 2 * (m1 * 16) * (k1 * 16) * (n1 * 16)
    return flops / timing.busy["M"] * t.cores * t.clock_ghz * 1e9 / 1e12, dict(timing.busy)


def aibench_vector(repeat: int, loops: int = 100) -> tuple[float, dict]:
    """AIBench's vector loop (operator_generate/vector_workload_generate.py): per iteration two
    GM -> UB moves of `repeat` x 256 B, one fp16 vec_mul of `repeat` repeats (128 lanes), one
    UB -> GM move. Returns (chip GFLOPS per busy vector cycle, pipe busy cycles)."""
    from opcompiler.backend.ascend.builder import KernelBuilder
    from opcompiler.backend.ascend.isa import VOp
    from opcompiler.backend.ascend.scheduler import schedule
    t, m = _ascend_machine()
    kb = KernelBuilder(m)
    n = repeat * 128
    gm_a = kb.gm("input_a_gm", (64 * 1024,), "float16")
    gm_o = kb.gm("output_r_gm", (32 * 1024,), "float16")
    a = kb.alloc("UB", "src_a_ub", (32 * 1024,), "float16")
    b = kb.alloc("UB", "src_b_ub", (32 * 1024,), "float16")
    c = kb.alloc("UB", "dst_c_ub", (32 * 1024,), "float16")
    for _ in range(loops):
        kb.data_move(a, (slice(0, n),), gm_a, (slice(0, n),))
        kb.data_move(b, (slice(0, n),), gm_a, (slice(32 * 1024, 32 * 1024 + n),))
        kb.vec_raw("mul", VOp(c), (VOp(a), VOp(b)), repeat)
        kb.data_move(gm_o, (slice(0, n),), c, (slice(0, n),))
        kb.loop()
    timing = schedule(kb.finish())
    flops = loops * n
    return flops / timing.busy["V"] * t.cores * t.clock_ghz * 1e9 / 1e9, dict(timing.busy)


def _aibench_cube_best() -> float:
    return max(aibench_cube(mm, kk, nn)[0] for mm in (2, 4, 8, 10) for kk in (2, 4, 8, 10) for nn in (2, 4, 8, 10))


def _aibench_vector_best() -> float:
    return max(aibench_vector(r)[0] for r in (8, 32, 64, 128, 255))


SCHEDULE = {
    "aibench-cube": "AIBench generator as written (L1-resident tik.matmul loop), cube busy time",
    "aibench-vector": "AIBench generator as written (GM->UB, vec_mul, UB->GM loop), vector busy time",
}


def cases(dsp_target: Target | None = None) -> dict[str, tuple[dict, Callable[[], float], str]]:
    """id -> (row, simulate, schedule) for every held-out row that can be simulated."""
    out = {}
    for chip in CHIPS:
        for row in held_out_rows(chip):
            rid = row.get("id", "")
            if rid.startswith("seed004-t3-"):
                out[rid] = (row, _seed004(row, dsp_target), f"paper schedule (--config paper), {row['data_mode']} mode")
            elif rid == "aibench-cube":
                out[rid] = (row, _aibench_cube_best, SCHEDULE[rid])
            elif rid == "aibench-vector":
                out[rid] = (row, _aibench_vector_best, SCHEDULE[rid])
    return out


# Written causes for cases off by more than 2x (and for the known large misses); the README's
# Fidelity section carries the same text.
CAUSES = {
    "seed004-t3-conv3_init-shared": (
        "the paper's CONV3_INIT (C = 13) takes 6.52 ms for 0.52 GFLOP, 1.6x the time of CONV3_RES (2.56 GFLOP): "
        "its kernel is about 8x less efficient per FLOP than its own CONV3_RES; Algorithm 3 as written (which we run) "
        "does not say why. A C of 13 fills neither the 16 VPEs' vectors nor aligned 64 B DMA rows; per-pixel edge "
        "checks and per-window transfers (Algorithm 3 lines 11-12) would cost that much, but the paper gives no figure to "
        "model them from"),
    "seed004-t3-conv3_init-copy": "as CONV3_INIT shared mode, plus the copy-mode figures (below)",
    "seed004-t3-conv1_policy-copy": (
        "copy-mode times do not scale with the bytes copied (CONV1_POLICY moves half the bytes of CONV3_RES yet takes "
        "longer: 18.22 vs 16.85 ms); the host copy rate was fitted to CONV3_RES, so small operators come out "
        "too fast"),
    "seed004-t3-conv1_value-copy": "as CONV1_POLICY copy mode",
    "seed004-t3-bn_relu-copy": "as CONV1_POLICY copy mode, and BN+ReLU shared mode",
    "seed004-t3-fc1_3-copy": "as CONV1_POLICY copy mode (three calls, each with its copies)",
    "seed004-t3-bn_relu-shared": (
        "not the same operator: the paper's BN+ReLU is the training-mode forward pass (batch mean and variance over "
        "N, H, W, reduced across the 8 cores through GSM, §2.1.3); ours is inference BN (folded scale and shift), one "
        "pass over the data"),
    "seed004-t3-conv1_policy-shared": (
        "0.80 ms of the 1.85 ms are the 8 per-core host copies of W (8 x the assumed 100 us per copy call, "
        "host_copy_overhead_us); without them the call is 1.05 ms, as published. The same per-call cost is what "
        "makes CONV3_RES's batch-independent 2.3 ms (Table 2), so the two tables are consistent only if the host cost "
        "of replicating W grows with W's bytes (147 KB for CONV3_RES, 512 B here), about 0.7 GB/s, half the copy-mode "
        "rate; seed 004 does not publish it. README, Fidelity"),
    "seed004-t3-conv1_value-shared": "as CONV1_POLICY shared mode",
}

NOT_SIMULATED = {
    "backward ms, copy -> shared, batch 96": "the simulators have no backward operators",
    "other published FT-M7032 conv efficiencies": "maxima over layer sets whose shapes we could not read (abstracts only)",
}


@dataclass
class Result:
    chip: str
    id: str
    what: str
    unit: str
    published: float
    simulated: float
    schedule: str

    @property
    def error(self) -> float:
        return (self.simulated - self.published) / self.published * 100

    @property
    def factor(self) -> float:
        return max(self.simulated / self.published, self.published / self.simulated)


def _published(row: dict) -> tuple[str, float]:
    for unit in ("ms", "value_tflops", "value_gflops"):
        if unit in row:
            return unit.replace("value_", ""), float(row[unit])
    raise KeyError(f"held-out row {row['what']!r} has no ms / value_tflops / value_gflops")


def run(only: set[str] | None = None, dsp_target: Target | None = None) -> list[Result]:
    out = []
    for rid, (row, sim, sched) in cases(dsp_target).items():
        if only is not None and rid not in only:
            continue
        unit, pub = _published(row)
        chip = next(c for c in CHIPS if row in held_out_rows(c))
        out.append(Result(chip, rid, row["what"], unit, pub, float(sim()), sched))
    return out


def mae(results: list[Result], chip: str) -> float:
    errs = [abs(r.error) for r in results if r.chip == chip]
    return sum(errs) / len(errs) if errs else float("nan")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--conv1-candidate", action="store_true",
                    help="also run the DSP cases with the CONV1 candidate fix (not shipped; README, Fidelity)")
    args = ap.parse_args(argv)
    results = run()
    if args.conv1_candidate:
        _candidate_report(results)
        return
    if args.json:
        for r in results:
            print(json.dumps({**dataclasses.asdict(r), "error_pct": r.error}))
        return
    for chip, target in CHIPS.items():
        rs = [r for r in results if r.chip == chip]
        print(f"\n{target} ({chip}): {len(rs)} held-out cases")
        print(f"{'case':<74} {'published':>10} {'simulated':>10} {'error %':>8}  schedule")
        for r in rs:
            flag = "  >2x" if r.factor > 2 else ""
            print(f"{r.what[:74]:<74} {r.published:>10.4g} {r.simulated:>10.4g} {r.error:>+8.1f}  {r.schedule}{flag}")
        print(f"MAE {mae(results, chip):.1f} %")
    off = [r for r in results if r.factor > 2 or r.id in CAUSES]
    if off:
        print("\nwritten causes (every case off by more than 2x has one):")
        for r in off:
            print(f"  {r.id} ({r.simulated / r.published:.2f}x): {CAUSES.get(r.id, 'NO CAUSE WRITTEN')}")
    missing = [r.id for r in results if r.factor > 2 and r.id not in CAUSES]
    print("\nheld-out rows not simulated:")
    for chip in CHIPS:
        for row in held_out_rows(chip):
            if row.get("id") not in cases():
                why = next((v for k, v in NOT_SIMULATED.items() if row["what"].startswith(k)), "no case written")
                print(f"  {row['what']}: {why}")
    if missing:
        sys.exit(f"cases off by more than 2x without a written cause: {', '.join(missing)}")


def _candidate_report(shipped: list[Result]) -> None:
    t, gbps = candidate_target()
    ids = {r.id for r in shipped if r.chip == "ft_m7032"}
    cand = {r.id: r for r in run(ids, t)}
    print(f"dsp-sim with the CONV1 candidate (W replication at {gbps:.2f} GB/s fitted to CONV3_RES b96, no per-call "
          "host cost); not shipped")
    print(f"{'case':<74} {'published':>10} {'shipped':>10} {'candidate':>10} {'error %':>8}")
    for r in shipped:
        if r.id in cand:
            c = cand[r.id]
            print(f"{r.what[:74]:<74} {r.published:>10.4g} {r.simulated:>10.4g} {c.simulated:>10.4g} {c.error:>+8.1f}")
    print(f"MAE shipped {mae(shipped, 'ft_m7032'):.1f} %, candidate {mae(list(cand.values()), 'ft_m7032'):.1f} %")
    be = get_backend(t)
    tc = dataclasses.replace(t, extra=MappingProxyType({**t.extra, "data_mode": "copy"}))
    for b in (96, 768):
        r = be.measure(be.build(workload("conv2d", preset="minigo.conv3_res", batch=b), "paper"))
        print(f"fit check: CONV3_RES b{b} {r.seconds * 1e3:.2f} ms, {r.metrics['percent_of_peak']:.1f} % of peak "
              f"(seed 004 Table 2: {'23.03' if b == 96 else '46.90'} %)")
    sh = be.measure(be.build(workload("conv2d", preset="minigo.conv3_res", batch=96), "paper")).seconds
    cp = get_backend(tc).measure(get_backend(tc).build(workload("conv2d", preset="minigo.conv3_res", batch=96), "paper")).seconds
    print(f"fit check: CONV3_RES copy/shared {cp / sh:.2f}x (seed 004: 4.19x)")


if __name__ == "__main__":
    main()
