"""A shared or pre-created archive directory (issue 22, Medium 2 and 3, Low 5 and 7).

Another user who can write the archive directory, or who planted runs in it, changes nothing
for the launcher or for its readers: a non-sticky directory others may write is refused
(exit 2, before anything connects); a run directory swapped for a symlink mid-run redirects
no write; `ps`, `attach`, `logs`, `stop` and completion skip other users' runs, symlinks,
FIFOs and oversized files, and show no control sequence from a meta.json; a run id is a path
only when it says so (a `/` or a leading `.`).

"Another user" is a uid that is not ours (files chowned to it). The readers run as a plain
user (``ME``, a uid of no one else) in a directory under /tmp that user can reach; the
tests need root to set that up (as the cluster tests do) and skip elsewhere.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.errors import UsageError
from launcher.models import OutputLine
from launcher.output.archive import RunArchive
from launcher.output.runlock import LauncherLock
from tests import cluster as tc
from tests.util import REPO, assert_exit, cannot_run, dtrain

ME = 54320  # the reader: a plain user (no passwd entry needed)
OTHER = 54321  # another user
UNREACHABLE = "198.18.0.250"
OSC52 = "\x1b]52;c;cHduZWQ=\x07"  # a clipboard write
CLEAR = "\x1b[2J\x1b[H"  # clear the screen, cursor home


@pytest.fixture(autouse=True)
def _root() -> None:
    if os.geteuid() != 0:
        cannot_run("needs root to plant files owned by another uid")


def _as_me() -> None:
    """The reader is a plain user, and one that reads /dev/zero must fail, not take the
    machine's memory."""
    os.setgroups([])
    os.setgid(ME)
    os.setuid(ME)
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


