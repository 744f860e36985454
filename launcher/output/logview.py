"""`dtrain logs`: replay (or follow) a run's output.jsonl with the live console's tags.

Filters match the live console's (``--rank``, ``--host``; dtrain's own messages always
pass) plus ``--grep`` (a regular expression searched in the line text). ``--json`` prints
the archived objects unchanged. ``--follow`` tails a run that is still going and returns
once meta.json records an ``end`` or ``outcome`` and the file has been read to its end:
the pipeline closes output.jsonl before the outcome is written, so nothing is missed.

`dtrain attach` uses the same replay with ``tail`` (start at the last N lines), ``status``
(a live status line under the log on a colour terminal) and ``ended`` (stop following when
the launcher is gone too, not only when meta.json records the end).
"""

from __future__ import annotations

import json
import os
import re
import time
from typing import TYPE_CHECKING, Any, TextIO

from ClusterShell.NodeSet import NodeSetException

from launcher.errors import UsageError
from launcher.exitcodes import EXIT_INTERRUPTED
from launcher.hosts.entries import check_expr_size, nodeset
from launcher.models import OutputLine
from launcher.output.archive import open_output, read_meta
from launcher.output.console import Console

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Iterator
    from pathlib import Path

    from launcher.output.fold import BarrierReplay, StderrFolder

POLL_S = 0.2
_Record = tuple[str, OutputLine]  # (the raw JSON text, the parsed line)
_READ_SIZE = 1 << 20


def replay(
    run_dir: Path,
    *,
    ranks: Collection[int] | None = None,
    host: str | None = None,
    hosts: Collection[str] | None = None,
    grep: str | None = None,
    follow: bool = False,
    as_json: bool = False,
    out: TextIO | None = None,
    color: bool | None = None,
    poll_s: float = POLL_S,
    tail: int | None = None,
    status: Callable[[], str] | None = None,
    ended: Callable[[], bool] | None = None,
    attempt: int | None = None,
    fold: bool = False,
) -> int:
    """Print a run's archived output; returns the exit code (0, or 130 on Ctrl-C in --follow).
    ``fold``: repeated stderr lines of many ranks folded into one, as the live console
    folds them (fold.StderrFolder over each line's recorded arrival time): `dtrain attach`.
    ``hosts``: the host labels to show (decide.copies.filters.select_hosts), ``host``: an
    expression of them taken as it is.
    ``attempt``: only that attempt's lines (--restarts; a line without the field is 1)."""
    meta = read_meta(run_dir)
    world = meta.get("world_size")
    beyond = sorted(r for r in ranks or () if isinstance(world, int) and not 0 <= r < world)
    if beyond and isinstance(world, int):
        raise UsageError(f"--rank {beyond[0]}: run {run_dir.name} had {world} rank"
                         f"{'' if world == 1 else 's'} ({_rank_range(world)})",
                         hint="see them all with `dtrain logs` without --rank")
    console = Console(
        out,
        color=False if as_json else color,
        ranks=ranks,
        hosts=set(hosts) if hosts is not None else expand_hosts(host),
        labels=[h for h in meta.get("hosts", []) if isinstance(h, str)],
        world_size=meta.get("world_size") if isinstance(meta.get("world_size"), int) else None,
    )
    console.status = status
    folder = None
    if fold and not as_json:
        from launcher.hosts.hostfile import fold as fold_names
        from launcher.output.fold import StderrFolder

        nodes = len(meta.get("hosts") or ())
        folder = StderrFolder(world if isinstance(world, int) else 0, nodes,
                              fold_hosts=fold_names)
    pattern = _compile(grep)
    start = tail_offset(run_dir, tail) if tail is not None else 0
    done = ended or (lambda: is_finished(run_dir))
    # torchrun's shutdown chatter, folded as the console folded it (its marker line stays):
    # a first pass over the whole file finds it, so not when following a run still going
    hidden = _chatter(run_dir) if not follow and not as_json and not start else set()
    seen = 0
    # torchrun's exit-barrier trace of a finished node, folded as the console folded it
    barrier: BarrierReplay[_Record] | None = None
    if not as_json:
        from launcher.output.fold import BarrierReplay

        barrier = BarrierReplay()
    try:
        for batch in _batches(run_dir, follow=follow, poll_s=poll_s, start=start, ended=done):
            if hidden:
                batch, seen = [rec for i, rec in enumerate(batch, seen)
                               if i not in hidden], seen + len(batch)
            if attempt is not None:
                batch = [rec for rec in batch if attempt_of(rec[0]) == attempt]
            if barrier is not None:
                batch = [out for rec in batch for out in barrier.feed(rec, rec[1])]
            _show(console, batch, pattern, as_json=as_json, folder=folder)
            if console.broken:
                break  # `dtrain logs | head` is done reading
    except KeyboardInterrupt:
        if not follow:
            raise
        console.clear_status()
        console.flush()
        return EXIT_INTERRUPTED
    if barrier is not None and barrier.held:
        _show(console, barrier.flush(), pattern, as_json=as_json, folder=folder)
    if folder is not None:
        console.write(folder.flush())
    console.clear_status()
    console.flush()
    return 0


