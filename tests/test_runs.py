"""ps/attach/stop without a cluster: run states, the launcher lock, the control socket,
attach's tail, and --detach's bad input failing before anything starts."""

from __future__ import annotations

import asyncio
import io
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.errors import DtrainError
from launcher.job.control import CONTROL, ControlServer, StopRequest, request_stop
from launcher.models import OutputLine
from launcher.output.archive import RunArchive
from launcher.output.logview import replay, tail_offset
from launcher.output.rundir import RunDir
from launcher.output.runlock import LOCK, LauncherLock, probe
from launcher.output.runstate import (
    age,
    last_line_time,
    list_status,
    ps_json,
    render_table,
    status_of,
)
from tests.util import dtrain

# -- the state decision (pure) -------------------------------------------------------------

LOCK_INFO = {"pid": 4242, "uid": 0, "host": "login1", "detached": True}


@pytest.mark.parametrize(("meta", "lock", "state", "label"), [
    pytest.param({"state": "running"}, LOCK_INFO, "running", "running", id="running"),
    pytest.param({"state": "stopping"}, LOCK_INFO, "stopping", "stopping", id="stopping"),
    pytest.param({}, LOCK_INFO, "starting", "starting", id="no-state-yet"),
    pytest.param({"state": "running", "exit_code": 130, "end": 5.0}, None, "finished",
                 "finished (130)", id="finished"),
    pytest.param({"state": "running", "exit_code": 0, "end": 5.0}, LOCK_INFO, "finished",
                 "finished (0)", id="end-written-lock-not-yet-released"),
    pytest.param({"state": "running"}, None, "launcher lost", "launcher lost", id="kill-9"),
    pytest.param({}, None, "launcher lost", "launcher lost", id="old-archive-no-lock"),
])
def test_state_from_meta_and_lock(meta: dict, lock: dict | None, state: str, label: str) -> None:
    st = status_of(Path("/x/r1"), {"run_id": "r1", **meta}, lock)
    assert (st.state, st.label, st.alive) == (state, label, lock is not None)
    assert (st.note is not None) == (state == "launcher lost")


def test_lost_note_names_the_heartbeat_timeout() -> None:
    st = status_of(Path("/x/r1"), {"launcher": {"heartbeat_timeout": 3.0, "pid": 7}}, None)
    assert st.note is not None and "no heartbeat from the launcher for 3 s" in st.note
    # the nodes wait 3 timeouts for the launcher (decide/outcome/liveness.launcher_timeout)
    st = status_of(Path("/x/r1"), {"launcher": {"heartbeat_timeout": 3.0,
                                                "launcher_timeout": 9.0, "pid": 7}}, None)
    assert st.note is not None and "no heartbeat from the launcher for 9 s" in st.note
    assert "stopped the job by themselves" in st.note


def test_age() -> None:
    assert [age(s) for s in (5, 65, 3700, 90000)] == ["5s", "1m05s", "1h01m", "1d01h"]


# -- the lock ---------------------------------------------------------------------------------

def _archive(tmp_path: Path, run_id: str = "r1") -> RunArchive:
    archive = RunArchive.create(tmp_path, run_id)
    archive.update_meta(hosts=["n1", "n2"], world_size=2, state="running",
                        start=time.time() - 65)
    return archive


def test_lock_held_means_alive_released_means_lost(tmp_path: Path) -> None:
    archive = _archive(tmp_path)
    assert probe(archive.path) is None  # no lock file yet
    lock = LauncherLock.acquire(archive.dir, detached=True)
    info = probe(archive.path)
    assert info is not None and info["pid"] == os.getpid() and info["detached"] is True
    [st] = list_status(tmp_path)
    assert (st.state, st.alive, st.pid) == ("running", True, os.getpid())
    lock.release()
    assert probe(archive.path) is None
    [st] = list_status(tmp_path)
    assert st.state == "launcher lost"


