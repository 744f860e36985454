"""What the report keeps of output.jsonl, one record at a time (pure, bounded memory).

A 64-rank hour is hundreds of thousands of lines; the report needs only, per rank, its first
and last line and its stderr tail, per node its last lines, dtrain's own messages, and the
metric points (curves.py). Records are tolerated as they come: a field of the wrong type
is ignored, ``attempt`` absent means 1 (the restart contract), a record that is not an
object is counted and skipped.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from launcher.output.fold import is_shutdown_chatter
from launcher.output.runreport.curves import CurveBuilder, Pattern

STDERR_TAIL = 40  # lines of the failing rank's stderr kept
NODE_TAIL = 40  # last lines kept per node (every stream)
DTRAIN_NOTES = 400  # dtrain's own messages kept (the first ones: the run's story)
TEXT_CAP = 2000  # characters of one line shown
# dtrain's own note when it starts stopping the job (job/orchestrate.py)
_STOPPING = re.compile(r"(?:stopping|killing) every node")


class Line(NamedTuple):
    """One archived line as the report keeps it (a tuple: hundreds of thousands are made)."""

    t: float
    host: str
    rank: int | None
    stream: str  # out, err, dtrain
    text: str
    attempt: int


@dataclass
class RankSeen:
    first_t: float
    last_t: float
    lines: int = 0
    attempts: set[int] = field(default_factory=set)
    host: str = ""
    node_rank: int | None = None


@dataclass
class Digest:
    pats: list[Pattern]
    stderr_tail: int = STDERR_TAIL
    node_tail: int = NODE_TAIL
    ranks: dict[int, RankSeen] = field(default_factory=dict)
    err_tails: dict[int, deque[Line]] = field(default_factory=dict)
    node_tails: dict[str, deque[Line]] = field(default_factory=dict)
    node_lines: dict[str, int] = field(default_factory=dict)
    notes: list[Line] = field(default_factory=list)
    attempt_span: dict[int, list[float]] = field(default_factory=dict)
    host_ranks: dict[tuple[str, int], list[float]] = field(default_factory=dict)  # first,
    # last time and lines of each rank on each host (a restart may move a rank)
    first_t: float | None = None
    last_t: float | None = None
    lines: int = 0
    bad: int = 0
    chatter: dict[str, int] = field(default_factory=dict)  # host -> shutdown lines folded
    stopping: int | None = None  # the attempt dtrain was stopping (its note said so)
    _in_tb: dict[str, bool] = field(default_factory=dict)
    curves: CurveBuilder = field(init=False)

    def __post_init__(self) -> None:
        self.curves = CurveBuilder(self.pats)

    def add(self, rec: object) -> None:
        if not isinstance(rec, Mapping):
            self.bad += 1
            return
        line = _line(rec)
        if line is None:
            self.bad += 1
            return
        self.lines += 1
        t = line.t
        self.first_t = t if self.first_t is None else min(self.first_t, t)
        self.last_t = t if self.last_t is None else max(self.last_t, t)
        span = self.attempt_span.setdefault(line.attempt, [t, t])
        span[0], span[1] = min(span[0], t), max(span[1], t)
        if line.stream == "dtrain":
            if len(self.notes) < DTRAIN_NOTES:
                self.notes.append(line)
            if _STOPPING.search(line.text):
                self.stopping = line.attempt
            return
        if line.rank is None and line.stream == "err" and line.host \
                and self.stopping == line.attempt:
            # torchrun's shutdown chatter, folded in the node's tail as on the console
            chatter, self._in_tb[line.host] = is_shutdown_chatter(
                line.text, self._in_tb.get(line.host, False))
            if chatter:
                self.chatter[line.host] = self.chatter.get(line.host, 0) + 1
                self.node_lines[line.host] = self.node_lines.get(line.host, 0) + 1
                return
        if line.host:
            tail = self.node_tails.get(line.host)
            if tail is None:
                tail = self.node_tails[line.host] = deque(maxlen=self.node_tail)
            tail.append(line)
            self.node_lines[line.host] = self.node_lines.get(line.host, 0) + 1
        if line.rank is None:
            return
        seen = self.ranks.get(line.rank)
        if seen is None:
            node_rank = rec.get("node_rank")
            seen = self.ranks[line.rank] = RankSeen(
                t, t, host=line.host,
                node_rank=node_rank if isinstance(node_rank, int) else None)
        seen.first_t, seen.last_t = min(seen.first_t, t), max(seen.last_t, t)
        seen.lines += 1
        seen.attempts.add(line.attempt)
        hr = self.host_ranks.get((line.host, line.rank))
        if hr is None:
            self.host_ranks[(line.host, line.rank)] = [t, t, 1]
        else:
            hr[0], hr[1], hr[2] = min(hr[0], t), max(hr[1], t), hr[2] + 1
        if line.stream == "err":
            err = self.err_tails.get(line.rank)
            if err is None:
                err = self.err_tails[line.rank] = deque(maxlen=self.stderr_tail)
            err.append(line)
        elif line.stream == "out":
            self.curves.add(t, line.rank, line.attempt, line.text)


def _line(rec: Mapping[str, Any]) -> Line | None:
    t, text = rec.get("t"), rec.get("line")
    if isinstance(t, bool) or not isinstance(t, int | float) or not isinstance(text, str):
        return None
    host = rec.get("host")
    rank = rec.get("rank")
    stream = rec.get("stream")
    attempt = rec.get("attempt")
    return Line(
        t=float(t), host=host if isinstance(host, str) else "",
        rank=rank if isinstance(rank, int) and not isinstance(rank, bool) else None,
        stream=stream if isinstance(stream, str) else "out",
        text=text if len(text) <= TEXT_CAP else text[:TEXT_CAP] + " [dtrain report: cut]",
        attempt=attempt if isinstance(attempt, int) and attempt >= 1 else 1)
