"""Runs that outlive the login session, on the real-sshd cluster: `run --detach`, `ps`,
`attach`, `stop`, a lost launcher, and SIGHUP without --detach.

Small on purpose: 2 nodes x 1 rank of tests/workloads/tick.py (no torch in the worker). Each
test checks that no process of its job is left on the nodes (``JobWatch`` of the chaos
tests: processes tagged with the run's DTRAIN_RUN_ID, and their supervisors).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests import cluster as tc
from tests.test_failures import Dtrain, JobWatch
from tests.util import REPO, dtrain

pytestmark = [pytest.mark.ssh, pytest.mark.torch, pytest.mark.timeout(150)]

TICK = "tests/workloads/tick.py"
NODES = [1, 2]
GRACE = 2  # --grace of the detached run: a stop would have ended it this long after


def run_args(cluster: tc.Cluster, archive: Path, run_id: str, *extra: str) -> list[str]:
    return ["run", "-H", "node[1-2]", "--nproc-per-node", "1", "--python", cluster.python,
            "--archive-dir", str(archive), "--run-id", run_id, "--no-color", *extra, TICK]


def ps(cluster: tc.Cluster, archive: Path) -> dict[str, dict[str, Any]]:
    res = dtrain(["ps", "--archive-dir", str(archive), "--json"], env=cluster.client_env(),
                 timeout=30)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["ps_version"] == 1
    return {r["run_id"]: r for r in doc["runs"]}


def ps_table(cluster: tc.Cluster, archive: Path) -> str:
    res = dtrain(["ps", "--archive-dir", str(archive)], env=cluster.client_env(), timeout=30)
    assert res.returncode == 0, res.stderr
    return res.stdout


@pytest.fixture
def archive(cluster: tc.Cluster):  # type: ignore[no-untyped-def]
    """An archive directory another user can look into (for the refused-stop check)."""
    path = cluster.shared_dir / f"detach-{uuid.uuid4().hex[:8]}"
    path.mkdir(mode=0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def launchers():  # type: ignore[no-untyped-def]
    """Detached launcher pids of a test: killed at the end whatever happened."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait_ticks_after(archive: Path, run_id: str, since: float, ranks: tuple[int, ...] = (0, 1),
                     timeout: float = 30) -> None:
    """Wait until every rank's tick line stamped after ``since`` is in the archive: the run
    went on (the launcher writes the archive, so it is alive too). With ``since`` = a signal's
    time + grace + 1, a run that the signal stopped cannot pass: its ranks are dead by then."""
    path = archive / run_id / "output.jsonl"
    deadline = time.monotonic() + timeout
    while True:
        seen = set()
        for raw in path.read_text().splitlines() if path.exists() else []:
            try:
                rec = json.loads(raw)
            except ValueError:
                continue
            if rec.get("t", 0) > since and str(rec.get("line", "")).startswith("tick "):
                seen.add(rec.get("rank"))
        if set(ranks) <= seen:
            return
        assert time.monotonic() < deadline, f"no tick after {since} from ranks " \
            f"{sorted(set(ranks) - seen)} within {timeout}s"
        time.sleep(0.1)