def test_a_dead_process_releases_the_lock_and_a_child_never_holds_it(tmp_path: Path) -> None:
    """kill -9 releases the lock (a pid is never trusted); a process the holder started
    does not inherit it, even one started with close_fds=False (as a library that spawns
    without closing fds would): the lock's own fd is close-on-exec, Popen's default of
    closing every fd is not what keeps it out."""
    archive = _archive(tmp_path)
    code = ("import sys, time, subprocess; from pathlib import Path; "
            "from launcher.output.runlock import LauncherLock; "
            "from launcher.output.rundir import RunDir; "
            "LauncherLock.acquire(RunDir.open(Path(sys.argv[1]))); "
            "subprocess.Popen(['sleep', '30'], close_fds=False); "
            "print('locked', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(archive.path)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
        assert probe(archive.path) is not None
        proc.kill()
        proc.wait(5)
        assert probe(archive.path) is None  # the sleep child still lives, without the lock
    finally:
        proc.kill()
    assert (archive.path / LOCK).exists()


def test_last_line_time_is_the_last_record_s_own_time_not_the_file_s(tmp_path: Path) -> None:
    """The time comes from the last complete record's "t"; the file's mtime (set here an
    hour apart from every record) is only the fallback for a tail that is one long line."""
    archive = _archive(tmp_path)
    t0 = 1_700_000_000.25
    archive.write_lines([OutputLine("n1", "out", f"line {i}", rank=0, node_rank=0, t=t0 + i)
                         for i in range(3)])
    archive.close()
    out = archive.path / "output.jsonl"
    os.utime(out, (t0 + 3600, t0 + 3600))
    assert last_line_time(archive.path) == t0 + 2
    with open(out, "ab") as fh:  # a torn last record (the launcher died mid-write)
        fh.write(b'{"t": 1800000000, "host": "n1", "li')
    os.utime(out, (t0 + 3600, t0 + 3600))
    assert last_line_time(archive.path) == t0 + 2
    out.write_bytes(b"x" * (70 * 1024))  # one long line: nothing to read a time from
    os.utime(out, (t0 + 7200, t0 + 7200))
    assert last_line_time(archive.path) == t0 + 7200
    out.write_bytes(b"")
    assert last_line_time(archive.path) is None


def test_ps_table_and_json(tmp_path: Path) -> None:
    archive = _archive(tmp_path)
    said = time.time() - 2
    archive.write_lines([OutputLine("n1", "out", "hello", rank=0, node_rank=0, t=said)])
    archive.close()
    os.utime(archive.path / "output.jsonl", (said - 3, said - 3))  # not the mtime
    fin = _archive(tmp_path, "r2")
    fin.update_meta(exit_code=7, end=time.time(), outcome="rank 1 on n2 exited 7")
    runs = list_status(tmp_path)
    table = render_table(runs)
    # RANKS, FABRIC (no NCCL account: -), AGE, LAST LINE, GOODPUT, LAUNCHER
    assert re.search(r"^r1 +run +launcher lost +2 +2 +- +1m0\ds +\ds ago +- +-$", table,
                     re.M), table
    assert re.search(r"^r2 +run +finished \(7\) ", table, re.M), table
    assert "r1: launcher lost: the launcher died" in table
    doc = ps_json(runs, tmp_path)
    assert doc["ps_version"] == 1
    r1 = doc["runs"][0]
    assert (r1["run_id"], r1["state"], r1["nodes"], r1["world_size"]) == ("r1", "launcher lost",
                                                                         2, 2)
    assert r1["last_line_t"] == pytest.approx(said, abs=1e-3)


# -- the control socket -------------------------------------------------------------------------

async def test_stop_request_reaches_the_launcher(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 90) / "run"  # longer than a unix socket path may be
    deep.mkdir(parents=True)
    got: list[StopRequest] = []

    def on_stop(req: StopRequest) -> str:
        got.append(req)
        return "stopping"

    server = ControlServer(RunDir.open(deep), on_stop)
    await server.start()
    try:
        assert (deep / CONTROL).stat().st_mode & 0o777 == 0o600
        reply = await asyncio.to_thread(request_stop, deep, grace=2.5, kill=False)
        assert reply == {"ok": True, "state": "stopping"}
        await asyncio.to_thread(request_stop, deep, grace=None, kill=True)
    finally:
        await server.aclose()
    assert [(r.grace, r.kill, r.uid, r.pid) for r in got] == [
        (2.5, False, os.getuid(), os.getpid()), (None, True, os.getuid(), os.getpid())]
    assert not (deep / CONTROL).exists()


async def test_stop_from_another_uid_is_refused(tmp_path: Path) -> None:
    """SO_PEERCRED: the launcher answers only its owner, whatever the socket's mode."""
    got: list[StopRequest] = []
    server = ControlServer(RunDir.open(tmp_path), lambda r: got.append(r) or "stopping",
                           owner_uid=os.getuid() + 1)
    await server.start()
    try:
        with pytest.raises(DtrainError, match="refused: this run belongs to uid"):
            await asyncio.to_thread(request_stop, tmp_path, grace=None, kill=False)
    finally:
        await server.aclose()
    assert got == []


def test_stop_with_no_launcher_says_so(tmp_path: Path) -> None:
    with pytest.raises(DtrainError, match="does not answer"):
        request_stop(tmp_path, grace=None, kill=False)


# -- attach's tail ------------------------------------------------------------------------------

def test_tail_offset_starts_at_the_last_lines(tmp_path: Path) -> None:
    archive = RunArchive.create(tmp_path, "r")
    archive.write_lines([OutputLine("n1", "out", f"line {i}", rank=0, node_rank=0, t=1.0)
                         for i in range(100)])
    archive.close()
    out = io.StringIO()
    replay(archive.path, out=out, color=False, tail=3)
    assert out.getvalue().splitlines() == ["n1 r0: line 97", "n1 r0: line 98", "n1 r0: line 99"]
    assert tail_offset(archive.path, 1000) == 0
    assert tail_offset(tmp_path / "missing", 3) == 0


# -- the CLI -------------------------------------------------------------------------------------

def test_detach_bad_input_exits_2_before_anything_starts(tmp_path: Path) -> None:
    res = dtrain(["run", "--detach", "-H", "node1", "--rdzv", "bogus", "--archive-dir",
                  str(tmp_path), "x.py"], timeout=30)
    assert res.returncode == 2, res.stderr
    assert "--rdzv 'bogus'" in res.stderr
    assert list(tmp_path.iterdir()) == []


def test_ps_attach_stop_on_an_empty_archive(tmp_path: Path) -> None:
    res = dtrain(["ps", "--archive-dir", str(tmp_path)], timeout=180)
    assert res.returncode == 0 and "no runs in" in res.stderr
    res = dtrain(["attach", "--archive-dir", str(tmp_path)], timeout=180)
    assert res.returncode == 2 and "no runs in" in res.stderr
    res = dtrain(["stop", "nope", "--archive-dir", str(tmp_path)], timeout=180)
    assert res.returncode == 2 and "no run 'nope'" in res.stderr


def test_attach_status_line_is_drawn_and_cleared(tmp_path: Path) -> None:
    archive = RunArchive.create(tmp_path, "r")
    archive.write_lines([OutputLine("n1", "out", "step 1", rank=0, node_rank=0, t=1.0)])
    archive.close()
    out = io.StringIO()
    replay(archive.path, out=out, color=True, status=lambda: "dtrain attach r | running")
    text = out.getvalue()
    assert "step 1" in text and "dtrain attach r | running" in text
    assert text.endswith("\r\x1b[K")  # the status line is removed at the end


def test_attach_to_a_finished_run_shows_its_tail_and_returns_its_code(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from launcher.commands.runs import attach

    archive = _archive(tmp_path, "done")
    archive.write_lines([OutputLine("n1", "out", f"l{i}", rank=0, node_rank=0, t=1.0)
                         for i in range(10)])
    archive.close()
    archive.update_meta(exit_code=7, end=time.time(), outcome="rank 0 on n1 exited 7")
    assert attach(tmp_path, None, lines=2, color=False) == 7
    out, err = capsys.readouterr()
    assert out.splitlines() == ["n1 r0: l8", "n1 r0: l9"]
    assert "is not running (finished (7))" in err and "exit 7" in err


def test_attach_folds_repeated_stderr_as_the_live_console_did(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 24.7: the same warning from every rank is one folded line in attach, as on the
    live console (it was one line per rank); `dtrain logs` still shows each."""
    from launcher.commands.runs import attach

    archive = RunArchive.create(tmp_path, "warn")
    archive.update_meta(hosts=["n1", "n2"], world_size=6, state="running", start=time.time())
    lines = [OutputLine(f"n{1 + r // 3}", "err", "UserWarning: TypedStorage is deprecated",
                        rank=r, node_rank=r // 3, t=100.0 + r / 1000) for r in range(6)]
    lines += [OutputLine("n1", "out", "step 1", rank=0, node_rank=0, t=105.0)]
    archive.write_lines(lines)
    archive.close()
    archive.update_meta(exit_code=0, end=time.time(), outcome="succeeded")
    assert attach(tmp_path, None, lines=20, color=False) == 0
    out, _ = capsys.readouterr()
    shown = out.splitlines()
    assert len([ln for ln in shown if "UserWarning" in ln]) == 1, shown
    assert shown[-1] == "n1 r0: step 1", shown
    replay(archive.path, color=False)
    every, _ = capsys.readouterr()
    assert every.count("UserWarning") == 6


def test_ps_lists_the_kind_and_the_newest_runs_and_prune_deletes_old_ones(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 24.12: KIND (run, smoke) in ps; ps shows the 20 newest finished runs unless
    --all; `logs --prune --older-than` deletes the runs that ended before, never a live one."""
    from launcher.commands.runs import prune, ps
    from launcher.output.runstate import PS_RECENT, parse_age

    now = time.time()
    for i in range(PS_RECENT + 3):
        archive = RunArchive.create(tmp_path, f"20261101-0000{i:02d}-aaaa")
        archive.update_meta(hosts=["n1"], world_size=1, start=now - 86400 * (40 - i),
                            end=now - 86400 * (40 - i) + 60, exit_code=0,
                            kind="smoke" if i == PS_RECENT + 2 else "run")
        archive.close()
    ps(tmp_path)
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["RUN", "ID", "KIND"]
    assert len(lines) == 1 + PS_RECENT and lines[-1].split()[1] == "smoke", out
    assert "3 older runs not shown (`dtrain ps --all`" in err
    ps(tmp_path, show_all=True)
    assert len(capsys.readouterr()[0].splitlines()) == 1 + PS_RECENT + 3
    assert parse_age("30d") == 30 * 86400 and parse_age("90m") == 5400
    prune(tmp_path, parse_age("30d"), dry_run=True)
    assert "would delete 10 runs" in capsys.readouterr()[1]
    assert len(list(tmp_path.iterdir())) == PS_RECENT + 3
    prune(tmp_path, parse_age("30d"))
    assert "deleted 10 runs" in capsys.readouterr()[1]
    assert len(list(tmp_path.iterdir())) == PS_RECENT + 3 - 10
