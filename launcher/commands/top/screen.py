"""The live full-screen view: a rich table redrawn every interval, and the keys.

Keys: ``s``/``S`` next/previous sort column, ``r`` reverse, ``/`` filter (type a host, a
glob or a folded set, Enter; Esc clears), ``f`` fold identical rows, ``g`` a row per GPU
under each node, ``j``/``k`` (or the arrows, PgDn/PgUp) scroll, ``q`` (or Ctrl-C) quits.
The terminal is put in cbreak mode and always restored, also when dtrain dies of an
exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import termios
import tty
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from launcher.commands.top.model import TopState
from launcher.commands.top.view import SORT_KEYS, Row, ViewOptions, columns, header_lines, rows

KEYS_HELP = "s/S sort  r reverse  / filter  f fold  g GPUs  j/k scroll  q quit"
LEVEL_STYLE = {"bad": "red", "warn": "yellow", "ok": ""}


class KeyState:
    """The keys' effect on the view (pure: tests feed it bytes)."""

    def __init__(self, opts: ViewOptions) -> None:
        self.opts = opts
        self.editing: str | None = None  # the filter being typed
        self.offset = 0
        self.quit = False

    def feed(self, data: bytes) -> None:
        text = data.decode(errors="ignore")
        i = 0
        while i < len(text):
            ch = text[i]
            if text.startswith("\x1b[", i) and i + 2 < len(text):  # an arrow or PgUp/PgDn
                seq = text[i:i + 4] if text[i + 2] in "56" else text[i:i + 3]
                self._scroll({"\x1b[A": -1, "\x1b[B": 1, "\x1b[5~": -10,
                              "\x1b[6~": 10}.get(seq, 0))
                i += len(seq)
                continue
            self._key(ch)
            i += 1

    def _scroll(self, n: int) -> None:
        self.offset = max(0, self.offset + n)

    def _key(self, ch: str) -> None:
        if self.editing is not None:
            if ch in "\r\n":
                self.opts = replace(self.opts, filter=self.editing.strip())
                self.editing, self.offset = None, 0
            elif ch == "\x1b":
                self.editing = None
                self.opts = replace(self.opts, filter="")
            elif ch in "\x7f\b":
                self.editing = self.editing[:-1]
            elif ch.isprintable():
                self.editing += ch
            return
        if ch in "qQ\x03":
            self.quit = True
        elif ch in "sS":
            at = SORT_KEYS.index(self.opts.sort) if self.opts.sort in SORT_KEYS else 0
            step = 1 if ch == "s" else -1
            self.opts = replace(self.opts, sort=SORT_KEYS[(at + step) % len(SORT_KEYS)])
        elif ch == "r":
            self.opts = replace(self.opts, reverse=not self.opts.reverse)
        elif ch == "f":
            self.opts = replace(self.opts, fold=not self.opts.fold)
            self.offset = 0
        elif ch == "g":
            self.opts = replace(self.opts, gpus=not self.opts.gpus)
            self.offset = 0
        elif ch == "/":
            self.editing = self.opts.filter
        elif ch == "\x1b":
            self.opts = replace(self.opts, filter="")
        elif ch == "j":
            self._scroll(1)
        elif ch == "k":
            self._scroll(-1)


RIGHT = frozenset({"cpu", "load", "gpus", "temp", "busy"})  # numbers, right-aligned


class TableText(Text):
    """The table as one Text, a line per row (``row_count``: the rows shown)."""

    row_count = 0


def table_text(cols: list[tuple[str, str, int]], titles: list[str], table_rows: list[Row],
               visible: list[Row]) -> TableText:
    """Aligned columns two spaces apart, a row's colour by its level, each line cut at the
    terminal's edge. One Text, not a rich Table: a Table measures every cell of every
    column at each refresh (~1 ms a row, ~65 ms for 64 rows); this costs ~3 ms
    (bench/bench_top.py)."""
    widths = [max([len(t)] + [len(r.cells.get(k, "")) for r in table_rows])
              for (k, _, _), t in zip(cols, titles, strict=True)]
    right = [k in RIGHT for k, _, _ in cols]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if r else c.ljust(w)
                         for c, w, r in zip(cells, widths, right, strict=True)).rstrip()

    out = TableText(no_wrap=True, overflow="ellipsis")
    out.append(line(titles), style="bold")
    for r in visible:
        out.append("\n")
        out.append(line([r.cells.get(k, "") for k, _, _ in cols]),
                   style=LEVEL_STYLE[r.level] or None)
    out.row_count = len(visible)
    return out


def renderable(doc: dict[str, Any], keys: KeyState, height: int) -> Group:
    """Header, table and footer, the table cut to the terminal's height."""
    opts = keys.opts
    table_rows = rows(doc, opts)
    head = header_lines(doc, opts, shown=sum(len(r.hosts) for r in table_rows))
    room = max(1, height - len(head) - 4)  # header lines, table header, footer
    keys.offset = min(keys.offset, max(0, len(table_rows) - room))
    visible = table_rows[keys.offset:keys.offset + room]
    cols = columns(doc)
    titles = [title + ((" v" if not opts.reverse else " ^") if key == opts.sort else "")
              for key, title, _ in cols]
    table = table_text(cols, titles, table_rows, visible)
    more = len(table_rows) - keys.offset - len(visible)
    foot = KEYS_HELP
    if keys.offset or more > 0:
        foot = f"rows {keys.offset + 1}-{keys.offset + len(visible)} of {len(table_rows)}  " + foot
    if keys.editing is not None:
        foot = f"filter: {keys.editing}_  (Enter applies, Esc clears)"
    return Group(*(Text(line, style="bold" if i == 0 else "", no_wrap=True,
                        overflow="ellipsis") for i, line in enumerate(head)),
                 table, Text(foot, style="dim", no_wrap=True, overflow="ellipsis"))


@contextlib.contextmanager
def cbreak(fd: int) -> Iterator[None]:
    """Keys arrive one by one, unechoed; the terminal is restored whatever happens."""
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


async def live(state: TopState, opts: ViewOptions, *, color: bool | None,
               refresh: float) -> int:
    """Run the full-screen view until q; returns the exit code (0)."""
    no_color = bool(os.environ.get("NO_COLOR")) if color is None else not color
    console = Console(no_color=no_color, highlight=False)
    keys = KeyState(opts)
    wake = asyncio.Event()
    loop = asyncio.get_running_loop()
    fd = sys.stdin.fileno()

    def on_key() -> None:
        with contextlib.suppress(OSError):
            data = os.read(fd, 64)
            if not data:
                keys.quit = True
            keys.feed(data)
        wake.set()

    with cbreak(fd), Live(console=console, screen=True, auto_refresh=False,
                          redirect_stdout=False, redirect_stderr=False) as screen:
        loop.add_reader(fd, on_key)
        try:
            while not keys.quit:
                screen.update(renderable(state.document(), keys, console.size.height),
                              refresh=True)
                wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(refresh):
                        await wake.wait()
        finally:
            loop.remove_reader(fd)
    return 0