class Session:
    """A login session: a shell in a session of its own that starts dtrain and lingers."""

    def __init__(self, cluster: tc.Cluster, args: list[str]) -> None:
        cmd = shlex.join([sys.executable, "-m", "launcher", *args])
        self.proc = subprocess.Popen(
            ["bash", "-c", f"{cmd}; echo dtrain-rc=$?; sleep 120"], cwd=REPO,
            env=cluster.client_env(PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines: list[str] = []
        self.done = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if line.startswith("dtrain-rc="):
                self.done.set()
        self.done.set()

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def rc(self, timeout: float) -> int:
        assert self.done.wait(timeout), f"dtrain did not return within {timeout}s:\n{self.output}"
        found = [int(x[len("dtrain-rc="):]) for x in self.lines if x.startswith("dtrain-rc=")]
        assert found, self.output
        return found[0]

    def hang_up(self) -> None:
        """A Ctrl-C in that shell, then the terminal closes: SIGINT, then SIGHUP, to every
        process of the session's process group."""
        for sig in (signal.SIGINT, signal.SIGHUP):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
        self.proc.wait(10)


def test_detached_run_survives_logout_then_ps_attach_stop(cluster: tc.Cluster, archive: Path,
                                                          launchers: list[int]) -> None:
    run_id = f"detach-{uuid.uuid4().hex[:8]}"
    with JobWatch(cluster, NODES, run_id=run_id) as watch:
        t0 = time.monotonic()
        session = Session(cluster, run_args(cluster, archive, run_id, "--detach", "--grace",
                                            str(GRACE)))
        assert session.rc(90) == 0, session.output
        started_in = time.monotonic() - t0
        assert f"run {run_id} started; detached" in session.output
        assert f"dtrain attach {run_id} --archive-dir {archive}" in session.output
        info = ps(cluster, archive)[run_id]
        launchers.append(info["launcher_pid"])
        assert (info["state"], info["alive"], info["detached"]) == ("running", True, True)
        assert (info["nodes"], info["world_size"]) == (2, 2)

        # logout: the session's processes get SIGHUP and end; so does a stray SIGHUP to the
        # launcher itself
        session.hang_up()
        os.kill(info["launcher_pid"], signal.SIGHUP)
        wait_ticks_after(archive, run_id, time.time() + GRACE + 1)
        assert ps(cluster, archive)[run_id]["state"] == "running"
        assert watch.supervisors() == 2 and watch.left(), "the job must still be running"
        table = ps_table(cluster, archive)
        assert re.search(rf"^{run_id} +run +running +2 +2 .* ago +\S+ +pid \d+ detached$", table,
                         re.M), table

        # attach follows the live console; Ctrl-C detaches and leaves the run alone
        attach = Dtrain(cluster, ["attach", run_id, "--archive-dir", str(archive), "-n", "2",
                                  "--no-color"])
        attach.wait_line(r"Ctrl-C detaches and leaves the run running", timeout=20)
        first = attach.wait_line(r"^node1 r0: tick 0 \d+$", timeout=20)
        last = attach.wait_line(r"^node1 r0: tick 0 \d+$", timeout=20, count=4)
        assert last > first  # lines arrive while attached: live, not a replay
        assert re.search(r"^node2 r1: tick 1 \d+$", attach.output, re.M), attach.output
        attach.signal(signal.SIGINT)
        assert attach.wait(10) == 0, attach.output
        assert f"detached from run {run_id}; it is still running" in attach.output
        wait_ticks_after(archive, run_id, time.time() + GRACE + 1)
        assert ps(cluster, archive)[run_id]["state"] == "running"
        assert watch.left(), "attach's Ctrl-C must leave the run running"

        # another user may not stop it
        other = subprocess.run(
            ["setpriv", f"--reuid={cluster.user}", f"--regid={cluster.user}", "--clear-groups",
             sys.executable, "-m", "launcher", "stop", run_id, "--archive-dir", str(archive)],
            cwd=REPO, env=cluster.client_env(HOME="/tmp"), capture_output=True, text=True,
            timeout=30)
        # refused before any socket: the run directory (0700) is not theirs to read
        assert other.returncode == 2, (other.returncode, other.stderr)
        assert f"{run_id}: permission denied: the run belongs to another user, refused" in \
            other.stderr, other.stderr
        assert "only the user who started a run can" in other.stderr, other.stderr
        assert "Traceback" not in other.stderr, other.stderr
        assert ps(cluster, archive)[run_id]["state"] == "running"

        # stop: as Ctrl-C in the foreground, from this other shell
        t1 = time.monotonic()
        res = dtrain(["stop", run_id, "--archive-dir", str(archive), "--grace", "2"],
                     env=cluster.client_env(), timeout=60)
        stopped_in = time.monotonic() - t1
        assert res.returncode == 0, res.stderr
        assert f"run {run_id} stopped: stopped by `dtrain stop`" in res.stderr
        assert "(exit 130)" in res.stderr
        watch.assert_clean(5)
    meta = json.loads((archive / run_id / "meta.json").read_text())
    assert (meta["exit_code"], meta["state"]) == (130, "finished")
    assert meta["launcher"]["detached"] is True
    assert not (archive / run_id / "control.sock").exists()
    assert "detached: launcher pid" in (archive / run_id / "launcher.log").read_text()
    assert ps(cluster, archive)[run_id]["state"] == "finished"
    assert re.search(rf"^{run_id} +run +finished \(130\) ", ps_table(cluster, archive), re.M)
    print(f"detach: started and detached in {started_in:.1f}s; stop took {stopped_in:.1f}s")


def test_detached_launcher_imports_nothing_from_the_project_and_keeps_no_secret_in_argv(
        cluster: tc.Cluster, archive: Path, launchers: list[int], tmp_path: Path) -> None:
    """The detached child is `python -P -c <fixed code>`: a project's json.py, secrets.py,
    logging.py or types.py in the current directory is never imported, and the request
    (-e NAME=value) reaches it on stdin, so /proc/<pid>/cmdline holds no value for days."""
    project = tmp_path / "project"
    project.mkdir()
    marker = tmp_path / "imported"
    for name in ("json", "secrets", "logging", "types"):
        (project / f"{name}.py").write_text(f"open({str(marker)!r}, 'a').write('{name}\\n')\n")
    run_id = f"hygiene-{uuid.uuid4().hex[:8]}"
    secret = f"v-{uuid.uuid4().hex}"
    args = run_args(cluster, archive, run_id, "--detach", "--workdir", str(REPO),
                    "-e", f"DTRAIN_T_TOKEN={secret}", "-e", f"DTRAIN_T_PLAIN={secret}x")
    # as the installed console script starts it: the project directory is not on sys.path
    res = subprocess.run([sys.executable, "-P", "-m", "launcher", *args], cwd=project,
                         env=cluster.client_env(PYTHONPATH=str(REPO)), capture_output=True,
                         text=True, timeout=90)
    assert res.returncode == 0, res.stdout + res.stderr
    info = ps(cluster, archive)[run_id]
    launchers.append(info["launcher_pid"])
    cmdline = Path(f"/proc/{info['launcher_pid']}/cmdline").read_bytes()
    # the detached launcher itself, titled with its run (docs/runs.md, "Everyone's runs")
    assert cmdline.split(b"\0")[0] == f"dtrain run {run_id} 2 nodes".encode(), cmdline
    assert secret.encode() not in cmdline and b"DTRAIN_T_" not in cmdline, cmdline
    assert not marker.exists(), f"the launcher imported {marker.read_text().split()}"
    with JobWatch(cluster, NODES, run_id=run_id) as watch:
        res = dtrain(["stop", run_id, "--archive-dir", str(archive), "--grace", "2"],
                     env=cluster.client_env(), timeout=60)
        assert res.returncode == 0, res.stderr
        watch.assert_clean(5)
    meta = json.loads((archive / run_id / "meta.json").read_text())
    assert "DTRAIN_T_TOKEN=***" in meta["command"], meta["command"]
    assert not marker.exists()
    for name in ("launcher.log", "launcher.lock", "meta.json"):
        assert (archive / run_id / name).stat().st_mode & 0o777 == 0o600, name


def test_killed_detached_launcher_is_lost_and_nodes_clean(cluster: tc.Cluster, archive: Path,
                                                          launchers: list[int]) -> None:
    run_id = f"lost-{uuid.uuid4().hex[:8]}"
    res = dtrain(run_args(cluster, archive, run_id, "--detach", "--heartbeat-timeout", "3"),
                 env=cluster.client_env(), timeout=90)
    assert res.returncode == 0, res.stdout + res.stderr
    info = ps(cluster, archive)[run_id]
    launchers.append(info["launcher_pid"])
    with JobWatch(cluster, NODES, run_id=run_id) as watch:
        deadline = time.monotonic() + 30
        while watch.supervisors() != 2:  # the watch sees the job before the kill
            assert time.monotonic() < deadline, f"supervisors seen: {watch.supervisors()}"
            time.sleep(0.1)
        os.kill(info["launcher_pid"], signal.SIGKILL)
        ok, took = watch.wait_clean(20)
    assert ok, f"left after 20s: {watch.left()}"
    lost = ps(cluster, archive)[run_id]
    assert (lost["state"], lost["alive"], lost["exit_code"]) == ("launcher lost", False, None)
    assert "no heartbeat from the launcher for 9 s" in lost["note"]  # 3 timeouts
    table = ps_table(cluster, archive)
    assert re.search(rf"^{run_id} +run +launcher lost ", table, re.M), table
    assert f"{run_id}: launcher lost: " in table and "stopped the job by themselves" in table
    res = dtrain(["stop", run_id, "--archive-dir", str(archive)], env=cluster.client_env(),
                 timeout=30)
    assert res.returncode == 0 and "nothing to stop" in res.stderr, res.stderr
    print(f"kill -9 detached launcher: nodes clean {took:.2f}s later")


def test_detach_preflight_failure_prints_and_exits_as_in_the_foreground(
        cluster: tc.Cluster, archive: Path) -> None:
    args = ["run", "-H", "node[1-2]", "--python", "/nonexistent/python3", "--archive-dir",
            str(archive), "--no-color", TICK]
    fg = dtrain(args, env=cluster.client_env(), timeout=60)
    bg = dtrain([*args[:1], "--detach", *args[1:]], env=cluster.client_env(), timeout=60)
    assert fg.returncode == bg.returncode == 1, bg.stderr
    assert "/nonexistent/python3 not found" in bg.stderr
    assert bg.stderr == fg.stderr
    assert "detached" not in bg.stderr


def test_without_detach_sighup_stops_every_node(cluster: tc.Cluster, archive: Path) -> None:
    run_id = f"hup-{uuid.uuid4().hex[:8]}"
    job = Dtrain(cluster, run_args(cluster, archive, run_id, "--grace", "2"))
    try:
        with JobWatch(cluster, NODES, run_id=run_id) as watch:
            job.wait_line(r"tick 1 2$", timeout=60)
            # issue 24.7: not on a pipe (it was 150 characters on every run); on a
            # terminal one short line (test_graceful_stop's tmux test)
            assert "closing this terminal" not in job.output
            job.signal(signal.SIGHUP)
            rc = job.wait(30)
            watch.assert_clean(5)
    finally:
        job.kill()
    assert rc == 129, job.output
    assert "SIGHUP (the terminal closed): stopping every node" in job.output
    assert json.loads((archive / run_id / "meta.json").read_text())["exit_code"] == 129
