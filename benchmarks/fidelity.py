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
    unit the figure is about (M or V pipe), times the 32 cores at 1 GHz (`--aibench-readings`
    prints the other readings the abstract leaves open).
Best-case rows (`compare`: max / range / upper-bound; Xu et al. 2024 and Wang et al. 2023, J.
NUDT, abstracts) give a maximum or a range over layer sets the abstracts do not list: they are
set against the simulator's best or range over ResNet-50's convolutions (batch 1, NHWC) with the
template's default schedule, DSP-side cycles, and kept out of the case-by-case MAE.
No case uses a tuned schedule. Cases off by more than 2x carry a written cause (CAUSES,
BEST_CASE_CAUSES); rows that cannot be simulated say why (NOT_SIMULATED).

    python benchmarks/fidelity.py                     # the tables (about 15 s)
    python benchmarks/fidelity.py --json              # one JSON object per case
    python benchmarks/fidelity.py --aibench-readings  # AIBench under each open reading (about 7 s)
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import dataclass
from typing import Callable

from opcompiler.backend import get_backend
from opcompiler.calibration import figure, held_out_rows
from opcompiler.ops import PRESETS, get_op, preset_params, workload
from opcompiler.target import Target, load_target, with_figures
from opcompiler.workload import Workload

CHIPS = {"ascend910": "ascend-sim", "ft_m7032": "dsp-sim"}


# --- the cases -----------------------------------------------------------------------------------

def _dsp_call_ms(op: str, shape: str, batch: int, mode: str, target: Target | None = None) -> float:
    t = target or load_target("dsp-sim")
    if mode != "shared":
        t = with_figures(t, {"extra.data_mode": mode}, mode)
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
    """The CONV1 candidate fix (docs/fidelity.md), not shipped: the host's per-core copies of W
    cost their bytes at a rate of their own and no fixed per-call cost (host_copy_overhead_us = 0
    too); the rate is fitted, like the shipped figures, to CONV3_RES at batch 96 (4.02 ms, a
    `fit` row), so CONV3_RES stays where it is. Returns (target, fitted GB/s)."""
    base = load_target("dsp-sim")
    pub_ms = figure("ft_m7032", "forward ms, copy mode", use="fit")["conv3_res"][1]

    def variant(gbps: float) -> Target:
        return with_figures(base, {"extra.host_copy_overhead_us": 0.0, "extra.host_replicate_gbps": gbps,
                                   "extra.host_replicate_overhead_us": 0.0}, f"conv1-candidate-{gbps:.6g}")

    free = _dsp_call_ms("conv2d", "minigo.conv3_res", 96, "shared", variant(1e9))  # replication ~ free
    w_bytes = 3 * 3 * 64 * 64 * 4 * base.cores  # W of CONV3_RES, one copy per core
    gbps = w_bytes / ((pub_ms - free) * 1e-3) / 1e9
    return variant(gbps), gbps


def _ascend_machine(target: Target | None = None):
    from opcompiler.backend.ascend.machine import _machine
    t = target or load_target("ascend-sim")
    return t, _machine(t)


def aibench_cube(m1: int, k1: int, n1: int, loops: int = 100, target: Target | None = None) -> tuple[float, float]:
    """AIBench's L1-resident matmul loop (operator_generate/矩阵matmul相关测试generate): per
    iteration two tik.matmul calls of (m1*16) x (k1*16) x (n1*16) on the same L1 operands, the
    second accumulating. On the 910 a tik.matmul is Load2D A and B (L1 -> L0A / L0B) and one MMAD.
    Returns the fraction of one core's cube peak (per busy cube cycle, per cycle of the whole loop)."""
    from opcompiler.backend.ascend import KernelBuilder
    from opcompiler.backend.ascend.timing import schedule
    t, m = _ascend_machine(target)
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
    peak = t.peak_flops_per_cycle["float16"]
    return flops / timing.busy["M"] / peak, flops / timing.cycles / peak


