"""Training curves from the ranks' output: pure, line by line (docs/report.md, "Curves").

A metric is a ``name=value`` or ``name: value`` pair on a rank's **stdout** line
(``step=120 loss=0.4312 lr=3e-4``, ``epoch: 1, loss: 0.52``). stderr is not read: warnings
and c10d's ``err=-3`` are not training metrics. The step (the x axis) is the value of a
``step``/``global_step``/``iter``/``iteration`` pair, or the number after a bare ``step``
word (``step 120 ...``); a line without one counts as the next step of its rank. After a
bare step word the default also reads ``name value`` pairs (``step 0 loss 14.8792``, what
examples/ddp_smoke.py prints and ``--progress`` recognises).
``--metric REGEX`` replaces the default pattern: a regex with a ``value`` group (and
optionally a ``name`` group), or with exactly one group, the value. Without a ``name``
group the chart is titled by the one group's own name (``(?P<loss>...)``), else by the
pattern's last literal word before its group (``loss (?P<value>...)``: ``loss``), else by
the pattern itself.

Every point is kept per rank (and attempt); ``curves()`` then averages the ranks per step
and thins each series to a fixed budget of points (the minimum and maximum of each bucket,
so a spike survives), which keeps the page small at any run length.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from launcher.errors import UsageError

DEFAULT_METRIC = (r"(?<![\w./-])(?P<name>[A-Za-z_][\w./-]*?)\s*(?:=|:\s)\s*"
                  r"(?P<value>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)(?![\w.:/-])")
STEP_NAMES = frozenset({"step", "global_step", "iter", "iteration", "it", "steps"})
_BARE_STEP = re.compile(r"(?<![\w-])(?:step|iter|iteration)\s+(\d+)\b", re.I)
# `name value` (a space between), read only after a bare step word
_SPACED = re.compile(r"(?<![\w./-])([A-Za-z_][\w./-]*)\s+"
                     r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)(?![\w.:/-])")
# names that are ids, not curves
IGNORED_NAMES = frozenset({"rank", "local_rank", "global_rank", "world_size", "world", "pid",
                           "port", "node", "node_rank", "nnodes", "gpu", "device", "seed"})
_METRIC, _STEP, _IGNORED = 0, 1, 2
MAX_METRICS = 16
MEAN_POINTS = 2000  # per series (and attempt) of the averaged curve
RANK_POINTS_TOTAL = 8000  # shared by every rank's series of one metric
RANK_POINTS_MAX = 1000  # per rank
RANK_SERIES_MAX = 64  # more ranks than this: the per-rank view draws their spread
RANK_OUTLIERS = 4  # ... and the ranks farthest from the others


@dataclass(frozen=True)
class Pattern:
    """One metric pattern: the compiled regex and the name it gives when it has no name
    group."""

    regex: re.Pattern[str]
    label: str | None  # None: the regex names each metric (its `name` group)
    default: bool = False  # the default pattern (also reads `name value` after a step)

    def pairs(self, text: str) -> list[tuple[str, str]]:
        """(name, value text) of every match."""
        rx = self.regex
        if self.label is None:
            if rx.groups == 2 and list(rx.groupindex) == ["name", "value"]:
                return rx.findall(text)  # the default: one C call per line
            return [(m.group("name") or "", m.group("value")) for m in rx.finditer(text)]
        if "value" in rx.groupindex:
            return [(self.label, m.group("value")) for m in rx.finditer(text)]
        return [(self.label, m.group(1)) for m in rx.finditer(text)]


def patterns(user: list[str] | None) -> list[Pattern]:
    """The default pattern, or the user's ``--metric`` patterns (bad one: exit 2)."""
    if not user:
        return [Pattern(re.compile(DEFAULT_METRIC), None, default=True)]
    out: list[Pattern] = []
    for text in user:
        try:
            rx = re.compile(text)
        except re.error as exc:
            raise UsageError(f"--metric {text!r}: not a regular expression: {exc}",
                             hint="e.g. --metric 'loss (?P<value>[0-9.]+)'") from None
        names = rx.groupindex
        if "value" not in names and rx.groups != 1:
            raise UsageError(f"--metric {text!r}: needs a group named `value` (or exactly one "
                             "group)", hint="e.g. --metric 'tok/s=(?P<value>[0-9.]+)'")
        label = None if "name" in names else _label(rx, text)
        if label is not None and any(p.label == label for p in out):
            label = text  # two patterns with one title: tell them apart by their regex
        out.append(Pattern(rx, label))
    return out


def _label(rx: re.Pattern[str], text: str) -> str:
    """A chart title for a pattern without a ``name`` group (see the module doc)."""
    named = [n for n in rx.groupindex if n != "value"]
    if rx.groups == 1 and named:
        return named[0]
    literal = re.sub(r"\\[A-Za-z]", " ", text)  # \s \d \b ...: not words
    before = literal.split("(", 1)[0]
    words = re.findall(r"[A-Za-z_][\w/-]*", before) or re.findall(
        r"[A-Za-z_][\w/-]*", literal.rsplit(")", 1)[-1])
    return words[-1] if words and words[-1] not in ("P", "value") else text


