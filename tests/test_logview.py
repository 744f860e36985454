"""`dtrain logs` replay: tags, filters, --json, --grep and --follow."""

from __future__ import annotations

import io
import json
import threading
import time
from pathlib import Path

import pytest

from launcher.errors import UsageError
from launcher.models import OutputLine
from launcher.output.archive import RunArchive
from launcher.output.logview import expand_hosts, replay


@pytest.fixture
def run(tmp_path: Path) -> Path:
    archive = RunArchive.create(tmp_path, "r")
    archive.update_meta(hosts=["n1", "n2"], world_size=4)
    archive.write_lines(
        [
            OutputLine("", "dtrain", "starting", t=1.0),
            OutputLine("n1", "out", "loss 1.0", rank=0, node_rank=0, t=1.0),
            OutputLine("n1", "err", "warning", rank=1, node_rank=0, t=1.1),
            OutputLine("n2", "out", "loss 2.0", rank=2, node_rank=1, t=1.2),
            OutputLine("n2", "out", "agent up", node_rank=1, t=1.3),
        ]
    )
    archive.close()
    return archive.path


def show(run: Path, **kwargs: object) -> str:
    out = io.StringIO()
    assert replay(run, out=out, color=False, **kwargs) == 0  # type: ignore[arg-type]
    return out.getvalue()


def test_replay_uses_the_console_tags(run: Path) -> None:
    assert show(run) == (
        "dtrain: starting\nn1 r0: loss 1.0\nn1 r1 [err]: warning\nn2 r2: loss 2.0\nn2: agent up\n"
    )


def test_replay_rank_filter(run: Path) -> None:
    assert show(run, ranks={2}) == "dtrain: starting\nn2 r2: loss 2.0\n"


def test_replay_host_filter_takes_folded_sets(run: Path) -> None:
    assert show(run, host="n2") == "dtrain: starting\nn2 r2: loss 2.0\nn2: agent up\n"
    assert expand_hosts("n[1-2]") == {"n1", "n2"}
    assert expand_hosts(None) is None


def test_replay_grep(run: Path) -> None:
    assert show(run, grep=r"loss \d") == "n1 r0: loss 1.0\nn2 r2: loss 2.0\n"
    with pytest.raises(UsageError, match="invalid --grep"):
        show(run, grep="(")


def test_replay_json_prints_the_archived_objects(run: Path) -> None:
    objects = [json.loads(raw) for raw in show(run, as_json=True, ranks={1}).splitlines()]
    assert objects == [
        {"t": 1.0, "host": "", "node_rank": None, "rank": None, "stream": "dtrain",
         "line": "starting"},
        {"t": 1.1, "host": "n1", "node_rank": 0, "rank": 1, "stream": "err", "line": "warning"},
    ]  # fmt: skip


def test_replay_colour_aligns_with_meta_hosts(run: Path) -> None:
    out = io.StringIO()
    replay(run, out=out, color=True)
    assert "\x1b[" in out.getvalue()


def test_replay_skips_a_torn_last_line(run: Path) -> None:
    with open(run / "output.jsonl", "a") as fh:
        fh.write('{"t": 2.0, "host": "n1", "li')
    assert show(run).endswith("n2: agent up\n")


def test_replay_of_a_run_without_output(tmp_path: Path) -> None:
    archive = RunArchive.create(tmp_path, "empty")
    archive.close()
    (archive.path / "output.jsonl").unlink()
    assert show(archive.path) == ""


def test_follow_tails_until_the_outcome_is_recorded(tmp_path: Path) -> None:
    archive = RunArchive.create(tmp_path, "live")
    archive.write_lines([OutputLine("n1", "out", "early", rank=0)])
    archive.flush()

    def job() -> None:
        time.sleep(0.3)
        archive.write_lines([OutputLine("n1", "out", "late", rank=0)])
        archive.flush()
        time.sleep(0.3)
        archive.write_lines([OutputLine("n1", "out", "last", rank=0)])
        archive.close()  # the pipeline closes the output before the outcome is written
        archive.update_meta(outcome="success", end=time.time())

    writer = threading.Thread(target=job)
    writer.start()
    start = time.monotonic()
    text = show(archive.path, follow=True, poll_s=0.05)
    writer.join()
    assert text == "n1 r0: early\nn1 r0: late\nn1 r0: last\n"
    assert 0.5 < time.monotonic() - start < 60  # it waited for the late lines, then ended


def test_follow_of_a_finished_run_returns_at_once(run: Path) -> None:
    with RunArchive(run, "r") as archive:  # reopening keeps the meta written so far
        archive.update_meta(outcome="failed")
    assert archive.meta["hosts"] == ["n1", "n2"]
    start = time.monotonic()
    assert show(run, follow=True).count("\n") == 5
    assert time.monotonic() - start < 30  # returned, did not follow a finished run


def test_follow_stops_on_ctrl_c(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupt(_: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(time, "sleep", interrupt)
    assert replay(run, follow=True, out=io.StringIO(), color=False) == 130


def test_rank_beyond_the_world_size_says_so(run: Path) -> None:
    with pytest.raises(UsageError) as info:
        show(run, ranks={1, 99})
    assert info.value.message == "--rank 99: run r had 4 ranks (ranks 0-3)"
    assert info.value.exit_code == 2