def aibench_vector(repeat: int, loops: int = 100, target: Target | None = None) -> tuple[float, float]:
    """AIBench's vector loop (operator_generate/vector_workload_generate.py): per iteration two
    GM -> UB moves of `repeat` x 256 B, one fp16 vec_mul of `repeat` repeats (128 lanes), one
    UB -> GM move. Returns the fraction of one core's 128 fp16 lanes (per busy vector cycle, per
    cycle of the whole loop)."""
    from opcompiler.backend.ascend import KernelBuilder
    from opcompiler.backend.ascend.program import VOp
    from opcompiler.backend.ascend.timing import schedule
    t, m = _ascend_machine(target)
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
    return flops / timing.busy["V"] / 128, flops / timing.cycles / 128


CUBE_SWEEP = tuple((mm, kk, nn) for mm in (2, 4, 8, 10) for kk in (2, 4, 8, 10) for nn in (2, 4, 8, 10))
VECTOR_SWEEP = (8, 32, 64, 128, 255)


def _chip(t: Target, dtype: str, cores: int | None = None) -> float:
    """The chip's peak in FLOP/s with `cores` cores (the target's by default)."""
    return t.peak_flops_per_cycle[dtype] * (cores or t.cores) * t.clock_ghz * 1e9


def _aibench_cube_best() -> float:
    t = load_target("ascend-sim")
    return max(aibench_cube(*s)[0] for s in CUBE_SWEEP) * _chip(t, "float16") / 1e12


def _aibench_vector_best() -> float:
    t = load_target("ascend-sim")
    return max(aibench_vector(r)[0] for r in VECTOR_SWEEP) * 128 * t.cores * t.clock_ghz


def aibench_readings() -> list[tuple[str, float, float]]:
    """The AIBench figures under the readings their abstract leaves open: per busy unit cycle (the
    shipped case) or per cycle of the whole loop (a profiler's kernel time); 32 cores (the 910A,
    our target) or 30 (the workload generators launch block_num=30). (reading, TFLOPS or GFLOPS,
    error % against the published figure)."""
    t = load_target("ascend-sim")
    cube = [aibench_cube(*s) for s in CUBE_SWEEP]
    vec = [aibench_vector(r) for r in VECTOR_SWEEP]
    pc = figure("ascend910", "AIBench: matrix-unit", use="held-out")["value_tflops"]
    pv = figure("ascend910", "AIBench: vector-unit", use="held-out")["value_gflops"]
    out = []
    for cores in (32, 30):
        for name, frac in (("per busy cube cycle", max(c[0] for c in cube)),
                           ("per whole-loop cycle", max(c[1] for c in cube))):
            v = frac * _chip(t, "float16", cores) / 1e12
            out.append((f"cube TFLOPS, {cores} cores, {name}", v, (v - pc) / pc * 100))
        for name, frac in (("per busy vector cycle", max(v[0] for v in vec)),
                           ("per whole-loop cycle", max(v[1] for v in vec))):
            v = frac * 128 * cores * t.clock_ghz
            out.append((f"vector GFLOPS, {cores} cores, {name}", v, (v - pv) / pv * 100))
    return out


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


# --- best-case rows ---------------------------------------------------------------------------------
# Held-out rows whose document gives only a maximum or a range over a layer set it lists in a part we
# could not read (an abstract): `compare` is "max", "range" or "upper-bound". They are set against
# the simulator's best (or range) over a layer set named here, with the template's default schedule
# (no tuned records exist for these NHWC shapes), and reported apart from the case-by-case MAE.

RESNET50_CONVS = tuple(k for k in PRESETS if k.startswith("resnet50.") and "r" in PRESETS[k])
BEST_CASE_SET = "ResNet-50's 16 convolution layers (resnet50.* presets), batch 1, NHWC"


def _nhwc(preset: str, batch: int = 1) -> Workload:
    """A ResNet-50 convolution in NHWC (the layout of seed 004 and the FT-M7032 convolution
    papers). In NCHW the template adds a layout change done by one core, which dominates at batch 1."""
    return workload("conv2d", {**preset_params(preset), "layout": "NHWC", "n": batch}, dtype="float32")


def _one_core(t: Target) -> Target:
    return with_figures(t, {"target.cores": 1}, "1core")


