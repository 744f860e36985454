"""`dtrain exec`'s output path: whole lines tagged `host: ` at C speed, bytes in, bytes out.

exec output is pdsh's format: no ranks, no archive, no progress-bar folding, so lines
never need to become objects. Each chunk is cut at its last newline, the complete part is
prefixed in one ``bytes.replace`` and queued; the unfinished tail waits for the next chunk
(or EOF). Bytes pass through unchanged, so invalid UTF-8 and very long lines survive.
With --timestamps the prefix starts with the time the chunk arrived (console.wall_clock).
On a terminal (not with --raw) control sequences other than colours are neutralised first
(termsafe.py); a chunk without control bytes costs one ``bytes.translate`` for that, and
output to a pipe or a file is not looked at at all.

A writer thread does the writes, so a blocked stdout (`| less`, paused) never blocks the
event loop, which must keep heartbeats flowing. exec keeps no archive, so it never drops a
line: past HIGH_WATER queued bytes, ``backpressure()`` makes the node sessions stop
reading until the writer is below LOW_WATER. The SSH window then carries the pause back to
the node, where the command blocks on its pipe, exactly as it would under pdsh.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from typing import BinaryIO

from launcher.models import Host
from launcher.output.console import wall_clock
from launcher.output.render import should_color
from launcher.text.termsafe import clean_bytes, inert, needs_cleaning

HIGH_WATER = 16 * 1024 * 1024
LOW_WATER = 4 * 1024 * 1024
PALETTE = ("36", "33", "35", "32", "34", "96", "93", "95", "92", "94")


class ExecOutput:
    """Tags exec output by host; the LineRouter interface the orchestrator drives."""

    def __init__(self, labels: list[str], *, color: bool | None = None,
                 out: BinaryIO | None = None, err: BinaryIO | None = None,
                 sanitize: bool | None = None, timestamps: bool = False,
                 prefix: bool = True) -> None:
        self._out = out or sys.stdout.buffer
        self._tag = prefix  # -N (pdsh's): no host prefix on the nodes' lines
        self._timestamps = timestamps
        self._err = err or sys.stderr.buffer
        if color is None:
            color = should_color(self._out)  # type: ignore[arg-type]  # isatty is all it uses
        self._color = color
        # per stream: neutralise remote control sequences where they reach a terminal
        self._clean = {"out": _isatty(self._out) if sanitize is None else sanitize,
                       "err": _isatty(self._err) if sanitize is None else sanitize}
        self._index = {label: i for i, label in enumerate(labels)}
        self._prefixes: dict[str, bytes] = {}
        self._partial: dict[tuple[str, str], bytes] = {}
        self._queue: list[tuple[BinaryIO, bytes]] = []
        self._queued = 0
        self._closing = False
        self._room: asyncio.Event | None = None  # set while the queue is below LOW_WATER
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._writer, name="dtrain-exec-out",
                                        daemon=True)
        self._thread.start()

    def _prefix(self, label: str) -> bytes:
        prefix = self._prefixes.get(label)
        if prefix is None:
            if not self._tag:
                prefix = b""
            elif self._color:
                colour = PALETTE[self._index.get(label, len(self._index)) % len(PALETTE)]
                prefix = f"\x1b[{colour}m{label}\x1b[0m: ".encode()
            else:
                prefix = f"{label}: ".encode()
            self._prefixes[label] = prefix
        return prefix

    def _stamp(self) -> bytes:
        """--timestamps: when the launcher received this chunk (every line of it)."""
        if not self._timestamps:
            return b""
        stamp = wall_clock(time.time())
        return (f"\x1b[2m{stamp}\x1b[0m " if self._color else f"{stamp} ").encode()

    def chunk(self, host: Host, rank: int | None, stream: str, data: bytes) -> None:
        """Queue the complete lines of this chunk, tagged; keep the unfinished tail."""
        key = (host.label, stream)
        pending = self._partial.pop(key, b"")
        if pending:
            data = pending + data
        cut = data.rfind(b"\n")
        if cut < 0:
            self._partial[key] = data
            return
        if cut + 1 < len(data):
            self._partial[key] = data[cut + 1:]
        prefix = self._stamp() + self._prefix(host.label)
        lines = data[:cut]
        if self._clean.get(stream) and needs_cleaning(lines):
            lines = clean_bytes(lines)
        body = prefix + lines.replace(b"\n", b"\n" + prefix) + b"\n"
        self._put(self._err if stream == "err" else self._out, body)

    def flush(self, host: str) -> None:
        """A host is done: its unfinished last lines go out with a newline."""
        for key in [k for k in self._partial if k[0] == host]:
            tail = self._partial.pop(key)
            if self._clean.get(key[1]) and needs_cleaning(tail):
                tail = clean_bytes(tail)
            target = self._err if key[1] == "err" else self._out
            self._put(target, self._stamp() + self._prefix(host) + tail + b"\n")

    def say(self, host: str, text: str) -> None:
        """dtrain's own messages go to stderr, like pdsh's."""
        where = "" if host == "dtrain" else f"{host}: "
        # it may quote the node (its stderr's last line): inert on a pipe too
        shown = inert(text, "\n\t")
        self._put(self._err, self._stamp() + f"dtrain: {where}{shown}\n".encode())

    def _put(self, target: BinaryIO, data: bytes) -> None:
        with self._cond:
            self._queue.append((target, data))
            self._queued += len(data)
            self._cond.notify()

    async def backpressure(self) -> None:
        """Wait (in a node session, between reads) while the writer is far behind."""
        if self._queued < HIGH_WATER:
            return
        if self._room is None:
            self._loop = asyncio.get_running_loop()
            self._room = asyncio.Event()
        with self._cond:
            if self._queued < LOW_WATER:
                return
            self._room.clear()
        await self._room.wait()

    def _wake(self) -> None:
        if self._room is not None and self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._room.set)
            except RuntimeError:
                pass  # the loop is closed: nobody waits

    def _writer(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                items, self._queue = self._queue, []
                closing = self._closing
            touched: set[int] = set()
            for target, data in items:
                try:
                    target.write(data)
                    touched.add(id(target))
                except (BrokenPipeError, ValueError, OSError):
                    pass  # `| head` went away: the job goes on
            for target in (self._out, self._err):
                if id(target) in touched:
                    try:
                        target.flush()
                    except (BrokenPipeError, ValueError, OSError):
                        pass
            with self._cond:
                self._queued -= sum(len(data) for _, data in items)
                wake = self._queued < LOW_WATER
            if wake:
                self._wake()
            if closing and not items:
                return

    def close(self, timeout: float | None = None) -> None:
        """Write everything queued (every host's tail first), then stop the writer."""
        for host, _ in list(self._partial):
            self.flush(host)
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout)


def _isatty(stream: BinaryIO) -> bool:
    try:
        return stream.isatty()
    except (ValueError, OSError, AttributeError):
        return False
