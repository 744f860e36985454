"""Where start-up goes, fresh and after a relaunch (issue 52 step 1; docs/goodput.md).

    python bench/bench_recovery.py [--nodes 8] [--nproc-per-node 2] [--first-node 1]
                                   [--kill-after 5] [--steps 30] [--json FILE]
                                   [--modes cold,warm,session,torchrun] [--run-args "ARGS"]
                                   [--reps N]

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

``--modes cold,warm,torchrun`` (issue 52 steps 2 and 3, docs/warm-start.md) runs each
repetition once per mode, interleaved and rotated (cold, warm, torchrun; then warm, torchrun,
cold; ...): ``cold`` adds ``--no-preload`` (every rank a fresh interpreter), ``warm`` adds
``--preload torch`` (ranks forked from the node's warm interpreter), ``session`` the same with
``DTRAIN_KEEP_WARM=1`` in dtrain's environment (the node session keeps the warm process from
one attempt to the next); ``--run-args`` adds its
words (shlex) to every dtrain run. ``torchrun`` is no dtrain at all: torchrun's own in-place
restart of the same job, started by the bench on every node over plain ``ssh`` (the
cluster's ssh config, one session per node): ``--nnodes N --nproc-per-node P --max-restarts
1 --monitor-interval 0.2 --rdzv-backend c10d --rdzv-endpoint <first node>:<free port>
--rdzv-id <run> --rdzv-conf is_host=1|0`` (the monitor interval and ``is_host`` as dtrain
gives its own torchrun), with ``OMP_NUM_THREADS=1``, ``GLOO_SOCKET_IFNAME`` (the node's
interface) and ``PYTHONUNBUFFERED=1``, as dtrain sets them. The same rank position is
SIGKILLed the same way (the last node's ``LOCAL_RANK`` P-1, found by this run's checkpoint
directory in its command line, killed by pid); torchrun's agents stay and restart the
workers. Every process of a torchrun run (found by its unique checkpoint directory) is
KILLed by pid at its end, and the ssh sessions closed; ``leftover`` counts what was still
there (0 when torchrun ended by itself).

Every mode runs the script through bench/data/first_line.py, whose first line is
``dtrain-bench first-line t=<time.time()> rank=R attempt=A`` (before torch is imported;
``attempt`` from ``DTRAIN_ATTEMPT`` or torchrun's ``TORCHELASTIC_RESTART_COUNT`` + 1). All
nodes share one clock (network namespaces on one box), so one metric is measured the same
way in every mode: ``kill_to_first_line_s``, from the SIGKILL to the moment EVERY rank of
attempt 2 has printed that line (the latest rank's). Also ``start_to_first_line_s`` (the
launcher's spawn: ``dtrain run``, or the first ssh session, to every rank of attempt 1 at its
first line) and ``kill_to_noticed_s`` (dtrain: its ``detected`` instant in meta.json;
torchrun: the arrival of its agent's ``Worker group FAILED`` log line from the victim's node,
and ``kill_to_all_noticed_s`` the last agent's ``will restart worker group``). ``by_mode``
holds, per mode, the median, min, max and count of each; per mode and attempt (dtrain modes)
the start-up and each part; ``kill_to_first_line_vs_torchrun`` each dtrain mode's median
over torchrun's.
"""

from __future__ import annotations

import contextlib
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
from collections.abc import Iterable, Sequence
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
WRAPPER = "bench/data/first_line.py"  # prints each rank's first instant, then runs SCRIPT
PARTS = ("connect_probe", "agent_start", "rendezvous", "rank_start", "script", "unsplit")
FIRST_LINE = re.compile(r"dtrain-bench first-line t=(\d+(?:\.\d+)?) rank=(\d+) attempt=(\d+)")
# torchrun's agents, as they see a worker die (its WARNING/ERROR lines; INFO is not shown)
NOTICED = re.compile(r"failed \(exitcode: -?\d+\)|Worker group (?:FAILED|UNHEALTHY)")
RESTARTING = re.compile(r"failed \(exitcode: -?\d+\)|closing signal SIG|will restart worker group")
METRICS = ("kill_to_first_line_s", "start_to_first_line_s", "kill_to_noticed_s",
           "kill_to_all_noticed_s")


