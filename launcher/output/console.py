"""The live console: one tagged text line per remote line, plus the --gather renderer.

Formats (``<host>`` is the host label, padded to the widest label on a terminal only):

    terminal (colour)          plain (pipe, NO_COLOR, color=False)
    node1 r3 │ text            node1 r3: text
    node1 r3 ! text  (stderr)  node1 r3 [err]: text
    node1    │ text  (node)    node1: text        <- exactly pdsh's "host: text" in exec mode
    node[1-2] r0-7 ! text      node[1-2] r0-7 [err]: text   (the same line on many ranks,
                                                            folded by fold.StderrFolder)
    dtrain   │ text            dtrain: text

On a terminal each host gets its own colour and a stderr line swaps the dim "│" for a red
"!". The plain format is unpadded so that ``cut -d: -f1``, ``sort`` and ``dshbak`` work on
it. With ``err_stream`` set, stderr lines and dtrain's own messages go there instead, with
no ``[err]`` mark (as pdsh does).

Colours are raw ANSI codes with a prefix cached per source: going through rich for every
line would cost more than everything else on the output path together.

With ``timestamps`` (``--timestamps``) every line, in both formats, starts with the time the
launcher received it (``OutputLine.t``), ``2026-11-30T12:34:56.789 node1 r3: text``.
"""

from __future__ import annotations

import functools
import shutil
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet, NodeSetException

from launcher.output.fold import FOLDED, SUMMARY
from launcher.output.render import should_color
from launcher.text.termsafe import clean_text, inert

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable, Sequence

    from launcher.models import OutputLine

RESET = "\x1b[0m"
CLEAR_LINE = "\r\x1b[K"
BOLD = "\x1b[1m"
DIM = "\x1b[2m"
RED = "\x1b[1;31m"
# Bright-ish colours that stay readable on both dark and light backgrounds; no red (stderr).
PALETTE = ("36", "33", "35", "32", "34", "96", "93", "95", "92", "94")
DTRAIN_TAG = "dtrain"
GATHER_RULE = "-" * 16  # what pdsh's dshbak prints, whatever the header's length


@functools.lru_cache(maxsize=8)
def _seconds(sec: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(sec))


def wall_clock(t: float) -> str:
    """``--timestamps``: ISO 8601 local time with milliseconds, ``2026-11-30T12:34:56.789``
    (the seconds part is formatted once per second: lines come in bursts)."""
    sec = int(t)
    return f"{_seconds(sec)}.{min(999, int((t - sec) * 1000)):03d}"


def _isatty(stream: object) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except (ValueError, OSError):
        return False


