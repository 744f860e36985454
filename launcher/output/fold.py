"""Console-only folding of repeated stderr lines, and of torchrun's shutdown chatter.

Pure decision objects: they take OutputLines and a clock value and return the lines the
console shows. The archive never sees them (the pipeline archives every line first).

``StderrFolder`` (docs/output-and-archive.md, "Repeated stderr lines"): a stderr line
that many ranks print (a UserWarning on all 8 ranks) is shown once, with a folded tag
(``node[1-2] r0-7 [err]: text``). Each stderr line is held until every rank of its group
printed it (all ranks for a rank's line, all nodes for a torchrun agent's line) or for at
most ``window`` seconds, whichever comes first. Lines compare equal after a leading
glog/torch-logging timestamp (and thread or process id) is dropped, so the same warning
stamped 3 microseconds apart on each rank still folds; the first rank's text is shown.
stdout and dtrain's own lines are never held. A rank's stderr lines keep their order.

``ShutdownChatter``: once dtrain is stopping the job, what a torchrun agent prints on
stderr while it dies (``Received 15 death signal``, ``Sending process N closing signal
SIGTERM``, the SignalException traceback) is the console's noise: it is counted per node
and summed up in one line (``node2: torchrun shutting down (14 lines in the archive)``).
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from launcher.models import OutputLine
from launcher.text.words import count, rank_ranges

DEFAULT_WINDOW_S = 0.75
MAX_HELD = 5_000  # held groups beyond this are let go at once (a rank spamming stderr)
FOLDED = -1  # the node_rank of a folded line: its host field is the folded tag
SUMMARY = -2  # the node_rank of a line of the summary after the job: never time-stamped

# glog (`[W1130 12:01:37.099694116 socket.cpp:207]`) and torch logging
# (`W1130 12:01:37.645000 18103 site-packages/...`): severity, date, time, optional thread id
_STAMP = re.compile(r"^(\[?[IWEF])\d{4} \d\d:\d\d:\d\d\.\d+(?: +\d+)?")

Member = tuple[str, int | None]  # (host, rank)
HostFolder = Callable[[Iterable[str]], str]


def fold_key(text: str) -> str:
    """The text two ranks' lines are compared by: a leading log timestamp dropped."""
    if text[:2].lstrip("[")[:1] in ("I", "W", "E", "F"):
        return _STAMP.sub(r"\1", text, count=1)
    return text


def folded_tag(members: Sequence[Member], fold_hosts: HostFolder | None = None) -> str:
    """``node[1-2] r0-7`` for ranks, ``node[1-3]`` for torchrun agents (hosts joined with
    commas when no ``fold_hosts`` is given)."""
    hosts = list(dict.fromkeys(h for h, _ in members))
    shown = fold_hosts(hosts) if fold_hosts is not None else ",".join(hosts)
    ranks = [r for _, r in members if r is not None]
    return f"{shown} r{rank_ranges(ranks)}" if ranks else shown


@dataclass
class _Group:
    seq: int
    key: str
    first: OutputLine
    deadline: float
    size: int
    members: list[Member] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return len(self.members) >= self.size


