"""Pure: the goodput ledger, where a run's wall time went (docs/goodput.md).

From what the archive already holds: meta.json (the run's start and end, ``attempts[]`` with
each attempt's start, end, ``detected`` and ``relaunched`` times, ``hangs[]`` with their
declaration time) and output.jsonl's records (time, rank, attempt, line). Nothing is read
here: the caller feeds records (``Ledger.feed``) and asks for the result (``Ledger.result``).

Every second of the run's wall time [start, end] lands in exactly one cause, per attempt:

    startup             an attempt's start (or the run's launch) to its first progress line
    productive          first progress to the last step that counts
    lost                steps done again: from the last step below the step the next attempt
                        resumed at, to the attempt's last progress line
    checkpoint_save     a checkpoint line's gap to the line before it (same rank)
    checkpoint_restore  the same for a restore line (carved out of the three above)
    hang                last progress line to the hang's declaration
    detection           last progress line to the moment dtrain noticed the fault
    restart             noticing to the attempt's end (the gang stopped, the decision taken)
    backoff             the attempt's end to the relaunch (--restart-backoff)
    winddown            a last attempt's last progress line to its end (exit, teardown)

The reference rank of an attempt is the lowest rank that printed a progress line (in data
parallel training every rank steps at the same pace; rank 0 is the one that logs). A cause
that cannot be measured is ``None`` ("not measured"), never a guess: lost steps need step
numbers in the progress lines; productive time needs progress lines at all.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from launcher.decide.outcome import startup
from launcher.decide.outcome.hang import DEFAULT_PROGRESS
from launcher.decide.outcome.steprate import STEP_NUMBER

SCHEMA = 1
CAUSES = ("startup", "productive", "lost", "checkpoint_save", "checkpoint_restore", "hang",
          "detection", "restart", "backoff", "winddown")
CARVED = frozenset({"startup", "productive", "lost", "winddown"})  # checkpoint time comes out
# a save: "saved checkpoint", "saving checkpoint to ...", "checkpoint saved", "checkpoint
# step 40" (a line that starts with "checkpoint"); a restore: "loaded/restored/resumed ...
# checkpoint/step" (docs/goodput.md)
DEFAULT_CHECKPOINT = (r"(?i)(?:\b(?:sav(?:e|ed|ing)|wr(?:ite|ites|iting|itten|ote))\b.{0,80}"
                      r"\bcheckpoint)|(?:\bcheckpoint\b.{0,80}\b(?:saved|written)\b)"
                      r"|(?:^\s*checkpoint\b)")
RESTORE = re.compile(r"(?i)\b(?:load(?:ed|ing)?|restor(?:e|ed|ing)|resum(?:e|ed|ing))\b.{0,80}"
                     r"\b(?:checkpoint|step|iter(?:ation)?)\b")


@dataclass
class _Rank:
    points: list[tuple[float, int | None]] = field(default_factory=list)  # progress (t, step)
    ckpt: list[tuple[float, float, str]] = field(default_factory=list)  # (from, to, cause)
    last_t: float | None = None
    host: str | None = None


@dataclass(frozen=True)
class AttemptLedger:
    n: int
    start: float
    end: float
    seconds: dict[str, float | None]  # per cause; None: not measured
    wall: float
    goodput: float | None
    resumed_at: int | None  # the step this attempt began at (its first step number)
    highest: int | None  # the highest step it reached
    lost_steps: int | None
    # the start-up's parts, per node (decide/outcome/startup.py); None: no node instants recorded
    startup_split: dict[str, Any] | None = None


@dataclass(frozen=True)
class GoodputLedger:
    start: float
    end: float
    running: bool
    attempts: tuple[AttemptLedger, ...]
    totals: dict[str, float | None]
    wall: float
    goodput: float | None
    segments: tuple[tuple[float, float, str, int], ...]  # (from, to, cause, attempt)
    notes: tuple[str, ...]
    step_time: dict[str, dict[str, float]]  # {"ranks": {r: s}, "nodes": {host: s}}
    startup_split: dict[str, float | None] | None = None  # the run's (decide/outcome/startup.total)

    def json(self) -> dict[str, Any]:
        """meta.json's and --json's ``goodput`` (docs/goodput.md, schema version 1)."""
        return {"schema": SCHEMA, "wall_s": _r(self.wall), "goodput": _g(self.goodput),
                "running": self.running,
                "seconds": {c: _r(v) for c, v in self.totals.items()},
                "attempts": [{"n": a.n, "wall_s": _r(a.wall), "goodput": _g(a.goodput),
                              "seconds": {c: _r(v) for c, v in a.seconds.items()},
                              "resumed_at": a.resumed_at, "highest_step": a.highest,
                              "lost_steps": a.lost_steps,
                              "startup_split": _split_json(a.startup_split)}
                             for a in self.attempts],
                "not_measured": sorted({c for c, v in self.totals.items() if v is None}),
                "notes": list(self.notes),
                "step_time": self.step_time,
                "startup_split": None if self.startup_split is None
                else startup.rounded(self.startup_split),
                "segments": [[round(a, 3), round(b, 3), c, n] for a, b, c, n in self.segments]}


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def _split_json(s: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if s is None:
        return None
    return {"node": s["node"], "seconds": startup.rounded(s["seconds"]),
            "nodes": {h: startup.rounded(p) for h, p in s["nodes"].items()}}


def _g(v: float | None) -> float | None:
    return None if v is None else round(v, 4)


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def percent(goodput: float | None) -> str:
    """A goodput as ps and the report print it: ``87%``, or ``-`` when not measured."""
    return "-" if goodput is None else f"{goodput * 100:.0f}%"


class Ledger:
    """Feed output.jsonl records, then ``result(meta)``."""

    def __init__(self, progress: str | None = None, checkpoint: str | None = None) -> None:
        self.progress = re.compile(progress or DEFAULT_PROGRESS)
        self.checkpoint = re.compile(checkpoint or DEFAULT_CHECKPOINT)
        self.ranks: dict[tuple[int, int], _Rank] = {}  # (attempt, rank)
        self.hosts: dict[int, str] = {}
        self.lowest: dict[int, int] = {}  # attempt -> the lowest rank with progress so far

    def feed(self, rec: Mapping[str, Any]) -> None:
        rank, t, text = rec.get("rank"), rec.get("t"), rec.get("line")
        if type(rank) is not int or type(text) is not str or rec.get("stream") == "dtrain" \
                or not isinstance(t, int | float):
            return
        attempt = rec.get("attempt")
        n = attempt if type(attempt) is int else 1
        key = (n, rank)
        r = self.ranks.get(key)
        if r is None:
            host = rec.get("host")
            r = self.ranks[key] = _Rank(host=host if isinstance(host, str) else None)
            if isinstance(host, str):
                self.hosts.setdefault(rank, host)
        t = float(t)
        if self.progress.search(text):
            m = STEP_NUMBER.search(text)
            r.points.append((t, int(m.group(1) or m.group(2)) if m else None))
            low = self.lowest.get(n)
            if low is None or rank < low:
                self.lowest[n] = rank
        # checkpoint lines matter on the reference rank only: a rank above the lowest one
        # that printed progress cannot be it
        low = self.lowest.get(n)
        if (low is None or rank <= low) and r.last_t is not None:
            restore = RESTORE.search(text)
            if restore or self.checkpoint.search(text):
                r.ckpt.append((r.last_t, t, "checkpoint_restore" if restore
                               else "checkpoint_save"))
        r.last_t = t

    def _ref(self, n: int) -> _Rank | None:
        ranks = [rank for (a, rank), r in self.ranks.items() if a == n and r.points]
        return self.ranks[(n, min(ranks))] if ranks else None

    def result(self, meta: Mapping[str, Any], now: float | None = None) -> GoodputLedger:
        return _build(self, meta, now)


def _attempts(meta: Mapping[str, Any], now: float | None) -> list[dict[str, Any]]:
    raw = meta.get("attempts")
    out = [dict(a) for a in raw if isinstance(a, Mapping)] if isinstance(raw, list) else []
    start, end = _num(meta.get("start")), _num(meta.get("end"))
    if not out:
        return [{"n": 1, "start": start, "end": end, "detected": None, "relaunched": None}]
    last = out[-1]
    if last.get("end") is None:
        last["end"] = end if meta.get("state") == "finished" else None
    elif meta.get("state") in ("starting", "running") and _num(last.get("relaunched")):
        # attempts[] lists the running attempt only once it ended; the live one is next
        out.append({"n": len(out) + 1, "start": last["relaunched"], "end": None,
                    "detected": None, "relaunched": None})
    return out


def _build(led: Ledger, meta: Mapping[str, Any], now: float | None) -> GoodputLedger:
    attempts = _attempts(meta, now)
    hang_t: dict[int, float] = {}
    for h in meta.get("hangs") or [] if isinstance(meta.get("hangs"), list) else []:
        if isinstance(h, Mapping) and _num(h.get("t")) is not None:
            hang_t.setdefault(_n(h.get("attempt"), 1), float(h["t"]))
    run_start = _num(meta.get("start"))
    first_start = _num(attempts[0].get("start"))
    starts = [x for x in (run_start, first_start) if x is not None]
    t0 = min(starts) if starts else 0.0
    running = meta.get("state") in ("starting", "running", "restarting") or \
        _num(meta.get("end")) is None
    segs: list[tuple[float, float, str, int]] = []
    notes: list[str] = []
    per: list[AttemptLedger] = []
    lost_unmeasured = False
    any_progress = False
    records = _startup_records(meta)
    clock = now if now is not None else max([t0, *[t for r in led.ranks.values()
                                                    for t, _ in r.points[-1:]]])
    for i, a in enumerate(attempts):
        n = _n(a.get("n"), i + 1)
        s = _num(a.get("start")) if i else t0
        s = t0 if s is None else s
        e = _num(a.get("end"))
        live = e is None
        e = clock if e is None else e
        e = max(e, s)
        relaunched = _num(a.get("relaunched"))
        nxt = attempts[i + 1] if i + 1 < len(attempts) else None
        ref = led._ref(n)
        mine: list[tuple[float, float, str]] = []
        resumed = highest = lost_steps = None
        unmeasured = False
        if ref is None:
            d = _num(a.get("detected"))
            if d is not None and s <= d <= e:
                mine += [(s, d, "startup"), (d, e, "restart")]
            else:
                mine.append((s, e, "startup"))
        else:
            any_progress = True
            pts = sorted(ref.points, key=_at)
            f, last = min(max(pts[0][0], s), e), min(max(pts[-1][0], s), e)
            steps = [st for _, st in pts if st is not None]
            numbered = len(steps) == len(pts)
            resumed = steps[0] if numbered and steps else None
            highest = max(steps) if numbered and steps else None
            boundary = last
            if nxt is not None:
                nref = led._ref(_n(nxt.get("n"), i + 2))
                nsteps = [st for _, st in sorted(nref.points, key=_at)] if nref else []
                if numbered and nsteps and nsteps[0] is not None:
                    r0 = nsteps[0]
                    below = [t for t, st in pts if st is not None and st < r0]
                    boundary = min(max(below[-1] if below else f, f), last)
                    lost_steps = max(0, highest - r0 + 1) if highest is not None else 0
                elif nref is not None:
                    unmeasured = lost_unmeasured = True
            mine += [(s, f, "startup"), (f, boundary, "productive"),
                     (boundary, last, "lost")]
            ht, d = hang_t.get(n), _num(a.get("detected"))
            if live:
                mine.append((last, e, "productive"))
            elif ht is not None and last <= ht <= e:
                mine += [(last, ht, "hang"), (ht, e, "restart")]
            elif d is not None and d <= e:
                d = max(d, last)
                mine += [(last, d, "detection"), (d, e, "restart")]
            else:
                mine.append((last, e, "winddown"))
            mine = _carve(mine, ref.ckpt)
        if relaunched is not None and relaunched > e:
            mine.append((e, relaunched, "backoff"))
            end_n = relaunched
        else:
            end_n = e
        mine = [(x, y, c) for x, y, c in mine if y > x]
        segs += [(x, y, c, n) for x, y, c in mine]
        secs: dict[str, float | None] = dict.fromkeys(CAUSES, 0.0)
        for x, y, c in mine:
            secs[c] = (secs[c] or 0.0) + (y - x)
        if unmeasured:
            secs["lost"] = None
        wall = end_n - s
        prod = secs["productive"]
        good = None if ref is None or prod is None or secs["lost"] is None or wall <= 0 \
            else prod / wall
        split = startup.attempt_split(s, [(x, y) for x, y, c in mine if c == "startup"],
                                      records.get(n), ref.host if ref is not None else None)
        per.append(AttemptLedger(n, s, end_n, secs, wall, good, resumed, highest, lost_steps,
                                 split))
    end = per[-1].end if per else t0
    meta_end = _num(meta.get("end"))
    if meta_end is not None and meta_end > end and not running:
        segs.append((end, meta_end, "winddown", per[-1].n if per else 1))
        if per:
            last_a = per[-1]
            secs = dict(last_a.seconds)
            secs["winddown"] = (secs["winddown"] or 0.0) + meta_end - end
            per[-1] = AttemptLedger(last_a.n, last_a.start, meta_end, secs,
                                    meta_end - last_a.start,
                                    None if last_a.goodput is None else
                                    (secs["productive"] or 0.0) / (meta_end - last_a.start),
                                    last_a.resumed_at, last_a.highest, last_a.lost_steps,
                                    last_a.startup_split)
        end = meta_end
    totals: dict[str, float | None] = {}
    for c in CAUSES:
        vals = [a.seconds[c] for a in per]
        totals[c] = None if any(v is None for v in vals) else sum(v or 0.0 for v in vals)
    wall = end - t0
    if not any_progress:
        totals["productive"] = totals["lost"] = None
        notes.append("no progress line in the output: productive and lost time not "
                     "measured (give --progress REGEX)")
    elif lost_unmeasured:
        notes.append("the progress lines carry no step numbers: the steps redone after a "
                      "restart (lost) are not measured")
    prod = totals["productive"]
    good = None if prod is None or totals["lost"] is None or wall <= 0 else prod / wall
    split_total = startup.total([(a.startup_split, a.seconds["startup"] or 0.0) for a in per])
    return GoodputLedger(t0, end, running, tuple(per), totals, wall, good, tuple(segs),
                         tuple(notes), step_times(led), split_total)


def _carve(segs: Sequence[tuple[float, float, str]],
           ckpt: Sequence[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """Checkpoint intervals take their time out of start-up, productive and lost time."""
    if not ckpt:
        return list(segs)
    out: list[tuple[float, float, str]] = []
    for x, y, c in segs:
        if c not in CARVED or y <= x:
            out.append((x, y, c))
            continue
        cur = x
        for a, b, kind in sorted(ckpt):
            a, b = max(a, cur), min(b, y)
            if b <= a:
                continue
            out += [(cur, a, c), (a, b, kind)]
            cur = b
        out.append((cur, y, c))
    return out


def step_times(led: Ledger) -> dict[str, dict[str, float]]:
    """Seconds per step per rank (the median over its numbered progress lines, every
    attempt) and per node (its slowest rank)."""
    ranks: dict[int, list[float]] = {}
    for (_, rank), r in led.ranks.items():
        prev: tuple[float, int] | None = None
        for t, st in r.points:
            if st is None:
                continue
            if prev is not None and st > prev[1]:
                ranks.setdefault(rank, []).append((t - prev[0]) / (st - prev[1]))
            prev = (t, st)
    per_rank = {str(k): round(statistics.median(v), 4) for k, v in sorted(ranks.items()) if v}
    nodes: dict[str, float] = {}
    for k, v in per_rank.items():
        host = led.hosts.get(int(k))
        if host is not None:
            nodes[host] = max(nodes.get(host, 0.0), v)
    return {"ranks": per_rank, "nodes": nodes}


def _at(point: tuple[float, int | None]) -> float:
    """A progress point's time: points sort by time alone (a line without a step number
    may share its time with a numbered one)."""
    return point[0]


def ledger_of(meta: Mapping[str, Any], records: Sequence[Mapping[str, Any]] | Any,
              checkpoint: str | None = None, now: float | None = None) -> GoodputLedger:
    """The ledger of a run: its meta.json and an iterable of its output.jsonl records."""
    policy = meta.get("hang_policy")
    progress = policy.get("progress") if isinstance(policy, Mapping) else None
    led = Ledger(progress if isinstance(progress, str) else None,
                 checkpoint or _str(meta.get("checkpoint_pattern")))
    for rec in records:
        if isinstance(rec, Mapping):
            led.feed(rec)
    return led.result(meta, now)


def compile_checkpoint(pattern: str) -> re.Pattern[str]:
    """--checkpoint REGEX, checked before anything connects (exit 2 on a bad one)."""
    from launcher.errors import UsageError

    try:
        return re.compile(pattern)
    except re.error as exc:
        raise UsageError(f"--checkpoint {pattern!r}: {exc}",
                         hint="a Python regular expression, searched in each output line"
                         ) from None


def _startup_records(meta: Mapping[str, Any]) -> dict[int, Mapping[str, Any]]:
    """meta.json ``startup[]``: each attempt's node instants (decide/outcome/startup.py)."""
    raw = meta.get("startup")
    out: dict[int, Mapping[str, Any]] = {}
    for rec in raw if isinstance(raw, list) else []:
        if isinstance(rec, Mapping):
            out[_n(rec.get("attempt"), 1)] = rec
    return out


def _n(v: object, default: int) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else default


def _str(v: object) -> str | None:
    return v if isinstance(v, str) else None
