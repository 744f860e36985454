"""Hangs on the real-sshd test cluster: how fast the folded verdict comes, and what arming costs.

    python bench/bench_hangs.py [--reps 3] [--only verdict16,verdict64,stacks16,steptime]

Cases (numbers, never assertions; docs/benchmarks.md "Hangs"):

* ``verdict16`` / ``verdict64``: ``dtrain run --hang-timeout 3 --on-hang stop`` of
  tests/workloads/stall.py (torch-free ranks: the last one sleeps in ``load_batch``, every
  other waits in ``all_reduce``) on 16 nodes x 2 ranks and 64 nodes x 1 (nodes 5 and up:
  other sessions cut links on 1-4). Measured on dtrain's own console: from the ``HANG:``
  line (the hang declared) to the ``likely culprit:`` line (the folded verdict), and the
  dump's own ``took`` (request sent -> every node's answer) from meta.json. Goals: <= 3 s
  at 16 x 2, <= 10 s at 64 x 1.
* ``stacks16``: ``dtrain stacks RUN`` against a detached 16 x 2 run of the same workload:
  the command's wall time (its Python start included) and the dump's ``took``. Goal <= 2 s.
* ``steptime``: tests/workloads/steptime.py (gloo all_reduce of 1024 floats, median of 2000
  steps) on 2 nodes x 1 rank, interleaved rounds in rotated order: the armed dumper and the
  flight recorder (dtrain's default), ``DTRAIN_STACKS=0`` (no wrapper, flight recorder on),
  and both off (``DTRAIN_STACKS=0``, ``TORCH_FR_BUFFER_SIZE=0``): what each costs a step.
* ``armcost``: the same loop in one process (world size 1, a HashStore: no network, no
  ssh, ~25 us a step), plain ``python`` vs the rank wrapper armed (a listener stands in for
  the supervisor), each with the flight recorder off and at 2000 entries; 5000 steps a run,
  rotated rounds; median and minimum of the runs' medians.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from launcher.nodeside import wire  # noqa: E402
from tests import cluster as tc  # noqa: E402

PYTHON = sys.executable
STALL = str(REPO / "tests/workloads/stall.py")
STEPTIME = str(REPO / "tests/workloads/steptime.py")


def dtrain_cmd(cluster: tc.Cluster, hosts: str, nproc: int, archive: Path, run_id: str,
               *extra: str) -> list[str]:
    return [PYTHON, "-m", "launcher", "run", "-H", hosts, "--nproc-per-node", str(nproc),
            "--python", cluster.python, "--archive-dir", str(archive), "--run-id", run_id,
            "--no-color", "--no-preflight", "--start-timeout", "600", *extra]


def timed_lines(argv: list[str], env: dict[str, str],
                timeout: float) -> tuple[int, list[tuple[float, str]]]:
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)
    lines: list[tuple[float, str]] = []
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        lines.append((time.monotonic(), line.rstrip("\n")))
        if time.monotonic() > deadline:
            proc.kill()
    return proc.wait(), lines


def verdict(cluster: tc.Cluster, nodes: int, nproc: int, archive: Path) -> dict[str, object]:
    run_id = f"bench-hang-{uuid.uuid4().hex[:6]}"
    hosts = f"node[5-{4 + nodes}]"
    barrier = Path(tempfile.mkdtemp(prefix="stall-", dir=cluster.shared_dir))
    barrier.chmod(0o777)
    code, lines = timed_lines(dtrain_cmd(cluster, hosts, nproc, archive, run_id,
                                         "--hang-timeout", "3", "--on-hang", "stop",
                                         "--grace", "2", "-e", f"WL_BARRIER_DIR={barrier}",
                                         STALL),
                              cluster.client_env(PYTHONUNBUFFERED="1"), 900)
    hang = next((t for t, text in lines if text.startswith("dtrain: HANG:")), None)
    folded = next((t for t, text in lines if text.startswith("dtrain: likely culprit:")), None)
    meta = json.loads((archive / run_id / "meta.json").read_text())
    dump = (meta.get("stacks") or [{}])[0]
    culprit = (dump.get("culprit") or {})
    ok = code == 125 and culprit.get("rank") == nodes * nproc - 1
    if not ok:
        print("\n".join(text for _, text in lines if not text.startswith("dtrain:   node")),
              file=sys.stderr)
    return {"case": f"verdict {nodes}x{nproc}", "ok": ok, "exit": code,
            "declared_to_verdict_s": round(folded - hang, 3) if hang and folded else None,
            "dump_took_s": dump.get("took"), "ranks": nodes * nproc}


def stacks(cluster: tc.Cluster, nodes: int, nproc: int, archive: Path,
           reps: int) -> list[dict[str, object]]:
    run_id = f"bench-stacks-{uuid.uuid4().hex[:6]}"
    env = cluster.client_env(PYTHONUNBUFFERED="1")
    hosts = f"node[5-{4 + nodes}]"
    barrier = Path(tempfile.mkdtemp(prefix="stall-", dir=cluster.shared_dir))
    barrier.chmod(0o777)
    res = subprocess.run(dtrain_cmd(cluster, hosts, nproc, archive, run_id, "--detach",
                                    "--hang-timeout", "0", "--grace", "2", "-e",
                                    f"WL_BARRIER_DIR={barrier}", STALL),
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    out = []
    try:
        assert res.returncode == 0, res.stdout + res.stderr
        log = archive / run_id / "output.jsonl"
        deadline = time.monotonic() + 600
        while "step 0" not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline
            time.sleep(0.5)
        time.sleep(2)
        for _ in range(reps):
            t0 = time.monotonic()
            got = subprocess.run([PYTHON, "-m", "launcher", "stacks", run_id, "--archive-dir",
                                  str(archive)], cwd=REPO, env=env, capture_output=True,
                                 text=True, timeout=120)
            wall = time.monotonic() - t0
            took = re.search(r"stacks of (\d+) ranks in ([\d.]+) s", got.stdout)
            out.append({"case": f"dtrain stacks {nodes}x{nproc}", "ok": got.returncode == 0
                        and f"rank {nodes * nproc - 1}" in got.stdout, "wall_s": round(wall, 3),
                        "dump_took_s": float(took.group(2)) if took else None})
    finally:
        subprocess.run([PYTHON, "-m", "launcher", "stop", run_id, "--archive-dir",
                        str(archive)], cwd=REPO, env=env, capture_output=True, timeout=120)
    return out


STEP_VARIANTS = {
    "armed + flight recorder (default)": {},
    "DTRAIN_STACKS=0 (flight recorder on)": {"DTRAIN_STACKS": "0"},
    "both off": {"DTRAIN_STACKS": "0", "TORCH_FR_BUFFER_SIZE": "0"},
}


def steptime(cluster: tc.Cluster, archive: Path, reps: int) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {name: [] for name in STEP_VARIANTS}
    names = list(STEP_VARIANTS)
    for r in range(reps + 1):  # round 0: warm-up, not counted
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            extra: list[str] = []
            for k, v in STEP_VARIANTS[name].items():
                extra += ["-e", f"{k}={v}"]
            run_id = f"bench-step-{uuid.uuid4().hex[:6]}"
            res = subprocess.run(dtrain_cmd(cluster, "node[5-6]", 1, archive, run_id, *extra,
                                            STEPTIME), cwd=REPO,
                                 env=cluster.client_env(PYTHONUNBUFFERED="1"),
                                 capture_output=True, text=True, timeout=600)
            m = re.search(r"steptime median_us ([\d.]+)", res.stdout)
            if m and r > 0:
                results[name].append(float(m.group(1)))
            elif not m:
                print(res.stdout[-2000:], res.stderr[-2000:], file=sys.stderr)
    return results


ARM_SCRIPT = r"""
import os, statistics, time, torch, torch.distributed as dist
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
t, times = torch.ones(1024), []
for i in range(5500):
    s = time.perf_counter()
    dist.all_reduce(t)
    if i >= 500:
        times.append(time.perf_counter() - s)