# ---------------------------------------------------------------- pure helpers


def first_lines(texts: Iterable[str]) -> list[dict[str, Any]]:
    """The first-line records (bench/data/first_line.py) among output lines, in order."""
    out = []
    for text in texts:  # (finditer: two ranks' lines run together stay two records)
        for m in FIRST_LINE.finditer(text):
            out.append({"t": float(m[1]), "rank": int(m[2]), "attempt": int(m[3])})
    return out


def all_ranks_after(records: Sequence[dict[str, Any]], t0: float | None,
                    world: int) -> float | None:
    """When every rank 0..world-1 had printed its first line after ``t0`` (the latest
    rank's instant; a rank's earliest line after ``t0`` counts); None while one rank is
    missing. By instant, not by the line's ``attempt``: torchrun's restart count is each
    agent's own (an agent restarted by a membership change does not count it: pytorch#135712),
    so the ranks of one restart may print different attempts."""
    if t0 is None:
        return None
    first: dict[int, float] = {}
    for r in records:
        if r["t"] > t0 and 0 <= r["rank"] < world:
            first[r["rank"]] = min(r["t"], first.get(r["rank"], r["t"]))
    return max(first.values()) if world > 0 and len(first) == world else None


def since(t0: float | None, t1: float | None) -> float | None:
    return None if t0 is None or t1 is None else round(t1 - t0, 3)


def rotated(modes: Sequence[str], r: int) -> list[str]:
    """Round r's order: one mode further on each round (no mode always first)."""
    k = r % len(modes) if modes else 0
    return [*modes[k:], *modes[:k]]


