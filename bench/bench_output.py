"""Micro benchmark of the output path: LineSplitter, RunArchive, Console (to /dev/null).

    python bench/bench_output.py [--lines N] [--sources S] [--chunk BYTES]

Feeds S sources of short lines ("step 123 loss 0.123456 lr 1e-4", ~40 bytes) in chunks of
--chunk bytes, as the supervisor forwards them, and prints lines/s for each stage alone
and for the whole OutputPipeline (splitter + archive + console thread).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from launcher.models import OutputLine  # noqa: E402
from launcher.output.archive import RunArchive  # noqa: E402
from launcher.output.console import Console  # noqa: E402
from launcher.output.linesplit import LineSplitter  # noqa: E402
from launcher.output.pipeline import OutputPipeline  # noqa: E402


def make_chunks(lines: int, chunk: int) -> list[bytes]:
    data = "".join(f"step {i} loss 0.{i % 1000000:06d} lr 1e-4\n" for i in range(lines)).encode()
    return [data[i : i + chunk] for i in range(0, len(data), chunk)]


def timed(label: str, lines: int, fn: Callable[[], object], repeat: int = 3) -> float:
    """Best of ``repeat`` runs, by CPU time (all threads) and by wall-clock time.

    CPU time is the fair figure on a shared machine; wall time shows what a run got.
    """
    cpu = wall = float("inf")
    for _ in range(repeat):
        cpu0, wall0 = time.process_time(), time.perf_counter()
        fn()
        cpu = min(cpu, time.process_time() - cpu0)
        wall = min(wall, time.perf_counter() - wall0)
    rate = lines / cpu
    print(  # noqa: T201  # benchmark report
        f"{label:<44} {rate / 1e6:6.2f} M lines/s CPU  {lines / wall / 1e6:6.2f} M lines/s wall"
    )
    return rate


def bench_splitter(chunks: list[bytes], sources: int) -> list[str]:
    texts: list[str] = []
    for _ in range(sources):
        splitter = LineSplitter()
        for chunk in chunks:
            texts += splitter.feed(chunk)
        texts += splitter.flush()
    return texts


def to_lines(texts: list[str]) -> list[OutputLine]:
    now = time.time()
    return [OutputLine("node1", "out", text, 3, 0, now) for text in texts]


def batches(lines: list[OutputLine], size: int = 1500) -> list[list[OutputLine]]:
    return [lines[i : i + size] for i in range(0, len(lines), size)]


def bench_archive(parts: list[list[OutputLine]], tmp: Path) -> None:
    with RunArchive.create(tmp) as archive:
        for part in parts:
            archive.write_lines(part)


def bench_console(parts: list[list[OutputLine]]) -> None:
    with open(os.devnull, "w") as devnull:
        console = Console(devnull, color=True, labels=["node1"], world_size=16)
        for part in parts:
            console.write(part)
        console.flush()


async def bench_pipeline(chunks: list[bytes], sources: int, tmp: Path) -> None:
    with open(os.devnull, "w") as devnull:
        console = Console(devnull, color=True, world_size=16)
        archive = RunArchive.create(tmp)
        async with OutputPipeline(console, archive) as out:
            for chunk in chunks:
                for source in range(sources):
                    out.feed(f"node{source // 8}", source, "out", chunk, node_rank=source // 8)
    assert out.skipped == 0, f"the console dropped {out.skipped} lines"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lines", type=int, default=200_000, help="lines per source")
    parser.add_argument("--sources", type=int, default=8)
    parser.add_argument("--chunk", type=int, default=65536, help="bytes per chunk")
    args = parser.parse_args()
    chunks = make_chunks(args.lines, args.chunk)
    total = args.lines * args.sources
    timed("LineSplitter.feed", total, lambda: bench_splitter(chunks, args.sources))
    texts = bench_splitter(chunks, args.sources)
    timed("OutputLine construction", total, lambda: to_lines(texts))
    lines = to_lines(texts)
    parts = batches(lines)
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        timed("RunArchive.write_lines (jsonl + host log)", total, lambda: bench_archive(parts, tmp))
        timed("Console.write (colour, /dev/null)", total, lambda: bench_console(parts))
        timed(
            "OutputPipeline.feed end to end",
            total,
            lambda: asyncio.run(bench_pipeline(chunks, args.sources, tmp)),
        )


if __name__ == "__main__":
    main()
