"""Chaos tests on the real-sshd cluster: no orphans, the right exit code, every phase bounded.

Every test checks that NO process of its job is left on any node. A job's processes are
found in the node namespaces' process lists (``cluster.node_pids``), never by name: a
process belongs to the job when its environment carries the job's tag (``DTRAIN_RUN_ID``
for ``dtrain run``, inherited by torchrun, the shims, the workers and anything they start,
setsid or not) or its command line carries the job's unique marker (exec), plus every
ancestor of such a process up to sshd (the dtrain supervisor), plus every descendant of those
by parent pid, whatever its environment: a daemon that double-forks, ``setsid``s and scrubs
its environment is reparented to the supervisor (a subreaper) and found that way. Other
sessions may run jobs on the same nodes at the same time; they are not ours and are left
alone.

Each test checks that the watch SAW the job (a watch that sees nothing passes trivially) and
that nothing is left about a second after dtrain exits (``assert_clean(since=job.ended)``;
the measured teardown is under 0.4 s), waiting on the condition with a deadline.

Small on purpose (the machine has 2 cores): 3 nodes x 1 rank, gloo, workloads in
tests/workloads/ that flush and ``os._exit``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest

from tests import cluster as tc
from tests.util import TRACEBACK, proc_environ

REPO = Path(__file__).resolve().parents[1]
TRAIN = "tests/workloads/train.py"
SPIN = "tests/workloads/spin.py"
DAEMON = "tests/workloads/daemon.py"


def _tagged(pid: int, env_tag: bytes | None, marker: bytes | None) -> bool:
    if env_tag is not None and env_tag in proc_environ(pid):
        return True
    try:
        return marker is not None and marker in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


class JobWatch:
    """Finds and remembers every process of one job on the given nodes (see module doc).

    ``scan()`` once, or ``start()`` a background poller for jobs whose processes come and
    go; ``left()`` lists what is still alive; ``wait_clean(t)`` polls until nothing is.
    """

    def __init__(self, cluster: tc.Cluster, nodes: Iterable[int], *, run_id: str | None = None,
                 marker: str | None = None, interval: float = 0.05) -> None:
        self.cluster = cluster
        self.nodes = list(nodes)
        self.env_tag = f"DTRAIN_RUN_ID={run_id}".encode() if run_id else None
        self.marker = marker.encode() if marker else None
        self.interval = interval
        self.known: dict[int, dict[tuple[int, int], str]] = {k: {} for k in self.nodes}
        # processes found not to be ours, with when first seen: re-checked for a while, since
        # a fork is not tagged until it execs (environ and cmdline are the parent's till then)
        self._checked: dict[tuple[int, int], float] = {}
        self.sup_keys: set[tuple[int, int]] = set()  # children of sshd: the supervisors
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _ours(self, pid: int, start: int) -> bool:
        return _tagged(pid, self.env_tag, self.marker)

    def scan(self) -> dict[int, list[int]]:
        """Record the job's processes now on each node; returns the live ones per node."""
        live: dict[int, list[int]] = {}
        for k in self.nodes:
            found: dict[int, tuple[int, int, str]] = {}
            for pid in self.cluster.node_pids(k):
                st = tc.proc_stat(pid)
                if st is not None:
                    found[pid] = st
            with self._lock:
                live[k] = self._scan_node(self.known[k], found)
        return live

    def _scan_node(self, known: dict[tuple[int, int], str],
                   found: dict[int, tuple[int, int, str]]) -> list[int]:
        mine = [pid for pid, (_, start, _) in found.items() if (pid, start) in known]
        for pid, (ppid, start, comm) in found.items():
            key = (pid, start)
            if key in known:
                continue
            first = self._checked.setdefault(key, time.monotonic())
            if time.monotonic() - first > 3.0 or not self._ours(pid, start):
                continue
            known[key] = comm
            mine.append(pid)
            # ancestors up to sshd: the supervisor (and a shell in between, if any)
            up, below = ppid, key
            while up in found and not found[up][2].startswith("sshd"):
                ukey = (up, found[up][1])
                if ukey not in known:
                    known[ukey] = found[up][2]
                    mine.append(up)
                up, below = found[up][0], ukey
            if up in found:
                self.sup_keys.add(below)
        # descendants by parent pid, whatever their environment or command line: a daemon
        # that setsid()s, double-forks and scrubs its environment is reparented to the
        # supervisor (a subreaper), and is the job's all the same
        grew = True
        while grew:
            grew = False
            for pid, (ppid, start, comm) in found.items():
                key = (pid, start)
                if key in known or ppid not in found:
                    continue
                if (ppid, found[ppid][1]) in known:
                    known[key] = comm
                    mine.append(pid)
                    grew = True
        return sorted(set(mine))

    def left(self) -> dict[int, list[str]]:
        """The job's processes still alive, per node: "pid comm" (only non-empty nodes)."""
        self.scan()
        out: dict[int, list[str]] = {}
        for k in self.nodes:
            with self._lock:
                known = dict(self.known[k])
            alive = [f"{pid} {comm}" for (pid, start), comm in known.items()
                     if (st := tc.proc_stat(pid)) is not None and st[1] == start]
            if alive:
                out[k] = alive
        return out

    def count(self) -> int:
        with self._lock:
            return sum(len(v) for v in self.known.values())

    def supervisors(self) -> int:
        """How many supervisors were seen (the job's processes whose parent is sshd)."""
        with self._lock:
            return len(self.sup_keys & {key for k in self.nodes for key in self.known[k]})

    def wait_clean(self, timeout: float) -> tuple[bool, float]:
        """Poll until no process of the job is left; (clean, seconds waited)."""
        t0 = time.monotonic()
        while True:
            if not self.left():
                return True, time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                return False, time.monotonic() - t0
            time.sleep(0.05)

    def assert_clean(self, timeout: float = 1.0, since: float | None = None) -> float:
        """Nothing of the job left within ``timeout`` s of ``since`` (a monotonic time, e.g.
        when dtrain exited; default: now); returns the seconds waited from now."""
        if since is not None:
            timeout = max(0.0, since + timeout - time.monotonic())
        ok, took = self.wait_clean(timeout)
        if not ok:
            left = self.kill_left()
            pytest.fail(f"processes of the job left after {took:.1f}s (now killed): {left}")
        return took

    def kill_left(self) -> dict[int, list[str]]:
        """KILL what is left of the job (by pid, start time checked), so that a failed test
        does not leave it running on the shared nodes; returns what was left."""
        left = self.left()
        with self._lock:
            keys = [key for k in self.nodes for key in self.known[k]]
        for pid, start in keys:
            st = tc.proc_stat(pid)
            if st is not None and st[1] == start:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        return left

    def assert_saw(self, nodes: int, per_node: int = 2) -> None:
        """The watch saw ``nodes`` supervisors and at least ``per_node`` processes on each
        of that many nodes (a supervisor and its job)."""
        with self._lock:
            counts = sorted((len(v) for v in self.known.values()), reverse=True)
        assert self.supervisors() == nodes, f"supervisors seen: {self.supervisors()}: {self.known}"
        assert counts[:nodes] and min(counts[:nodes]) >= per_node, self.known

    def saw_pid(self, k: int, pid: int) -> bool:
        with self._lock:
            return any(p == pid for p, _ in self.known[k])

    def wait_saw(self, nodes: int, timeout: float = 20.0) -> None:
        """Wait (polling, with a deadline) until ``nodes`` supervisors were seen."""
        deadline = time.monotonic() + timeout
        while self.supervisors() < nodes and time.monotonic() < deadline:
            self.scan()
            time.sleep(0.05)
        self.assert_saw(nodes)

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.scan()
            self._stop.wait(self.interval)

    def start(self) -> JobWatch:
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> JobWatch:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Dtrain:
    """dtrain as a user runs it (a subprocess, HOME at the cluster's client home), its
    output collected line by line with arrival times."""

    def __init__(self, cluster: tc.Cluster, args: Sequence[str], *,
                 env: dict[str, str] | None = None) -> None:
        self.args = list(args)
        self.lines: list[tuple[float, str]] = []
        self.cond = threading.Condition()
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "launcher", *args], cwd=REPO,
            env=cluster.client_env(PYTHONUNBUFFERED="1", **(env or {})),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        self.ended: float | None = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.cond:
                self.lines.append((time.monotonic(), line.rstrip("\n")))
                self.cond.notify_all()

    @property
    def output(self) -> str:
        with self.cond:
            return "\n".join(text for _, text in self.lines)

    def wait_line(self, pattern: str, timeout: float = 30, count: int = 1) -> float:
        """Wait for ``count`` lines matching the regex; the arrival time of the last one."""
        rx = re.compile(pattern)

        def hits() -> list[float]:
            return [t for t, text in self.lines if rx.search(text)]

        with self.cond:
            ok = self.cond.wait_for(lambda: len(hits()) >= count or self.proc.poll() is not None,
                                    timeout)
            got = hits()
        assert ok and len(got) >= count, (f"no {count} line(s) matching {pattern!r} within "
                                          f"{timeout}s (rc={self.proc.poll()}):\n{self.output}")
        return got[count - 1]

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 60) -> int:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            pytest.fail(f"dtrain did not end within {timeout}s:\n{self.output}")
        self.ended = time.monotonic()
        self._reader.join(10)  # the reader takes the last lines, up to EOF
        # whatever the exit code, it must come from an error message, not from a crash
        assert not TRACEBACK.search(self.output), f"dtrain crashed:\n{self.output[-4000:]}"
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