def stats(values: Sequence[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 3), "min": min(values),
            "max": max(values), "n": len(values)}


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            "utf-8", "replace")
    except OSError:
        return ""


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.decode("utf-8", "replace").partition("=") for item in raw.split(b"\0"))
    return {k: v for k, _, v in pairs if k}


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
    docs/goodput.md quotes); attempt 1 with ``start_to_first_line_s``, attempt 2 with
    ``kill_to_first_line_s`` (torchrun's runs: those two rows, without a ledger)."""
    out = []
    for i, r in enumerate(runs):
        mode = {"mode": r["mode"]} if r.get("mode") else {}
        extra = {1: {"start_to_first_line_s": r.get("start_to_first_line_s")},
                 2: {"kill_to_first_line_s": r.get("kill_to_first_line_s")}}
        attempts: list[dict[str, Any]] = ([{"n": 1}, {"n": 2}] if r.get("mode") == "torchrun"
                                          else r.get("attempts") or [])
        for a in attempts:
            row: dict[str, Any] = {"run": i + 1, **mode, "attempt": a["n"]}
            if "startup_s" in a:
                row.update(startup_s=a["startup_s"], node=a["node"], **(a["split"] or {}))
            out.append({**row, **extra.get(a["n"], {})})
    return out


MODES = {"cold": ["--no-preload"], "warm": ["--preload", "torch"], "": [], "torchrun": [],
         "session": ["--preload", "torch"]}
# what a mode sets in dtrain's environment: the node session (docs/warm-start.md), asked for
MODE_ENV = {"session": {"DTRAIN_KEEP_WARM": "1"}}


def by_mode(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per mode: the median, min and max of each of ``METRICS``; per dtrain mode and
    attempt, of the start-up and of each part."""
    out: dict[str, Any] = {}
    for mode in dict.fromkeys(r.get("mode", "") for r in runs):
        mine = [r for r in runs if r.get("mode", "") == mode and r.get("ok")]
        per: dict[str, Any] = {}
        for n in (1, 2):
            attempts = [a for r in mine for a in r.get("attempts", []) if a["n"] == n]
            if not attempts:
                continue
            values: dict[str, list[float]] = {"startup_s": [a["startup_s"] for a in attempts]}
            for part in PARTS:
                values[part] = [float(v) for a in attempts
                                if (v := (a["split"] or {}).get(part)) is not None]
            per[str(n)] = {k: stats(v) for k, v in values.items() if v}
        for key in METRICS:
            found = [float(r[key]) for r in mine if r.get(key) is not None]
            if found:
                per[key.removesuffix("_s")] = stats(found)
        out[mode or "default"] = per
    return out


def vs_torchrun(modes: dict[str, Any]) -> dict[str, float]:
    """Each dtrain mode's median kill -> every rank at its first line over torchrun's."""
    base = (modes.get("torchrun") or {}).get("kill_to_first_line", {}).get("median")
    if not base:
        return {}
    return {m: round(v["kill_to_first_line"]["median"] / base, 2) for m, v in modes.items()
            if m != "torchrun" and "kill_to_first_line" in v}


def script_args(ck: Path, steps: int) -> list[str]:
    return [WRAPPER, SCRIPT, "--ckpt-dir", str(ck), "--steps", str(steps),
            "--step-sleep", "0.2"]


def _wall(job: Watched, t: float) -> float:
    """A console line's arrival (monotonic) on the wall clock the ranks print."""
    return job.t0_wall + (t - job.t0)


# ---------------------------------------------------------------- dtrain


def one_run(cluster: tc.Cluster, nodes: int, nproc: int, first: int, kill_after: int,
            steps: int, archive: Path, extra: list[str] | None = None,
            env: dict[str, str] | None = None) -> dict[str, Any]:
    run_id = f"bench-recovery-{uuid.uuid4().hex[:6]}"
    last = first + nodes - 1
    ck = Path(tempfile.mkdtemp(prefix="ck-", dir=cluster.shared_dir))
    ck.chmod(0o777)
    state = tempfile.mkdtemp(prefix="bench-state-")  # a lemon list of this run's own
    argv = [PYTHON, "-m", "launcher", "run", "-H", f"node[{first}-{last}]",
            "--nproc-per-node", str(nproc), "--python", cluster.python,
            "--archive-dir", str(archive), "--run-id", run_id, "--no-color",
            "--restarts", "1", "--start-timeout", "600", "--sample-interval", "0",
            *(extra or []), *script_args(ck, steps)]
    job = Watched(argv, cluster.client_env(PYTHONUNBUFFERED="1", XDG_STATE_HOME=state,
                                           **(env or {})))
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
        texts = [json.loads(x).get("line", "") for x in
                 (archive / run_id / "output.jsonl").read_text().splitlines() if x.strip()]
    except (OSError, ValueError) as exc:
        result["problem"] = f"{exc}: {job.text[-3000:]}"
        return result
    result["attempt_causes"] = [a.get("cause") for a in meta.get("attempts") or []]
    result.update(summary(meta))
    records = first_lines(texts)
    world = nodes * nproc
    attempts = meta.get("attempts") or []
    result.update(
        kill_to_first_line_s=since(killed.get("t"), all_ranks_after(records, killed.get("t"),
                                                                     world)),
        start_to_first_line_s=since(job.t0_wall, all_ranks_after(records, job.t0_wall, world)),
        kill_to_noticed_s=since(killed.get("t"), attempts[0].get("detected")
                                if attempts else None))
    result["ok"] = (code == 0 and len(result["attempts"]) == 2 and "pid" in killed
                    and result["kill_to_first_line_s"] is not None)
    if not result["ok"]:
        result["problem"] = job.text[-3000:]
    decision = next((t for _, t in job.lines if re.search(r"attempt 2 .*same nodes", t)), "")
    result["decision"] = decision.removeprefix("dtrain: ")
    return result


# ---------------------------------------------------------------- torchrun's own restart


def ssh_argv(cluster: tc.Cluster, node: str, remote: str) -> list[str]:
    """Plain OpenSSH to a node, with the cluster's files passed explicitly (it reads the
    passwd entry's ~/.ssh, not $HOME); -n: no stdin."""
    return ["ssh", "-n", "-F", str(cluster.ssh_config), "-i", str(cluster.identity),
            "-o", f"UserKnownHostsFile={cluster.known_hosts}", "-o", "BatchMode=yes",
            "-l", cluster.user, node, remote]


def torchrun_command(cluster: tc.Cluster, node: tc.Node, *, nnodes: int, nproc: int,
                     endpoint: str, run_id: str, host: bool, ck: Path, steps: int) -> str:
    """One node's shell line: torchrun with the c10d rendezvous and --max-restarts 1, the
    environment dtrain's plan gives its own torchrun on this cluster."""
    env = {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": node.ifname, "PYTHONUNBUFFERED": "1",
           "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    argv = [cluster.python, "-m", "torch.distributed.run", "--nnodes", str(nnodes),
            "--nproc-per-node", str(nproc), "--max-restarts", "1", "--monitor-interval", "0.2",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", run_id,
            "--rdzv-conf", f"is_host={1 if host else 0}", *script_args(ck, steps)]
    return (f"cd {shlex.quote(str(cluster.repo))} && exec env "
            + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " "
            + shlex.join(argv))


def free_port(cluster: tc.Cluster, k: int) -> int:
    """A port free in node k's network namespace now (the kernel's pick)."""
    out = cluster.node_exec(k, [cluster.python, "-c", "import socket; s = socket.socket(); "
                                "s.bind(('', 0)); print(s.getsockname()[1])"], check=True)
    return int(out.stdout.split()[-1])


def worker_pid(cluster: tc.Cluster, node: int, local_rank: int,
               ckpt: Path) -> tuple[int, int] | None:
    """(pid, RANK) of this run's torchrun worker with ``local_rank`` on node ``node``."""
    for pid in cluster.node_pids(node, match=str(ckpt)):
        if "torch.distributed.run" in _cmdline(pid) or WRAPPER not in _cmdline(pid):
            continue
        env = _environ(pid)
        if env.get("LOCAL_RANK") == str(local_rank) and env.get("RANK", "").isdigit():
            return pid, int(env["RANK"])
    return None


def reap(cluster: tc.Cluster, nodes: range, ckpt: Path) -> int:
    """KILL, by pid, every process of this torchrun run still on its nodes (its agents and
    workers: their command lines hold the run's own checkpoint directory); how many."""
    found = [pid for k in nodes for pid in cluster.node_pids(k, match=str(ckpt))]
    for pid in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(found)


def _first_match(sessions: list[Watched], rx: re.Pattern[str],
                 after: float | None) -> list[float | None]:
    """Per session, the wall-clock arrival of its first line matching ``rx`` after
    ``after``."""
    if after is None:
        return [None for _ in sessions]
    return [next((w for t, text in list(s.lines) if (w := _wall(s, t)) > after
                  and rx.search(text)), None) for s in sessions]


def _wait_any(sessions: list[Watched], rx: re.Pattern[str], timeout: float) -> bool:
    """A line matching ``rx`` came from any session (False: the time ran out, or every
    session ended without one)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(rx.search(text) for s in sessions for _, text in list(s.lines)):
            return True
        if all(s.proc.poll() is not None for s in sessions):
            return False
        time.sleep(0.05)
    return False


def _wait_all(sessions: list[Watched], timeout: float, after_failure: float = 60) -> list[int]:
    """Every session's exit code; once one failed, the others get ``after_failure`` seconds
    (a worker left in a collective whose peer is gone waits for ever), then are killed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(s.proc.poll() is None for s in sessions):
        if any(s.proc.poll() not in (None, 0) for s in sessions):
            deadline = min(deadline, time.monotonic() + after_failure)
        time.sleep(0.1)
    return [s.wait(1) for s in sessions]


def torchrun_run(cluster: tc.Cluster, nodes: int, nproc: int, first: int, kill_after: int,
                 steps: int) -> dict[str, Any]:
    run_id = f"bench-recovery-torchrun-{uuid.uuid4().hex[:6]}"
    last = first + nodes - 1
    ck = Path(tempfile.mkdtemp(prefix="ck-", dir=cluster.shared_dir))
    ck.chmod(0o777)
    endpoint = f"{cluster.node(first).ip}:{free_port(cluster, first)}"
    killed: dict[str, Any] = {"local_rank": nproc - 1, "host": f"node{last}"}
    result: dict[str, Any] = {"nodes": nodes, "nproc_per_node": nproc, "run_id": run_id,
                              "endpoint": endpoint, "killed": killed}
    t_start = time.time()
    sessions: list[Watched] = []
    try:
        for k in range(first, last + 1):
            remote = torchrun_command(cluster, cluster.node(k), nnodes=nodes, nproc=nproc,
                                      endpoint=endpoint, run_id=run_id, host=k == first,
                                      ck=ck, steps=steps)
            sessions.append(Watched(ssh_argv(cluster, f"node{k}", remote),
                                    cluster.client_env()))
        if _wait_any(sessions, re.compile(rf"^step {kill_after}\b"), 600):
            found = None
            until = time.monotonic() + 20
            while found is None and time.monotonic() < until:
                found = worker_pid(cluster, last, nproc - 1, ck)
                if found is None:
                    time.sleep(0.05)
            if found is not None:
                os.kill(found[0], signal.SIGKILL)
                killed.update(pid=found[0], rank=found[1], t=time.time())
        result["exit"] = _wait_all(sessions, 900)
    finally:
        for s in sessions:  # the ssh sessions closed (a no-op for those that ended)
            if s.proc.poll() is None:
                s.proc.kill()
                s.wait(10)
        result["leftover"] = reap(cluster, range(first, last + 1), ck)
    records = first_lines(text for s in sessions for _, text in s.lines)
    world = nodes * nproc
    noticed = _first_match(sessions[-1:], NOTICED, killed.get("t"))[0]
    everyone = [t for t in _first_match(sessions, RESTARTING, killed.get("t")) if t is not None]
    result.update(
        kill_to_first_line_s=since(killed.get("t"), all_ranks_after(records, killed.get("t"),
                                                                     world)),
        start_to_first_line_s=since(t_start, all_ranks_after(records, t_start, world)),
        kill_to_noticed_s=since(killed.get("t"), noticed),
        kill_to_all_noticed_s=since(killed.get("t"), max(everyone) if len(everyone) ==
                                    nodes else None))
    result["ok"] = (result["exit"] == [0] * nodes and "pid" in killed
                    and result["kill_to_first_line_s"] is not None)
    if not result["ok"]:
        result["problem"] = "\n".join(f"--- node{first + i}\n{s.text[-1500:]}"
                                      for i, s in enumerate(sessions))
    return result


def main() -> int:
    parser = bench_parser(__doc__, reps=1, only="", first_node=1)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--nproc-per-node", type=int, default=2)
    parser.add_argument("--kill-after", type=int, default=5, metavar="STEP")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--modes", default="", metavar="cold,warm,session,torchrun",
                        help="run each repetition once per mode, interleaved and rotated")
    parser.add_argument("--run-args", default="", metavar="ARGS",
                        help="more `dtrain run` words for every dtrain run (shlex)")
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",")] if args.modes else [""]
    if any(m not in MODES or not m and args.modes for m in modes):
        log(f"--modes: cold, warm, session and/or torchrun, not {args.modes!r}")
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
        for mode in rotated(modes, r):
            log(f"run {r + 1}/{args.reps}{' ' + mode if mode else ''}: {args.nodes} nodes x "
                f"{args.nproc_per_node} ranks ...")
            if mode == "torchrun":
                res = torchrun_run(cluster, args.nodes, args.nproc_per_node, args.first_node,
                                   args.kill_after, args.steps)
            else:
                res = one_run(cluster, args.nodes, args.nproc_per_node, args.first_node,
                              args.kill_after, args.steps, archive,
                              MODES[mode] + shlex.split(args.run_args), MODE_ENV.get(mode))
            res["mode"] = mode
            log(f"  kill -> every rank at its first line: {res.get('kill_to_first_line_s')} s")
            if not res.get("ok"):
                log(res.get("problem", "")[-3000:])
            runs.append(res)
    modes_doc = by_mode(runs) if args.modes else {}
    doc = {"bench": "recovery", "machine": machine(), "revision": revision(),
           "commit": subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=REPO,
                                    capture_output=True, text=True).stdout.strip(),
           "date": time.strftime("%Y-%m-%d"),
           "command": shlex.join(["python", "bench/bench_recovery.py", *sys.argv[1:]]),
           "rows": rows(runs), "runs": runs,
           **({"by_mode": modes_doc} if args.modes else {}),
           **({"kill_to_first_line_vs_torchrun": vs_torchrun(modes_doc)}
              if "torchrun" in modes_doc else {})}
    print(json.dumps(doc, indent=2))
    save_json(args.json, doc)
    return 0 if all(x.get("ok") for x in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
