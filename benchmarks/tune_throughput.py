"""Tuning throughput on the simulators: candidates measured per second (build + timing-mode
simulation, in worker processes) with 1 and 2 workers, and in-process for reference; then the
whole xgb loop (search + model + measurement + records) in trials per second.

The same random sample of check-valid configs is measured by every variant; worker start-up
is excluded (each pool is warmed on a few other configs first).

    python benchmarks/tune_throughput.py [--n 96] [--json]

`--rpc` measures remote measurement instead (issue 26), in one run: it starts a TVM tracker and
simulator servers on loopback (`python -m opcompiler.rpc --key ...`, subprocesses) and measures
candidates per second with 1 server and with 2 (one or two candidates in flight) on the same
sample of one op's configs, in alternating rounds. It prints the load average (`os.getloadavg`)
before and after: on a shared machine other processes' load is part of the figure.

    python benchmarks/tune_throughput.py --rpc [--n 64] [--rounds 3] [--target ascend-sim]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time

from opcompiler.ops import get_op, workload
from opcompiler.target import load_target
from opcompiler.template import get_template
from opcompiler.tune import tune
from opcompiler.tune.measure import BackendSpec, Measurer
from opcompiler.tune.space import Space

WORKLOADS = [("ascend-sim", "conv2d", "resnet50.res2_3x3", "float16"),
             ("ascend-sim", "matmul", "seed.matmul_16x256x1024", "float16"),
             ("dsp-sim", "conv2d", "minigo.conv3_res", "float32")]


def sample(space: Space, n: int, seed: int) -> list[dict]:
    rng, out, seen = random.Random(seed), [], set()
    for _ in range(100 * n):
        c = space.random(rng)
        cid = space.id(c)
        if cid not in seen and space.why_invalid(c) is None:
            seen.add(cid)
            out.append(c)
            if len(out) == n:
                break
    return out


RPC_WORKLOADS = {"ascend-sim": ("conv2d", "resnet50.res2_3x3", "float16"),
                 "dsp-sim": ("conv2d", "minigo.conv3_res", "float32")}
RPC_KEY = "opc-bench"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _free_servers(port: int) -> int:
    import tvm
    try:
        return tvm.rpc.connect_tracker("127.0.0.1", port).summary()["queue_info"].get(RPC_KEY, {}).get("free", 0)
    except Exception:
        return 0


def _start(cmd: list[str], log: str) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)


def rpc_main(args: argparse.Namespace) -> int:
    """1 vs 2 loopback simulator servers on one op: candidates per second, same configs. Both
    servers run throughout; "1 server" keeps one session (one candidate in flight), "2 servers"
    two. The two are measured in alternating rounds, so a change in other processes' load
    falls on both; the median round of each is reported."""
    import statistics

    from opcompiler.tune.remote import RemoteMeasurer
    tname = args.target
    op, preset, dtype = RPC_WORKLOADS.get(tname, RPC_WORKLOADS["ascend-sim"])
    target = load_target(tname)
    wl = workload(op, preset=preset, dtype=dtype)
    space = Space.of(wl, target, get_template(get_op(op).family, target.family))
    cfgs, warm = sample(space, args.n, 0), sample(space, 4, 1)
    tmp = tempfile.mkdtemp(prefix="opc_rpc_bench_")
    port = _free_port()
    spec = f"127.0.0.1:{port}:{RPC_KEY}"
    procs = [_start([sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(port),
                     "--port-end", str(port + 1)], f"{tmp}/tracker.log")]
    rates: dict[int, list[float]] = {1: [], 2: []}
    busy: dict[int, list[float]] = {1: [], 2: []}  # server-side seconds measuring / wall seconds
    per: dict[int, list[float]] = {1: [], 2: []}  # server-side seconds per candidate
    ok = {1: 0, 2: 0}
    try:
        deadline = time.time() + 60
        while True:  # servers started before the tracker listens would wait 5 s to retry
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.time() > deadline:
                    raise SystemExit(f"the tracker did not start; see {tmp}")
                time.sleep(0.2)
        for n in (1, 2):
            procs.append(_start([sys.executable, "-m", "opcompiler.rpc", "--tracker", f"127.0.0.1:{port}", "--key",
                                 RPC_KEY, "--target", tname, "--port", str(29700 + 50 * n),
                                 "--port-end", str(29749 + 50 * n)], f"{tmp}/server{n}.log"))
        deadline = time.time() + 120
        while _free_servers(port) < 2:
            if time.time() > deadline:
                raise SystemExit(f"servers did not register; see {tmp}")
            time.sleep(0.5)
        with Measurer(BackendSpec(target=target), workers=0) as m:  # reference: in this process, no RPC
            m.measure(wl, warm)
            t0 = time.perf_counter()
            m.measure(wl, cfgs)
            local = len(cfgs) / (time.perf_counter() - t0)
        load_before = os.getloadavg()
        for r in range(args.rounds):
            for n in (1, 2) if r % 2 == 0 else (2, 1):
                deadline = time.time() + 60
                while _free_servers(port) < 2:  # the last round's sessions have ended
                    if time.time() > deadline:
                        raise SystemExit(f"servers did not come back; see {tmp}")
                    time.sleep(0.2)
                m = RemoteMeasurer(target, spec, timeout=300, max_slots=n)
                try:
                    m.measure(wl, warm)  # sessions opened, the servers' measuring workers started
                    assert m.parallelism == n, m.stats
                    t0 = time.perf_counter()
                    res = m.measure(wl, cfgs)
                    wall = time.perf_counter() - t0
                    rates[n].append(len(cfgs) / wall)
                    busy[n].append(sum(x.elapsed for x in res) / wall)
                    per[n].append(statistics.median(x.elapsed for x in res))
                finally:
                    m.close()
                ok[n] = sum(x.status == "ok" for x in res)
                print(f"round {r + 1}: {n} server(s) {rates[n][-1]:.1f} candidates/s", file=sys.stderr)
        load_after = os.getloadavg()
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=30)
    med = {n: statistics.median(v) for n, v in rates.items()}
    ratios = [b / a for a, b in zip(rates[1], rates[2])]
    out = {"target": target.name, "workload": f"{op} {preset} {dtype}", "n": len(cfgs), "rounds": args.rounds,
           "cand/s": rates, "median_cand/s": med, "ratio_of_medians": med[2] / med[1], "ratio_per_round": ratios,
           "busy_servers": busy, "server_s_per_candidate": per, "ok": ok, "in_process_cand/s": local, "cpus": os.cpu_count(), "loadavg_before": load_before,
           "loadavg_after": load_after}
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"\nremote measurement on loopback, {target.name} {op} {preset} {dtype}: {len(cfgs)} random check-valid "
          f"configs per round, the same every round; {args.rounds} alternating rounds; {os.cpu_count()} CPUs")
    print(f"{'servers':>8}{'median cand/s':>15}{'busy servers':>14}{'ms/cand on server':>19}  cand/s per round")
    for n in (1, 2):
        print(f"{n:>8}{med[n]:>15.1f}{statistics.median(busy[n]):>14.2f}{statistics.median(per[n]) * 1e3:>19.1f}  "
              + " ".join(f"{v:.1f}" for v in rates[n]) + f"   ({ok[n]} ok)")
    print(f"2 servers / 1 server: {med[2] / med[1]:.2f}x (median rounds; per round "
          + " ".join(f"{x:.2f}x" for x in ratios) + f"); in this process, no RPC: {local:.1f} candidates/s")
    print("busy servers: the servers' measuring seconds over wall seconds (how many candidates were being measured "
          "at once); ms/cand on server: the median candidate's build + simulation, CPU contention included")
    print("load average (1, 5, 15 min) before: " + ", ".join(f"{v:.2f}" for v in load_before)
          + "; after: " + ", ".join(f"{v:.2f}" for v in load_after))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=96, help="candidates per variant")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--rpc", action="store_true", help="1 vs 2 loopback simulator servers instead (issue 26)")
    ap.add_argument("--target", default="ascend-sim", help="with --rpc: ascend-sim or dsp-sim")
    ap.add_argument("--rounds", type=int, default=3, help="with --rpc: alternating rounds per variant")
    args = ap.parse_args()
    if args.rpc:
        return rpc_main(args)
    rows = []
    for tname, op, preset, dtype in WORKLOADS:
        target = load_target(tname)
        wl = workload(op, preset=preset, dtype=dtype)
        space = Space.of(wl, target, get_template(get_op(op).family, target.family))
        cfgs, warm = sample(space, args.n, 0), sample(space, 4, 1)
        row = {"target": target.name, "workload": f"{op} {preset}", "n": len(cfgs)}
        for workers in (0, 1, 2):
            with Measurer(BackendSpec(target=target), workers=workers, timeout=300) as m:
                m.measure(wl, warm)
                t0 = time.perf_counter()
                res = m.measure(wl, cfgs)
                row[f"cand/s w{workers}"] = len(cfgs) / (time.perf_counter() - t0)
                row["ok"] = sum(r.status == "ok" for r in res)
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            r = tune(op, target, preset=preset, dtype=dtype, trials=args.n, workers=2, log=f"{tmp}/l.jsonl",
                     early_stop=0, verify=False, progress=False)
            row["xgb loop trials/s (2 workers, incl. start-up)"] = r.new_trials / (time.perf_counter() - t0)
        rows.append(row)
        print(row, file=sys.stderr)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"\ncandidates per second, {args.n} random check-valid configs each, same configs for every column")
    print(f"{'target':<18}{'workload':<34}{'in-process':>11}{'1 worker':>10}{'2 workers':>10}{'2w/1w':>7}"
          f"{'xgb loop':>10}")
    for r in rows:
        print(f"{r['target']:<18}{r['workload']:<34}{r['cand/s w0']:>11.1f}{r['cand/s w1']:>10.1f}"
              f"{r['cand/s w2']:>10.1f}{r['cand/s w2'] / r['cand/s w1']:>6.2f}x"
              f"{r['xgb loop trials/s (2 workers, incl. start-up)']:>10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