@dataclass
class Series:
    """One rank's points of one metric in one attempt: time, step (or None), value."""

    t: list[float] = field(default_factory=list)
    step: list[int | None] = field(default_factory=list)
    v: list[float] = field(default_factory=list)


@dataclass
class CurveBuilder:
    """Fed one stdout line at a time; keeps every point per (metric, rank, attempt)."""

    pats: list[Pattern]
    series: dict[str, dict[tuple[int, int], Series]] = field(default_factory=dict)
    stepped: set[str] = field(default_factory=set)  # metrics seen with a step number
    _count: dict[tuple[int, int], int] = field(default_factory=dict)
    _last_step: dict[tuple[int, int], int] = field(default_factory=dict)
    _kinds: dict[str, int] = field(default_factory=dict)  # name -> _METRIC/_STEP/_IGNORED
    _cells: dict[tuple[str, tuple[int, int]], Series] = field(default_factory=dict)

    def _spaced(self, rest: str, found: list[tuple[str, float]]) -> None:
        """``name value`` pairs after a bare step word (``step 0 loss 14.8792``)."""
        have = {n for n, _ in found}
        for name, raw in _SPACED.findall(rest):
            if name in have:
                continue
            kind = self._kinds.get(name)
            if kind is None:
                low = name.lower()
                kind = self._kinds[name] = (_STEP if low in STEP_NAMES else _IGNORED
                                            if low in IGNORED_NAMES else _METRIC)
            value = float(raw)
            if kind == _METRIC and math.isfinite(value):
                found.append((name, value))
                have.add(name)

    def add(self, t: float, rank: int, attempt: int, text: str) -> None:
        found: list[tuple[str, float]] = []
        step: int | None = None
        kinds = self._kinds
        for pat in self.pats:
            for name, raw in pat.pairs(text):
                kind = kinds.get(name)
                if kind is None:
                    low = name.lower()
                    kind = kinds[name] = (
                        _STEP if pat.label is None and low in STEP_NAMES else
                        _IGNORED if not name or low in IGNORED_NAMES else _METRIC)
                if kind == _IGNORED:
                    continue
                try:
                    value = float(raw)
                except (TypeError, ValueError):
                    continue
                if kind == _STEP:
                    if value.is_integer():
                        step = int(value)
                elif math.isfinite(value):
                    found.append((name, value))
            if pat.default and step is None:
                bare = _BARE_STEP.search(text)
                if bare:
                    step = int(bare.group(1))
                    self._spaced(text[bare.end():], found)
        if not found:
            return
        if step is None and not self.pats[0].default:
            bare = _BARE_STEP.search(text)
            if bare:
                step = int(bare.group(1))
        key = (rank, attempt)
        if step is None:
            step = self._last_step.get(key)  # `epoch: 1, acc: 0.9` after step 40's line
        else:
            self._last_step[key] = step
        n = self._count.get(key, 0)
        self._count[key] = n + 1
        x = step if step is not None else n
        cells = self._cells
        for name, value in found:
            s = cells.get((name, key))
            if s is None:
                s = cells[(name, key)] = self.series.setdefault(name, {})[key] = Series()
            s.t.append(t)
            s.step.append(x)
            s.v.append(value)
            if step is not None and name not in self.stepped:
                self.stepped.add(name)


@dataclass(frozen=True)
class Curve:
    """One metric as the page draws it: the mean over ranks per attempt, and per-rank series
    (both thinned). ``x_is_step``: the lines carried a step number (else the x axis counts the
    rank's lines with metrics). Times are seconds since the run's start."""

    name: str
    x_is_step: bool
    mean: dict[int, Series]  # attempt -> averaged series
    ranks: dict[tuple[int, int], Series]  # (rank, attempt) -> thinned series
    points: int  # points in the archive, all ranks
    thinned: bool
    # past RANK_SERIES_MAX ranks: per attempt the lowest and highest value over the ranks at
    # each step (thinned as the mean), and the RANK_OUTLIERS ranks whose mean is farthest
    # from the mean of all (their series thinned as one rank's alone would be)
    spread: dict[int, dict[str, Series]] = field(default_factory=dict)
    outliers: dict[tuple[int, int], Series] = field(default_factory=dict)


