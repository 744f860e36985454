"""Pure: the lemon list's records, which of them hold now, and which hosts a run skips.

A node fenced by a run (``decide.outcome.restarts``) is remembered in the per-user state directory
(``job/lemons.py`` keeps the file): which node, why, which run, when, until when, its tier
and how often it was named. Two tiers (docs/restarts.md):

* ``isolate``: evidence of the machine (lost, unreachable, failed preflight, a hardware
  Xid, the hang culprit again after a restart with its stack outside the script's code):
  ``RestartPolicy.fence_ttl`` (24 h);
* ``suspect``: a one-off (the hang culprit once, outside the script's code): forgiven after
  a cooldown that doubles with each repeat, ``SUSPECT_BASE_S`` up to ``SUSPECT_CAP_S``, as
  horovod's host blacklist cools down (without its jitter: there is one launcher).

Later runs leave a remembered node out while it is in force and they have hosts to spare
(``--nnodes`` below the host count), and use it with a warning when they need every host
they were given. ``dtrain nodes`` lists the records, ``unfence`` removes them, ``expire``
drops the old ones.

A record's time is anyone's who could write the file: one dtrain could not have written
(not finite, before 2000, more than a day ahead of this clock) is a time unknown
(``known_time``), said as such, never as an age of 300 digits.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_TTL_S = 24 * 3600.0
ISOLATE, SUSPECT = "isolate", "suspect"
TIERS = (ISOLATE, SUSPECT)
SUSPECT_BASE_S = 600.0  # a suspect's first cooldown: 10 min, then 20, 40, ...
SUSPECT_CAP_S = DEFAULT_TTL_S  # ... at most a day, as long as an isolate
MAX_LIFETIME_S = DEFAULT_TTL_S  # no fence dtrain writes lasts longer (isolate, suspect cap)
MAX_COUNT = 1_000_000
T_MIN = 946684800.0  # 2000-01-01 UTC: no fence time dtrain wrote is older
CLOCK_AHEAD_S = 86400.0  # a record written by a clock up to a day ahead of this one
UNKNOWN = "time unknown"


def cooldown(count: int, base: float = SUSPECT_BASE_S, cap: float = SUSPECT_CAP_S) -> float:
    """How long a suspect named ``count`` times is left out: base, 2 base, 4 base, ... cap."""
    return float(min(cap, base * 2 ** min(max(count, 1) - 1, 32)))


@dataclass(frozen=True)
class Lemon:
    """One remembered bad node."""

    host: str
    why: str
    run_id: str
    t: float  # when it was fenced
    until: float  # skipped until then (t + the fence's lifetime)
    tier: str = ISOLATE
    count: int = 1  # how often it was put on the list (the suspect's cooldown doubles)

    def json(self) -> dict[str, Any]:
        return {"host": self.host, "why": self.why, "run_id": self.run_id, "t": self.t,
                "until": self.until, "tier": self.tier, "count": self.count}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Lemon | None:
        """A record, or None for one that is not well formed (skipped, never fatal)."""
        try:
            host, why, run = data["host"], data.get("why", ""), data.get("run_id", "")
            t = float(data["t"])
            until = float(data.get("until", t + DEFAULT_TTL_S))
        except (KeyError, TypeError, ValueError):
            return None
        if not isinstance(host, str) or not host:
            return None
        tier = data.get("tier", ISOLATE)
        count = data.get("count", 1)
        tier = tier if tier in TIERS else ISOLATE  # an unknown tier: the stricter one
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            count = 1
        return cls(host, str(why), str(run), t, until, tier, min(count, MAX_COUNT))


def parse(data: Any) -> list[Lemon]:
    """The file's records (``{"lemons_version": 1, "lemons": [...]}``)."""
    items = data.get("lemons") if isinstance(data, dict) else None
    out = []
    for item in items if isinstance(items, list) else []:
        lemon = Lemon.from_json(item) if isinstance(item, dict) else None
        if lemon is not None:
            out.append(lemon)
    return out


def document(lemons: Iterable[Lemon]) -> dict[str, Any]:
    return {"lemons_version": 1, "lemons": [lemon.json() for lemon in lemons]}


def ends(lemon: Lemon, now: float) -> float:
    """When a record stops being in force: its ``until``, but never more than the longest
    fence dtrain writes (``MAX_LIFETIME_S``) after its time. A record whose time is unknown
    (``known_time``) holds to its ``until`` only where dtrain could have written that
    (within that lifetime, and the clock's day ahead, of now). An ``until`` of ``inf`` or
    of the year 3000, written by hand or by a broken clock, never fences a node forever."""
    if math.isnan(lemon.until):
        return -math.inf
    if known_time(lemon.t, now):
        return min(lemon.until, lemon.t + MAX_LIFETIME_S)
    return lemon.until if lemon.until <= now + MAX_LIFETIME_S + CLOCK_AHEAD_S else -math.inf


def current(lemons: Iterable[Lemon], now: float) -> dict[str, Lemon]:
    """The records in force now, the latest per host."""
    out: dict[str, Lemon] = {}
    for lemon in sorted(lemons, key=by_time):
        if ends(lemon, now) > now:
            out[lemon.host] = lemon
    return out