def run_args(cluster: tc.Cluster, tmp_path: Path, run_id: str, script: str, *extra: str,
             hosts: str = "node[1-3]", nproc: int = 1, env: dict[str, str] | None = None,
             script_args: Sequence[str] = ()) -> list[str]:
    args = ["run", "-H", hosts, "--nproc-per-node", str(nproc), "--python", cluster.python,
            "--archive-dir", str(tmp_path / "runs"), "--run-id", run_id, "--no-color", *extra]
    for key, value in (env or {}).items():
        args += ["-e", f"{key}={value}"]
    return [*args, script, *script_args]


def meta(tmp_path: Path, run_id: str) -> dict:
    return json.loads((tmp_path / "runs" / run_id / "meta.json").read_text())


def new_id(what: str) -> str:
    return f"chaos-{what}-{uuid.uuid4().hex[:8]}"


pytestmark = [pytest.mark.timeout(90)]

# kill -9 dtrain -> nodes clean: sshd sees the TCP close at once, the supervisor its stdin EOF
# and TERMs the ranks (they honour it); measured ~0.5 s. Generous for a loaded 2-core box,
# and far below the 300 s heartbeat timeout the test sets, which is the other way out.
KILL9_CLEAN = 5.0


# -- a rank fails ------------------------------------------------------------------------------

@pytest.mark.ssh
@pytest.mark.torch
def test_rank_exit_code_is_the_root_cause(cluster: tc.Cluster, tmp_path: Path, jobs) -> None:
    """Rank 1 exits 7 after a step while the others train (and then fail on the broken
    all-reduce): dtrain exits 7 quickly, names node2 and rank 1, nothing is left."""
    run_id = new_id("exit7")
    job = Dtrain(cluster, run_args(cluster, tmp_path, run_id, TRAIN,
                                   env={"WL_FAIL_RANK": "1", "WL_FAIL_STEP": "2"}))
    jobs.append(job)
    with JobWatch(cluster, [1, 2, 3], run_id=run_id) as watch:
        failed_at = job.wait_line(r"rank 1: failing on purpose", timeout=60)
        rc = job.wait(60)
        took = watch.assert_clean(1.0, since=job.ended)
    assert rc == 7, job.output
    watch.assert_saw(3, per_node=3)  # supervisor, torchrun's agent, the rank
    assert job.ended is not None and job.ended - failed_at < 6.0, job.output
    assert "FAILED: rank 1 on node2 exited 7 (exit 7)" in job.output
    assert re.search(r"node2 \(node 1\): r1 exit 7 .*ROOT CAUSE", job.output), job.output
    assert re.search(r"node1 \(node 0\): r0 .*(stopped|killed) by dtrain", job.output), job.output
    assert "rank 1: failing on purpose" in job.output.split("last stderr lines")[-1]
    m = meta(tmp_path, run_id)
    assert (m["exit_code"], m["root_cause"]["host"], m["root_cause"]["rank"]) == (7, "node2", 1)
    assert m["root_cause"]["kind"] == "rank"
    by_host = {n["host"]: n for n in m["nodes"]}
    assert by_host["node2"]["ranks"]["1"]["role"] == "root cause"
    assert by_host["node1"]["ranks"]["0"]["role"] in ("stopped", "unknown")
    print(f"exit-7: dtrain ended {job.ended - failed_at:.2f}s after the failure line; "
          f"clean {took:.2f}s later")