def _dsp_side(t: Target, wl: Workload, config: dict | None = None) -> tuple[float, int]:
    """(FLOPs over the DSP-side cycles times the cores' fp32 peak, DSP-side cycles): the host's
    launch and copies are left out, as a kernel-level "computing efficiency" leaves them out."""
    be = get_backend(t)
    cyc = be.measure(be.build(wl, config)).metrics["dsp_cycles"]
    return get_op(wl.op).flops(wl) / (cyc * t.peak_flops_per_cycle["float32"] * t.cores), cyc


def direct_conv_sweep(target: Target | None = None) -> dict[str, tuple[float, float, float]]:
    """preset -> (one-core efficiency, 8-core efficiency, 8-core scaling efficiency), the direct
    convolution template's default schedule, DSP-side cycles."""
    t8 = target or load_target("dsp-sim")
    t1 = _one_core(t8)
    out = {}
    for p in RESNET50_CONVS:
        wl = _nhwc(p)
        e1, c1 = _dsp_side(t1, wl)
        e8, c8 = _dsp_side(t8, wl)
        out[p] = (e1 * 100, e8 * 100, c1 / c8 / t8.cores * 100)
    return out


def im2col_gemm_sweep(target: Target | None = None) -> dict[str, float]:
    """preset -> 8-core efficiency of the GEMM alone of an explicit im2col convolution
    (M = output pixels, K = C*R*S, N = output channels), the matmul template's default, DSP side."""
    t = target or load_target("dsp-sim")
    out = {}
    for p in RESNET50_CONVS:
        q = preset_params(p)
        ho = (q["h"] + 2 * q.get("pad", 0) - q["r"]) // q.get("stride", 1) + 1
        wo = (q["w"] + 2 * q.get("pad", 0) - q["s"]) // q.get("stride", 1) + 1
        wl = workload("matmul", {"m": ho * wo, "k": q["c"] * q["r"] * q["s"], "n": q["k"]}, dtype="float32")
        out[p] = _dsp_side(t, wl)[0] * 100
    return out


@dataclass
class BoundResult:
    chip: str
    id: str
    what: str
    compare: str  # max | range | upper-bound
    published: tuple[float, ...]
    simulated: tuple[float, ...]
    where: tuple[str, ...]  # the layer(s) the simulated figure(s) come from
    schedule: str

    @property
    def errors(self) -> tuple[float, ...]:
        """Error of each published figure (a range has two); none for a one-sided check."""
        if self.compare == "upper-bound":
            return ()
        return tuple((s - p) / p * 100 for s, p in zip(self.simulated, self.published))

    @property
    def factor(self) -> float:
        if self.compare == "upper-bound":
            return 1.0 if self.ok else self.published[0] / self.simulated[0]
        return max(max(s / p, p / s) for s, p in zip(self.simulated, self.published))

    @property
    def ok(self) -> bool:
        """upper-bound: the simulated part alone reaches the published whole."""
        return self.compare != "upper-bound" or self.simulated[0] >= self.published[0]


BEST_CASE_SCHEDULE = {
    "xu2024-direct-1core-max": "direct-conv template default, 1 core, DSP side; best of " + BEST_CASE_SET,
    "xu2024-direct-8core-scaling": "direct-conv template default, 1 vs 8 cores, DSP side; range over " + BEST_CASE_SET,
    "wang2023-ftmeconv-max": "matmul template default (GEMM of the im2col shapes only), 8 cores, DSP side; best of "
                             + BEST_CASE_SET,
}


