"""A stop that training can trust (issue 24 items 1-3), on the real-sshd cluster.

A training script saves a checkpoint when it gets SIGTERM; that is how it survives a stop.
So every stop dtrain makes (Ctrl-C, SIGTERM, SIGHUP, `dtrain stop`, a terminal closing)
must give each rank exactly ONE SIGTERM, the whole ``--grace`` to finish, and only then
KILL. A terminal that closes delivers more than one signal (the pty's SIGHUP, the shell's
resend, tmux's own): those are one request, not "again: kill now". And a rank that exits by
itself during such a stop was stopped by dtrain, not a failure.

The workload (tests/workloads/checkpoint.py, torch-free, under torchrun) writes one line per
signal it receives and a file when its checkpoint is complete; 2 nodes x 2 ranks, so that
torchrun's own shutdown of its local workers (killpg) is in play too.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests import cluster as tc
from tests.test_failures import Dtrain, JobWatch, meta, run_args
from tests.util import REPO, dtrain

CKPT = "tests/workloads/checkpoint.py"
RANKS = 4  # 2 nodes x 2
SAVE_S = 2.0

pytestmark = [pytest.mark.ssh, pytest.mark.torch, pytest.mark.timeout(150)]


@pytest.fixture
def ckpt_dir(cluster: tc.Cluster) -> Path:
    """A directory every node's dtuser can write (the shared filesystem)."""
    path = cluster.shared_dir / f"ckpt-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    path.chmod(0o777)
    return path


def _args(cluster: tc.Cluster, tmp_path: Path, run_id: str, ckpt_dir: Path,
          grace: int = 30) -> list[str]:
    return run_args(cluster, tmp_path, run_id, CKPT, "--grace", str(grace), hosts="node[1-2]",
                    nproc=2, env={"CKPT_DIR": str(ckpt_dir), "CKPT_SECONDS": str(SAVE_S)})


def _signals(ckpt_dir: Path) -> dict[int, list[str]]:
    return {r: [line.split()[0] for line in (ckpt_dir / f"r{r}.signals").read_text().splitlines()]
            if (ckpt_dir / f"r{r}.signals").exists() else [] for r in range(RANKS)}


def assert_one_term_and_checkpoints(ckpt_dir: Path, output: str) -> None:
    """Each rank got exactly one SIGTERM and finished its checkpoint."""
    got = _signals(ckpt_dir)
    assert got == {r: ["SIGTERM"] for r in range(RANKS)}, f"signals per rank: {got}\n{output}"
    missing = [r for r in range(RANKS) if not (ckpt_dir / f"r{r}.ckpt").exists()]
    assert not missing, f"ranks {missing} never finished their checkpoint\n{output}"


def assert_ranks_stopped(tmp_path: Path, run_id: str, output: str) -> None:
    """Every rank exited 143 by itself during the stop: stopped by dtrain, never 'failed'."""
    assert "failed too" not in output and "ROOT CAUSE" not in output, output
    for r in range(RANKS):
        assert f"r{r} exit 143" in output and "(stopped by dtrain)" in output, output
    data = meta(tmp_path, run_id)
    roles = {rank: entry["role"] for node in data["nodes"] for rank, entry in node["ranks"].items()}
    assert roles == {str(r): "stopped" for r in range(RANKS)}, roles
    assert data["root_cause"]["kind"] == "interrupted", data["root_cause"]


def _start(cluster: tc.Cluster, tmp_path: Path, run_id: str, ckpt_dir: Path, jobs: list,
           grace: int = 30) -> Dtrain:
    job = Dtrain(cluster, _args(cluster, tmp_path, run_id, ckpt_dir, grace))
    jobs.append(job)
    job.wait_line(r"r\d: rank \d up", timeout=90, count=RANKS)
    return job


def test_dtrain_stop_gives_each_rank_one_term_and_its_checkpoint(
        cluster: tc.Cluster, tmp_path: Path, ckpt_dir: Path, jobs: list) -> None:
    run_id = f"stop1-{uuid.uuid4().hex[:8]}"
    with JobWatch(cluster, [1, 2], run_id=run_id) as watch:
        job = _start(cluster, tmp_path, run_id, ckpt_dir, jobs)
        res = dtrain(["stop", run_id, "--archive-dir", str(tmp_path / "runs")],
                     env=cluster.client_env(), timeout=90)
        rc = job.wait(60)
        watch.assert_clean(1.0, since=job.ended)
    assert res.returncode == 0, res.stderr
    assert rc == 130, job.output
    assert_one_term_and_checkpoints(ckpt_dir, job.output)
    assert_ranks_stopped(tmp_path, run_id, job.output)