@pytest.mark.ssh
@pytest.mark.torch
def test_rank_killed_by_sigkill_is_137(cluster: tc.Cluster, tmp_path: Path, jobs) -> None:
    run_id = new_id("sigkill")
    job = Dtrain(cluster, run_args(cluster, tmp_path, run_id, TRAIN, env={
        "WL_FAIL_RANK": "2", "WL_FAIL_STEP": "1", "WL_FAIL_MODE": "sigkill",
        "WL_COLLECTIVE": "0"}))
    jobs.append(job)
    with JobWatch(cluster, [1, 2, 3], run_id=run_id) as watch:
        rc = job.wait(60)
        watch.assert_clean(1.0, since=job.ended)
    assert rc == 137, job.output
    watch.assert_saw(3, per_node=3)
    assert "rank 2 on node3 was killed by SIGKILL" in job.output
    assert re.search(r"node3 \(node 2\): r2 SIGKILL \(137\).*ROOT CAUSE", job.output), job.output
    assert meta(tmp_path, run_id)["root_cause"]["signal"] == 9


@pytest.mark.ssh
@pytest.mark.torch
def test_term_ignoring_job_is_killed_after_the_grace(cluster: tc.Cluster, tmp_path: Path,
                                                     jobs) -> None:
    """Every rank ignores SIGTERM; rank 0 exits 3: the others are KILLed after --grace 2."""
    run_id = new_id("ignoreterm")
    job = Dtrain(cluster, run_args(cluster, tmp_path, run_id, TRAIN, "--grace", "2", env={
        "WL_FAIL_RANK": "0", "WL_FAIL_STEP": "2", "WL_FAIL_CODE": "3", "WL_COLLECTIVE": "0",
        "WL_IGNORE_TERM": "1"}))
    jobs.append(job)
    with JobWatch(cluster, [1, 2, 3], run_id=run_id) as watch:
        job.wait_line(r"rank 0: failing on purpose", timeout=60)
        rc = job.wait(60)
        watch.assert_clean(1.0, since=job.ended)
    assert rc == 3, job.output
    watch.assert_saw(3, per_node=3)
    assert job.ended is not None
    # from the rank's exit as its shim reported it (the console may hold a stderr line for
    # folding, docs/output-and-archive.md), to dtrain's exit: the grace, then the KILL
    failed_at = float(meta(tmp_path, run_id)["root_cause"]["t"])  # epoch; job.ended: monotonic
    took = job.ended - (failed_at - (time.time() - time.monotonic()))
    assert 1.8 <= took < 15.0, f"{took:.2f}s\n{job.output}"
    assert "FAILED: rank 0 on node1 exited 3" in job.output


# -- the user stops dtrain -----------------------------------------------------------------------

@pytest.mark.ssh
@pytest.mark.torch
@pytest.mark.parametrize(("sig", "code", "name"), [(signal.SIGINT, 130, "Ctrl-C"),
                                                    (signal.SIGTERM, 143, "SIGTERM")])
def test_interrupt_stops_every_node(cluster: tc.Cluster, tmp_path: Path, jobs, sig: int,
                                    code: int, name: str) -> None:
    run_id = new_id(name.lower())
    job = Dtrain(cluster, run_args(cluster, tmp_path, run_id, TRAIN))
    jobs.append(job)
    with JobWatch(cluster, [1, 2, 3], run_id=run_id) as watch:
        job.wait_line(r"r\d: step 1 ", timeout=60, count=3)
        t0 = time.monotonic()
        job.signal(sig)
        rc = job.wait(30)
        took = watch.assert_clean(1.0, since=job.ended)
    assert rc == code, job.output
    watch.assert_saw(3, per_node=3)
    assert f"{name}: stopping every node" in job.output
    assert f"interrupted by {name} (exit {code})" in job.output
    assert meta(tmp_path, run_id)["outcome"].startswith("interrupted")
    print(f"{name}: dtrain ended {job.ended - t0:.2f}s after the signal, clean {took:.2f}s later")


@pytest.mark.ssh
@pytest.mark.torch
def test_second_ctrl_c_kills_at_once(cluster: tc.Cluster, tmp_path: Path, jobs) -> None:
    """Ranks ignore SIGTERM and the grace is long: the second Ctrl-C KILLs now."""
    run_id = new_id("ctrlc2")
    job = Dtrain(cluster, run_args(cluster, tmp_path, run_id, TRAIN, "--grace", "60",
                                   env={"WL_IGNORE_TERM": "1", "WL_COLLECTIVE": "0"}))
    jobs.append(job)
    with JobWatch(cluster, [1, 2, 3], run_id=run_id) as watch:
        job.wait_line(r"r\d: step 1 ", timeout=60, count=3)
        job.signal(signal.SIGINT)
        job.wait_line(r"Ctrl-C: stopping every node", timeout=10)
        # an absence (nothing may happen for a while): the grace is 60 s, we look for 1 s
        with pytest.raises(subprocess.TimeoutExpired):
            job.proc.wait(1.0)
        t0 = time.monotonic()
        job.signal(signal.SIGINT)
        rc = job.wait(20)
        watch.assert_clean(1.0, since=job.ended)
    assert rc == 130, job.output
    watch.assert_saw(3, per_node=3)
    assert job.ended is not None and job.ended - t0 < 8.0
    assert "Ctrl-C again: killing every node now" in job.output