class Console:
    """Format OutputLines and write them in batches to a text stream."""

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        color: bool | None = None,
        err_stream: TextIO | None = None,
        ranks: Collection[int] | None = None,
        hosts: Collection[str] | None = None,
        labels: Sequence[str] = (),
        world_size: int | None = None,
        sanitize: bool | None = None,
        timestamps: bool = False,
    ) -> None:
        self.stream = sys.stdout if stream is None else stream
        self.timestamps = timestamps  # --timestamps: each line starts with wall_clock(line.t)
        self._stamp_t, self._stamp_text = -1.0, ""
        self.err_stream = err_stream
        self.color = should_color(self.stream) if color is None else color
        # remote control sequences are neutralised on a terminal (termsafe.py); --raw: False
        self.sanitize = (_isatty(self.stream) or _isatty(err_stream)) if sanitize is None \
            else sanitize
        self.ranks = frozenset(ranks) if ranks is not None else None
        self.hosts = frozenset(hosts) if hosts is not None else None
        self.broken = False  # the reader went away (EPIPE): drop further output
        # a live status line under the log (terminal only): a callable giving its text
        self.status: Callable[[], str] | None = None
        self._colors: dict[str, str] = {}
        self._prefixes: dict[tuple[str, int | None, str], str] = {}
        self._host_w = 0
        self._rank_w = len(str(world_size - 1)) if world_size else 0
        for label in labels:
            self._see(label, None)

    def wants(self, line: OutputLine) -> bool:
        """Apply the --rank/--host filters; dtrain's own messages always pass."""
        if line.stream == "dtrain":
            return True
        if self.hosts is not None and line.host not in self.hosts:
            return False
        # With a rank filter, node-level lines (the torchrun agent) belong to no asked rank.
        return self.ranks is None or line.rank in self.ranks

    def select(self, lines: Sequence[OutputLine]) -> Sequence[OutputLine]:
        """The lines the filters let through (the same list when there are no filters)."""
        if self.ranks is None and self.hosts is None:
            return lines
        return [line for line in lines if self.wants(line)]

    def format_line(self, line: OutputLine) -> str:
        """One line as the console shows it, without the newline."""
        text = line.text
        if line.stream == "dtrain" and line.host:
            text = f"{line.host}: {text}"
        prefix = self._prefix(line)
        if self.timestamps and line.node_rank != SUMMARY:  # the summary: not stamped
            prefix = self._stamp(line.t or time.time()) + prefix
        if line.stream == "dtrain":
            # dtrain's own lines (FAILED, the summary, restarts) quote nodes: inert on a
            # pipe or a file too (a CI log that renders ANSI is a terminal); docs/security.md
            text = inert(text, "\n\t")
        elif self.sanitize and not text.isprintable():
            text = clean_text(text)  # ends with a reset if it kept a colour
        elif self.color and "\x1b" in text:
            text += RESET  # the remote program's colours must not leak into our next tag
        if "\n" in text:
            text = text.replace("\n", "\n" + prefix)
        return prefix + text

    def _stamp(self, t: float) -> str:
        """The --timestamps prefix; lines of one chunk share their arrival time."""
        if t != self._stamp_t:
            stamp = wall_clock(t)
            self._stamp_t, self._stamp_text = t, (f"{DIM}{stamp}{RESET} " if self.color
                                                  else f"{stamp} ")
        return self._stamp_text

    def write(self, lines: Iterable[OutputLine]) -> None:
        """Filter, format and write lines with one write() per destination."""
        if self.broken:
            return
        out: list[str] = []
        err: list[str] = []
        split = self.err_stream is not None
        fmt = self.format_line
        if self.ranks is not None or self.hosts is not None:
            lines = [line for line in lines if self.wants(line)]
        for line in lines:
            if split and line.stream != "out":
                err.append(fmt(line))
            else:
                out.append(fmt(line))
        if self.live:
            self._write_live(out)
        else:
            self._write(self.stream, out)
        if err and self.err_stream is not None:
            self._write(self.err_stream, err)

    @property
    def live(self) -> bool:
        """A status line is kept under the log: a colour terminal, one stream, a provider."""
        return self.status is not None and self.color and self.err_stream is None

    def _write_live(self, parts: list[str]) -> None:
        """Erase the status line, write the lines, redraw it: one write, no torn lines."""
        assert self.status is not None
        width = max(20, shutil.get_terminal_size((100, 24)).columns - 1)
        status = self.status()[:width]
        text = CLEAR_LINE + "".join(p + "\n" for p in parts) + f"{DIM}{status}{RESET}"
        try:
            self.stream.write(text)
        except (BrokenPipeError, ValueError, OSError):
            self.broken = True

    def redraw_status(self) -> None:
        """Refresh the status line when no output arrives (the clock, node states)."""
        if self.live and not self.broken:
            self._write_live([])
            self.flush()

    def clear_status(self) -> None:
        """Remove the status line for good (the job is over)."""
        if self.live and not self.broken:
            try:
                self.stream.write(CLEAR_LINE)
            except (BrokenPipeError, ValueError, OSError):
                self.broken = True
        self.status = None

    def write_raw(self, texts: Sequence[str]) -> None:
        """Write ready-made lines (replay --json) with the same EPIPE handling."""
        self._write(self.stream, list(texts))

    def flush(self) -> None:
        """Flush the underlying streams (an EPIPE marks the console broken)."""
        for stream in (self.stream, self.err_stream):
            if stream is not None and not self.broken:
                try:
                    stream.flush()
                except (BrokenPipeError, ValueError, OSError):
                    self.broken = True

    def _write(self, stream: TextIO, parts: list[str]) -> None:
        if not parts or self.broken:
            return
        parts.append("")
        try:
            stream.write("\n".join(parts))
        except (BrokenPipeError, ValueError, OSError):
            # `dtrain run ... | head` closed the pipe: the job goes on, the archive keeps all.
            self.broken = True

    def _prefix(self, line: OutputLine) -> str:
        if line.node_rank == FOLDED:  # a folded tag (fold.py): no cache, no column widening
            return self._folded_prefix(line.host, line.stream)
        key = (line.host, line.rank, line.stream)
        prefix = self._prefixes.get(key)
        if prefix is None:
            self._see(line.host if line.stream != "dtrain" else "", line.rank)
            prefix = self._prefixes[key] = self._build_prefix(*key)
        return prefix

    def _see(self, host: str, rank: int | None) -> None:
        """Widen the label columns when a longer host or rank appears."""
        host_w = max(self._host_w, len(host))
        rank_w = max(self._rank_w, len(str(rank)) if rank is not None else 0)
        if (host_w, rank_w) != (self._host_w, self._rank_w):
            self._host_w, self._rank_w = host_w, rank_w
            self._prefixes.clear()
        if host and host not in self._colors:
            self._colors[host] = PALETTE[len(self._colors) % len(PALETTE)]

    def _build_prefix(self, host: str, rank: int | None, stream: str) -> str:
        if not self.color:
            return _plain_prefix(host, rank, stream, marked=self.err_stream is None)
        tag_w = self._host_w + (self._rank_w + 2 if self._rank_w else 0)
        if stream == "dtrain":
            return f"{BOLD}{DTRAIN_TAG:<{tag_w}}{RESET} {DIM}│{RESET} "
        sep = f"{RED}!{RESET}" if stream == "err" else f"{DIM}│{RESET}"
        label = f"{host:<{self._host_w}}"
        if self._rank_w:
            label += f" r{rank:<{self._rank_w}}" if rank is not None else " " * (self._rank_w + 2)
        return f"\x1b[{self._colors[host]}m{label}{RESET} {sep} "


    def _folded_prefix(self, tag: str, stream: str) -> str:
        if not self.color:
            return _plain_prefix(tag, None, stream, marked=self.err_stream is None)
        tag_w = self._host_w + (self._rank_w + 2 if self._rank_w else 0)
        sep = f"{RED}!{RESET}" if stream == "err" else f"{DIM}│{RESET}"
        return f"{BOLD}{tag:<{tag_w}}{RESET} {sep} "


