"""OutputPipeline: chunks -> archive and console, and the slow-console policy."""

from __future__ import annotations

import asyncio
import io
import json
import random
import threading
import time
from pathlib import Path

import pytest

from launcher.models import OutputLine
from launcher.output.archive import RunArchive
from launcher.output.console import Console, Gatherer
from launcher.output.pipeline import ConsoleSink, OutputPipeline

SOURCES = [("n1", 0, "out"), ("n1", 1, "out"), ("n1", 1, "err"), ("n2", 2, "out"),
           ("n2", 3, "out"), ("n2", None, "err")]  # fmt: skip


class BlockingStream(io.StringIO):
    """A console whose reader has stopped reading (| less, paused) until released."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.entered = threading.Event()

    def write(self, s: str) -> int:
        self.entered.set()
        self.release.wait()
        return super().write(s)


def chunked(data: bytes, rng: random.Random) -> list[bytes]:
    chunks, pos = [], 0
    while pos < len(data):
        size = rng.choice((1, 7, 100, 4096, 65536))
        chunks.append(data[pos : pos + size])
        pos += size
    return chunks


async def test_every_line_exactly_once_in_archive_and_console(tmp_path: Path) -> None:
    rng = random.Random(3)
    stream = io.StringIO()
    archive = RunArchive.create(tmp_path, "r")
    pending = {
        src: chunked("".join(f"{src[0]}/{src[1]}/{src[2]} line {i}\n" for i in range(20_000))
                     .encode(), rng)
        for src in SOURCES
    }  # fmt: skip
    async with OutputPipeline(Console(stream, color=False), archive) as out:
        while any(pending.values()):
            src = rng.choice([s for s, chunks in pending.items() if chunks])
            out.feed(*src, pending[src].pop(0), node_rank=int(src[0][1]) - 1)
            if rng.random() < 0.01:
                await asyncio.sleep(0)
    assert out.skipped == 0
    seen: dict[tuple[str, int | None, str], list[str]] = {src: [] for src in SOURCES}
    for raw in (tmp_path / "r" / "output.jsonl").read_text().splitlines():
        rec = json.loads(raw)
        assert rec["node_rank"] == int(rec["host"][1]) - 1
        seen[(rec["host"], rec["rank"], rec["stream"])].append(rec["line"])
    for (host, rank, stream_name), texts in seen.items():
        assert texts == [f"{host}/{rank}/{stream_name} line {i}" for i in range(20_000)]
    console_lines = stream.getvalue().splitlines()
    assert len(console_lines) == 6 * 20_000
    assert console_lines.count("n1 r1 [err]: n1/1/err line 19999") == 1
    assert console_lines.count("n2 [err]: n2/None/err line 0") == 1


async def test_unfinished_lines_are_flushed_at_exit(tmp_path: Path) -> None:
    stream = io.StringIO()
    async with OutputPipeline(Console(stream, color=False)) as out:
        out.feed("h", 0, "out", b"done\npartial")
        out.feed("h", 0, "out", b"\r50%\r100%")
    assert stream.getvalue() == "h r0: done\nh r0: 100%\n"


async def test_slow_console_never_blocks_emit_and_marks_the_gap(tmp_path: Path) -> None:
    stream = BlockingStream()
    archive = RunArchive.create(tmp_path, "r")
    pipeline = OutputPipeline(Console(stream, color=False), archive, max_console_lines=100)
    async with pipeline as out:
        out.emit([OutputLine("h", "out", "first")])
        assert await asyncio.to_thread(stream.entered.wait, 5)  # the writer is now stuck
        start = time.monotonic()
        for i in range(1000):
            out.emit([OutputLine("h", "out", f"line {i}")])
        assert time.monotonic() - start < 30  # emit never waits for the stuck writer
        skipped = out.skipped
        assert skipped == 900
        stream.release.set()
    text = stream.getvalue().splitlines()
    assert text[0] == "h: first"
    assert text[1:101] == [f"h: line {i}" for i in range(100)]
    assert text[101] == (
        "dtrain: [dtrain: 900 lines skipped on the console; all are in the archive]"
    )
    assert len((tmp_path / "r" / "output.jsonl").read_text().splitlines()) == 1001


async def test_stuck_console_is_left_behind_after_drain_timeout() -> None:
    stream = BlockingStream()
    start = time.monotonic()
    async with OutputPipeline(Console(stream, color=False), drain_timeout=0.2) as out:
        out.emit([OutputLine("h", "out", "never shown")])
    assert time.monotonic() - start < 30  # left behind after 0.2 s, not waited for
    stream.release.set()


async def test_archive_reaches_disk_while_running_without_further_writes(tmp_path: Path) -> None:
    """No further writes and the pipeline still open: the flush timer (1 s) must bring the
    lines to disk. Waited for with a generous deadline; the 1 s is the design, not a bound
    this test measures."""
    archive = RunArchive.create(tmp_path, "r")
    path = tmp_path / "r" / "output.jsonl"

    def on_disk() -> int:
        return len(path.read_text().splitlines()) if path.exists() else 0

    async with OutputPipeline(None, archive) as out:
        out.emit([OutputLine("h", "out", "a")])
        out.emit([OutputLine("h", "out", "b")])  # no further writes: the timer must flush
        deadline = asyncio.get_running_loop().time() + 10
        while on_disk() < 2 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        assert on_disk() == 2


async def test_gather_mode_shows_only_dtrain_messages_live() -> None:
    stream, gatherer = io.StringIO(), Gatherer()
    async with OutputPipeline(Console(stream, color=False), gatherer=gatherer) as out:
        out.feed("a", None, "out", b"same\n")
        out.feed("b", None, "out", b"same\n")
        out.message("node c unreachable", host="c")
    assert stream.getvalue() == "dtrain: c: node c unreachable\n"
    assert gatherer.render() == "----------------\na,b\n----------------\nsame\n"


async def test_emit_outside_the_block_is_a_bug() -> None:
    pipeline = OutputPipeline(Console(io.StringIO()))
    with pytest.raises(RuntimeError, match="new"):
        pipeline.emit([OutputLine("h", "out", "x")])
    async with pipeline:
        pass
    with pytest.raises(RuntimeError, match="closed"):
        pipeline.emit([OutputLine("h", "out", "x")])


async def test_a_console_bug_surfaces_at_exit() -> None:
    class Exploding(Console):
        def format_line(self, line: OutputLine) -> str:
            raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        async with OutputPipeline(Exploding(io.StringIO())) as out:
            out.emit([OutputLine("h", "out", "x")])


async def test_sink_without_archive_says_so() -> None:
    sink = ConsoleSink(Console(io.StringIO()), archived=False)
    assert "no archive" in sink.gap_line(3).text