def reader(args: list[str], cwd: Path = REPO,
           **extra: str) -> subprocess.CompletedProcess[str]:
    """dtrain as the plain user ME."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTRAIN_")}
    env.update(PYTHONPATH=str(REPO), HOME="/tmp", **extra)
    return subprocess.run([sys.executable, "-m", "launcher", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60, preexec_fn=_as_me)


def chown_tree(path: Path, uid: int) -> None:
    for p in [path, *path.rglob("*")]:
        os.lchown(p, uid, uid)


@pytest.fixture
def area() -> Iterator[Path]:
    """A directory the plain user ME can reach (pytest's tmp_path is root's, 0700)."""
    path = Path(tempfile.mkdtemp(prefix="dtrain-shared-", dir="/tmp"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


# -- the launcher: which archive directories it writes in -----------------------------------

@pytest.mark.parametrize(("mode", "owner"), [(0o777, None), (0o773, None), (0o755, OTHER)],
                         ids=["world-writable", "group-writable-shared-group", "another-owner"])
def test_an_archive_dir_others_may_write_and_not_sticky_is_refused(
        tmp_path: Path, mode: int, owner: int | None) -> None:
    shared = tmp_path / "runs"
    shared.mkdir()
    os.chmod(shared, mode)
    if owner is not None:
        os.chown(shared, owner, owner)
    if mode & 0o020:
        os.chown(shared, 0, 100)  # group "users" (or whatever gid 100 is): not root's own
    with pytest.raises(UsageError, match="can be written by other users and is not sticky"):
        RunArchive.create(shared, "r")
    assert list(shared.iterdir()) == []
    # the CLI says so before it connects anywhere (the host is unreachable: 255 otherwise)
    res = dtrain(["run", "-H", UNREACHABLE, "--connect-timeout", "30", "--archive-dir",
                  str(shared), "x.py"], timeout=60)
    assert_exit(res, 2)
    assert f"archive directory {shared}" in res.stderr and "chmod +t" in res.stderr
    assert "198.18.0.250" not in res.stderr


def test_a_sticky_shared_dir_and_ones_own_dirs_are_accepted(tmp_path: Path) -> None:
    for name, mode, owner in (("sticky", 0o1777, OTHER), ("own", 0o755, None),
                              ("own-private-group", 0o775, None)):
        d = tmp_path / name
        d.mkdir()
        os.chmod(d, mode)
        if owner is not None:
            os.chown(d, owner, owner)
        with RunArchive.create(d, "r") as archive:
            archive.write_lines([OutputLine("n1", "out", "x", rank=0)])
        assert (d / "r" / "meta.json").is_file()


def test_lock_and_log_are_private_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        archive = RunArchive.create(tmp_path / "runs", "r")
        lock = LauncherLock.acquire(archive.dir)
        os.close(archive.dir.append("launcher.log"))
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in archive.path.iterdir()}
    lock.release()
    archive.close()
    assert modes["launcher.lock"] == modes["launcher.log"] == modes["meta.json"] == 0o600


@pytest.mark.ssh
@pytest.mark.torch
@pytest.mark.timeout(150)
def test_a_run_directory_swapped_for_a_symlink_mid_run_redirects_nothing(
        cluster: tc.Cluster, tmp_path: Path) -> None:
    """The owner of a sticky shared archive directory renames a live run's directory and puts
    a symlink in its place, to a directory of theirs holding hosts/node1.log -> the victim's
    ~/.bashrc. The launcher goes on writing into its own directory: nothing reaches the
    bashrc, no meta.json appears in the attacker's directory, `dtrain stop` does not follow
    the symlink."""
    from tests.test_failures import Dtrain

    shared = cluster.shared_dir / f"shared-{uuid.uuid4().hex[:8]}"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    os.chown(shared, OTHER, OTHER)
    bait = tmp_path / "bait"
    (bait / "hosts").mkdir(parents=True)
    bashrc = tmp_path / "bashrc"
    bashrc.write_text("# my bashrc\n")
    for name in ("node1.log", "node2.log"):
        (bait / "hosts" / name).symlink_to(bashrc)
    run_id = f"swap-{uuid.uuid4().hex[:8]}"
    job = Dtrain(cluster, ["run", "-H", "node[1-2]", "--nproc-per-node", "1", "--python",
                           cluster.python, "--archive-dir", str(shared), "--run-id", run_id,
                           "--grace", "2", "--no-color", "-e", "TICK_S=0.2",
                           "tests/workloads/tick.py"])
    try:
        job.wait_line(r"^node1 r0: tick 0 2$", timeout=90)
        moved = shared / f"{run_id}.moved"
        os.rename(shared / run_id, moved)
        (shared / run_id).symlink_to(bait)
        os.lchown(shared / run_id, OTHER, OTHER)
        job.wait_line(r"^node1 r0: tick 0 20$", timeout=60)  # > 2 flushes after the swap
        # the lines above reached the disk (in the run's own, moved, directory)
        deadline = time.monotonic() + 30
        while "r0 tick 0 20" not in _text(moved / "hosts" / "node1.log"):
            assert time.monotonic() < deadline, "the launcher stopped writing its logs"
            time.sleep(0.1)
        assert bashrc.read_text() == "# my bashrc\n"
        stop = dtrain(["stop", run_id, "--archive-dir", str(shared)], env=cluster.client_env(),
                      timeout=30)
        assert_exit(stop, 2)
        assert "belongs to another user, refused" in stop.stderr
        job.signal(signal.SIGINT)
        assert job.wait(60) == 130, job.output
    finally:
        job.kill()
    assert bashrc.read_text() == "# my bashrc\n"
    assert sorted(p.name for p in bait.rglob("*")) == ["hosts", "node1.log", "node2.log"]
    meta = json.loads((moved / "meta.json").read_text())
    assert (meta["run_id"], meta["exit_code"]) == (run_id, 130)
    logged = (moved / "hosts" / "node1.log").read_text()
    assert "r0 tick 0 20" in logged
    assert not (moved / "control.sock").exists()


# -- readers: ps, attach, logs, stop, completion ---------------------------------------------

def _run(archive: Path, name: str, created: float, **meta: object) -> Path:
    with RunArchive.create(archive, name) as run:
        run.write_lines([OutputLine("n1", "out", f"line of {name}", rank=0, node_rank=0,
                                    t=created)])
        run.update_meta(**{"created_ts": created, "hosts": ["n1"], "world_size": 1,
                           "end": created + 1, "exit_code": 0, "outcome": "ok", **meta})
    return run.path


@pytest.fixture
def planted(area: Path) -> Path:
    """An archive with one run of ME's and what other users (or anyone) planted beside it."""
    archive = area / "runs"
    archive.mkdir()
    os.chmod(archive, 0o1777)
    now = time.time()
    mine = _run(archive, "mine-1", now - 100, outcome=f"ok{OSC52}", run_id=f"mine-1{CLEAR}")
    # another user's private run: unreadable (ps crashed on it)
    private = _run(archive, "theirs-private", now - 50)
    chown_tree(private, OTHER)
    # another user's readable run, started "in the future", with escapes everywhere
    bait = _run(archive, "theirs-bait", now + 10**6, outcome=f"PASS{CLEAR}{OSC52}",
                run_id=f"theirs{OSC52}")
    for p in [bait, *bait.rglob("*")]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    chown_tree(bait, OTHER)
    # ours in name, but meta.json is a symlink to /dev/zero, a FIFO, or huge
    zero = archive / "mine-zero"
    zero.mkdir(mode=0o700)
    (zero / "meta.json").symlink_to("/dev/zero")
    (zero / "output.jsonl").symlink_to("/dev/zero")
    fifo = archive / "mine-fifo"
    fifo.mkdir(mode=0o700)
    os.mkfifo(fifo / "meta.json")
    os.mkfifo(fifo / "output.jsonl")
    os.mkfifo(fifo / "launcher.lock")
    huge = archive / "mine-huge"
    huge.mkdir(mode=0o700)
    with open(huge / "meta.json", "wb") as fh:
        fh.truncate(1 << 30)  # sparse: 1 GiB of NULs
    # a symlink named like a run, to one of ours elsewhere
    elsewhere = area / "elsewhere"
    (archive / "mine-link").symlink_to(_run(elsewhere, "x", now))
    for path in (mine, zero, fifo, huge, elsewhere, archive / "mine-link"):
        chown_tree(path, ME)
    return archive


