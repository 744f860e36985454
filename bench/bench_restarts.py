"""`dtrain run --restarts` on the real-sshd test cluster (#28): what a relaunch costs.

    python bench/bench_restarts.py [--reps 3] [--only crash4,lost4,crash16,lost16]
                                   [--workload lite|torch] [--heartbeat-timeout 5]

Cases (numbers, never assertions; docs/benchmarks.md "Restarts"), N = 4 or 16 nodes from
node5 up (the test suite cuts links on node1-4), one rank per node:

* ``crashN``: rank 1 raises once (a flag file) after 7 steps: a process fault, the same N
  nodes again after the default back-off (1 s).
* ``lostN``: N+1 hosts, ``--nnodes N``; once rank 0's checkpoint file says step 10, the last
  active node's link is cut (``ip link set down`` on its veth, as the tests do): fenced after
  ``--heartbeat-timeout``, the spare comes in.

Each run gives, from its own meta.json ``attempts[]`` and output.jsonl (one clock: one box):

* **detected -> relaunched**: the failure known to dtrain (a lost node: when the heartbeat
  timeout ran out) to the next attempt's start; split into detected -> ended (the other
  nodes stopped, the verdict) and ended -> relaunched (the decision and the back-off).
  Goal <= 3 s. For ``lost``: also cut -> detected (bounded by --heartbeat-timeout).
* **relaunch -> first resumed rank line** (attempt 2's start to its first rank line) vs the
  **fresh start** of the same run (attempt 1's start to its first rank line: the same
  nodes for ``crash``; the same code path, connect + preflight + torchrun + the rank's
  first print). Goal: ratio <= 1.2. And dtrain's spawn to the first rank line on its
  console (the CLI's own start included), for reference.

Rounds are interleaved in rotated order (crash4, lost4, crash16, lost16, then one further
on); a warm-up run of each case is not counted; the median over --reps is reported.
``--workload lite`` (default) is tests/workloads/ckpt.py with CK_LITE=1: torch-free ranks,
since 16 torch imports on 2 cores would measure the imports; ``torch`` is the same script
without it (gloo; torchrun imports torch either way).
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.common import bench_parser, log, machine, revision, save_json, table, wait_quiet  # noqa: E402
from tests import cluster as tc  # noqa: E402

PYTHON = sys.executable
CKPT = str(REPO / "tests/workloads/ckpt.py")
WORKLOADS = {"lite": {"CK_LITE": "1"}, "torch": {}}  # the workload's extra environment


class Watched:
    """dtrain as a subprocess, its console lines with arrival times (monotonic)."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.t0 = time.monotonic()
        self.t0_wall = time.time()
        self.proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, bufsize=1)
        self.lines: list[tuple[float, str]] = []
        self.cond = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.cond:
                self.lines.append((time.monotonic(), line.rstrip("\n")))
                self.cond.notify_all()

    def wait_line(self, pattern: str, timeout: float) -> bool:
        rx = re.compile(pattern)
        with self.cond:
            return self.cond.wait_for(lambda: any(rx.search(t) for _, t in self.lines)
                                      or self.proc.poll() is not None, timeout) and \
                any(rx.search(t) for _, t in self.lines)

    def wait(self, timeout: float) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(10)
        self.reader.join(10)
        return code

    @property
    def text(self) -> str:
        with self.cond:
            return "\n".join(t for _, t in self.lines)