class StderrFolder:
    """Holds stderr lines briefly to fold the same line from many ranks into one (see module).

    ``feed(lines, now)`` returns the lines to show now; ``release(now)`` those whose window
    has passed (call it at ``next_deadline``); ``flush()`` everything still held.
    """

    def __init__(self, ranks: int, nodes: int, *, window: float = DEFAULT_WINDOW_S,
                 fold_hosts: HostFolder | None = None, max_held: int = MAX_HELD) -> None:
        self.ranks = ranks
        self.nodes = nodes
        self.window = window
        self.max_held = max_held
        self._fold_hosts = fold_hosts
        self._seq = 0
        self._groups: dict[int, _Group] = {}  # held, in seq (arrival) order
        self._open: dict[tuple[bool, str], _Group] = {}  # newest group per (is_rank, key)
        self._pending: dict[Member, deque[int]] = {}  # per member: its held groups' seqs

    def held_lines(self) -> list[OutputLine]:
        """The lines held now, one per group (its first), oldest first: what a caller may
        still judge before they leave (a run's shutdown chatter, once the stop began)."""
        return [g.first for g in self._groups.values()]

    @property
    def held(self) -> int:
        """Groups held now."""
        return len(self._groups)

    @property
    def next_deadline(self) -> float | None:
        """When the oldest held group must be let go (None: nothing held)."""
        for group in self._groups.values():
            return group.deadline
        return None

    def feed(self, lines: Sequence[OutputLine], now: float) -> list[OutputLine]:
        """Lines in arrival order -> the lines to show now (stdout and dtrain's at once)."""
        out: list[OutputLine] = []
        for line in lines:
            if line.stream != "err":
                out.append(line)
            else:
                self._add(line, now, out)
        if len(self._groups) > self.max_held:
            self._release_oldest(now, out, force=len(self._groups) - self.max_held)
        return out

    def release(self, now: float) -> list[OutputLine]:
        """Lines whose window has passed (and any that only waited for them)."""
        out: list[OutputLine] = []
        self._release_oldest(now, out)
        return out

    def flush(self) -> list[OutputLine]:
        """Every held line, in order (the job's output is over)."""
        out: list[OutputLine] = []
        self._release_oldest(float("inf"), out)
        return out

    # -- internals ----------------------------------------------------------------------------
    def _add(self, line: OutputLine, now: float, out: list[OutputLine]) -> None:
        member: Member = (line.host, line.rank)
        is_rank = line.rank is not None
        key = fold_key(line.text)
        pending = self._pending.get(member)
        group = self._open.get((is_rank, key))
        if (group is not None and group.seq in self._groups and now < group.deadline
                and member not in group.members
                and (not pending or pending[-1] < group.seq)):
            group.members.append(member)
        else:
            self._seq += 1
            size = self.ranks if is_rank else self.nodes
            group = _Group(self._seq, key, line, now + self.window, max(size, 1), [member])
            self._groups[group.seq] = group
            self._open[(is_rank, key)] = group
        self._pending.setdefault(member, deque()).append(group.seq)
        if group.complete:
            self._cascade([group], now, out)

    def _releasable(self, group: _Group, now: float) -> bool:
        if group.seq not in self._groups:
            return False
        if not (group.complete or now >= group.deadline):
            return False
        return all(self._pending[m][0] == group.seq for m in group.members)

    def _cascade(self, candidates: list[_Group], now: float, out: list[OutputLine]) -> None:
        """Release the candidates that may go, then whatever only waited for them."""
        while candidates:
            group = candidates.pop(0)
            if not self._releasable(group, now):
                continue
            self._emit(group, out)
            for m in group.members:
                nxt = self._pending.get(m)
                if nxt:
                    candidates.append(self._groups[nxt[0]])

    def _release_oldest(self, now: float, out: list[OutputLine], force: int = 0) -> None:
        # The oldest held group never waits for another (its members have nothing older).
        while self._groups:
            group = next(iter(self._groups.values()))
            if force > 0:
                force -= 1
                self._emit(group, out)
                self._cascade([self._groups[p[0]] for m in group.members
                               if (p := self._pending.get(m))], now, out)
            elif now >= group.deadline:
                self._cascade([group], now, out)
            else:
                return

    def _emit(self, group: _Group, out: list[OutputLine]) -> None:
        del self._groups[group.seq]
        if self._open.get((group.first.rank is not None, group.key)) is group:
            del self._open[(group.first.rank is not None, group.key)]
        for m in group.members:
            pending = self._pending[m]
            pending.popleft()
            if not pending:
                del self._pending[m]
        if len(group.members) == 1:
            out.append(group.first)
        else:
            first = group.first
            tag = folded_tag(group.members, self._fold_hosts)
            out.append(OutputLine(tag, first.stream, first.text, None, FOLDED, first.t))


# -- torchrun's shutdown chatter ---------------------------------------------------------------

_CHATTER = re.compile(
    r"death signal|closing signal|torch\.distributed\.elastic|torch/distributed/elastic"
    r"|SignalException|ChildFailedError|^=+$|^-+$|^Root Cause|^Failures:|^\s*<NO_OTHER_FAILURES>"
    r"|^\S+ FAILED$"
    r"|^\s*\[\d+\]:$|^\s*(time|host|rank|exitcode|error_file|traceback)\s*:"
)
_TB_START = ("Traceback (most recent call last):",
             "During handling of the above exception",
             "The above exception was the direct cause")


def is_shutdown_chatter(text: str, in_traceback: bool) -> tuple[bool, bool]:
    """Is this torchrun agent stderr line (seen while dtrain stops the job) shutdown chatter?

    Returns (chatter, in_traceback after it). A traceback is chatter as a whole: its
    indented lines, and the exception line that ends it.
    """
    if text.startswith(_TB_START):
        return True, True
    if in_traceback:
        if not text or text[0].isspace():
            return True, True
        return True, False  # the exception line ends it
    return bool(_CHATTER.search(text)), False


