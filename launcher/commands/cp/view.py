"""What `dtrain cp` prints: a live progress line on a terminal, one summary line per node,
then the total.

Summary lines go to stdout, one per node as it finishes (format documented in docs/cp.md,
``cp-summary 1``; ``received`` for --pull)::

    node1: sent 12 (3.4 MiB), skipped 100, deleted 2
    node2: sent 0 (0 B), skipped 112, deleted 0, 3 stale temps removed, 1 error
    total 2 nodes: sent 12 (3.4 MiB), skipped 212, deleted 2 in 1.2 s, 2.8 MiB/s

From FOLD_AT nodes on, the per-node lines wait for the end and identical ones are folded
(``node[1-64]: sent 12 (3.4 MiB), ...``), the failed nodes first.

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
from launcher.output.hostgroups import FOLD_AT, folded
from launcher.text.termsafe import inert
from launcher.text.words import count

REDRAW_S = 0.2


def human(n: float) -> str:
    """Bytes as B / KiB / MiB / GiB with one decimal."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def summary_line(r: CopyResult, verb: str = "sent") -> str:
    """One node's summary (stable format: docs/cp.md)."""
    return f"{r.label}: {_counts(r, verb)}"


def _counts(r: CopyResult, verb: str) -> str:
    if r.unreachable is not None:
        return f"not reached: {r.unreachable}"
    text = f"{verb} {r.sent} ({human(r.sent_bytes)}), skipped {r.skipped}, deleted {r.deleted}"
    if r.stale:
        text += f", {count(r.stale, 'stale temp')} removed"
    if r.errors:
        text += f", {count(len(r.errors), 'error')}"
    return text


def total_line(results: list[CopyResult], seconds: float, verb: str = "sent") -> str:
    """``total 3 nodes: sent 6 (36 B), skipped 0, deleted 0 in 0.4 s, 88 B/s``: the sum
    over the nodes reached, the wall time of the whole copy and its throughput."""
    reached = [r for r in results if r.unreachable is None]
    files = sum(r.sent for r in reached)
    size = sum(r.sent_bytes for r in reached)
    text = (f"total {count(len(results), 'node')}: {verb} {files} ({human(size)}), "
            f"skipped {sum(r.skipped for r in reached)}, "
            f"deleted {sum(r.deleted for r in reached)} in {seconds:.1f} s, "
            f"{human(size / max(seconds, 1e-3))}/s")
    bad = [r for r in results if r.unreachable is not None or r.errors]
    if bad:
        text += f"; {count(len(bad), 'node')} failed"
    return text


class CopyView:
    """Progress and per-node results of one `dtrain cp`."""

    def __init__(self, n_nodes: int, *, live: bool | None = None, out: TextIO | None = None,
                 err: TextIO | None = None, verb: str = "sent",
                 order: list[str] | None = None) -> None:
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.live = bool(getattr(self.err, "isatty", lambda: False)()) if live is None else live
        self.n_nodes = n_nodes
        self.done = 0
        self.bytes = 0
        self.verb = verb
        self.fold = n_nodes >= FOLD_AT
        self.results: list[CopyResult] = []
        self._order = {label: i for i, label in enumerate(order or [])}
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
        """A node finished: its errors (stderr) and, below FOLD_AT nodes, its summary line
        (stdout)."""
        self.done += 1
        self.results.append(r)
        self._clear()
        for e in r.errors:
            render.note(f"{r.label}: {e}", self.err)
        if not self.fold:
            # an unreachable node's reason: text
            self.out.write(inert(summary_line(r, self.verb)) + "\n")
            self.out.flush()
        if self.live:
            self._draw()

    def close(self) -> None:
        """Remove the live line; the folded per-node lines (from FOLD_AT nodes on), then
        the total."""
        self._clear()
        if not self.results:
            return
        if self.fold:
            ordered = sorted(self.results, key=lambda r: self._order.get(r.label, 1 << 30))
            rows = [(r.label, (_counts(r, self.verb), r.unreachable is not None
                               or bool(r.errors))) for r in ordered]
            for hosts, (text, _) in folded(rows, lambda key: key[1]):
                self.out.write(inert(f"{hosts}: {text}") + "\n")
        self.out.write(total_line(self.results, time.monotonic() - self._t0, self.verb)
                       + "\n")
        self.out.flush()
