"""Remote byte chunks -> whole lines -> the archive, then the console, never stalling the job.

Policy (see docs/internals/output.md):

1. Lines reach the archive first, synchronously, in arrival order; the archive never drops.
2. The console gets a bounded hand-off buffer (``ConsoleSink``) drained by one daemon
   thread, so a stdout that blocks (``| less`` paused, a frozen terminal) blocks only that
   thread, never the event loop, the readers or the remote ranks.
3. ``put`` never waits. When the buffer is full, new console lines are dropped and counted;
   the console later shows ``[dtrain: N lines skipped on the console; all are in the
   archive]`` exactly where the gap is.
4. On exit the pipeline waits for the console to drain (``drain_timeout``, None = as long
   as it takes, like ``cat``); cancelling (Ctrl-C) stops that wait.

Blocking the readers instead would fill the SSH windows and then the remote pipes, and a
training step would stall on print(): a slow terminal must never slow the job.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Self

from launcher.models import OutputLine
from launcher.output.fold import SUMMARY
from launcher.output.linesplit import DEFAULT_MAX_LINE, LineSplitter

if TYPE_CHECKING:
    from types import TracebackType

    from launcher.output.archive import RunArchive
    from launcher.output.console import Console, Gatherer
    from launcher.output.fold import StderrFolder

DEFAULT_MAX_LINES = 100_000
DEFAULT_MAX_CHARS = 32 * 1024 * 1024
_FLUSH_TICK_S = 0.5
STATUS_REFRESH_S = 0.5  # with flush_if_due(0.5): archived lines reach the disk within 1 s


class _Gap:
    """A run of console lines dropped while the buffer was full."""

    __slots__ = ("count",)

    def __init__(self, count: int) -> None:
        self.count = count


_Item = Sequence[OutputLine] | _Gap


class ConsoleSink:
    """Bounded, never-blocking hand-off from the event loop to a console-writer thread."""

    def __init__(
        self,
        console: Console,
        *,
        max_lines: int = DEFAULT_MAX_LINES,
        max_chars: int = DEFAULT_MAX_CHARS,
        archived: bool = True,
    ) -> None:
        self.console = console
        self.max_lines = max_lines
        self.max_chars = max_chars
        self.archived = archived
        self.skipped = 0  # console lines dropped so far (all of them are in the archive)
        self.error: BaseException | None = None
        self._items: list[_Item] = []
        self._lines = 0
        self._chars = 0
        self._closing = False
        self._exited = False
        self._on_exit: Callable[[], object] | None = None
        self._cond = threading.Condition()
        # A daemon thread, not the default executor: a write stuck forever must not keep
        # asyncio.run() (which joins executor threads) or the interpreter from exiting.
        self._thread = threading.Thread(target=self._run, name="dtrain-console", daemon=True)

    def start(self) -> None:
        """Start the writer thread."""
        self._thread.start()

    def put(self, lines: Sequence[OutputLine], *, size: int | None = None) -> None:
        """Queue lines for the console, or count them as skipped; never waits for the writer.

        ``size`` is the text size when the caller knows it (the chunk's byte count), to
        spare a pass over the lines. The sink keeps a reference to ``lines``: do not
        mutate the sequence afterwards.
        """
        if self._closing or self.console.broken:
            return
        selected = self.console.select(lines)
        if not selected:
            return
        count = len(selected)
        if size is None or selected is not lines:
            size = sum(len(line.text) for line in selected)
        with self._cond:
            if self._lines and (
                self._lines + count > self.max_lines or self._chars + size > self.max_chars
            ):
                self._skip(count)
                return
            self._items.append(selected)
            self._lines += count
            self._chars += size
            self._cond.notify()

    def close(self) -> None:
        """No more lines: the writer drains what it holds and exits."""
        with self._cond:
            self._closing = True
            self._cond.notify()

    async def aclose(self) -> None:
        """Close and wait, without blocking the loop, until the writer has drained.

        Bound it with ``asyncio.timeout``: a console stuck forever only leaves the daemon
        thread behind.
        """
        loop = asyncio.get_running_loop()
        drained = asyncio.Event()
        with self._cond:
            self._closing = True
            self._on_exit = lambda: loop.call_soon_threadsafe(drained.set)
            self._cond.notify()
            running = self._thread.ident is not None and not self._exited
        if running:
            await drained.wait()
        if self.error is not None:
            raise self.error  # a bug in formatting: show it, don't hide it

    def _skip(self, count: int) -> None:
        last = self._items[-1] if self._items else None
        if isinstance(last, _Gap):
            last.count += count
        else:
            self._items.append(_Gap(count))
        self.skipped += count

    def _run(self) -> None:
        try:
            self._drain_until_closed()
        finally:
            with self._cond:
                self._exited = True
                on_exit = self._on_exit
            if on_exit is not None:
                with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits
                    on_exit()

    def _drain_until_closed(self) -> None:
        while True:
            with self._cond:
                while not self._items and not self._closing:
                    if self.console.live:
                        if not self._cond.wait(timeout=STATUS_REFRESH_S):
                            break  # nothing arrived: refresh the status line below
                    else:
                        self._cond.wait()
                items, self._items = self._items, []
                self._lines = self._chars = 0
                closing = self._closing
            if not items:
                if closing:
                    self.console.clear_status()
                    self.console.flush()
                    return
                self.console.redraw_status()
                continue
            try:
                self.console.write(self._batch(items))
                self.console.flush()
            except Exception as exc:  # record it for aclose(); keep the job running
                self.error = exc
                self.console.broken = True
                return

    def _batch(self, items: list[_Item]) -> list[OutputLine]:
        batch: list[OutputLine] = []
        for item in items:
            if isinstance(item, _Gap):
                batch.append(self.gap_line(item.count))
            else:
                batch.extend(item)
        return batch

    def gap_line(self, count: int) -> OutputLine:
        """The console marker for ``count`` dropped lines."""
        where = "all are in the archive" if self.archived else "no archive was kept"
        text = f"[dtrain: {count} lines skipped on the console; {where}]"
        return OutputLine(host="", stream="dtrain", text=text, t=time.time())


def console_filtered(console: Console) -> bool:
    """--rank/--host asked for some sources: folded lines would belong to none of them."""
    return console.ranks is not None or console.hosts is not None


class OutputPipeline:
    """The launcher's one output path: chunks -> lines -> archive, console (or gatherer).

    ``async with OutputPipeline(console, archive) as out:`` then, from any task on the loop,
    ``out.feed(host, rank, stream, data)`` for supervisor chunks, ``out.eof(...)`` when a
    source ends, ``out.emit(lines)`` for ready lines and ``out.message(text)`` for dtrain's
    own. All of them are plain (non-async) calls that never block on the console. Leaving
    the block flushes unfinished lines and closes the archive's output files (meta.json stays
    writable, so the caller records the outcome after everything is on disk), then waits
    for the console.
    """

    def __init__(
        self,
        console: Console | None = None,
        archive: RunArchive | None = None,
        *,
        gatherer: Gatherer | None = None,
        max_console_lines: int = DEFAULT_MAX_LINES,
        max_console_chars: int = DEFAULT_MAX_CHARS,
        drain_timeout: float | None = None,
        max_line: int = DEFAULT_MAX_LINE,
        folder: StderrFolder | None = None,
    ) -> None:
        self.archive = archive
        self.folder = folder if console is not None and not console_filtered(console) else None
        self.gatherer = gatherer
        self.drain_timeout = drain_timeout
        self.max_line = max_line
        self.sink = (
            ConsoleSink(
                console,
                max_lines=max_console_lines,
                max_chars=max_console_chars,
                archived=archive is not None,
            )
            if console is not None
            else None
        )
        self._splitters: dict[tuple[str, int | None, str], tuple[LineSplitter, int | None]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._fold_timer: asyncio.TimerHandle | None = None
        self._state = "new"

    @property
    def skipped(self) -> int:
        """Lines the console dropped because it could not keep up."""
        return self.sink.skipped if self.sink is not None else 0

    async def __aenter__(self) -> Self:
        if self._state != "new":
            raise RuntimeError("an OutputPipeline can be entered only once")
        self._state = "open"
        if self.sink is not None:
            self.sink.start()
        if self.archive is not None:
            self._arm_timer()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.eof_all()
            self.flush_console()
        finally:
            self._state = "closed"
            for timer in (self._timer, self._fold_timer):
                if timer is not None:
                    timer.cancel()
            try:
                if self.archive is not None:
                    self.archive.close()
            finally:
                if self.sink is not None:
                    await self._drain_console()

    async def _drain_console(self) -> None:
        assert self.sink is not None
        try:
            async with asyncio.timeout(self.drain_timeout):
                await self.sink.aclose()
        except TimeoutError:
            pass  # the console stays behind; everything is in the archive anyway

    def feed(
        self,
        host: str,
        rank: int | None,
        stream: str,
        data: bytes,
        *,
        node_rank: int | None = None,
    ) -> None:
        """A raw chunk from one source; complete lines go out at once."""
        key = (host, rank, stream)
        entry = self._splitters.get(key)
        if entry is None:
            entry = self._splitters[key] = (LineSplitter(self.max_line), node_rank)
        texts = entry[0].feed(data)
        if texts:
            self._emit_texts(key, entry[1], texts, size=len(data))

    def eof(self, host: str, rank: int | None, stream: str) -> None:
        """A source ended: its unfinished last line goes out."""
        entry = self._splitters.pop((host, rank, stream), None)
        if entry is not None:
            texts = entry[0].flush()
            if texts:
                self._emit_texts((host, rank, stream), entry[1], texts)

    def eof_all(self) -> None:
        """End every source (the job is over or a connection dropped)."""
        for key in list(self._splitters):
            self.eof(*key)

    def emit(self, lines: Sequence[OutputLine], *, size: int | None = None) -> None:
        """Archive the lines, then hand them to the console (or the gatherer).

        ``size``: the lines' total text size, when known (see ConsoleSink.put).
        """
        if self._state != "open":
            raise RuntimeError(f"OutputPipeline.emit() on a {self._state} pipeline")
        if self.archive is not None:
            self.archive.write_lines(lines)
        if self.gatherer is not None:
            self.gatherer.add(lines)
            lines, size = [line for line in lines if line.stream == "dtrain"], None
        if self.sink is not None and lines:
            shown = self.for_console(lines)
            if shown:
                self.sink.put(shown, size=size if shown is lines else None)

    def for_console(self, lines: Sequence[OutputLine]) -> Sequence[OutputLine]:
        """What the console shows of archived lines now (the same list when unchanged);
        the folder holds repeated stderr lines a moment (fold.py)."""
        folder = self.folder
        if folder is None or all(line.stream != "err" for line in lines):
            return lines
        shown = self.leaving_fold(folder.feed(lines, time.time()))
        self._arm_fold_timer()
        return shown

    def leaving_fold(self, lines: Sequence[OutputLine]) -> Sequence[OutputLine]:
        """The console's last word on lines the folder lets go, which may be up to its
        window after they came: a subclass filters here what it learns about meanwhile
        (run's torchrun chatter once the stop began)."""
        return lines

    def flush_console(self) -> None:
        """Let go of every line held for folding (the job's output is over)."""
        if self.folder is not None and self.sink is not None:
            held = self.leaving_fold(self.folder.flush())
            if held:
                self.sink.put(held)

    def _arm_fold_timer(self) -> None:
        assert self.folder is not None
        deadline = self.folder.next_deadline
        if deadline is None or self._fold_timer is not None:
            return
        delay = max(0.0, deadline - time.time())
        self._fold_timer = asyncio.get_running_loop().call_later(delay, self._fold_tick)

    def _fold_tick(self) -> None:
        self._fold_timer = None
        if self._state != "open" or self.folder is None or self.sink is None:
            return
        released = self.leaving_fold(self.folder.release(time.time()))
        if released:
            self.sink.put(released)
        self._arm_fold_timer()

    def message(self, text: str, *, host: str = "") -> None:
        """One of dtrain's own messages, shown and archived in order with the output."""
        self.emit([OutputLine(host=host, stream="dtrain", text=text, t=time.time())])

    def summary(self, text: str) -> None:
        """A line of the summary after the job: a message that --timestamps leaves
        unstamped (docs/cli.md)."""
        self.emit([OutputLine("", "dtrain", text, None, SUMMARY, time.time())])

    def _emit_texts(
        self,
        key: tuple[str, int | None, str],
        node_rank: int | None,
        texts: list[str],
        *,
        size: int | None = None,
    ) -> None:
        host, rank, stream = key
        t = time.time()
        lines = [OutputLine(host, stream, text, rank, node_rank, t) for text in texts]
        self.emit(lines, size=size)

    def _arm_timer(self) -> None:
        self._timer = asyncio.get_running_loop().call_later(_FLUSH_TICK_S, self._tick)

    def _tick(self) -> None:
        if self._state == "open" and self.archive is not None:
            self.archive.flush_if_due(_FLUSH_TICK_S)
            self._arm_timer()
