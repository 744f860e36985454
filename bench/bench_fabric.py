"""Issue 36's measurements (docs/fabric.md), never asserted in tests:

* pairs: `smoke --pairs` rounds at 4..32 nodes, and whether a slow node is named from
  them wherever it sits (the goal: 16 nodes in <= 5 rounds);
* poll: the supervisor's NcclFiles.poll over 16 ranks' NCCL files (INIT,NET: ~40 lines
  each; and the 256 KiB cap), in ms per poll (it runs every 0.5 s, after the ranks start);
* first-line (the cluster): the time from `dtrain run` to the first rank line with NCCL's
  account asked for (the default) against without it (the user's own NCCL_DEBUG=WARN),
  interleaved rounds, medians (the goal: <= 0.1 s added);
* health (the cluster): `doctor --health` at 16 nodes without DCGM (the goal: <= 2 s), the
  wall time of the command and the document's elapsed_s, medians; --health-interval 1 (the
  default: the port counters' two readings 1 s apart) and 0.2.

    python bench/bench_fabric.py [--reps 5] [--only pairs,poll,first-line,health]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from launcher.decide import smoke as sm  # noqa: E402
from launcher.nodeside.nodeevidence import NcclFiles  # noqa: E402


def bench_pairs() -> None:
    print("| nodes | rounds (--pairs) | rounds (default) | slow node named |")
    print("|---|---|---|---|")
    for n in (4, 8, 12, 16, 24, 32):
        named = 0
        labels = [f"n{i}" for i in range(n)]
        for bad in range(n):
            res = sm.SmokeResults(layout={i: labels[i] for i in range(n)}, nodes=labels)
            for a, b in (p for rnd in sm.log_rounds(n) for p in rnd):
                res.pairs.append({"a": a, "b": b, "size": 1 << 24, "time_us": 1.0,
                                  "gbps": 0.05 if bad in (a, b) else 10.0})
            pairs, best = sm.pair_results(res, labels, 0.25)
            fails = sm.slow_failures(pairs, best, 0.25)
            named += [f.hosts for f in fails] == [(labels[bad],)]
        print(f"| {n} | {len(sm.log_rounds(n))} | {len(sm.pair_schedule(n, False))} "
              f"| {named}/{n} |")


LINE = ("node1:{pid}:{tid} [0] NCCL INFO Channel {c:02d}/0 : 0[0] -> 8[0] [send] via "
        "NET/IB/0/GDRDMA\n")


def bench_poll(reps: int) -> None:
    for label, lines in (("16 ranks x 40 lines", 40), ("16 ranks x 256 KiB cap", 4000)):
        times = []
        for _ in range(reps):
            with tempfile.TemporaryDirectory() as d:
                for pid in range(100, 116):
                    with open(os.path.join(d, f"nccl.node1.{pid}.log"), "w") as f:
                        f.write("".join(LINE.format(pid=pid, tid=pid + 1, c=c % 32)
                                        for c in range(lines)))
                files = NcclFiles(d)
                t0 = time.perf_counter()
                files.poll(set(range(100, 116)))
                first = time.perf_counter() - t0
                t0 = time.perf_counter()
                files.poll(set(range(100, 116)))  # nothing new: the steady cost
                idle = time.perf_counter() - t0
                times.append((first, idle))
        print(f"poll, {label}: first {statistics.median(t[0] for t in times) * 1e3:.2f} ms, "
              f"then {statistics.median(t[1] for t in times) * 1e3:.3f} ms per poll")


def first_line(extra: list[str]) -> float:
    from tests import cluster as test_cluster

    c = test_cluster.up(4)
    argv = [sys.executable, "-m", "launcher", "run", "-H", "node[1-2]", "--python", c.python,
            "--nproc-per-node", "2", "--no-preflight", "--archive-dir",
            tempfile.mkdtemp(prefix="bench-fabric-"), *extra,
            "tests/workloads/nccl_info.py", "--sleep", "0"]
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=REPO, env=c.client_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    first = None
    assert proc.stdout is not None
    for line in proc.stdout:
        if first is None and " started" in line and " r" in line:
            first = time.monotonic() - t0
    proc.wait()
    if first is None:
        raise SystemExit(f"no rank line from {argv}")
    return first


def bench_first_line(reps: int) -> None:
    on: list[float] = []
    off: list[float] = []
    first_line([])  # warm-up
    for r in range(reps):
        order = [(on, []), (off, ["--env", "NCCL_DEBUG=WARN"])]
        for series, extra in order if r % 2 == 0 else order[::-1]:
            series.append(first_line(extra))
    print("asked:", " ".join(f"{x:.2f}" for x in on), "/ not asked:",
          " ".join(f"{x:.2f}" for x in off))
    a, b = statistics.median(on), statistics.median(off)
    print(f"first rank line: NCCL's account asked {a:.3f} s, not asked {b:.3f} s "
          f"(medians of {reps}, interleaved): {a - b:+.3f} s")


def bench_health(reps: int) -> None:
    import json

    from tests import cluster as test_cluster

    c = test_cluster.up(16)
    state = tempfile.mkdtemp(prefix="bench-health-")
    # cold (a new SSH connection per node, as a first command), then warm: --persist's
    # connection keeper (docs/connections.md) holds them, as for a second command
    for interval, persist in (("1", ()), ("0.2", ()), ("1", ("--persist", "10m"))):
        walls, inner = [], []
        for r in range(reps + 1):
            argv = [sys.executable, "-m", "launcher", "doctor", "--health", "--json",
                    "-H", "node[1-16]", "--python", c.python, "--health-interval", interval,
                    *persist]
            t0 = time.monotonic()
            res = subprocess.run(argv, cwd=REPO, env=c.client_env(DTRAIN_STATE_DIR=state),
                                 capture_output=True, text=True, check=False)
            wall = time.monotonic() - t0
            if res.returncode not in (0, 1):
                raise SystemExit(f"doctor --health: exit {res.returncode}: {res.stderr[-800:]}")
            doc = json.loads(res.stdout)
            if r:  # round 0: warm-up (the nodes' compiled-code cache)
                walls.append(wall)
                inner.append(doc["elapsed_s"])
        print(f"doctor --health, 16 nodes, --health-interval {interval}"
              f"{' (warm: --persist)' if persist else ''}: wall "
              f"{statistics.median(walls):.2f} s (runs {' '.join(f'{w:.2f}' for w in walls)}), "
              f"connect to verdict {statistics.median(inner):.2f} s; counts {doc['counts']}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--only", default="pairs,poll,first-line,health")
    args = ap.parse_args()
    only = args.only.split(",")
    if "pairs" in only:
        bench_pairs()
    if "poll" in only:
        bench_poll(args.reps)
    if "first-line" in only:
        bench_first_line(args.reps)
    if "health" in only:
        bench_health(args.reps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