def add(lemons: Sequence[Lemon], new: Iterable[Lemon]) -> list[Lemon]:
    """The list with ``new`` records replacing those of the same hosts. A host's count goes
    on from its earlier record (in force or not); a suspect's ``until`` is its time plus
    the cooldown of that count; a suspect never shortens an isolate still in force."""
    before = {x.host: x for x in sorted(lemons, key=by_time)}
    fresh: list[Lemon] = []
    for n in new:
        old = before.get(n.host)
        count = min(MAX_COUNT, (old.count + 1) if old is not None else n.count)
        until = n.t + cooldown(count) if n.tier == SUSPECT else n.until
        tier = n.tier
        if old is not None and old.tier == ISOLATE and ends(old, n.t) > n.t and tier == SUSPECT:
            tier, until = ISOLATE, max(until, ends(old, n.t))
        fresh.append(Lemon(n.host, n.why, n.run_id, n.t, until, tier, count))
    hosts = {n.host for n in fresh}
    return [x for x in lemons if x.host not in hosts] + fresh


def remove(lemons: Sequence[Lemon], hosts: Iterable[str]) -> tuple[list[Lemon], list[str]]:
    """(the list without those hosts, the hosts that were on it)."""
    drop = set(hosts)
    found = sorted({x.host for x in lemons if x.host in drop})
    return [x for x in lemons if x.host not in drop], found


def expire(lemons: Sequence[Lemon], now: float, older_than: float | None = None
           ) -> tuple[list[Lemon], list[Lemon]]:
    """(kept, dropped): records whose time is over, or fenced more than ``older_than`` s
    ago."""
    kept: list[Lemon] = []
    dropped: list[Lemon] = []
    for x in lemons:
        old = ends(x, now) <= now or (older_than is not None and now - x.t >= older_than)
        (dropped if old else kept).append(x)
    return kept, dropped


@dataclass(frozen=True)
class Skip:
    """Which hosts a run uses, which it leaves out, which it uses despite the list."""

    hosts: tuple[str, ...]
    skipped: tuple[Lemon, ...]
    kept: tuple[Lemon, ...]  # on the list, used because the run needs every host


def skip(hosts: Sequence[str], lemons: Mapping[str, Lemon], need: int) -> Skip:
    """Leave remembered nodes out while at least ``need`` hosts remain (hostfile order);
    those that cannot be spared are used, and said so."""
    bad = [h for h in hosts if h in lemons]
    spare = max(0, len(hosts) - need)
    out = set(bad[:spare])
    used = tuple(h for h in hosts if h not in out)
    return Skip(used, tuple(lemons[h] for h in bad[:spare]),
                tuple(lemons[h] for h in bad[spare:]))


def known_time(t: float, now: float) -> bool:
    """A fence time dtrain could have written: finite, not negative, not before 2000 (judged
    only by a clock that is past 2000 itself: a test's ``now = 1000.0`` keeps its own small
    times), not more than a day ahead of ``now``."""
    return math.isfinite(t) and 0.0 <= t <= now + CLOCK_AHEAD_S \
        and (t >= T_MIN or now < T_MIN)


def by_time(lemon: Lemon) -> float:
    """The records' order: by time, an unknown one (NaN sorts nowhere) first."""
    return lemon.t if math.isfinite(lemon.t) else -math.inf


def since(t: float, now: float) -> str:
    """``3 h ago``, or ``time unknown`` for a time no dtrain wrote."""
    return f"{ago(now - t)} ago" if known_time(t, now) else UNKNOWN


def ago(seconds: float) -> str:
    """``3 h``, ``12 min``, ``40 s``; ``?`` for what is no duration (not finite, or more
    than a century)."""
    if not math.isfinite(seconds) or seconds > 100 * 365 * 86400:
        return "?"
    s = max(0.0, seconds)
    if s >= 7200:
        return f"{s / 3600:.0f} h"
    if s >= 120:
        return f"{s / 60:.0f} min"
    return f"{s:.0f} s"


def _by(lemon: Lemon) -> str:
    """``fenced by`` (isolate), ``a suspect (2nd time, for 20 min) since`` (suspect)."""
    if lemon.tier == SUSPECT:
        return (f"a suspect (named {lemon.count}x, left out for "
                f"{ago(lemon.until - lemon.t)}) since")
    return "fenced by"


def skip_line(lemon: Lemon, now: float) -> str:
    return (f"{lemon.host} skipped: {_by(lemon)} run {lemon.run_id} {since(lemon.t, now)} "
            f"({lemon.why}); `dtrain nodes unfence {lemon.host}` brings it back")


def kept_line(lemon: Lemon, now: float) -> str:
    was = "was fenced by" if lemon.tier == ISOLATE else f"is {_by(lemon)}"
    return (f"warning: {lemon.host} {was} run {lemon.run_id} {since(lemon.t, now)} "
            f"({lemon.why}); used anyway: this run needs every host it was given "
            f"(--nnodes with a spare host leaves it out; `dtrain nodes unfence "
            f"{lemon.host}`)")
