"""Teardown latency on the real-sshd test cluster: from a failure to the last remote process gone.

    python bench/bench_teardown.py [--rounds 3] [--nodes 16] [--skip-run16]

Cases (1 rank per node, every job honours SIGTERM):

* ``run-3 torch``: ``dtrain run`` of tests/workloads/train.py on 3 nodes (gloo, local steps so
  only dtrain stops the survivors); rank 1 exits 7. Failure time = the rank's exit time as
  its shim reported it (meta.json ``root_cause.t``).
* ``run-N spin``: ``dtrain run`` of tests/workloads/spin.py (no torch in the workers; the
  torchrun agents still import it) on N nodes; rank 1 exits 7. Same failure time.
* ``exec-N ctrl-c``: ``dtrain exec`` of spin.py on N nodes, then SIGINT to dtrain (exec does not
  stop the others on a failure: it lets every node finish, like pdsh); time from the signal.
* ``exec-N timeout``: ``dtrain exec --timeout 3`` of spin.py on N nodes; time from dtrain's
  "--timeout reached" line (when it started stopping the nodes).

Also reported: start -> first line (dtrain started -> the first rank's ``ready`` line) and
start -> all up (every rank has printed it).

"Gone" = no process of the job left in any node's namespace (same identification as
tests/test_failures.py: the job's tag in the environment, plus ancestors up to sshd, i.e. the
supervisors), polled every 2 ms once the failure has happened. The dtrain column is when the
dtrain process itself exited (it closes its SSH connections first). Goal: gone <= 1 s.
Other sessions share this machine: the numbers are medians and maxima over rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests import cluster as tc  # noqa: E402

PYTHON = sys.executable
SPIN = str(REPO / "tests/workloads/spin.py")


class Watch:
    """The job's processes across the node namespaces: discover while it runs (one /proc pass
    for all nodes), then poll only the known pids once the failure has happened."""

    def __init__(self, nodes: list[int], tag: bytes) -> None:
        self.ns = {tc._ns_inode(k): k for k in nodes}
        self.tag = tag
        self.known: dict[tuple[int, int], int] = {}  # (pid, start) -> node
        self.negative: dict[tuple[int, int], float] = {}
        self.last_seen: dict[tuple[int, int], tuple[float, str, str]] = {}

    def discover(self) -> None:
        found: dict[int, tuple[int, int, str]] = {}
        in_ns: dict[int, int] = {}
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            pid = int(name)
            try:
                ino = os.stat(f"/proc/{pid}/ns/net").st_ino
            except OSError:
                continue
            if ino in self.ns and (st := tc.proc_stat(pid)) is not None:
                found[pid], in_ns[pid] = st, self.ns[ino]
        now = time.monotonic()
        for pid, (ppid, start, _comm) in found.items():
            key = (pid, start)
            if key in self.known or now - self.negative.setdefault(key, now) > 3.0:
                continue
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if self.tag not in env:
                continue
            self.known[key] = in_ns[pid]
            up = ppid
            while up in found and not found[up][2].startswith("sshd"):
                self.known[(up, found[up][1])] = in_ns[up]
                up = found[up][0]

    def alive(self) -> list[tuple[int, int]]:
        out = []
        now = time.time()
        for (pid, start), k in self.known.items():
            st = tc.proc_stat(pid)
            if st is not None and st[1] == start:
                out.append((pid, k))
                self.last_seen[(pid, start)] = (now, st[2], _cmd(pid))
        return out

    def slowest(self, t0: float) -> list[str]:
        """When each kind of process was last seen alive after t0: (median, max) seconds."""
        kinds: dict[str, list[float]] = {}
        for t, _comm, cmd in self.last_seen.values():
            # the node programs' titles (set_title), or their command lines before it
            kind = ("supervisor" if cmd.startswith("dtrain supervisor ")
                    or " -c " in cmd and "def r(n)" in cmd else
                    "torchrun" if cmd.startswith("dtrain torchrun ")
                    or "torch.distributed.run" in cmd else
                    "shim" if " shim: " in cmd or "dtrain_shim.py" in cmd else "job")
            kinds.setdefault(kind, []).append(t - t0)
        return [f"{kind:<10} last seen {statistics.median(v):.3f} / {max(v):.3f}s (n={len(v)})"
                for kind, v in sorted(kinds.items(), key=lambda kv: max(kv[1]))]


class Proc:
    """dtrain as a subprocess, its output lines collected."""

    def __init__(self, cluster: tc.Cluster, args: list[str]) -> None:
        self.lines: list[str] = []
        self.times: list[float] = []
        self.cond = threading.Condition()
        self.proc = subprocess.Popen(
            [PYTHON, "-m", "launcher", *args], cwd=REPO, text=True, bufsize=1,
            env=cluster.client_env(PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT)
        self.exited: float | None = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                self.times.append(time.time())
                self.cond.notify_all()
        self.proc.wait()
        self.exited = time.time()

    def first(self, text: str) -> float | None:
        with self.cond:
            hits = (t for t, line in zip(self.times, self.lines, strict=True) if text in line)
            return next(hits, None)

    def count(self, text: str) -> int:
        with self.cond:
            return sum(text in line for line in self.lines)


def _cmd(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace").strip()
    except OSError:
        return ""


VERBOSE = False


def measure(cluster: tc.Cluster, args: list[str], nodes: list[int], tag: bytes, *,
            ready: str, trigger: str, archive: Path | None = None, run_id: str | None = None,
            timeout: float = 120, timeout_s: float = 3.0) -> dict[str, float | str]:
    """Run one job; returns failure->gone and failure->dtrain exit, in seconds."""
    job = Proc(cluster, args)
    watch = Watch(nodes, tag)
    deadline = time.monotonic() + timeout
    t_start = time.time()
    try:
        # phase 1: discover the processes while waiting for every rank to be up
        while job.count(ready) < len(nodes):
            if job.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"job ended (exit {job.proc.poll()}) or hung (after "
                                   f"{time.time() - t_start:.1f} s) before it was ready, "
                                   f"{job.count(ready)}/{len(nodes)} up:\n"
                                   + "\n".join(job.lines[-30:]))
            watch.discover()
            time.sleep(0.05)
        t_all_up = time.time()
        for _ in range(5):  # the last ones up
            watch.discover()
            time.sleep(0.05)
        n_procs = len(watch.known)
        t_trigger = None
        if trigger == "sigint":
            t_trigger = time.time()
            job.proc.send_signal(signal.SIGINT)
        elif trigger == "fail":
            while job.count("FAIL ") == 0 and job.proc.poll() is None:
                time.sleep(0.002)
        # phase 2: poll the known pids until none is left
        gone = None
        while time.monotonic() < deadline:
            if not watch.alive():
                gone = time.time()
                break
            time.sleep(0.002)
        if gone is None:
            raise RuntimeError(f"processes left: {watch.alive()}")
        job.proc.wait(max(1.0, deadline - time.monotonic()))
        time.sleep(0.05)
    finally:
        if job.proc.poll() is None:
            job.proc.kill()
            job.proc.wait()
    if trigger == "fail":
        assert archive is not None and run_id is not None
        meta = json.loads((archive / run_id / "meta.json").read_text())
        t_fail = float(meta["root_cause"]["t"])
        what = f"exit {meta['exit_code']}: {meta['outcome']}"
    elif trigger == "timeout":
        t_fail = job.first("s reached: stopping") or t_start + timeout_s
        what = f"exit {job.proc.returncode}"
    else:
        assert t_trigger is not None
        t_fail = t_trigger
        what = f"exit {job.proc.returncode}"
    if VERBOSE:
        print("  last to go:\n    " + "\n    ".join(watch.slowest(t_fail)))
    first_line = job.first(ready)
    return {"gone": gone - t_fail, "dtrain": (job.exited or time.time()) - t_fail,
            "procs": n_procs, "what": what,
            "first_line": (first_line or t_all_up) - t_start, "all_up": t_all_up - t_start}


def exec_timeout(n: int) -> int:
    return 3 if n <= 16 else 3 + n // 8


def run_case(cluster: tc.Cluster, name: str, n: int, tmp: Path) -> dict[str, float | str]:
    hosts = f"node[1-{n}]"
    nodes = list(range(1, n + 1))
    run_id = f"bench-td-{uuid.uuid4().hex[:8]}"
    if name.startswith("run"):
        torch = "torch" in name
        script = "tests/workloads/train.py" if torch else "tests/workloads/spin.py"
        args = ["run", "-H", hosts, "--nproc-per-node", "1", "--python", PYTHON, "--no-color",
                "--archive-dir", str(tmp), "--run-id", run_id, "--grace", "10"]
        if torch:
            args += ["-e", "WL_FAIL_RANK=1", "-e", "WL_FAIL_STEP=4", "-e", "WL_COLLECTIVE=0",
                     script]
            ready = ": step 1 "
        else:
            args += ["-e", "SPIN_FAIL_RANK=1", script, "3", "7"]
            ready = "spin pid"
        # every torchrun agent imports torch: on this one box, N agents take ~N x 1.5 s of CPU
        return measure(cluster, args, nodes, f"DTRAIN_RUN_ID={run_id}".encode(), ready=ready,
                       trigger="fail", archive=tmp, run_id=run_id, timeout=max(120.0, 4.0 * n))
    tag = f"BENCH_TAG={run_id}"
    # --fanout n: exec runs at most --fanout commands at once (pdsh -f), and these never end
    args = ["exec", "-H", hosts, "--no-color", "--python", PYTHON, "--fanout", str(n)]
    if name.endswith("timeout"):
        # long enough for every node to be up first (~6 s for 128 nodes on this box)
        args += ["--timeout", str(exec_timeout(n))]
    args += ["--", "env", tag, PYTHON, SPIN]
    return measure(cluster, args, nodes, tag.encode(), ready="spin pid",
                   trigger="timeout" if name.endswith("timeout") else "sigint",
                   timeout_s=exec_timeout(n))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--skip-run16", action="store_true",
                        help="skip the N-node dtrain run (N torchrun agents import torch)")
    parser.add_argument("--only", help="run only the cases whose name contains this")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="show the last processes to go in each round")
    opts = parser.parse_args()
    global VERBOSE
    VERBOSE = opts.verbose
    cluster = tc.up(max(4, opts.nodes))
    n = opts.nodes
    cases = [("run-3 torch", 3), (f"exec-{n} ctrl-c", n), (f"exec-{n} timeout", n)]
    if not opts.skip_run16:
        cases.append((f"run-{n} spin", n))
    if opts.only:
        cases = [c for c in cases if opts.only in c[0]]
    results: dict[str, list[dict[str, float | str]]] = {c: [] for c, _ in cases}
    with tempfile.TemporaryDirectory(prefix="bench-teardown-") as tmpdir:
        tmp = Path(tmpdir)
        os.chmod(tmp, 0o755)
        for r in range(opts.rounds):
            for case, nodes in cases:
                res = run_case(cluster, case, nodes, tmp)
                results[case].append(res)
                print(f"round {r + 1} {case:<18} gone {res['gone']:.3f}s  dtrain exit "
                      f"{res['dtrain']:.3f}s  ({res['procs']} processes; {res['what']}); "
                      f"start -> first line {res['first_line']:.2f}s, all up "
                      f"{res['all_up']:.2f}s", flush=True)
    print(f"\nteardown: failure -> last remote process gone (median / max of {opts.rounds}); "
          "goal <= 1 s")
    print(f"{'case':<18} {'gone':>14} {'dtrain exits':>16} {'first line':>11} {'all up':>8}")
    for case, rows in results.items():
        gone = [float(x["gone"]) for x in rows]
        dt = [float(x["dtrain"]) for x in rows]
        first = statistics.median(float(x["first_line"]) for x in rows)
        up = statistics.median(float(x["all_up"]) for x in rows)
        print(f"{case:<18} {statistics.median(gone):6.3f} / {max(gone):5.3f}   "
              f"{statistics.median(dt):6.3f} / {max(dt):5.3f} {first:10.2f}s {up:7.2f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
