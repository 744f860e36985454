"""Noise a user should not see (issue 40, item 6): asyncio's child-watcher warning after
`doctor -H localhost`, and torchrun's shutdown chatter in `dtrain logs` after a stop (the
console folds it; the replay now folds it the same way)."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest

from launcher.models import Host, OutputLine
from launcher.output.archive import RunArchive
from launcher.output.fold import folded_chatter
from launcher.output.logview import replay
from launcher.transports.local import LocalConnection
from tests.util import dtrain

# what a stopped torchrun agent printed (output.jsonl of a real run, shortened)
AGENT = [
    "W1203 07:15:11.729000 11660 site-packages/torch/distributed/elastic/agent/server/api.py:"
    "753] Received 15 death signal, shutting down workers",
    "Traceback (most recent call last):",
    '  File "<frozen runpy>", line 198, in _run_module_as_main',
    "    raise SignalException(f\"Process {os.getpid()} got signal: {sigval}\", sigval=sigval)",
    "torch.distributed.elastic.multiprocessing.api.SignalException: Process 11660 got signal: 15",
]


async def test_a_local_connection_reaps_its_commands_when_closed() -> None:
    """A command still running when its connection closes is reaped inside the loop (as
    sshd ends a dropped channel's command): none is left for asyncio's child watcher to
    find after the loop closed ("Loop ... that handles pid N is closed")."""
    conn = LocalConnection(Host("localhost"))
    proc = await conn.start("cat >/dev/null; sleep 0.2")  # ends once stdin is closed
    inner = proc._proc  # type: ignore[attr-defined]
    await conn.aclose()
    assert inner.returncode == 0
    stubborn = await conn.start("trap '' HUP; exec sleep 30")  # ignores its stdin
    t0 = time.monotonic()
    await conn.aclose()
    assert stubborn._proc.returncode is not None  # type: ignore[attr-defined]
    assert time.monotonic() - t0 < 10


def test_doctor_on_localhost_prints_no_asyncio_warning() -> None:
    """It did in 4 of 5 runs: three runs, not one warning."""
    for _ in range(3):
        res = dtrain(["doctor", "-H", "localhost", "--no-color"], timeout=120)
        out = res.stdout + res.stderr
        assert "handles pid" not in out and "is closed" not in out, out
        assert "1 node" in out, out


def _archive(tmp_path: Path, lines: list[OutputLine]) -> Path:
    archive = RunArchive.create(tmp_path, "r")
    archive.update_meta(hosts=["n1"], world_size=1)
    archive.write_lines(lines)
    archive.close()
    return archive.path


def _stopped_run() -> list[OutputLine]:
    return [
        OutputLine("", "dtrain", "run r: 1 node", t=1.0),
        OutputLine("n1", "err", "agent: a line of its own before the stop", node_rank=0, t=1.0),
        OutputLine("n1", "out", "step 1 loss 2.0", rank=0, node_rank=0, t=1.1),
        *(OutputLine("n1", "err", text, node_rank=0, t=2.0) for text in AGENT),
        OutputLine("n1", "dtrain", f"torchrun shutting down ({len(AGENT)} lines in the archive)",
                   t=3.0),
        OutputLine("", "dtrain", "FAILED: rank 0 on n1 exited 7 (exit 7)", t=3.0),
    ]


def test_logs_fold_torchruns_shutdown_chatter_as_the_console_did(tmp_path: Path) -> None:
    run = _archive(tmp_path, _stopped_run())
    out = io.StringIO()
    assert replay(run, out=out, color=False) == 0
    text = out.getvalue()
    assert "SignalException" not in text and "Traceback" not in text, text
    assert "Received 15 death signal" not in text, text
    assert "agent: a line of its own before the stop" in text  # not chatter: shown
    assert "n1: torchrun shutting down (5 lines in the archive)" in text
    assert "FAILED: rank 0 on n1" in text
    raw = io.StringIO()  # --json: the archive as it is, every line
    replay(run, out=raw, as_json=True)
    assert raw.getvalue().count("\n") == len(_stopped_run())


def test_folded_chatter_needs_the_marker_and_its_count() -> None:
    lines = _stopped_run()
    assert folded_chatter(lines) == {3, 4, 5, 6, 7}
    assert folded_chatter([x for x in lines if x.stream != "dtrain"]) == set()
    wrong = [OutputLine(x.host, x.stream, "torchrun shutting down (99 lines in the archive)")
             if x.text.startswith("torchrun shutting") else x for x in lines]
    assert folded_chatter(wrong) == set()  # a count no tail gives: nothing is hidden


@pytest.mark.torch
def test_logs_after_a_stop_show_what_the_console_showed(tmp_path: Path) -> None:
    """A real localhost run that dtrain stops (rank 1 exits 7, rank 0 is stopped): torchrun
    prints its SignalException traceback; the console folds it, and so does `dtrain logs`."""
    res = dtrain(["run", "-H", "localhost", "--nproc-per-node", "2", "--archive-dir",
                  str(tmp_path), "--run-id", "stopped", "--no-color", "-e", "WL_FAIL_RANK=1",
                  "-e", "WL_FAIL_STEP=2", "-e", "WL_COLLECTIVE=0", "tests/workloads/train.py"],
                 timeout=150)
    assert res.returncode == 7, res.stdout[-3000:] + res.stderr[-3000:]
    archived = (tmp_path / "stopped" / "output.jsonl").read_text()
    assert "SignalException" in archived  # the chatter is in the archive ...
    logs = dtrain(["logs", "--archive-dir", str(tmp_path), "stopped", "--no-color"])
    assert logs.returncode == 0, logs.stderr
    assert "SignalException" not in logs.stdout, logs.stdout  # ... and not on the screen
    assert "localhost: torchrun shutting down" in logs.stdout, logs.stdout
    console = [x for x in res.stdout.splitlines() if "step " not in x]
    replayed = [x for x in logs.stdout.splitlines() if "step " not in x]
    assert replayed == console, (res.stdout, logs.stdout)