@pytest.mark.ssh
@pytest.mark.torch
def test_launcher_sigkill_nodes_clean_themselves(cluster: tc.Cluster, tmp_path: Path,
                                                  jobs) -> None:
    """kill -9 dtrain: no launcher to stop anything; each supervisor sees stdin EOF and tears
    its job down at once. The heartbeat timeout is 300 s, so only the EOF path can make the
    nodes clean within seconds."""
    run_id = new_id("kill9")
    job = Dtrain(cluster, run_args(cluster, tmp_path, run_id, TRAIN, "--heartbeat-timeout",
                                   "300"))
    jobs.append(job)
    with JobWatch(cluster, [1, 2, 3], run_id=run_id) as watch:
        job.wait_line(r"r\d: step 1 ", timeout=60, count=3)
        watch.scan()
        watch.assert_saw(3, per_node=3)
        job.signal(signal.SIGKILL)
        job.wait(5)
        took = watch.assert_clean(KILL9_CLEAN, since=job.ended)
    print(f"kill -9 dtrain: nodes clean {took:.2f}s later")


# -- phase bounds --------------------------------------------------------------------------------

@pytest.mark.ssh
@pytest.mark.torch
def test_run_timeout_is_124(cluster: tc.Cluster, tmp_path: Path, jobs) -> None:
    run_id = new_id("timeout")
    job = Dtrain(cluster, run_args(cluster, tmp_path, run_id, TRAIN, "--timeout", "12"))
    jobs.append(job)
    with JobWatch(cluster, [1, 2, 3], run_id=run_id) as watch:
        reached = job.wait_line(r"--timeout 12 s reached: stopping every node", timeout=60)
        rc = job.wait(30)
        watch.assert_clean(1.0, since=job.ended)
    assert rc == 124, job.output
    watch.assert_saw(3, per_node=3)
    assert "FAILED: timed out (--timeout)" in job.output
    assert job.ended is not None and job.ended - reached < 5.0


@pytest.mark.ssh
def test_unreachable_node_is_named_and_nothing_starts(cluster: tc.Cluster, tmp_path: Path,
                                                      jobs) -> None:
    """node3 cut off before the run: the connect phase is bounded (--connect-timeout), the
    node is named, exit 255, and nothing was started on the others."""
    run_id = new_id("unreach")
    cluster.link_down(3)
    try:
        job = Dtrain(cluster, run_args(cluster, tmp_path, run_id, SPIN, "--connect-timeout", "2"))
        jobs.append(job)
        with JobWatch(cluster, [1, 2, 3], run_id=run_id) as watch:
            rc = job.wait(30)
            watch.assert_clean(1.0, since=job.ended)
    finally:
        cluster.link_up(3)
    assert rc == 255, job.output
    assert "node3" in job.output and "nothing was started" in job.output
    assert watch.count() == 0
    assert job.ended is not None and job.ended - job.t0 < 15


# -- a node is lost ------------------------------------------------------------------------------

@pytest.mark.ssh
@pytest.mark.torch
def test_link_down_node_lost(cluster: tc.Cluster, tmp_path: Path, jobs) -> None:
    """node3's link goes down mid-run: heartbeats stop, dtrain names it (exit 255) and stops
    the others; node3's own supervisor, cut off, tears its job down once the launcher has
    been silent for 3 heartbeat timeouts (decide/outcome/liveness.launcher_timeout; checked while
    the link is still down)."""
    run_id = new_id("linkdown")
    job = Dtrain(cluster, run_args(cluster, tmp_path, run_id, TRAIN, "--heartbeat-timeout", "5"))
    jobs.append(job)
    watch = JobWatch(cluster, [1, 2, 3], run_id=run_id).start()
    try:
        job.wait_line(r"r\d: step 1 ", timeout=60, count=3)
        watch.scan()
        watch.assert_saw(3, per_node=3)
        cut = time.monotonic()
        cluster.link_down(3)
        rc = job.wait(40)
        detected = job.ended - cut if job.ended else -1
        # the nodes dtrain still reaches are stopped before it exits
        _only(watch, 1).assert_clean(1.0, since=job.ended)
        _only(watch, 2).assert_clean(1.0, since=job.ended)
        # the cut-off node cleans itself up: no launcher reaches it
        ok3, took3 = JobWatch.wait_clean(_only(watch, 3), 30)
        assert ok3, f"node3 not clean {time.monotonic() - cut:.1f}s after the cut: {watch.left()}"
        cut_clean = time.monotonic() - cut
    finally:
        cluster.link_up(3)
        watch.stop()
    watch.assert_clean(1.0)
    assert rc == 255, job.output
    assert "FAILED: node node3 lost: no heartbeat for 5 s" in job.output, job.output
    assert re.search(r"node3 \(node 2\): .*LOST", job.output), job.output
    assert 4.0 < detected < 15.0, detected
    assert cut_clean < 3 * 5 + 5 + 5, cut_clean
    m = meta(tmp_path, run_id)
    assert (m["root_cause"]["kind"], m["root_cause"]["host"], m["exit_code"]) == (
        "lost", "node3", 255)
    print(f"link down: dtrain ended {detected:.2f}s after the cut; node3 clean after "
          f"{cut_clean:.2f}s")


def _supervisor_pid(watch: JobWatch, k: int) -> int:
    """The pid of node k's supervisor (the job's process whose parent is sshd)."""
    watch.wait_saw(len(watch.nodes))
    with watch._lock:
        keys = [key for key in watch.known[k] if key in watch.sup_keys]
    assert len(keys) == 1, (k, keys, watch.known)
    return keys[0][0]