def _plain_prefix(host: str, rank: int | None, stream: str, *, marked: bool) -> str:
    if stream == "dtrain":
        return f"{DTRAIN_TAG}: "
    tag = host if rank is None else f"{host} r{rank}"
    mark = " [err]" if marked and stream == "err" else ""
    return f"{tag}{mark}: "


class Gatherer:
    """--gather: keep each host's output, then print each distinct output once (dshbak -c)."""

    def __init__(self, order: Iterable[str] = ()) -> None:
        self._order = list(order)  # hostfile order: groups come in it, not in arrival order
        self._texts: dict[str, list[str]] = {}

    def add(self, lines: Iterable[OutputLine]) -> None:
        """Collect lines; dtrain's own messages are not host output and are skipped."""
        for line in lines:
            if line.stream != "dtrain":
                self._texts.setdefault(line.host, []).append(line.text)

    def groups(self) -> list[tuple[str, list[str]]]:
        """(folded host set, output lines) per distinct output, in the order of each
        output's first host in the hostfile (then of arrival, for hosts not in it)."""
        by_output: dict[tuple[str, ...], list[str]] = {}
        hosts = [h for h in dict.fromkeys(self._order) if h in self._texts]
        seen = set(hosts)
        hosts += [h for h in self._texts if h not in seen]
        for host in hosts:
            by_output.setdefault(tuple(self._texts[host]), []).append(host)
        return [(fold_hosts(hosts), list(texts)) for texts, hosts in by_output.items()]

    def render(self) -> str:
        """The dshbak -c style report: a ruled header per host set, then its lines."""
        blocks: list[str] = []
        for header, texts in self.groups():
            blocks.append("\n".join([GATHER_RULE, header, GATHER_RULE, *texts]) + "\n")
        return "".join(blocks)


def fold_hosts(hosts: Iterable[str]) -> str:
    """Fold host names the ClusterShell way (198.18.0.[11-14]); plain list if it can't."""
    names = list(hosts)
    try:
        return str(NodeSet.fromlist(names, resolver=RESOLVER_NOGROUP))
    except NodeSetException:
        return ",".join(sorted(names))