class ShutdownChatter:
    """Per node, while dtrain stops the job: hide the torchrun agent's chatter, count it."""

    def __init__(self) -> None:
        self.stopping = False
        self.counts: dict[str, int] = {}  # host -> chatter lines kept off the console
        self._in_tb: dict[str, bool] = {}

    def keep(self, line: OutputLine) -> bool:
        """Should the console show this line? (Always, until the job is stopping.)"""
        if not self.stopping or line.rank is not None or line.stream != "err":
            return True
        chatter, in_tb = is_shutdown_chatter(line.text, self._in_tb.get(line.host, False))
        self._in_tb[line.host] = in_tb
        if chatter:
            self.counts[line.host] = self.counts.get(line.host, 0) + 1
        return not chatter

    def summary(self, order: Iterable[str] = ()) -> list[tuple[str, str]]:
        """(host, message) per node with chatter hidden, in the given order then arrival;
        counts are reset so each line is said once."""
        hosts = [h for h in order if h in self.counts]
        hosts += [h for h in self.counts if h not in hosts]
        out = [(h, f"torchrun shutting down ({count(self.counts[h], 'line')} in the archive)")
               for h in hosts]
        self.counts.clear()
        return out


# the dtrain line the console writes for a node after the job (ShutdownChatter.summary)
_CHATTER_MARK = re.compile(r"^torchrun shutting down \((\d+) lines? in the archive\)$")
# how many of a node's last agent stderr lines a marker may reach back over (`dtrain logs`)
CHATTER_LOOKBACK = 4000


def folded_chatter(lines: Iterable[OutputLine]) -> set[int]:
    """The positions (in ``lines``, an archive's output in order) of the agent's shutdown
    chatter the live console kept off the screen: `dtrain logs` folds them as it did.

    The archive does not say when the stop began; the console's marker line after the job
    (``torchrun shutting down (N lines in the archive)``, one per node) says how many lines
    it hid. They are the node's last N chatter lines before it, counted as the console
    counted them from the stop on: a tail of the node's agent stderr lines (since its
    previous marker, at most 10 N + 200 of them) in which ShutdownChatter finds exactly N.
    No such tail (an archive written otherwise): nothing is folded. One pass, memory
    bounded by CHATTER_LOOKBACK lines per node."""
    tails: dict[str, deque[tuple[int, str]]] = {}
    hidden: set[int] = set()
    for i, line in enumerate(lines):
        if line.stream == "err" and line.rank is None and line.host:
            tail = tails.get(line.host)
            if tail is None:
                tail = tails[line.host] = deque(maxlen=CHATTER_LOOKBACK)
            tail.append((i, line.text))
            continue
        m = _CHATTER_MARK.match(line.text) if line.stream == "dtrain" else None
        if m is None or not line.host:
            continue
        hidden |= _chatter_tail(list(tails.pop(line.host, ())), int(m.group(1)))
    return hidden


def _chatter_tail(tail: list[tuple[int, str]], want: int) -> set[int]:
    found: set[int] = set()
    for start in range(len(tail) - 1, max(-1, len(tail) - 1 - 10 * want - 200), -1):
        chatter, in_tb = [], False
        for i, text in tail[start:]:
            hit, in_tb = is_shutdown_chatter(text, in_tb)
            if hit:
                chatter.append(i)
        if len(chatter) == want:
            found = set(chatter)  # keep going back: the shortest tail that says N
        elif len(chatter) > want:
            break
    return found


# -- torchrun's exit barrier, after a node's ranks all finished -------------------------------

_BARRIER = "Error waiting on exit barrier"
# c10d's C++ warning on the store's connection, and the C++ frames that follow it
_CLOSED = re.compile(r"Connection was likely closed|Connection reset|Broken pipe")
_C10D = re.compile(r"^\[[IWEF]\d{4} [\d:.]+ \S+\] \[c10d\] .*(?:Connection was likely closed"
                   r"|Connection reset|Broken pipe|failed on SocketImpl)")
_CXX = ("Exception raised from ", "frame #", "<omitting python frames>")