@pytest.mark.ssh
@pytest.mark.torch
def test_a_stopped_launcher_loses_no_node(cluster: tc.Cluster, tmp_path: Path, jobs) -> None:
    """dtrain itself is SIGSTOPped for 8 s (past its --heartbeat-timeout of 5) while the
    nodes keep running, then SIGCONTed: the time it was not running is not the nodes'
    silence (decide/outcome/liveness.py), and the nodes, which wait 3 timeouts for the launcher,
    are still there: the run carries on to its own end, no node lost, no tick missing."""
    run_id = new_id("launcher-stop")
    job = Dtrain(cluster, run_args(cluster, tmp_path, run_id, "tests/workloads/tick.py",
                                   "--heartbeat-timeout", "5", hosts="node[1-2]",
                                   env={"TICK_S": "0.5", "TICK_N": "40"}))
    jobs.append(job)
    with JobWatch(cluster, [1, 2], run_id=run_id) as watch:
        job.wait_line(r"r\d: tick \d 2$", timeout=90, count=2)
        watch.wait_saw(2)
        job.proc.send_signal(signal.SIGSTOP)
        try:
            time.sleep(8.0)
        finally:
            job.proc.send_signal(signal.SIGCONT)
        rc = job.wait(90)
        watch.assert_clean(2.0, since=job.ended)
    assert rc == 0, job.output
    assert "lost" not in job.output.lower(), job.output
    assert "no heartbeat" not in job.output, job.output
    for r in (0, 1):
        ticks = [ln for ln in job.output.splitlines() if re.search(rf"r{r}: tick {r} \d+$", ln)]
        assert len(ticks) == 40, (r, ticks)


@pytest.mark.ssh
@pytest.mark.torch
def test_a_stopped_supervisor_is_a_lost_node(cluster: tc.Cluster, tmp_path: Path,
                                             jobs) -> None:
    """node2's supervisor is SIGSTOPped (its job keeps running, the launcher keeps running):
    nothing comes from node2, and dtrain names it lost after --heartbeat-timeout (exit 255)
    and stops node1; SIGCONTed, node2's supervisor finds its channel gone and cleans up."""
    run_id = new_id("sup-stop")
    job = Dtrain(cluster, run_args(cluster, tmp_path, run_id, "tests/workloads/tick.py",
                                   "--heartbeat-timeout", "5", hosts="node[1-2]"))
    jobs.append(job)
    with JobWatch(cluster, [1, 2], run_id=run_id) as watch:
        job.wait_line(r"r\d: tick \d 2$", timeout=90, count=2)
        sup = _supervisor_pid(watch, 2)
        os.kill(sup, signal.SIGSTOP)
        try:
            rc = job.wait(60)
        finally:
            os.kill(sup, signal.SIGCONT)
        watch.assert_clean(15.0)
    assert rc == 255, job.output
    assert "FAILED: node node2 lost: no heartbeat for 5 s" in job.output, job.output
    m = meta(tmp_path, run_id)
    assert (m["root_cause"]["kind"], m["root_cause"]["host"], m["exit_code"]) == (
        "lost", "node2", 255)


def _only(watch: JobWatch, k: int) -> JobWatch:
    """A view of one node of a watch (same records)."""
    view = JobWatch(watch.cluster, [k], run_id=None)
    view.env_tag, view.marker = watch.env_tag, watch.marker
    view.known = {k: watch.known[k]}
    view._checked = watch._checked
    view.sup_keys = watch.sup_keys
    view._lock = watch._lock
    return view


# -- isolation -----------------------------------------------------------------------------------

@pytest.mark.ssh
@pytest.mark.torch
def test_two_jobs_on_the_same_nodes_are_isolated(cluster: tc.Cluster, tmp_path: Path,
                                                 jobs) -> None:
    id_a, id_b = new_id("iso-a"), new_id("iso-b")
    a = Dtrain(cluster, run_args(cluster, tmp_path, id_a, TRAIN))
    b = Dtrain(cluster, run_args(cluster, tmp_path, id_b, TRAIN,
                                 env={"WL_STEPS": "30", "WL_STEP_SLEEP": "0.25"}))
    jobs += [a, b]
    with JobWatch(cluster, [1, 2, 3], run_id=id_a) as wa, \
            JobWatch(cluster, [1, 2, 3], run_id=id_b) as wb:
        a.wait_line(r"r\d: step 1 ", timeout=60, count=3)
        b.wait_line(r"r\d: step 1 ", timeout=60, count=3)
        a.signal(signal.SIGINT)
        assert a.wait(30) == 130, a.output
        wa.assert_clean(1.0, since=a.ended)
        assert wb.left(), "job B must still be running when A is gone"
        rc_b = b.wait(60)
        wb.assert_clean(1.0, since=b.ended)
    assert rc_b == 0, b.output
    wa.assert_saw(3, per_node=3)
    wb.assert_saw(3, per_node=3)
    # neither watch took the other job's processes for its own
    assert not {key for k in wa.known for key in wa.known[k]} & {
        key for k in wb.known for key in wb.known[k]}
    assert "ok: succeeded (exit 0)" in b.output
    port_a = re.search(r"master [\d.]+:(\d+)", a.output)
    port_b = re.search(r"master [\d.]+:(\d+)", b.output)
    assert port_a and port_b and port_a.group(1) != port_b.group(1)


# -- daemons: found by ancestry, killed with the job ---------------------------------------------

def _daemons_seen(job: Dtrain, watch: JobWatch, tag: str,
                  daemons: dict[int, tuple[int, int]]) -> None:
    """Fill ``daemons`` (node index -> (pid, start time)) with the daemon each node reported,
    then check the watch saw them all, and that only their ancestry can find them (empty
    environment)."""
    job.wait_line(r"daemon pid \d+ up", timeout=60, count=3)
    pids = {int(k): int(pid) for k, pid in
            re.findall(rf"^node(\d){tag}: daemon pid (\d+) up$", job.output, re.M)}
    for k, pid in pids.items():
        if (st := tc.proc_stat(pid)) is not None:
            daemons[k] = (pid, st[1])
    assert sorted(daemons) == [1, 2, 3], (pids, job.output)
    deadline = time.monotonic() + 10
    while not all(watch.saw_pid(k, pid) for k, pid in pids.items()) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(watch.saw_pid(k, pid) for k, pid in pids.items()), (pids, watch.known)
    for pid in pids.values():
        assert Path(f"/proc/{pid}/environ").read_bytes() == b"", "the daemon must have no env"