print(f"median_us {statistics.median(times) * 1e6:.2f}", flush=True)
os._exit(0)
"""


def armcost(reps: int) -> dict[str, list[float]]:
    import socket
    import threading

    folder = Path(tempfile.mkdtemp(prefix="bench-arm-"))
    script = folder / "step.py"
    script.write_text(ARM_SCRIPT)
    sock_path = str(folder / "ranks.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(sock_path)
    listener.listen(64)
    held: list[object] = []

    def accept() -> None:  # stands in for the supervisor: keeps every rank's arm socket
        while True:
            held.append(listener.accept())

    threading.Thread(target=accept, daemon=True).start()
    shim = str(folder / "supervisor.py")  # the bundle the nodes get (wire.PROGRAMS)
    Path(shim).write_bytes(wire.program_source("supervisor"))
    armed = {"DTRAIN_ARM_SOCK": sock_path, "RANK": "0"}
    variants = {
        "plain, FR off": ([PYTHON, "-u", str(script)], {"TORCH_FR_BUFFER_SIZE": "0"}),
        "armed, FR off": ([PYTHON, "-u", shim, str(script)],
                          {"TORCH_FR_BUFFER_SIZE": "0", **armed}),
        "plain, FR 2000": ([PYTHON, "-u", str(script)], {"TORCH_FR_BUFFER_SIZE": "2000"}),
        "armed, FR 2000 (dtrain's default)": ([PYTHON, "-u", shim, str(script)],
                                              {"TORCH_FR_BUFFER_SIZE": "2000", **armed}),
    }
    names = list(variants)
    out: dict[str, list[float]] = {n: [] for n in names}
    for r in range(reps + 1):
        for name in names[r % len(names):] + names[:r % len(names)]:
            argv, env = variants[name]
            got = subprocess.run(argv, env={**os.environ, "OMP_NUM_THREADS": "1", **env},
                                 capture_output=True, text=True, timeout=300).stdout
            m = re.search(r"median_us ([\d.]+)", got)
            if m and r > 0:
                out[name].append(float(m.group(1)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", default="verdict16,verdict64,stacks16,steptime,armcost")
    ap.add_argument("--json")
    args = ap.parse_args()
    only = set(args.only.split(","))
    nodes = 68 if "verdict64" in only else 20
    cluster = tc.up(nodes)
    report: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="bench-hangs-") as tmp:
        archive = Path(tmp)
        rows = []
        for case, n, k in (("verdict16", 16, 2), ("verdict64", 64, 1)):
            if case in only:
                for _ in range(args.reps):
                    rows.append(verdict(cluster, n, k, archive))
                    print(rows[-1], flush=True)
        if "stacks16" in only:
            rows += stacks(cluster, 16, 2, archive, max(args.reps, 3))
            print(rows[-3:], flush=True)
        report["rows"] = rows
        if "steptime" in only:
            steps = steptime(cluster, archive, args.reps)
            report["steptime_us"] = steps
            base = statistics.median(steps["both off"]) if steps["both off"] else None
            print("\n| variant | median step (us) | vs both off |\n|---|---|---|")
            for name, values in steps.items():
                med = statistics.median(values) if values else float("nan")
                ratio = f"{med / base:.3f}" if base else "-"
                print(f"| {name} | {med:.1f} (runs: {', '.join(f'{v:.0f}' for v in values)})"
                      f" | {ratio} |")
    if "armcost" in only:
        arm = armcost(max(args.reps, 5))
        report["armcost_us"] = arm
        print("\n| in one process | median step (us) | min | runs |\n|---|---|---|---|")
        for name, values in arm.items():
            print(f"| {name} | {statistics.median(values):.2f} | {min(values):.2f} | "
                  f"{', '.join(f'{v:.1f}' for v in values)} |")
    print("\n| case | ok | declared -> verdict (s) | dump took (s) | wall (s) |")
    print("|---|---|---|---|---|")
    rows_out: list[dict[str, object]] = report.get("rows", [])  # type: ignore[assignment]
    for row in rows_out:
        print(f"| {row['case']} | {row['ok']} | {row.get('declared_to_verdict_s', '-')} | "
              f"{row.get('dump_took_s', '-')} | {row.get('wall_s', '-')} |")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