def checkpointed(ck: Path, step: int, job: Watched, timeout: float) -> bool:
    """Rank 0's checkpoint reached ``step`` (read from the file, not from the console, which
    lags under load)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and job.proc.poll() is None:
        try:
            if json.loads((ck / "ckpt.json").read_text())["step"] >= step:
                return True
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.05)
    return False


def one_run(cluster: tc.Cluster, case: str, nodes: int, first: int, archive: Path,
            workload: str, heartbeat: float) -> dict[str, Any]:
    lost = case.startswith("lost")
    run_id = f"bench-restart-{case}-{uuid.uuid4().hex[:6]}"
    last = first + nodes - 1 + (1 if lost else 0)
    hosts = f"node[{first}-{last}]"
    ck = Path(tempfile.mkdtemp(prefix="ck-", dir=cluster.shared_dir))
    ck.chmod(0o777)
    state = tempfile.mkdtemp(prefix="bench-state-")  # a lemon list of this run's own
    env = {"CK_DIR": str(ck), "CK_STEPS": "300" if lost else "14", "CK_STEP_SLEEP": "0.1",
           **WORKLOADS[workload]}
    if not lost:
        env["CK_CRASH_RANK"] = "1"
    argv = [PYTHON, "-m", "launcher", "run", "-H", hosts, "--nproc-per-node", "1",
            "--python", cluster.python, "--archive-dir", str(archive), "--run-id", run_id,
            "--no-color", "--restarts", "1", "--heartbeat-timeout", f"{heartbeat:g}",
            "--start-timeout", "600", "--sample-interval", "0"]
    if lost:
        argv += ["--nnodes", str(nodes)]
    for key, value in env.items():
        argv += ["-e", f"{key}={value}"]
    argv.append(CKPT)
    job = Watched(argv, cluster.client_env(PYTHONUNBUFFERED="1", XDG_STATE_HOME=state))
    cut_t = None
    cut = first + nodes - 1
    if lost:
        try:
            if checkpointed(ck, 10, job, 600):
                cluster.link_down(cut)
                cut_t = time.time()
                job.wait_line(r"fenced, spare node\d+ in", 120)
        finally:
            cluster.link_up(cut)
    code = job.wait(900)
    result: dict[str, Any] = {"case": case, "nodes": nodes, "exit": code, "ok": False}
    try:
        meta = json.loads((archive / run_id / "meta.json").read_text())
        records = [json.loads(x) for x in (archive / run_id / "output.jsonl").read_text()
                   .splitlines() if x.strip()]
    except (OSError, ValueError) as exc:
        result["problem"] = str(exc)
        return result
    attempts = meta.get("attempts") or []
    if code != 0 or len(attempts) != 2:
        result["problem"] = job.text[-3000:]
        return result
    a1, a2 = attempts

    def first_rank_line(n: int) -> float | None:
        ts = [r["t"] for r in records if r.get("rank") is not None
              and r.get("stream") == "out" and (r.get("attempt") or 1) == n]
        return min(ts) if ts else None

    f1, f2 = first_rank_line(1), first_rank_line(2)
    resumed = [r for r in records if (r.get("attempt") or 1) == 2
               and r["line"].startswith("resumed at step")]
    console_first = next((t for t, text in job.lines if re.match(r"\S+ r\d+: ", text)), None)
    decision = next((text for _, text in job.lines
                     if "attempt 2" in text and ("fenced" in text or "same nodes" in text)), "")
    result.update({
        "ok": bool(f1 and f2 and resumed),
        "detected_to_relaunched_s": a1["relaunched"] - a1["detected"],
        "detected_to_ended_s": a1["end"] - a1["detected"],
        "ended_to_relaunched_s": a1["relaunched"] - a1["end"],
        "cut_to_detected_s": (a1["detected"] - cut_t) if cut_t else None,
        "fresh_first_line_s": (f1 - a1["start"]) if f1 else None,
        "relaunch_first_line_s": (f2 - a2["start"]) if f2 else None,
        "spawn_to_console_first_line_s": (console_first - job.t0) if console_first else None,
        "decision": decision.removeprefix("dtrain: "),
        "hosts": [a1["hosts"], a2["hosts"]],
    })
    if result["fresh_first_line_s"] and result["relaunch_first_line_s"]:
        result["ratio"] = result["relaunch_first_line_s"] / result["fresh_first_line_s"]
    if lost:
        time.sleep(heartbeat + 2)  # the cut node's supervisor ends by its own heartbeat
    return result


CASES = {"crash4": 4, "lost4": 4, "crash16": 16, "lost16": 16}
KEYS = [("detected_to_relaunched_s", "detected -> relaunched"),
        ("detected_to_ended_s", "detected -> ended"),
        ("ended_to_relaunched_s", "ended -> relaunched"),
        ("cut_to_detected_s", "cut -> detected"),
        ("fresh_first_line_s", "fresh start -> 1st rank line"),
        ("relaunch_first_line_s", "relaunch -> 1st resumed line"),
        ("ratio", "relaunch / fresh"),
        ("spawn_to_console_first_line_s", "spawn -> 1st line (console)")]


def main() -> int:
    parser = bench_parser(__doc__, reps=3, only=",".join(CASES))
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="lite")
    parser.add_argument("--heartbeat-timeout", type=float, default=5.0)
    parser.add_argument("--no-warmup", action="store_true")
    args = parser.parse_args()
    cases = [c for c in args.only.split(",") if c]
    need = args.first_node + max(CASES[c] for c in cases)  # the spare of lostN included
    cluster = tc.up(need)
    archive = Path(tempfile.mkdtemp(prefix="bench-restarts-"))
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in cases}
    busy = 0
    rounds = args.reps + (0 if args.no_warmup else 1)
    for r in range(rounds):
        order = cases[r % len(cases):] + cases[:r % len(cases)]
        for case in order:
            if not wait_quiet(args.max_busy, args.patience):
                busy += 1
            log(f"round {r} {case} ...")
            res = one_run(cluster, case, CASES[case], args.first_node, archive, args.workload,
                          args.heartbeat_timeout)
            res["warmup"] = r == 0 and not args.no_warmup
            log(f"  {json.dumps({k: v for k, v in res.items() if k != 'problem'})}")
            if not res["ok"]:
                log(res.get("problem", ""))
            runs[case].append(res)
    rows = []
    for case in cases:
        good = [x for x in runs[case] if x["ok"] and not x["warmup"]]
        row = [case, f"{len(good)}/{len([x for x in runs[case] if not x['warmup']])}"]
        for key, _ in KEYS:
            vals = [x[key] for x in good if x.get(key) is not None]
            if not vals:
                row.append("-")
            elif key == "ratio":
                row.append(f"{statistics.median(vals):.2f}")
            else:
                row.append(f"{statistics.median(vals):.2f} s ({min(vals):.2f}-{max(vals):.2f})")
        rows.append(row)
    print(f"\n{machine()}\n{revision()}; workload {args.workload}, --heartbeat-timeout "
          f"{args.heartbeat_timeout:g} s, back-off 1 s (default); {busy} run(s) started on "
          f"a busy machine\n")
    print(table(["case", "ok runs", *[name for _, name in KEYS]], rows))
    for case in cases:
        lines = {x["decision"] for x in runs[case] if x.get("decision")}
        for line in sorted(lines)[:1]:
            print(f"\n{case}: `{line}`")
    save_json(args.json, {"runs": runs, "workload": args.workload,
                          "heartbeat_timeout": args.heartbeat_timeout})
    return 0 if all(x["ok"] for c in cases for x in runs[c]) else 1


if __name__ == "__main__":
    sys.exit(main())