def _daemons_left(daemons: dict[int, tuple[int, int]]) -> list[tuple[int, int]]:
    """(node, pid) of the daemons still alive; KILLs them (they ignore TERM): a failed test
    must not leave them on the shared nodes."""
    left = [(k, pid) for k, (pid, start) in daemons.items()
            if (st := tc.proc_stat(pid)) is not None and st[1] == start]
    for _, pid in left:
        os.kill(pid, signal.SIGKILL)
    return left


def _daemons_die_with(job: Dtrain, watch: JobWatch, tag: str, go: Path) -> None:
    """Each node's daemon (its line tagged ``tag`` after the node) seen under ``watch``,
    then ``go`` lets the job end: it succeeds and leaves nothing, no daemon either (a
    survivor is KILLed and named)."""
    daemons: dict[int, tuple[int, int]] = {}
    try:
        with watch:
            _daemons_seen(job, watch, tag, daemons)
            go.touch()
            rc = job.wait(60)
            watch.assert_clean(1.0, since=job.ended)
    finally:
        go.unlink(missing_ok=True)
        left = _daemons_left(daemons)
    assert not left, f"daemons survived the job: {left}"
    assert rc == 0, job.output
    watch.assert_saw(3, per_node=3)  # supervisor, daemon.py (or its rank), the daemon


@pytest.mark.ssh
@pytest.mark.torch
def test_a_setsid_daemon_with_no_environment_dies_with_the_run(cluster: tc.Cluster,
                                                               tmp_path: Path, jobs) -> None:
    """Each rank double-forks a daemon (setsid, empty environment, ignores SIGTERM) and exits
    0: the job succeeds, and the supervisor kills the daemon before it reports the exit."""
    run_id = new_id("daemon")
    go = cluster.shared_dir / f"{run_id}.go"
    job = Dtrain(cluster, run_args(cluster, tmp_path, run_id, DAEMON, script_args=[str(go)]))
    jobs.append(job)
    _daemons_die_with(job, JobWatch(cluster, [1, 2, 3], run_id=run_id), r" r\d", go)


@pytest.mark.ssh
def test_a_setsid_daemon_with_no_environment_dies_with_exec(cluster: tc.Cluster,
                                                            jobs) -> None:
    go = cluster.shared_dir / f"{new_id('daemon-exec')}.go"
    job = Dtrain(cluster, ["exec", "-H", "node[1-3]", "--no-color", "--", cluster.python,
                           str(REPO / DAEMON), str(go)])
    jobs.append(job)
    _daemons_die_with(job, JobWatch(cluster, [1, 2, 3], marker=str(go)), "", go)


# -- exec ----------------------------------------------------------------------------------------

def _sleep_marker() -> str:
    return f"3{uuid.uuid4().int % 10:d}.{uuid.uuid4().int % 10**6:06d}"  # unique on the nodes


@pytest.mark.ssh
def test_exec_timeout_is_124_and_leaves_nothing(cluster: tc.Cluster, jobs) -> None:
    marker = _sleep_marker()
    job = Dtrain(cluster, ["exec", "-H", "node[1-3]", "--timeout", "1", "--no-color", "--",
                           "sleep", marker])
    jobs.append(job)
    with JobWatch(cluster, [1, 2, 3], marker=f"sleep\0{marker}") as watch:
        rc = job.wait(30)
        watch.assert_clean(1.0, since=job.ended)
    assert rc == 124, job.output
    watch.assert_saw(3)  # a supervisor and its sleep on each node
    assert job.ended is not None and job.ended - job.t0 < 10


@pytest.mark.ssh
def test_exec_launcher_sigkill_nodes_clean_themselves(cluster: tc.Cluster, jobs) -> None:
    marker = _sleep_marker()
    job = Dtrain(cluster, ["exec", "-H", "node[1-3]", "--no-color", "--heartbeat-timeout",
                           "300", "--", "sleep", marker])
    jobs.append(job)
    with JobWatch(cluster, [1, 2, 3], marker=f"sleep\0{marker}") as watch:
        watch.wait_saw(3)  # a supervisor and its sleep on each node
        job.signal(signal.SIGKILL)
        job.wait(5)
        watch.assert_clean(KILL9_CLEAN, since=job.ended)


@pytest.mark.ssh
@pytest.mark.parametrize(("sig", "code", "name"), [(signal.SIGINT, 130, "Ctrl-C"),
                                                    (signal.SIGTERM, 143, "SIGTERM")])
def test_exec_interrupt_is_128_plus_n_and_leaves_nothing(cluster: tc.Cluster, jobs, sig: int,
                                                         code: int, name: str) -> None:
    marker = _sleep_marker()
    job = Dtrain(cluster, ["exec", "-H", "node[1-3]", "--no-color", "--", "sleep", marker])
    jobs.append(job)
    with JobWatch(cluster, [1, 2, 3], marker=f"sleep\0{marker}") as watch:
        watch.wait_saw(3)  # a supervisor and its sleep on each node
        job.signal(sig)
        rc = job.wait(30)
        watch.assert_clean(1.0, since=job.ended)
    assert rc == code, f"{name}: {job.output}"
    assert "Traceback" not in job.output, job.output


@pytest.mark.ssh
def test_exec_command_killed_by_a_signal_is_128_plus_n_and_leaves_nothing(
        cluster: tc.Cluster, jobs) -> None:
    """node1's shell dies of SIGKILL (137), node2's of SIGUSR1 (138), node3's exits 0; each
    leaves a background sleep behind. exec exits with the largest code, names both signals,
    and no sleep survives."""
    marker = _sleep_marker()
    go = cluster.shared_dir / f"{new_id('exec-signal')}.go"
    line = (f"sleep {marker} & while [ ! -e {go} ]; do sleep 0.05; done; "
            "case $(hostname) in node1) kill -KILL $$;; node2) kill -USR1 $$;; esac; exit 0")
    job = Dtrain(cluster, ["exec", "-H", "node[1-3]", "--no-color", "--", line])
    jobs.append(job)
    try:
        with JobWatch(cluster, [1, 2, 3], marker=f"sleep\0{marker}") as watch:
            watch.wait_saw(3)
            go.touch()
            rc = job.wait(30)
            watch.assert_clean(1.0, since=job.ended)
    finally:
        go.unlink(missing_ok=True)
    assert rc == 128 + signal.SIGUSR1, job.output
    assert "node1: killed by signal 9" in job.output, job.output
    assert "node2: killed by signal 10" in job.output, job.output
    assert "node3" not in job.output, job.output
    assert "Traceback" not in job.output, job.output