def run_best_cases(target: Target | None = None) -> list[BoundResult]:
    out = []
    rows = {r["id"]: r for r in held_out_rows("ft_m7032") if r.get("compare")}
    direct = direct_conv_sweep(target) if {"xu2024-direct-1core-max", "xu2024-direct-8core-scaling"} & set(rows) else {}
    for rid, row in rows.items():
        if rid == "xu2024-direct-1core-max":
            best = max(direct, key=lambda p: direct[p][0])
            sim, where = (direct[best][0],), (best,)
        elif rid == "xu2024-direct-8core-scaling":
            lo = min(direct, key=lambda p: direct[p][2])
            hi = max(direct, key=lambda p: direct[p][2])
            sim, where = (direct[lo][2], direct[hi][2]), (lo, hi)
        elif rid == "wang2023-ftmeconv-max":
            gemm = im2col_gemm_sweep(target)
            best = max(gemm, key=gemm.get)
            sim, where = (gemm[best],), (best,)
        else:
            continue
        pub = tuple(row["percent_of_peak_range"]) if "percent_of_peak_range" in row else (row["percent_of_peak"],)
        out.append(BoundResult("ft_m7032", rid, row["what"], row["compare"], pub, sim, where, BEST_CASE_SCHEDULE[rid]))
    return out


def mae_with_best_cases(results: list[Result], bounds: list[BoundResult], chip: str) -> float:
    """The MAE over the per-case errors and every published figure of the best-case rows (a range's
    two ends count as two); one-sided checks are left out."""
    errs = [abs(r.error) for r in results if r.chip == chip]
    errs += [abs(e) for b in bounds if b.chip == chip for e in b.errors]
    return sum(errs) / len(errs) if errs else float("nan")


# Written causes for cases off by more than 2x (and for the known large misses); docs/fidelity.md
# carries the same text.
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
        "rate; seed 004 does not publish it. docs/fidelity.md"),
    "seed004-t3-conv1_value-shared": "as CONV1_POLICY shared mode",
}

NOT_SIMULATED = {
    "backward ms, copy -> shared, batch 96": "the simulators have no backward operators",
}