def test_ps_lists_only_ones_own_readable_runs_and_shows_no_controls(planted: Path) -> None:
    res = reader(["ps", "--archive-dir", str(planted)])
    assert_exit(res, 0)
    assert "\x1b" not in res.stdout + res.stderr and "\x07" not in res.stdout
    rows = res.stdout.splitlines()[1:]
    assert len(rows) == 1 and rows[0].startswith("mine-1^[[2J^[[H "), res.stdout
    res = reader(["ps", "--archive-dir", str(planted), "--json"])
    assert_exit(res, 0)
    assert [r["path"] for r in json.loads(res.stdout)["runs"]] == [str(planted / "mine-1")]


def test_logs_and_attach_pick_ones_own_latest_run_and_show_no_controls(planted: Path) -> None:
    res = reader(["logs", "--archive-dir", str(planted), "--no-color"])
    assert_exit(res, 0)
    assert res.stdout == "n1 r0: line of mine-1\n"
    res = reader(["attach", "--archive-dir", str(planted), "--no-color"])
    assert_exit(res, 0)
    assert "line of mine-1" in res.stdout and "theirs" not in res.stdout + res.stderr
    assert "\x1b" not in res.stderr and "finished: ok^[]52;c;cHduZWQ=^G" in res.stderr


@pytest.mark.parametrize("cmd", ["logs", "attach", "stop"])
def test_other_users_runs_are_refused_by_name_and_never_matched_by_prefix(
        planted: Path, cmd: str) -> None:
    for run in ("theirs-bait", "theirs-private"):
        res = reader([cmd, run, "--archive-dir", str(planted)])
        assert_exit(res, 2)
        assert "belongs to another user, refused" in res.stderr
    res = reader([cmd, "theirs", "--archive-dir", str(planted)])
    assert_exit(res, 2)
    assert "no run 'theirs'" in res.stderr
    for run in ("mine-zero", "mine-fifo", "mine-huge", "mine-link"):
        res = reader([cmd, run, "--archive-dir", str(planted)])
        assert_exit(res, 2)
        assert f"no run {run!r}" in res.stderr


def test_completion_offers_only_ones_own_runs(planted: Path) -> None:
    words = f"dtrain logs --archive-dir {planted} "
    res = reader([], planted.parent, _DTRAIN_COMPLETE="complete_bash", COMP_WORDS=words,
                 COMP_CWORD=str(len(words.split(" ")) - 1))
    assert_exit(res, 0)
    assert res.stdout.splitlines() == ["mine-1"]


def test_a_run_id_is_a_path_only_with_a_slash_or_a_leading_dot(area: Path) -> None:
    """`dtrain stop X` with X in no archive never talks to a ./X/control.sock in the current
    directory (planted, or a project's own directory); `./X` names it."""
    archive = area / "runs"
    archive.mkdir()
    cwd = area / "cwd"
    planted = cwd / "X"
    planted.mkdir(parents=True)
    (planted / "meta.json").write_text(json.dumps({"run_id": "X", "created_ts": 1.0}))
    (planted / "output.jsonl").write_text("")
    heard: list[bytes] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as srv:
        srv.bind(str(planted / "control.sock"))
        chown_tree(area, ME)
        srv.listen()
        srv.settimeout(30)

        def serve() -> None:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                heard.append(conn.recv(4096))
                conn.sendall(b'{"ok": true, "state": "stopping"}\n')

        listener = threading.Thread(target=serve, daemon=True)
        listener.start()
        res = reader(["stop", "X", "--archive-dir", str(archive)], cwd=cwd)
        assert_exit(res, 2)
        assert "no run 'X'" in res.stderr and heard == []
        for cmd in (["logs", "X"], ["attach", "X"]):
            res = reader([*cmd, "--archive-dir", str(archive)], cwd=cwd)
            assert_exit(res, 2)
        # the path form still works
        res = reader(["logs", "./X", "--archive-dir", str(archive)], cwd=cwd)
        assert_exit(res, 0)
        srv.close()
        listener.join(5)


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
