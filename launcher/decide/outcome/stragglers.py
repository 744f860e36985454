"""Which rank (and node) is the straggler: pure, from per-rank CPU seconds over time.

In synchronous training every rank steps at the slowest rank's pace, so step rates are all
the same and say nothing. What differs is where the time goes: the slow rank computes while
the others wait in the collective. A rank that waits does not burn CPU (gloo blocks on a
socket and a condition variable; a CPU-bound rank's wait is its peers' idle time), so the
rank that is *rarely waiting* is the one whose CPU time grows fastest.

Evidence: ``busy`` = CPU seconds per second of a rank's processes (the node sampler's
per-rank ``cpu``), over the last ``window`` seconds. A rank is suspect while

    busy >= ratio * median(busy of the ranks on *other* nodes)   and
    busy - that median >= min_gap

(the ranks of the rank's own node are left out of the comparison: on a slow node they are
all slow). It is flagged once it has been suspect without a break for ``hold`` seconds; a
node is flagged with the ranks that were suspect. A flagged node is never flagged again in
the same attempt (one console line, not a flood); ``cleared`` records when the evidence
stopped holding for ``hold`` seconds. See docs/top.md for the defaults and what the signal
cannot see (NCCL's spin-waits on GPUs).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from statistics import median


@dataclass(frozen=True)
class StragglerSettings:
    """The detector's knobs (``--straggler-window``, ``--straggler-hold``,
    ``--straggler-ratio``); seconds, a ratio, CPU seconds per second."""

    window: float = 30.0
    hold: float = 30.0
    ratio: float = 2.0
    min_gap: float = 0.05


@dataclass(frozen=True)
class Straggler:
    """A flagged node: its suspect ranks, how busy they were and against what."""

    host: str
    ranks: tuple[int, ...]
    busy: float  # the suspect ranks' busy (the largest), CPU s per s
    others: float  # the median busy of the other nodes' ranks
    since: float  # when the evidence began to hold (wall clock)
    flagged: float  # when it had held for ``hold`` s
    window: float
    hold: float
    ratio: float
    attempt: int | None = None
    cleared: float | None = None

    def as_json(self) -> dict[str, object]:
        """The meta.json / dtrain.top/1 form (docs/output-and-archive.md)."""
        return {"host": self.host, "ranks": list(self.ranks), "busy": round(self.busy, 3),
                "others": round(self.others, 3), "since": round(self.since, 3),
                "flagged": round(self.flagged, 3), "window": self.window, "hold": self.hold,
                "ratio": self.ratio, "attempt": self.attempt,
                "cleared": round(self.cleared, 3) if self.cleared is not None else None,
                "signal": "cpu", "summary": self.line()}

    def line(self) -> str:
        """The one console line."""
        ranks = ",".join(str(r) for r in self.ranks)
        held = self.flagged - self.since
        return (f"straggler: {self.host} (rank{'s' if len(self.ranks) > 1 else ''} {ranks}) "
                f"is rarely waiting: busy {self.busy:.2f} CPU-s/s against {self.others:.2f} "
                f"on the other nodes (x{self.busy / max(self.others, 1e-3):.1f}) for "
                f"{held:.0f} s; every rank steps at its pace")


@dataclass
class _Series:
    host: str
    points: deque[tuple[float, float]] = field(default_factory=deque)  # (node t, cpu s)


class StragglerDetector:
    """Feed it samples (``add``), ask it who is flagged (``evaluate``)."""

    def __init__(self, settings: StragglerSettings | None = None,
                 attempt: int | None = None) -> None:
        self.settings = settings or StragglerSettings()
        self.attempt = attempt
        self.series: dict[int, _Series] = {}
        self.suspect_since: dict[int, float] = {}
        self.clear_since: dict[str, float] = {}
        self.flagged: dict[str, Straggler] = {}
        self.history: list[Straggler] = []  # every flag, in order (cleared ones too)

    def reset(self, attempt: int | None = None) -> None:
        """A new attempt (the ranks restarted): forget the series and the flags."""
        self.series.clear()
        self.suspect_since.clear()
        self.clear_since.clear()
        self.flagged.clear()
        self.attempt = attempt

    def add(self, host: str, t: float, ranks: Mapping[int, float]) -> None:
        """One node's sample: cumulative CPU seconds per rank at the node's time ``t``."""
        keep = self.settings.window * 2 + 1.0
        for rank, cpu in ranks.items():
            s = self.series.get(rank)
            if s is None or s.host != host:
                s = self.series[rank] = _Series(host)
            if s.points and (t <= s.points[-1][0] or cpu < s.points[-1][1]):
                if t <= s.points[-1][0]:
                    continue  # a repeated or out-of-order sample
                s.points.clear()  # the rank restarted: its counter began again
            s.points.append((t, cpu))
            while len(s.points) > 2 and t - s.points[1][0] >= keep:
                s.points.popleft()

    def busy(self) -> dict[int, float]:
        """Each rank's CPU seconds per second over the window (ranks with enough data)."""
        out = {}
        window = self.settings.window
        for rank, s in self.series.items():
            if len(s.points) < 2:
                continue
            t1, c1 = s.points[-1]
            start = s.points[0]
            for p in s.points:  # the newest point at least `window` old, else the oldest
                if t1 - p[0] >= window:
                    start = p
            t0, c0 = start
            if t1 - t0 >= window * 0.5:
                out[rank] = max(0.0, (c1 - c0) / (t1 - t0))
        return out

    def suspects(self) -> dict[int, tuple[float, float]]:
        """Ranks meeting the condition now: rank -> (busy, the other nodes' median)."""
        busy = self.busy()
        out = {}
        for rank, b in busy.items():
            host = self.series[rank].host
            others = [v for r, v in busy.items() if self.series[r].host != host]
            if not others:
                others = [v for r, v in busy.items() if r != rank]
            if not others:
                continue
            m = median(others)
            if b >= self.settings.ratio * m and b - m >= self.settings.min_gap:
                out[rank] = (b, m)
        return out

    def evaluate(self, now: float) -> list[Straggler]:
        """Update the evidence at wall time ``now``; the nodes newly flagged."""
        hold = self.settings.hold
        suspects = self.suspects()
        for rank in list(self.suspect_since):
            if rank not in suspects:
                del self.suspect_since[rank]
        for rank in suspects:
            self.suspect_since.setdefault(rank, now)
        new: list[Straggler] = []
        by_host: dict[str, list[int]] = {}
        for rank, since in self.suspect_since.items():
            if now - since >= hold:
                by_host.setdefault(self.series[rank].host, []).append(rank)
        for host, ranks in by_host.items():
            if host in self.flagged:
                continue
            ranks.sort()
            flag = Straggler(host, tuple(ranks), max(suspects[r][0] for r in ranks),
                             suspects[ranks[0]][1], min(self.suspect_since[r] for r in ranks),
                             now, self.settings.window, hold, self.settings.ratio,
                             self.attempt)
            self.flagged[host] = flag
            self.history.append(flag)
            new.append(flag)
        self._clear(now, {self.series[r].host for r in suspects})
        return new

    def _clear(self, now: float, suspect_hosts: Iterable[str]) -> None:
        hosts = set(suspect_hosts)
        for host, flag in self.flagged.items():
            if flag.cleared is not None:
                continue
            if host in hosts:
                self.clear_since.pop(host, None)
                continue
            since = self.clear_since.setdefault(host, now)
            if now - since >= self.settings.hold:
                cleared = replace(flag, cleared=since)
                self.flagged[host] = cleared
                self.history = [cleared if f is flag else f for f in self.history]

    def as_json(self) -> list[dict[str, object]]:
        """Every flag so far (meta.json ``stragglers``)."""
        return [f.as_json() for f in self.history]