# Written causes for the best-case rows (a figure off by more than 2x needs one; the others say what
# the gap means). docs/fidelity.md carries the same text.
BEST_CASE_CAUSES = {
    "xu2024-direct-1core-max": (
        "1.41x, optimistic: the simulator's best layer (conv1, 7x7, C=3 -> 64, vectorized over the 64 output channels) "
        "keeps one core's FMACs 92 % busy; the paper's best layer reached 64.95 %. The core model list-schedules each "
        "micro-kernel on the issue slots (3 FMAC, 2 vector load/store, 1 vector ALU, scalar loads) with latencies, "
        "register dependencies and register capacity, and charges a branch only at the micro-kernel's exit; it has "
        "no AM- or register-bank conflicts and no packing rule beyond slot counts. Which of these the paper's "
        "kernel pays is in its body. Not a 2x miss; it says the per-core model is about 1.4x "
        "optimistic at its best"),
    "xu2024-direct-8core-scaling": (
        "the top of the range matches (87.3 vs 88.52 %, res2_3x3); the bottom is 2.2x low: res5_1x1b (7x7 output, "
        "512 -> 2048, 4 MB of fp32 weights for 0.10 GFLOP) at batch 1 is DDR-bound on 8 cores in the model, 7.8 MB "
        "over the calibrated 42.7 GB/s (329k cycles), plus the weights broadcast GSM -> AM to every core (37.7 MB "
        "through GSM, 221k cycles; the 8-core kernel takes about their sum, 571k), against 1.0M compute-bound cycles "
        "on one core: 3.1x faster at best, not 8x. The template splits cores over (image, row block) "
        "items only, so every core needs all of W; the paper splits 1x1 convolutions at the feature-map level. Its "
        "layer set and batch are unpublished in the abstract; its 48.36 % low end is 'when the bandwidth is "
        "limited', so either its worst layer carries fewer weight bytes per FLOP than res5_1x1b at batch 1, or the "
        "cluster's DDR bandwidth (assumed, calibrated to seed 004 Table 2) is higher than 42.7 GB/s"),
    "wang2023-ftmeconv-max": (
        "one-sided: the GEMM alone of the im2col convolution (68.0 % at best: res3_3x3s2 and res3_3x3 share the GEMM "
        "M=784, K=1152, N=128) reaches the paper's whole "
        "four-part convolution (42.90 %), as it must; the three transforms are not simulated"),
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
                    help="also run the DSP cases with the CONV1 candidate fix (not shipped; docs/fidelity.md)")
    ap.add_argument("--aibench-readings", action="store_true",
                    help="the AIBench figures under each reading their abstract leaves open (docs/fidelity.md)")
    args = ap.parse_args(argv)
    if args.aibench_readings:
        for name, v, err in aibench_readings():
            print(f"{name:<62} {v:>8.1f} {err:>+7.1f} %")
        return
    results = run()
    if args.conv1_candidate:
        _candidate_report(results)
        return
    bounds = run_best_cases()
    if args.json:
        for r in results:
            print(json.dumps({**dataclasses.asdict(r), "error_pct": r.error}))
        for b in bounds:
            print(json.dumps({**dataclasses.asdict(b), "error_pct": b.errors, "ok": b.ok}))
        return
    for chip, target in CHIPS.items():
        rs = [r for r in results if r.chip == chip]
        print(f"\n{target} ({chip}): {len(rs)} held-out cases")
        print(f"{'case':<74} {'published':>10} {'simulated':>10} {'error %':>8}  schedule")
        for r in rs:
            flag = "  >2x" if r.factor > 2 else ""
            print(f"{r.what[:74]:<74} {r.published:>10.4g} {r.simulated:>10.4g} {r.error:>+8.1f}  {r.schedule}{flag}")
        print(f"MAE {mae(results, chip):.1f} %")
        bs = [b for b in bounds if b.chip == chip]
        if bs:
            print(f"\n{target} best-case rows (maxima or ranges over unpublished layer sets; percent of peak)")
            print(f"{'row':<74} {'published':>13} {'simulated':>13} {'error %':>13}  simulated on")
            for b in bs:
                pub = " - ".join(f"{v:.4g}" for v in b.published)
                sim = " - ".join(f"{v:.4g}" for v in b.simulated)
                err = " / ".join(f"{e:+.1f}" for e in b.errors) or ("ok (>=)" if b.ok else "FAILS (<)")
                flag = "  >2x" if b.factor > 2 else ""
                print(f"{b.what[:74]:<74} {pub:>13} {sim:>13} {err:>13}  {', '.join(b.where)}; {b.schedule}{flag}")
            print(f"MAE with the best-case figures {mae_with_best_cases(results, bounds, chip):.1f} % "
                  f"(per-case {mae(results, chip):.1f} %)")
    off = [r for r in results if r.factor > 2 or r.id in CAUSES]
    if off:
        print("\nwritten causes (every case off by more than 2x has one):")
        for r in off:
            print(f"  {r.id} ({r.simulated / r.published:.2f}x): {CAUSES.get(r.id, 'NO CAUSE WRITTEN')}")
    for b in bounds:
        print(f"  {b.id}: {BEST_CASE_CAUSES.get(b.id, 'NO CAUSE WRITTEN')}")
    missing = [r.id for r in results if r.factor > 2 and r.id not in CAUSES]
    missing += [b.id for b in bounds if (b.factor > 2 or not b.ok) and b.id not in BEST_CASE_CAUSES]
    print("\nheld-out rows not simulated:")
    simulated = set(cases()) | {b.id for b in bounds}
    for chip in CHIPS:
        for row in held_out_rows(chip):
            if row.get("id") not in simulated:
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
    tc = with_figures(t, {"extra.data_mode": "copy"}, "copy")
    for b in (96, 768):
        r = be.measure(be.build(workload("conv2d", preset="minigo.conv3_res", batch=b), "paper"))
        print(f"fit check: CONV3_RES b{b} {r.seconds * 1e3:.2f} ms, {r.metrics['percent_of_peak']:.1f} % of peak "
              f"(seed 004 Table 2: {'23.03' if b == 96 else '46.90'} %)")
    sh = be.measure(be.build(workload("conv2d", preset="minigo.conv3_res", batch=96), "paper")).seconds
    cp = get_backend(tc).measure(get_backend(tc).build(workload("conv2d", preset="minigo.conv3_res", batch=96), "paper")).seconds
    print(f"fit check: CONV3_RES copy/shared {cp / sh:.2f}x (seed 004: 4.19x)")


if __name__ == "__main__":
    main()
