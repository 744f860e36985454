"""FakeTransport's scripted node (issue 54 item 5; launcher/transports/scripted.py): the
stop policy and the restart loop of `dtrain run`, in-process as the CLI runs them, with no
root, no torchrun and no torch on the node: the node's real probe answers the preflight,
then a script plays its supervisor. A node whose rank 1 exits 3 at t=0.2 s, one whose ranks
hang, one that loses its link; each followed (or not) by a second attempt."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from typer.testing import CliRunner

from launcher.cli import app
from launcher.transports.fake import FakeTransport
from launcher.transports.scripted import Script, Step

PROGRESS = (Step(0.05, rank=0, line="step 1"), Step(0.05, rank=1, line="step 1"))
# rank 1 exits 3 at t=0.2 s; rank 0 would run on until stopped
FAIL = Script(steps=(*PROGRESS, Step(0.2, rank=1, exit=3)), hang=True)
HANG = Script(steps=PROGRESS, hang=True)  # a line each, then nothing until stopped
LOST = Script(steps=PROGRESS, hang=True, lost_at=0.3)  # then not a byte, heartbeats included
OK = Script(steps=(Step(0.1, rank=0, line="rank 0 done"), Step(0.1, rank=1, line="rank 1 done")))


def _run(tmp_path: Path, scripts: list[Script], *args: str, grace: str = "3"
         ) -> tuple[int, str, dict, float]:
    fake = FakeTransport(scripts={"n1": scripts})
    started = time.monotonic()
    with fake.installed():
        res = CliRunner().invoke(app, ["run", "-H", "n1", "--nproc-per-node", "2",
                                       "--no-preflight", "--archive-dir", str(tmp_path / "runs"),
                                       "--no-color", "--run-id", "r1", "--grace", grace, *args,
                                       "train.py"])
    took = time.monotonic() - started
    meta = json.loads((tmp_path / "runs" / "r1" / "meta.json").read_text())
    return res.exit_code, res.stdout + res.stderr, meta, took


def _attempts(meta: dict) -> list[tuple[int, str, int]]:
    return [(a["n"], a["cause"], a["exit_code"]) for a in meta["attempts"]]


def test_the_first_failure_stops_the_other_ranks_at_once(tmp_path: Path) -> None:
    """The stop policy: rank 1's exit 3 stops rank 0 (TERM, 143, "stopped by dtrain") well
    inside the grace (60 s); the run's exit code is rank 1's own."""
    code, out, meta, took = _run(tmp_path, [FAIL], grace="60")
    assert code == 3, out
    assert "rank 1 on n1 exited 3" in out
    assert re.search(r"r1 exit 3 after [\d.]+s \(ROOT CAUSE\), r0 SIGTERM \(143\) after "
                     r"[\d.]+s \(stopped by dtrain\)", out), out
    assert meta["root_cause"]["rank"] == 1 and meta["exit_code"] == 3
    assert took < 30, took  # no wait for the grace: the scripted ranks end at the TERM


def test_a_failed_rank_then_a_second_attempt_on_the_same_node(tmp_path: Path) -> None:
    code, out, meta, _ = _run(tmp_path, [FAIL, OK], "--restarts", "1", "--restart-backoff",
                              "0.1")
    assert code == 0, out
    assert _attempts(meta) == [(1, "process", 3), (2, "ok", 0)], meta["attempts"]
    assert all(a["fenced"] == [] and a["hosts"] == ["n1"] for a in meta["attempts"])
    assert "attempt 2 on the same nodes" in meta["attempts"][0]["decision"]
    assert "n1 r1: rank 1 done" in out and "FAILED" not in out
    assert meta["outcome"] == "succeeded after 1 restart"


def test_a_failure_before_any_progress_is_not_restarted(tmp_path: Path) -> None:
    early = Script(steps=(Step(0.2, rank=1, exit=3),), hang=True)
    code, out, meta, _ = _run(tmp_path, [early, OK], "--restarts", "1")
    assert code == 3, out
    assert _attempts(meta) == [(1, "user", 3)], meta["attempts"]
    assert "before any progress line" in out and "not restarted" in out


def test_a_hang_is_stopped_and_the_next_attempt_runs(tmp_path: Path) -> None:
    """No line for --hang-timeout: the hang watch asks for stacks (the script answers with
    none), stops the run (125) and the loop starts attempt 2, which finishes."""
    code, out, meta, _ = _run(tmp_path, [HANG, OK], "--restarts", "1", "--restart-backoff",
                              "0.1", "--hang-timeout", "1")
    assert code == 0, out
    assert _attempts(meta) == [(1, "process", 125), (2, "ok", 0)], meta["attempts"]
    assert "HANG: no rank made progress for 1 s" in out, out
    assert meta["hangs"][0]["attempt"] == 1


def test_a_node_that_loses_its_link_is_lost_then_run_again(tmp_path: Path) -> None:
    """Its last byte at 0.3 s, then silence: lost after --heartbeat-timeout (exit 255), the
    node's fault; n1 is the run's last usable node, so it is not fenced and attempt 2 runs
    there and finishes."""
    code, out, meta, took = _run(tmp_path, [LOST, OK], "--restarts", "1",
                                 "--restart-backoff", "0.1", "--heartbeat-timeout", "1")
    assert code == 0, out
    assert _attempts(meta) == [(1, "node", 255), (2, "ok", 0)], meta["attempts"]
    assert "n1: node lost: no heartbeat for 1 s" in out
    assert "not fenced (n1: the run's last usable node)" in out, out
    assert took < 20, took
