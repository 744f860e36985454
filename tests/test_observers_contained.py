"""Issue 50 item 1: an observer of a job that raises (a bug in the status line, the hang
watch, the samplers) is told once on stderr and detached; the run, its verdict and its
teardown go on. Cancellation is never swallowed. The run itself is driven through
transports/fake.py, as tests/test_fake_run.py does."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from launcher.decide.outcome.outcomes import RankEnd
from launcher.job.events import Hello, Observer, Observers, RankExit
from launcher.models import Host, OutputLine
from tests.util import need_root


class Broken(Observer):
    def __init__(self, exc: BaseException) -> None:
        self.exc, self.calls = exc, 0

    def on_rank_exit(self, host: Host, ev: RankExit) -> None:
        self.calls += 1
        raise self.exc

    def on_lines(self, lines: Any) -> None:
        self.calls += 1
        raise self.exc


class Recorder(Observer):
    def __init__(self) -> None:
        self.log: list[str] = []

    def on_hello(self, host: Host, ev: Hello) -> None:
        self.log.append("hello")

    def on_rank_exit(self, host: Host, ev: RankExit) -> None:
        self.log.append(f"rank_exit {ev.end.rank}")

    def on_lines(self, lines: Any) -> None:
        self.log.append(f"lines {len(lines)}")


def test_a_failing_observer_is_told_once_and_detached_the_others_go_on() -> None:
    said: list[str] = []
    obs = Observers(say=said.append)
    broken, after = Broken(ValueError("bad status line")), Recorder()
    obs.add(broken)
    obs.add(after)
    obs.event(Host("n1"), RankExit(1.0, RankEnd(0, code=0, t=1.0)))
    obs.event(Host("n1"), RankExit(1.0, RankEnd(1, code=0, t=1.0)))
    obs.lines([OutputLine("n1", "out", "step 1", 0, 0, 0.0)])
    obs.event(Host("n1"), Hello(None))
    assert after.log == ["rank_exit 0", "rank_exit 1", "lines 1", "hello"]
    assert broken.calls == 1 and broken not in obs.all
    assert said == ["observer Broken failed (ValueError: bad status line); "
                    "the run goes on without it"]


def test_a_failing_on_lines_is_contained_too() -> None:
    said: list[str] = []
    obs = Observers(say=said.append)
    broken = Broken(RuntimeError("x" * 500))
    obs.add(broken)
    obs.lines([])
    obs.lines([])
    assert broken.calls == 1 and len(said) == 1
    assert said[0].startswith("observer Broken failed (RuntimeError: xxx")
    assert len(said[0]) < 300  # the message is cut, not the run


@pytest.mark.parametrize("exc", [asyncio.CancelledError(), KeyboardInterrupt(),
                                 SystemExit(3)])
def test_cancellation_is_never_swallowed(exc: BaseException) -> None:
    said: list[str] = []
    obs = Observers(say=said.append)
    broken = Broken(exc)
    obs.add(broken)
    with pytest.raises(type(exc)):
        obs.event(Host("n1"), RankExit(1.0, RankEnd(0, code=0, t=1.0)))
    with pytest.raises(type(exc)):
        obs.lines([])
    assert said == [] and broken in obs.all


def test_the_default_says_it_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    obs = Observers()
    obs.add(Broken(ValueError("oops")))
    obs.lines([])
    obs.lines([])
    err = capsys.readouterr().err
    assert err.count("observer Broken failed (ValueError: oops)") == 1, err
    assert err.startswith("dtrain:")


# -- a whole run on the fake transport ----------------------------------------------------------

# rank 1 exits CODE, after rank 0 had its say (a failed rank stops the others at once)
SCRIPT = """\
import os, sys, time
print(f"rank {os.environ['RANK']} step 1", flush=True)
if os.environ["RANK"] == "1":
    time.sleep(1)
    sys.exit(int(os.environ.get("CODE", "0")))
"""


@pytest.mark.torch
@pytest.mark.parametrize("code", [0, 3])
def test_a_run_whose_observers_fail_ends_with_its_own_exit_code(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    need_root("a fake node's own hostname (a UTS namespace)")
    from launcher.cli import app
    from launcher.commands import launch
    from launcher.decide.outcome import hang
    from launcher.transports.fake import FakeTransport

    def status_line_bug(self: Any, host: Host, ev: Hello) -> None:
        raise ValueError("status line bug")

    def hang_watch_bug(self: Any, lines: Any) -> None:
        raise KeyError("progress")

    monkeypatch.setattr(launch.NodeBoard, "on_hello", status_line_bug)
    monkeypatch.setattr(hang.ProgressWatch, "observe", hang_watch_bug)
    script = tmp_path / "s.py"
    script.write_text(SCRIPT)
    fake = FakeTransport(own_hostname=True)
    with fake.installed():
        res = CliRunner().invoke(app, ["run", "-H", "n1", "--nproc-per-node", "2",
                                       "--archive-dir", str(tmp_path / "runs"), "--no-color",
                                       "--run-id", "obs", "--grace", "3", "-e", f"CODE={code}",
                                       str(script)])
    out = res.stdout + res.stderr
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert res.exit_code == code, out[-3000:]
    assert out.count("observer NodeBoard failed (ValueError: status line bug); "
                     "the run goes on without it") == 1, out[-3000:]
    assert out.count("observer HangWatch failed (KeyError: 'progress')") == 1, out[-3000:]
    assert "n1 r0: rank 0 step 1" in out and "n1 r1: rank 1 step 1" in out
    meta = json.loads((tmp_path / "runs" / "obs" / "meta.json").read_text())
    assert meta["state"] == "finished" and meta["exit_code"] == code