# -- the orchestrator and the verdict, locally (no sshd, no torch) -------------------------------

class _Router:
    """LineRouter stand-in: remembers dtrain's messages."""

    def __init__(self) -> None:
        self.said: list[tuple[str, str]] = []
        self.chunks: list[tuple[str, int | None, str, bytes]] = []

    def chunk(self, host, rank, stream, data) -> None:  # type: ignore[no-untyped-def]
        self.chunks.append((host.label, rank, stream, data))

    def flush(self, host: str) -> None:
        pass

    def say(self, host: str, text: str) -> None:
        self.said.append((host, text))


def _local_job(shells: dict[str, str], policy, *, setup: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    from launcher.job.node import JobSpec
    from launcher.job.orchestrate import Job, NodeLaunch
    from launcher.models import Host

    hosts = [Host(name) for name in shells]
    launches = {name: NodeLaunch(JobSpec(shell=cmd, grace=policy.grace), python=sys.executable,
                                 setup=(setup or {}).get(name))
                for name, cmd in shells.items()}
    router = _Router()
    return Job(hosts, launches, policy, router), router  # type: ignore[arg-type]


def _plan(*hosts: str, ranks: int = 1):  # type: ignore[no-untyped-def]
    from types import SimpleNamespace

    from launcher.models import Host

    return SimpleNamespace(nodes=[SimpleNamespace(host=Host(h), node_rank=i,
                                                  ranks=range(i * ranks, (i + 1) * ranks))
                                  for i, h in enumerate(hosts)])


async def test_first_failure_stops_every_other_node_local() -> None:
    from launcher.decide.outcome.verdict import TailKeeper, verdict
    from launcher.job.orchestrate import Policy
    from launcher.transports import LocalTransport

    job, _ = _local_job({"a": "sleep 0.3; exit 3", "b": "sleep 300", "c": "sleep 300"},
                        Policy(grace=2.0))
    t0 = time.monotonic()
    out = await job.run(LocalTransport())
    assert time.monotonic() - t0 < 60  # b and c were stopped, not waited for (300 s)
    assert out.root is not None and (out.root.kind, out.root.host, out.root.code) == (
        "node", "a", 3)
    assert [f.host for f in out.failures] == ["a"]  # b and c are followers
    assert {h: n.exit_code for h, n in out.nodes.items()} == {"a": 3, "b": 143, "c": 143}
    assert out.nodes["b"].stopped == "a failed (exit 3)"
    v = verdict(out, _plan("a", "b", "c"), TailKeeper())  # type: ignore[arg-type]
    assert (v.code, v.root_host) == (3, "a")


async def test_start_timeout_names_the_node_local() -> None:
    from launcher.decide.outcome.verdict import TailKeeper, verdict
    from launcher.job.orchestrate import Policy
    from launcher.transports import LocalTransport

    job, router = _local_job({"a": "sleep 300", "b": "sleep 300"},
                             Policy(grace=2.0, start_timeout=0.8), setup={"b": "sleep 1.5"})
    t0 = time.monotonic()
    out = await job.run(LocalTransport())
    assert time.monotonic() - t0 < 60  # the start timeout ended it, not the 300 s jobs
    # b's shell ends by itself: after its setup, the bootstrap finds stdin closed
    import asyncio

    await asyncio.wait_for(job.sessions["b"].proc._proc.wait(), 5)  # type: ignore[union-attr]
    assert out.start_timed_out == ("b",)
    assert ("b", "did not start within 0.8 s") in router.said
    assert out.nodes["b"].abandoned and out.nodes["a"].exit_code == 143
    v = verdict(out, _plan("a", "b"), TailKeeper())  # type: ignore[arg-type]
    assert (v.code, v.root_host, v.root_kind) == (124, "b", "start")
    assert "b did not start within 0.8 s" in v.outcome


class _SilentProcess:
    """A node whose supervisor never answers (a hung machine the network still reaches)."""

    def __init__(self) -> None:
        self.never = asyncio_event()

    async def write(self, data: bytes) -> None:
        pass

    def write_eof(self) -> None:
        pass

    async def read_stdout(self, n: int) -> bytes:
        await self.never.wait()
        return b""

    read_stderr = read_stdout

    async def wait(self) -> int | None:
        await self.never.wait()
        return None

    def abort(self) -> None:
        pass


def asyncio_event():  # type: ignore[no-untyped-def]
    import asyncio

    return asyncio.Event()


async def test_a_node_that_does_not_stop_is_abandoned_local(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from launcher.job import orchestrate
    from launcher.models import Host
    from launcher.transports import LocalTransport
    from launcher.transports.base import Connection

    class Silent(Connection):
        def __init__(self, host: Host) -> None:
            self.host = host

        async def start(self, command: str):  # type: ignore[no-untyped-def]
            return _SilentProcess()

        async def aclose(self) -> None:
            pass

    monkeypatch.setattr(orchestrate, "STOP_MARGIN", 0.5)
    job, router = _local_job({"a": "exit 5", "b": "sleep 300"}, orchestrate.Policy(grace=0.3))
    t0 = time.monotonic()
    out = await job.run(LocalTransport(), {"b": Silent(Host("b"))})
    assert time.monotonic() - t0 < 60  # b was abandoned, not waited for
    assert out.abandoned == ("b",)
    assert out.nodes["b"].abandoned and out.nodes["b"].exit_code is None
    assert out.root is not None and out.root.host == "a"
    assert any(h == "b" and "did not stop within 0.8 s" in t for h, t in router.said)


async def test_stop_asked_before_the_job_was_sent_is_not_lost() -> None:
    import asyncio

    from launcher.job.node import JobSpec, NodeSession
    from launcher.models import Host
    from launcher.transports.local import LocalConnection

    class Slow(LocalConnection):
        async def start(self, command: str):  # type: ignore[no-untyped-def]
            await asyncio.sleep(0.3)
            return await super().start(command)

    session = NodeSession(Slow(Host("a")), JobSpec(shell="sleep 300", grace=2.0),
                          python=sys.executable, on_chunk=lambda *a: None,
                          on_event=lambda *a: None)
    task = asyncio.create_task(session.run())
    await asyncio.sleep(0.05)
    await session.stop("early stop", 2.0)
    t0 = time.monotonic()
    out = await asyncio.wait_for(task, 120)
    assert time.monotonic() - t0 < 60  # stopped, not run to the end of its 300 s
    assert (out.exit_code, out.stopped) == (143, "early stop")


def _outcome(**kw):  # type: ignore[no-untyped-def]
    from launcher.decide.outcome.outcomes import JobOutcome

    return JobOutcome(**kw)


def _node(host: str, code: int | None, ranks: dict | None = None, **kw):  # type: ignore[no-untyped-def]
    from launcher.decide.outcome.outcomes import NodeOutcome
    from launcher.job.events import rank_end
    from launcher.models import Host

    # the exit message's ranks, as the decoder types them (job/events.py)
    ends = {int(r): rank_end(int(r), e) for r, e in (ranks or {}).items()}
    return NodeOutcome(Host(host), code, ranks=ends, started=100.0, ended=110.0, **kw)


def _verdict(out, *hosts: str):  # type: ignore[no-untyped-def]
    from launcher.decide.outcome.verdict import TailKeeper, summary_lines, verdict

    v = verdict(out, _plan(*hosts), TailKeeper())  # type: ignore[arg-type]
    return v, summary_lines(out, _plan(*hosts), v)  # type: ignore[arg-type]


def test_verdict_root_rank_code_and_followers() -> None:
    from launcher.decide.outcome.outcomes import Failure

    out = _outcome(
        nodes={"a": _node("a", 1, {"0": {"code": 143, "signal": 15, "t": 5.2, "duration": 5.0}},
                          stopped="b rank 1 exited 7"),
               "b": _node("b", 1, {"1": {"code": 7, "signal": None, "t": 5.0, "duration": 4.9}})},
        failures=[Failure("rank", "b", rank=1, code=7, t=5.0, seen=5.01)],
        stop_reason="b rank 1 exited 7", stop_t=5.02)
    v, lines = _verdict(out, "a", "b")
    assert (v.code, v.root_host, v.root_rank) == (7, "b", 1)
    assert lines[0] == "FAILED: rank 1 on b exited 7 (exit 7)"
    assert lines[1].startswith("  b (node 1): r1 exit 7 after 4.9s (ROOT CAUSE)")  # first
    assert "r0 SIGTERM (143) after 5.0s (stopped by dtrain)" in lines[2]


@pytest.mark.parametrize(("kw", "code", "text"), [
    ({"interrupted": 2, "interrupted_t": 1.0}, 130, "interrupted by Ctrl-C"),
    ({"interrupted": 15, "interrupted_t": 1.0, "killed": True}, 143,
     "interrupted by SIGTERM, then killed"),
    ({"timed_out": True}, 124, "timed out"),
])
def test_verdict_interrupt_and_timeout(kw: dict, code: int, text: str) -> None:
    v, _ = _verdict(_outcome(nodes={"a": _node("a", 143)}, **kw), "a")
    assert (v.code, v.outcome.startswith(text)) == (code, True), v


def test_verdict_failure_before_ctrl_c_wins() -> None:
    from launcher.decide.outcome.outcomes import Failure

    out = _outcome(nodes={"a": _node("a", 1, {"0": {"code": 139, "signal": 11, "t": 1.0}})},
                   failures=[Failure("rank", "a", rank=0, code=139, signal=11, seen=1.0)],
                   interrupted=2, interrupted_t=2.0)
    v, _ = _verdict(out, "a")
    assert (v.code, v.outcome) == (139, "rank 0 on a was killed by SIGSEGV")


def test_verdict_lost_unreachable_and_success() -> None:
    from launcher.decide.outcome.outcomes import Failure

    lost = _outcome(nodes={"a": _node("a", None, lost=True, error="no heartbeat for 5 s"),
                           "b": _node("b", 143)},
                    failures=[Failure("lost", "a", code=255, error="no heartbeat for 5 s")])
    v, lines = _verdict(lost, "a", "b")
    assert (v.code, v.outcome) == (255, "node a lost: no heartbeat for 5 s")
    assert "LOST: no heartbeat for 5 s" in lines[1]
    bad = _outcome(nodes={"a": _node("a", None, error="python3 not found")},
                   failures=[Failure("node", "a", error="python3 not found")])
    assert _verdict(bad, "a")[0].code == 255
    ok = _outcome(nodes={"a": _node("a", 0, {"0": {"code": 0, "t": 1.0}})})
    assert _verdict(ok, "a")[0].code == 0
    missing = _outcome(nodes={"a": _node("a", 0)})
    assert _verdict(missing, "a", "b")[0].code == 255


def test_verdict_node_root_reports_its_failing_rank() -> None:
    """With --max-restarts, rank failures do not stop the job; when torchrun finally gives up
    (exit 1), the exit code is still its first failing rank's."""
    from launcher.decide.outcome.outcomes import Failure

    out = _outcome(nodes={"a": _node("a", 1, {"0": {"code": 0, "t": 2.0},
                                              "1": {"code": 9, "t": 1.5, "duration": 1.0}})},
                   failures=[Failure("node", "a", code=1, seen=3.0)])
    v, lines = _verdict(out, "a")
    assert (v.code, v.root_rank, v.outcome) == (9, 1, "rank 1 on a exited 9")