def curves(builder: CurveBuilder, t0: float, *, mean_points: int = MEAN_POINTS,
           rank_points_total: int = RANK_POINTS_TOTAL) -> tuple[list[Curve], list[str]]:
    """The curves worth drawing (at most MAX_METRICS, the most frequent first) and the names
    left out. A metric needs two points on some rank."""
    ranked = sorted(builder.series.items(),
                    key=lambda kv: (-sum(len(s.v) for s in kv[1].values()), kv[0]))
    ranked = [(n, r) for n, r in ranked if max(len(s.v) for s in r.values()) >= 2]
    keep, dropped = ranked[:MAX_METRICS], [n for n, _ in ranked[MAX_METRICS:]]
    out = []
    for name, by_rank in keep:
        per_rank = max(2, min(RANK_POINTS_MAX, rank_points_total // max(1, len(by_rank))))
        ranks = {key: thin(_shift(s, t0), per_rank) for key, s in sorted(by_rank.items())}
        full = _means(by_rank, t0)
        means = {a: thin(m, mean_points) for a, m in full.items()}
        total = sum(len(s.v) for s in by_rank.values())
        thinned = (sum(len(s.v) for s in ranks.values()) < total
                   or any(len(means[a].v) < len(m.v) for a, m in full.items()))
        spread: dict[int, dict[str, Series]] = {}
        outliers: dict[tuple[int, int], Series] = {}
        if len(by_rank) > RANK_SERIES_MAX:
            spread = {a: {k: thin(x, mean_points) for k, x in e.items()}
                      for a, e in _extremes(by_rank, t0).items()}
            outliers = {key: thin(_shift(by_rank[key], t0), RANK_POINTS_MAX)
                        for key in _farthest(by_rank, RANK_OUTLIERS)}
        out.append(Curve(name=name, x_is_step=name in builder.stepped, mean=means,
                         ranks=ranks, points=total, thinned=thinned, spread=spread,
                         outliers=outliers))
    return out, dropped


def _extremes(by_rank: dict[tuple[int, int], Series], t0: float
              ) -> dict[int, dict[str, Series]]:
    """Per attempt: at each step, the lowest and the highest value over the ranks (at the
    ranks' mean time of that step, as ``_means``)."""
    acc: dict[int, dict[int, list[float]]] = {}  # attempt -> step -> [t sum, n, lo, hi]
    for (_rank, attempt), s in by_rank.items():
        steps = acc.setdefault(attempt, {})
        for t, step, v in zip(s.t, s.step, s.v, strict=True):
            cell = steps.get(step if step is not None else 0)
            if cell is None:
                steps[step if step is not None else 0] = [t, 1.0, v, v]
            else:
                cell[0] += t
                cell[1] += 1
                cell[2] = min(cell[2], v)
                cell[3] = max(cell[3], v)
    out = {}
    for attempt, steps in sorted(acc.items()):
        lo, hi = Series(), Series()
        for step in sorted(steps):
            t_sum, n, low, high = steps[step]
            t = round(t_sum / n - t0, 3)
            if not math.isfinite(t):
                continue
            for series, v in ((lo, low), (hi, high)):
                series.t.append(t)
                series.step.append(step)
                series.v.append(v)
        out[attempt] = {"min": lo, "max": hi}
    return out


def _farthest(by_rank: dict[tuple[int, int], Series], n: int) -> list[tuple[int, int]]:
    """The ``n`` (rank, attempt) whose mean value is farthest from the mean over all of them
    (ties: the lower rank), in rank order."""
    means = {key: sum(v / len(s.v) for v in s.v) for key, s in by_rank.items() if s.v}
    finite = {k: m for k, m in means.items() if math.isfinite(m)}
    if not finite:
        return []
    centre = sum(m / len(finite) for m in finite.values())
    picked = sorted(finite, key=lambda k: (-abs(finite[k] - centre), k))[:n]
    return sorted(picked)


def _shift(s: Series, t0: float) -> Series:
    return Series([round(t - t0, 3) for t in s.t], list(s.step), list(s.v))


def _means(by_rank: dict[tuple[int, int], Series], t0: float) -> dict[int, Series]:
    """Per attempt: at each step, the mean value and mean time over the ranks that have it."""
    acc: dict[int, dict[int, tuple[list[float], list[float]]]] = {}
    for (_rank, attempt), s in by_rank.items():
        steps = acc.setdefault(attempt, {})
        for t, step, v in zip(s.t, s.step, s.v, strict=True):
            ts, vs = steps.setdefault(step if step is not None else 0, ([], []))
            ts.append(t)
            vs.append(v)
    out = {}
    for attempt, steps in sorted(acc.items()):
        m = Series()
        for step in sorted(steps):
            ts, vs = steps[step]
            # each term divided first: two ranks' 1.7e308 have a mean, not an overflow
            mean_t = sum(t / len(ts) for t in ts) - t0
            mean_v = sum(v / len(vs) for v in vs)
            if not (math.isfinite(mean_t) and math.isfinite(mean_v)):
                continue  # a result out of range is no point of the chart
            m.t.append(round(mean_t, 3))
            m.step.append(step)
            m.v.append(mean_v)
        out[attempt] = m
    return out


def thin(s: Series, budget: int) -> Series:
    """At most ``budget`` points: the series cut into budget/2 buckets by position, each
    kept as its lowest and highest point (in their order). Shorter series are unchanged."""
    n = len(s.v)
    if n <= budget:
        return s
    buckets = max(1, budget // 2)
    out = Series()
    for b in range(buckets):
        lo, hi = b * n // buckets, (b + 1) * n // buckets
        if lo >= hi:
            continue
        idx = range(lo, hi)
        i_min = min(idx, key=s.v.__getitem__)
        i_max = max(idx, key=s.v.__getitem__)
        for i in sorted({i_min, i_max}):
            out.t.append(s.t[i])
            out.step.append(s.step[i])
            out.v.append(s.v[i])
    return out
