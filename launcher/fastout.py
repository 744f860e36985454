"""`dtrain exec`'s output path: whole lines tagged `host: ` at C speed, bytes in, bytes out.

exec output is pdsh's format: no ranks, no archive, no progress-bar folding, so lines
never need to become objects. Each chunk is cut at its last newline, the complete part is
prefixed in one ``bytes.replace`` and queued; the unfinished tail waits for the next chunk
(or EOF). Bytes pass through unchanged, so invalid UTF-8 and very long lines survive.

A writer thread does the writes. A blocked stdout (`| less`, paused) therefore never
blocks the event loop, which must keep heartbeats flowing. The queue is bounded: past the
bound, lines are dropped and counted, and a marker says how many (the same policy as the
run console, see docs/output-and-archive.md).
"""

from __future__ import annotations

import os
import sys
import threading
from typing import BinaryIO

from launcher.models import Host

MAX_QUEUED = 64 * 1024 * 1024
PALETTE = ("36", "33", "35", "32", "34", "96", "93", "95", "92", "94")


class ExecOutput:
    """Tags exec output by host; the LineRouter interface the orchestrator drives."""

    def __init__(self, labels: list[str], *, color: bool | None = None,
                 out: BinaryIO | None = None, err: BinaryIO | None = None) -> None:
        self._out = out or sys.stdout.buffer
        self._err = err or sys.stderr.buffer
        if color is None:
            color = not os.environ.get("NO_COLOR") and self._out.isatty()
        self._color = color
        self._index = {label: i for i, label in enumerate(labels)}
        self._prefixes: dict[str, bytes] = {}
        self._partial: dict[tuple[str, str], bytes] = {}
        self._queue: list[tuple[BinaryIO, bytes]] = []
        self._queued = 0
        self.skipped = 0
        self._skipped_pending = 0
        self._closing = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._writer, name="dtrain-exec-out",
                                        daemon=True)
        self._thread.start()

    def _prefix(self, label: str) -> bytes:
        prefix = self._prefixes.get(label)
        if prefix is None:
            if self._color:
                colour = PALETTE[self._index.get(label, len(self._index)) % len(PALETTE)]
                prefix = f"\x1b[{colour}m{label}\x1b[0m: ".encode()
            else:
                prefix = f"{label}: ".encode()
            self._prefixes[label] = prefix
        return prefix

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
        prefix = self._prefix(host.label)
        body = prefix + data[:cut].replace(b"\n", b"\n" + prefix) + b"\n"
        self._put(self._err if stream == "err" else self._out, body)

    def flush(self, host: str) -> None:
        """A host is done: its unfinished last lines go out with a newline."""
        for key in [k for k in self._partial if k[0] == host]:
            tail = self._partial.pop(key)
            target = self._err if key[1] == "err" else self._out
            self._put(target, self._prefix(host) + tail + b"\n")

    def say(self, host: str, text: str) -> None:
        """dtrain's own messages go to stderr, like pdsh's."""
        where = "" if host == "dtrain" else f"{host}: "
        self._put(self._err, f"dtrain: {where}{text}\n".encode(), force=True)

    def _put(self, target: BinaryIO, data: bytes, *, force: bool = False) -> None:
        with self._cond:
            if not force and self._queued + len(data) > MAX_QUEUED:
                lines = data.count(b"\n")
                self.skipped += lines
                self._skipped_pending += lines
                return
            if self._skipped_pending:
                marker = (f"[dtrain: {self._skipped_pending} lines skipped on the console: "
                          "it could not keep up]\n").encode()
                self._queue.append((self._err, marker))
                self._skipped_pending = 0
            self._queue.append((target, data))
            self._queued += len(data)
            self._cond.notify()

    def _writer(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                items, self._queue = self._queue, []
                self._queued = 0
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
