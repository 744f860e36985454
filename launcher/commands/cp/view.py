"""What `dtrain cp` prints: a live progress line on a terminal, one summary line per node.

Summary lines go to stdout, one per node as it finishes (format documented in docs/cp.md,
``cp-summary 1``)::

    node1: sent 12 (3.4 MiB), skipped 100, deleted 2
    node2: sent 0 (0 B), skipped 112, deleted 0, 3 stale temps removed, 1 error

File errors go to stderr as ``dtrain: node2: PATH: reason``; an unreachable node as
dtrain's error line. On a terminal (stderr), a status line is redrawn at most 5 times a
second: nodes done, bytes sent, rate.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from launcher.models import CopyResult
from launcher.output import render
from launcher.output.termsafe import inert

REDRAW_S = 0.2


def human(n: float) -> str:
    """Bytes as B / KiB / MiB / GiB with one decimal."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def summary_line(r: CopyResult) -> str:
    """One node's summary (stable format: docs/cp.md)."""
    if r.unreachable is not None:
        return f"{r.label}: not reached: {r.unreachable}"
    text = (f"{r.label}: sent {r.sent} ({human(r.sent_bytes)}), skipped {r.skipped}, "
            f"deleted {r.deleted}")
    if r.stale:
        text += f", {render.count(r.stale, 'stale temp')} removed"
    if r.errors:
        text += f", {render.count(len(r.errors), 'error')}"
    return text


class CopyView:
    """Progress and per-node results of one `dtrain cp`."""

    def __init__(self, n_nodes: int, *, live: bool | None = None, out: TextIO | None = None,
                 err: TextIO | None = None, verb: str = "sent") -> None:
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.live = bool(getattr(self.err, "isatty", lambda: False)()) if live is None else live
        self.n_nodes = n_nodes
        self.done = 0
        self.bytes = 0
        self.verb = verb
        self._t0 = time.monotonic()
        self._drawn = 0.0
        self._line = False

    def add_bytes(self, n: int) -> None:
        """Bytes moved (any node); redraws the live line at most every REDRAW_S."""
        self.bytes += n
        if self.live:
            now = time.monotonic()
            if now - self._drawn >= REDRAW_S:
                self._drawn = now
                self._draw()

    def _draw(self) -> None:
        elapsed = max(time.monotonic() - self._t0, 1e-6)
        self.err.write(f"\r\x1b[Kdtrain cp: {self.done}/{self.n_nodes} nodes done, "
                       f"{human(self.bytes)} {self.verb}, {human(self.bytes / elapsed)}/s")
        self.err.flush()
        self._line = True

    def _clear(self) -> None:
        if self._line:
            self.err.write("\r\x1b[K")
            self.err.flush()
            self._line = False

    def node_done(self, r: CopyResult) -> None:
        """A node finished: its errors (stderr) and its summary line (stdout)."""
        self.done += 1
        self._clear()
        for e in r.errors:
            render.note(f"{r.label}: {e}", self.err)
        self.out.write(inert(summary_line(r)) + "\n")  # an unreachable node's reason: text
        self.out.flush()
        if self.live:
            self._draw()

    def close(self) -> None:
        """Remove the live line."""
        self._clear()
