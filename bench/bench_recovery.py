"""Where start-up goes, fresh and after a relaunch (issue 52 step 1; docs/goodput.md).

    python bench/bench_recovery.py [--nodes 8] [--nproc-per-node 2] [--first-node 1]
                                   [--kill-after 5] [--steps 30] [--json FILE]
                                   [--modes cold,warm] [--run-args "ARGS"] [--reps N]

One `dtrain run --restarts 1` of examples/train_ckpt.py (a tiny DDP model over gloo, a
checkpoint every 5 steps in the cluster's shared directory) on N nodes of the real-sshd
test cluster, ``--nproc-per-node`` ranks each. Once rank 0 printed ``step K``
(``--kill-after``), the last node's last rank is SIGKILLed (found by its process title,
``dtrain rank R examples/train_ckpt.py ... <this run's checkpoint dir>``, and killed by its
pid): a process fault, so the same nodes are relaunched and resume from the checkpoint.

Printed (stdout, JSON): per attempt its ledger ``startup`` and the split (docs/goodput.md,
"Where start-up goes": connect_probe, agent_start, rendezvous, rank_start, script, unsplit)
of the reference rank's node, the per-node split, and the slowest node per part. From the
run's own meta.json ``goodput``: numbers, never assertions. The nodes must exist (``python
-m tests.cluster up --nodes N``): the bench never grows or shrinks the shared cluster.

``--modes cold,warm`` (issue 52 step 2, docs/warm-start.md) runs each repetition once per
mode, interleaved (cold, warm, cold, warm ...): ``cold`` adds ``--no-preload`` (every rank a
fresh interpreter), ``warm`` adds ``--preload torch`` (ranks forked from the node's warm
interpreter); ``--run-args`` adds its words (shlex) to every run. ``by_mode`` then holds, per
mode and attempt, the median and the range of the start-up and of each part.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.bench_restarts import Watched  # noqa: E402
from bench.common import bench_parser, log, machine, revision, save_json  # noqa: E402
from tests import cluster as tc  # noqa: E402

PYTHON = sys.executable
SCRIPT = "examples/train_ckpt.py"
PARTS = ("connect_probe", "agent_start", "rendezvous", "rank_start", "script", "unsplit")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            "utf-8", "replace")
    except OSError:
        return ""


def rank_pid(cluster: tc.Cluster, node: int, rank: int, ckpt: Path) -> int | None:
    """The rank process itself (not its shim) of this run on node ``node``."""
    for pid in cluster.node_pids(node, match=f"dtrain rank {rank} "):
        line = _cmdline(pid)
        if "shim:" not in line and str(ckpt) in line:
            return pid
    return None


def summary(meta: dict[str, Any]) -> dict[str, Any]:
    g = meta.get("goodput") or {}
    out: dict[str, Any] = {"wall_s": g.get("wall_s"), "goodput": g.get("goodput"),
                           "startup_s": (g.get("seconds") or {}).get("startup"),
                           "startup_split": g.get("startup_split"), "attempts": []}
    for a in g.get("attempts") or []:
        split = a.get("startup_split") or {}
        nodes = split.get("nodes") or {}
        slowest = {p: max(((h, v[p]) for h, v in nodes.items() if v.get(p) is not None),
                          key=lambda hv: hv[1], default=(None, None)) for p in PARTS}
        out["attempts"].append({
            "n": a["n"], "startup_s": a["seconds"]["startup"], "node": split.get("node"),
            "split": split.get("seconds"),
            "sum_of_parts_s": round(sum(v or 0.0 for v in (split.get("seconds") or {})
                                        .values()), 3) if split else None,
            "slowest_node": {p: {"host": h, "s": v} for p, (h, v) in slowest.items()
                             if h is not None},
            "nodes": nodes})
    return out


def rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per run and attempt: its start-up and the reference node's parts (what
    docs/goodput.md quotes)."""
    return [{"run": i + 1, **({"mode": r["mode"]} if r.get("mode") else {}),
             "attempt": a["n"], "startup_s": a["startup_s"], "node": a["node"],
             **(a["split"] or {})} for i, r in enumerate(runs) for a in r.get("attempts", [])]


MODES = {"cold": ["--no-preload"], "warm": ["--preload", "torch"], "": []}