class ExitBarrierNoise:
    """Per node, once every rank of it exited 0: torchrun's agent waits in its exit barrier
    on the rendezvous store, which lives in one agent (node_rank 0's, the store's host); when
    that agent passes the barrier and exits first, the others' last read of the store finds
    it closed, and each prints c10d's C++ warning with its frames and a logged traceback
    ("Error waiting on exit barrier"), then exits 0. Every rank had finished: on the console
    the trace is one line per node (the exception's last line, how many lines), every line
    is in the archive. Lines of a node whose ranks have not all finished are never touched.
    docs/output-and-archive.md, "torchrun's chatter"."""

    def __init__(self, ranks: dict[str, int]) -> None:
        self.ranks = dict(ranks)  # host -> its ranks, all of which must exit 0
        self.ok: dict[str, int] = {}  # host -> ranks that exited 0
        self.counts: dict[str, int] = {}  # host -> lines kept off the console
        self.last: dict[str, str] = {}  # host -> the trace's exception line
        # host -> in a trace: None (c10d's C++ frames) or the logged traceback's line prefix
        self._in: dict[str, str | None] = {}

    def rank_exit(self, host: str, code: object) -> None:
        """A rank of ``host`` exited with ``code`` (a failed one: that node is never done)."""
        if code == 0:
            self.ok[host] = self.ok.get(host, 0) + 1
        else:
            self.ok[host] = -(1 << 30)

    def done(self, host: str) -> bool:
        want = self.ranks.get(host, 0)
        return want > 0 and self.ok.get(host, 0) >= want

    def keep(self, line: OutputLine) -> bool:
        """Should the console show this line? (No for the trace of a node that is done.)"""
        host = line.host
        if line.rank is not None or line.stream != "err" or not self.done(host):
            return True
        text = line.text
        state = self._in.get(host)
        at = text.find(_BARRIER)
        if at >= 0:  # the logged error: its prefix (torch logging's stamp) starts each line
            self._in[host] = text[:at]
        elif _C10D.match(text):
            self._in[host] = None
        elif host not in self._in:
            return True
        elif state is None and (not text or text.startswith(_CXX)):
            pass
        elif state is not None and text.startswith(state):
            body = text[len(state):]
            if body and not body[0].isspace() and not body.startswith(_TB_START):
                self.last[host] = body.strip()  # the exception line (unindented)
                if not state:  # no prefix to follow: the exception line ends the trace
                    del self._in[host]
        else:
            del self._in[host]
            return True
        self.counts[host] = self.counts.get(host, 0) + 1
        return False

    def summary(self, order: Iterable[str] = ()) -> list[tuple[str, str]]:
        """(host, message) per node with a trace kept off the console; said once."""
        hosts = [h for h in order if h in self.counts]
        hosts += [h for h in self.counts if h not in hosts]
        out = []
        for h in hosts:
            why = self.last.get(h, "")
            lines = count(self.counts[h], "line")
            if _CLOSED.search(why):
                out.append((h, f"{BARRIER_MARK} (the rendezvous store's host left first: "
                               f"{why[:160]}); harmless, {lines} in the archive"))
            else:  # a timeout (a node that never came), or something else: no cause said
                why = f": {why[:160]}" if why else ""
                out.append((h, f"{BARRIER_MARK}{why} ({lines} in the archive)"))
        self.counts.clear()
        self.last.clear()
        return out


BARRIER_MARK = "torchrun's exit barrier failed after every rank here finished"
_T = TypeVar("_T")


class BarrierReplay(Generic[_T]):
    """The exit-barrier fold replayed over an archive's records in order (`dtrain logs`,
    `dtrain attach`, following a run or not). The archive has no rank exits, but it has the
    console's one line for each folded trace (``BARRIER_MARK``, archived at the job's end):
    an agent's trace is held until that line comes for its node (then dropped: the console
    never showed it), and let through as it was at any other line of that node or at the
    end. Memory: the held traces, bounded as the live fold's archive is."""

    def __init__(self) -> None:
        self.noise = ExitBarrierNoise({})
        self.held: dict[str, list[_T]] = {}

    def feed(self, item: _T, line: OutputLine) -> list[_T]:
        host = line.host
        if line.stream == "dtrain" and line.text.startswith(BARRIER_MARK):
            self.held.pop(host, None)
            return [item]
        if line.rank is None and line.stream == "err":
            self.noise.ranks[host] = self.noise.ok[host] = 1  # judged as a finished node
            if not self.noise.keep(line):
                self.held.setdefault(host, []).append(item)
                return []
        return [*self.held.pop(host, ()), item]

    def flush(self) -> list[_T]:
        out = [item for items in self.held.values() for item in items]
        self.held.clear()
        return out