_ATTEMPT = re.compile(r'"attempt":(\d+),"line":')


def attempt_of(raw: str) -> int:
    """Which attempt an output.jsonl record belongs to (absent = 1): the archive writes
    the field just before "line", so the text says it without a second parse."""
    m = _ATTEMPT.search(raw)
    return int(m.group(1)) if m else 1


def tail_offset(run_dir: Path, lines: int) -> int:
    """Where the last ``lines`` complete lines of a run's output.jsonl start (0: the whole
    file)."""
    fd = open_output(run_dir)
    if fd is None:
        return 0
    with open(fd, "rb") as fh:
        pos = size = fh.seek(0, os.SEEK_END)
        if lines == 0:
            return size
        seen = 0
        while pos > 0:
            step = min(_READ_SIZE, pos)
            pos -= step
            fh.seek(pos)
            block = fh.read(step)
            end = len(block)
            while True:
                nl = block.rfind(b"\n", 0, end)
                if nl < 0:
                    break
                if pos + nl + 1 < size:  # a newline ending a line: count the line after it
                    seen += 1
                    if seen >= lines:
                        return pos + nl + 1
                end = nl
    return 0


def expand_hosts(host: str | None) -> set[str] | None:
    """A --host value (a name, a comma list or a folded set like node[1-4]) as names."""
    if not host:
        return None
    check_expr_size(host, "--host")  # before NodeSet builds node[1-100000000]
    try:  # node groups (@name) are never resolved: they could run site commands
        return set(nodeset(host))
    except NodeSetException:
        return {part.strip() for part in host.split(",") if part.strip()}


def _chatter(run_dir: Path) -> set[int]:
    """The positions of the records the console kept off the screen as torchrun's shutdown
    chatter (fold.folded_chatter)."""
    from launcher.output.fold import folded_chatter

    return folded_chatter(line for batch in _batches(run_dir, follow=False, poll_s=0)
                          for _, line in batch)


def record_line(record: dict[str, Any]) -> OutputLine:
    """An output.jsonl object back as the OutputLine it was written from."""
    return OutputLine(
        host=str(record.get("host") or ""),
        stream=str(record.get("stream") or "out"),
        text=str(record.get("line") or ""),
        rank=record.get("rank"),
        node_rank=record.get("node_rank"),
        t=float(record.get("t") or 0.0),
    )


def is_finished(run_dir: Path) -> bool:
    """True once the launcher recorded how the run ended."""
    meta = read_meta(run_dir)
    return bool(meta.get("end") or meta.get("outcome"))


def _rank_range(world: int) -> str:
    return "rank 0" if world == 1 else f"ranks 0-{world - 1}" if world else "no ranks"


def _compile(grep: str | None) -> re.Pattern[str] | None:
    if grep is None:
        return None
    try:
        return re.compile(grep)
    except re.error as exc:
        raise UsageError(f"invalid --grep pattern {grep!r}: {exc}") from None


def _show(
    console: Console,
    batch: list[_Record],
    pattern: re.Pattern[str] | None,
    *,
    as_json: bool,
    folder: StderrFolder | None = None,
) -> None:
    wanted = [
        (raw, line)
        for raw, line in batch
        if console.wants(line) and (pattern is None or pattern.search(line.text))
    ]
    if as_json:
        console.write_raw([raw for raw, _ in wanted])
    elif folder is not None:
        shown: list[OutputLine] = []
        for _, line in wanted:  # each at its own recorded time, as the live console saw it
            shown += folder.release(line.t)
            shown += folder.feed([line], line.t)
        if not wanted:  # an idle poll: the groups whose window has passed
            shown += folder.release(time.time())
        console.write(shown)
    else:
        console.write(line for _, line in wanted)
    console.flush()


def _batches(run_dir: Path, *, follow: bool, poll_s: float, start: int = 0,
             ended: Callable[[], bool] | None = None) -> Iterator[list[_Record]]:
    """Parsed output.jsonl records, a read at a time; in follow mode, until the run ends
    (an empty batch each idle poll, so a status line can refresh)."""
    done_fn = ended or (lambda: is_finished(run_dir))
    while (fd := open_output(run_dir)) is None:  # a regular file of this user, or nothing
        if not follow or done_fn():
            return
        time.sleep(poll_s)
        yield []
    with open(fd, encoding="utf-8", errors="replace", newline="\n") as fh:
        if start:
            fh.seek(start)  # a byte offset: a valid cookie for utf-8 at a line start
        partial = ""
        done = False
        while True:
            chunk = fh.read(_READ_SIZE)
            if chunk:
                *complete, partial = (partial + chunk).split("\n")
                yield _parse(complete)
                continue
            if done or not follow:
                break
            # Read to the end once more after seeing the outcome: lines written before it.
            done = done_fn()
            if not done:
                time.sleep(poll_s)
                yield []
        if partial:
            yield _parse([partial])


def _parse(raws: list[str]) -> list[_Record]:
    parsed: list[_Record] = []
    for raw in raws:
        try:
            record = json.loads(raw)
        except ValueError:
            continue  # a line torn by a crash mid-write: skip it, keep the rest
        if isinstance(record, dict):
            parsed.append((raw, record_line(record)))
    return parsed