def by_mode(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per mode and attempt: the median, min and max of the start-up and of each part."""
    out: dict[str, Any] = {}
    for mode in dict.fromkeys(r.get("mode", "") for r in runs):
        mine = [r for r in runs if r.get("mode", "") == mode and r.get("ok")]
        per: dict[str, Any] = {}
        for n in (1, 2):
            attempts = [a for r in mine for a in r.get("attempts", []) if a["n"] == n]
            values: dict[str, list[float]] = {"startup_s": [a["startup_s"] for a in attempts]}
            for part in PARTS:
                values[part] = [float(v) for a in attempts
                                if (v := (a["split"] or {}).get(part)) is not None]
            per[str(n)] = {k: {"median": round(statistics.median(v), 3), "min": min(v),
                               "max": max(v), "n": len(v)} for k, v in values.items() if v}
        out[mode or "default"] = per
    return out


def one_run(cluster: tc.Cluster, nodes: int, nproc: int, first: int, kill_after: int,
            steps: int, archive: Path, extra: list[str] | None = None) -> dict[str, Any]:
    run_id = f"bench-recovery-{uuid.uuid4().hex[:6]}"
    last = first + nodes - 1
    ck = Path(tempfile.mkdtemp(prefix="ck-", dir=cluster.shared_dir))
    ck.chmod(0o777)
    state = tempfile.mkdtemp(prefix="bench-state-")  # a lemon list of this run's own
    argv = [PYTHON, "-m", "launcher", "run", "-H", f"node[{first}-{last}]",
            "--nproc-per-node", str(nproc), "--python", cluster.python,
            "--archive-dir", str(archive), "--run-id", run_id, "--no-color",
            "--restarts", "1", "--start-timeout", "600", "--sample-interval", "0",
            *(extra or []), SCRIPT, "--ckpt-dir", str(ck), "--steps", str(steps),
            "--step-sleep", "0.2"]
    job = Watched(argv, cluster.client_env(PYTHONUNBUFFERED="1", XDG_STATE_HOME=state))
    victim = nodes * nproc - 1  # the last node's last rank
    killed: dict[str, Any] = {"rank": victim, "host": f"node{last}"}
    if job.wait_line(rf"\br0: step {kill_after}\b", 600):
        deadline = time.monotonic() + 20
        pid = None
        while pid is None and time.monotonic() < deadline:
            pid = rank_pid(cluster, last, victim, ck)
            if pid is None:
                time.sleep(0.05)
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            killed.update(pid=pid, t=time.time())
    code = job.wait(900)
    result: dict[str, Any] = {"nodes": nodes, "nproc_per_node": nproc, "run_id": run_id,
                              "exit": code, "killed": killed, "args": extra or []}
    try:
        meta = json.loads((archive / run_id / "meta.json").read_text())
    except (OSError, ValueError) as exc:
        result["problem"] = f"{exc}: {job.text[-3000:]}"
        return result
    result["attempt_causes"] = [a.get("cause") for a in meta.get("attempts") or []]
    result.update(summary(meta))
    result["ok"] = code == 0 and len(result["attempts"]) == 2 and "pid" in killed
    if not result["ok"]:
        result["problem"] = job.text[-3000:]
    decision = next((t for _, t in job.lines if re.search(r"attempt 2 .*same nodes", t)), "")
    result["decision"] = decision.removeprefix("dtrain: ")
    return result


def main() -> int:
    parser = bench_parser(__doc__, reps=1, only="", first_node=1)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--nproc-per-node", type=int, default=2)
    parser.add_argument("--kill-after", type=int, default=5, metavar="STEP")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--modes", default="", metavar="cold,warm",
                        help="run each repetition once per mode, interleaved")
    parser.add_argument("--run-args", default="", metavar="ARGS",
                        help="more `dtrain run` words for every run (shlex)")
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",")] if args.modes else [""]
    if any(m not in MODES for m in modes):
        log(f"--modes: cold and/or warm, not {args.modes!r}")
        return 2
    cluster = tc.load()
    need = args.first_node + args.nodes - 1
    if cluster is None or len(cluster.nodes) < need:
        have = 0 if cluster is None else len(cluster.nodes)
        log(f"the test cluster has {have} node(s); this needs node{args.first_node}..node"
            f"{need} (python -m tests.cluster up --nodes {need}, or --nodes {max(have, 1)})")
        return 2
    archive = Path(tempfile.mkdtemp(prefix="bench-recovery-"))
    runs = []
    for r in range(args.reps):
        for mode in modes:
            log(f"run {r + 1}/{args.reps}{' ' + mode if mode else ''}: {args.nodes} nodes x "
                f"{args.nproc_per_node} ranks ...")
            res = one_run(cluster, args.nodes, args.nproc_per_node, args.first_node,
                          args.kill_after, args.steps, archive,
                          MODES[mode] + shlex.split(args.run_args))
            res["mode"] = mode
            if not res.get("ok"):
                log(res.get("problem", "")[-3000:])
            runs.append(res)
    doc = {"bench": "recovery", "machine": machine(), "revision": revision(),
           "commit": subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=REPO,
                                    capture_output=True, text=True).stdout.strip(),
           "date": time.strftime("%Y-%m-%d"),
           "command": " ".join(["python", "bench/bench_recovery.py", *sys.argv[1:]]),
           "rows": rows(runs), "runs": runs,
           **({"by_mode": by_mode(runs)} if args.modes else {})}
    print(json.dumps(doc, indent=2))
    save_json(args.json, doc)
    return 0 if all(x.get("ok") for x in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