@pytest.mark.parametrize("signals", [
    pytest.param((signal.SIGHUP, signal.SIGHUP, signal.SIGTERM), id="hup-hup-term"),
    pytest.param((signal.SIGTERM, signal.SIGTERM), id="term-term"),
])
def test_repeated_hangup_or_term_is_one_graceful_stop(
        cluster: tc.Cluster, tmp_path: Path, ckpt_dir: Path, jobs: list,
        signals: tuple[int, ...]) -> None:
    """What a closing terminal delivers (several signals) is one request: the grace holds."""
    run_id = f"hup-{uuid.uuid4().hex[:8]}"
    with JobWatch(cluster, [1, 2], run_id=run_id) as watch:
        job = _start(cluster, tmp_path, run_id, ckpt_dir, jobs)
        for sig in signals:
            job.signal(sig)
            time.sleep(0.2)  # spread as a terminal close spreads them; not an assertion
        rc = job.wait(60)
        watch.assert_clean(1.0, since=job.ended)
    first = signal.Signals(signals[0])
    assert rc == 128 + first, job.output
    assert "killed" not in meta(tmp_path, run_id)["outcome"], job.output
    assert "killing every node now" not in job.output, job.output
    assert_one_term_and_checkpoints(ckpt_dir, job.output)
    assert_ranks_stopped(tmp_path, run_id, job.output)


def test_second_ctrl_c_still_kills_now(cluster: tc.Cluster, tmp_path: Path, ckpt_dir: Path,
                                       jobs: list) -> None:
    """A deliberate second Ctrl-C escalates (after a SIGTERM too); the checkpoint is cut."""
    run_id = f"int2-{uuid.uuid4().hex[:8]}"
    with JobWatch(cluster, [1, 2], run_id=run_id) as watch:
        job = _start(cluster, tmp_path, run_id, ckpt_dir, jobs, grace=60)
        job.signal(signal.SIGTERM)
        job.wait_line(r"rank \d saving checkpoint", timeout=30)
        job.signal(signal.SIGINT)
        rc = job.wait(40)
        watch.assert_clean(1.0, since=job.ended)
    assert rc == 143, job.output
    assert "Ctrl-C again: killing every node now" in job.output
    assert "then killed" in meta(tmp_path, run_id)["outcome"]


def test_closing_the_tmux_window_stops_the_run_gracefully(
        cluster: tc.Cluster, tmp_path: Path, ckpt_dir: Path) -> None:
    """`tmux kill-window` under a foreground run, as a person closes a terminal: the run
    stops with exit 129, every rank got one TERM and finished its checkpoint, and dtrain
    recorded all of it although its terminal is gone."""
    run_id = f"tmux-{uuid.uuid4().hex[:8]}"
    sock = f"dtrain-test-{uuid.uuid4().hex[:8]}"
    env = cluster.client_env(PYTHONUNBUFFERED="1")
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    command = (f"cd {shlex.quote(str(REPO))} && env -i {exports} "
               f"{shlex.quote(cluster.python)} -m launcher "
               + " ".join(shlex.quote(a) for a in _args(cluster, tmp_path, run_id, ckpt_dir)))
    tmux = ["tmux", "-L", sock, "-f", "/dev/null"]
    subprocess.run([*tmux, "new-session", "-d", "-s", "t", "-x", "120", "-y", "40", "-n",
                    "keep", "sleep 600"], check=True)
    archive = tmp_path / "runs" / run_id
    try:
        subprocess.run([*tmux, "new-window", "-t", "t", "-n", "train", "bash", "--norc",
                        "--noprofile", "-i"], check=True)
        subprocess.run([*tmux, "send-keys", "-t", "t:train", command, "Enter"], check=True)
        with JobWatch(cluster, [1, 2], run_id=run_id) as watch:
            _wait(lambda: _lines(archive, "up pid") >= RANKS, 120,
                  lambda: _pane(tmux) + _launcher_log(archive))
            pane = _pane(tmux)
            # issue 24.7: on a terminal, one short line says what stops the run
            assert pane.count("dtrain: Ctrl-C or closing this terminal stops the run; "
                              "--detach keeps it going") == 1, pane
            subprocess.run([*tmux, "kill-window", "-t", "t:train"], check=True)
            _wait(lambda: _meta_end(archive) is not None, 90, lambda: _launcher_log(archive))
            watch.assert_clean(5.0)
    finally:
        subprocess.run([*tmux, "kill-server"], check=False)
    data = json.loads((archive / "meta.json").read_text())
    assert data["exit_code"] == 129, data["outcome"]
    assert "killed" not in data["outcome"], data["outcome"]
    assert_one_term_and_checkpoints(ckpt_dir, data["outcome"])
    roles = {rank: entry["role"] for node in data["nodes"] for rank, entry in node["ranks"].items()}
    assert roles == {str(r): "stopped" for r in range(RANKS)}, roles


def _lines(archive: Path, text: str) -> int:
    try:
        return sum(text in json.loads(line)["line"]
                   for line in (archive / "output.jsonl").read_text().splitlines() if line)
    except (OSError, ValueError):
        return 0


def _meta_end(archive: Path) -> int | None:
    try:
        data = json.loads((archive / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    return data.get("exit_code") if data.get("state") == "finished" else None


def _pane(tmux: list[str]) -> str:
    res = subprocess.run([*tmux, "capture-pane", "-p", "-t", "t:train"], capture_output=True,
                         text=True, check=False)
    return res.stdout


def _launcher_log(archive: Path) -> str:
    path = archive / "launcher.log"
    return path.read_text() if path.exists() else ""


def _wait(cond, timeout: float, why) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout}s:\n{why()}")
        time.sleep(0.1)
    os.sync()
