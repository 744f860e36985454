"""Pure: `dtrain smoke`'s decisions: the backend, the job's sizes, and the verdict.

The smoke job (nodeside/smoke_job.py) reports per-rank facts, the exact-sum check, the
all-reduce sweep and the node-pair bandwidths as ``DTRAIN-SMOKE <json>`` lines; this module
parses them and turns them into named failures. No I/O.

A node is not believed on its word: a report counts only from the rank it is about, as the
launcher attributed the line (the rank shim's socket, on the node the plan put that rank
on): a rank's facts and sum check from that rank, the sweep from rank 0, a pair's time from
a rank on one of its two nodes; each at most once, every field of the expected type (finite
numbers, bounded strings). Anything else (a line from another rank or from no rank, a
second sweep, a malformed line) is refused and fails the smoke as a ``ranks`` failure naming
the node it came from.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from launcher.decide.fabric.linerate import LineRate, below_line
from launcher.decide.runplan.facts import NodeFacts
from launcher.errors import UsageError
from launcher.exitcodes import EXIT_FAILED, EXIT_OK
from launcher.text.words import count

MARK = "DTRAIN-SMOKE "
_MAX_TEXT = 200  # a version, device or host name: longer is no report of ours
_MAX_ROWS = 4096
_MAX_REFUSED = 20
KIB, MIB = 1024, 1024 * 1024
MIN_SIZE = KIB
NCCL_MAX_SIZE = 64 * MIB
# gloo on CPUs moves ~0.1-1 GB/s: 64 MiB x iterations would take minutes on a small cluster
GLOO_MAX_SIZE = 4 * MIB
DEFAULT_PAIR_FRACTION = 0.25
# 16 MiB one way in 30 s is ~4.5 Mbit/s: no working link of a training cluster is that slow
DEFAULT_PAIR_TIMEOUT = 30.0
# the exit code of a smoke job whose pair exchange timed out (nodeside/smoke_job.py): it
# reported the pair and ended; the verdict is the failed link, not the job's crash
PAIR_FAILED_EXIT = 3


@dataclass(frozen=True)
class SmokeConfig:
    """What the job is asked to do (sent to it as one JSON argument)."""

    backend: str
    min_size: int = MIN_SIZE
    max_size: int = GLOO_MAX_SIZE
    warmup: int = 2
    iters: int = 5
    big: int = MIB  # sizes above this run half the iterations
    pair_size: int = MIB
    pair_warmup: int = 1
    pair_iters: int = 5
    # the whole pair schedule runs this many times, each pass after the others, and a pair's
    # best time counts: a burst of load on a shared node slows one pass, a slow link all
    pair_passes: int = 3
    # --pairs: the O(log n) schedule (pair_schedule), sent to the job; False: the job's own
    pairs: bool = False
    # --pair-timeout: one exchange of a pair not done in this many seconds is a failed link
    # (the job reports it and ends: no waiting for --timeout)
    pair_timeout: float = DEFAULT_PAIR_TIMEOUT

    def to_json(self) -> dict[str, Any]:
        return {"backend": self.backend, "min_size": self.min_size, "max_size": self.max_size,
                "warmup": self.warmup, "iters": self.iters, "big": self.big,
                "pair_size": self.pair_size, "pair_warmup": self.pair_warmup,
                "pair_iters": self.pair_iters, "pair_passes": self.pair_passes,
                "pair_timeout": self.pair_timeout, **({"pairs": True} if self.pairs else {})}


def log_rounds(n: int) -> list[list[tuple[int, int]]]:
    """``smoke --pairs``: rounds of disjoint node pairs, O(log n) of them. Round b pairs
    node i with i XOR 2^b (a hypercube: 16 nodes in 4 rounds, every node meeting 4 others
    once); a node whose partner does not exist (n not a power of two) is paired with another
    left-out node it has not met. Rounds are added until every node has met min(2, n-1)
    others, so a slow node (every pair with it slow) stands apart from a slow link (one pair).
    The anchor is DLRover's network check (pairs, then the slow ones against good nodes); a
    fixed schedule needs no second launch and names the node from its own pairs."""
    if n < 2:
        return []
    met: set[tuple[int, int]] = set()
    degree = [0] * n
    rounds: list[list[tuple[int, int]]] = []

    def add(rnd: list[tuple[int, int]], i: int, j: int) -> None:
        pair = (min(i, j), max(i, j))
        rnd.append(pair)
        met.add(pair)
        degree[i] += 1
        degree[j] += 1

    def fill(rnd: list[tuple[int, int]], used: set[int], want: list[int]) -> None:
        for i in want:
            if i in used:
                continue
            for j in range(n):
                if j != i and j not in used and (min(i, j), max(i, j)) not in met:
                    add(rnd, i, j)
                    used |= {i, j}
                    break

    for b in range((n - 1).bit_length()):
        rnd: list[tuple[int, int]] = []
        used: set[int] = set()
        for i in range(n):
            j = i ^ (1 << b)
            if i < j < n:
                add(rnd, i, j)
                used |= {i, j}
        fill(rnd, used, [i for i in range(n) if i not in used])
        rounds.append(sorted(rnd))
    need = min(2, n - 1)
    while any(d < need for d in degree):
        rnd = []
        used = set()
        fill(rnd, used, [i for i in range(n) if degree[i] < need])
        if not rnd:
            break
        rounds.append(sorted(rnd))
    return rounds


def default_rounds(n: int) -> list[list[tuple[int, int]]]:
    """The job's own schedule without --pairs (nodeside/smoke_job.py schedule): every pair
    (circle method) up to 8 nodes, else the ring in two or three rounds."""
    if n < 2:
        return []
    if n <= 8:
        return [[(0, 0)]] * (n - 1 if n % 2 == 0 else n)
    return [[(0, 0)]] * (2 + n % 2)


def pair_schedule(n: int, pairs: bool) -> list[list[tuple[int, int]]]:
    return log_rounds(n) if pairs else default_rounds(n)


def parse_size(text: str, option: str = "--max-size") -> int:
    """'4M', '512K', '1G', '65536' -> bytes (binary units, as nccl-tests' -e)."""
    m = re.fullmatch(r"\s*(\d+)\s*([kKmMgG]?)(i?[bB])?\s*", text)
    if not m:
        raise UsageError(f"{option} {text!r}: expected a size like 4M, 512K or 65536")
    value = int(m.group(1)) * {"": 1, "k": KIB, "m": MIB, "g": 1024 * MIB}[m.group(2).lower()]
    if value < 4:
        raise UsageError(f"{option} {text!r}: at least 4 bytes (one float)")
    return value


def choose_backend(facts: Mapping[str, NodeFacts], forced: str | None) -> tuple[str, str]:
    """(backend, why): NCCL where every node has a GPU, gloo otherwise; --backend wins."""
    if forced:
        return forced, "--backend"
    no_gpu = [label for label, f in facts.items() if f.gpus <= 0]
    if not no_gpu:
        return "nccl", "every node has a GPU"
    return "gloo", f"no GPU on {', '.join(no_gpu)}" if len(no_gpu) < len(facts) else \
        "no GPU on any node"


def make_config(backend: str, max_size: int | None) -> SmokeConfig:
    """Sizes and iterations: 1 KiB ... 64 MiB on NCCL, ... 4 MiB on gloo, capped by
    --max-size (a --max-size below 1 KiB makes it the only size). The pair test's size is
    not capped: under ~1 MiB latency and scheduling noise, not the link, decide the time."""
    if backend == "nccl":
        cap = max_size or NCCL_MAX_SIZE
        return SmokeConfig(backend, min_size=min(MIN_SIZE, cap), max_size=cap, warmup=5,
                           iters=20, big=16 * MIB, pair_size=16 * MIB, pair_warmup=2,
                           pair_iters=5)
    cap = max_size or GLOO_MAX_SIZE
    return SmokeConfig(backend, min_size=min(MIN_SIZE, cap), max_size=cap)


# -- results ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class RankReport:
    rank: int
    host: str  # the launcher's label for the node
    node_rank: int
    hostname: str
    torch: str
    nccl: str | None
    device: str
    device_count: int
    python: str


class _Refused(ValueError):
    """A smoke report line that does not count (why, for the failure message)."""


def _int(value: Any, what: str, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise _Refused(f"{what} is not an integer >= {low}")
    return value


def _num(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(value) or value < 0:
        raise _Refused(f"{what} is not a finite number >= 0")
    return float(value)


def _text(value: Any, what: str, *, none: bool = False) -> str | None:
    if value is None and none:
        return None
    if not isinstance(value, str) or len(value) > _MAX_TEXT:
        raise _Refused(f"{what} is not a short string")
    return value


def _rows(msg: dict[str, Any]) -> list[dict[str, Any]]:
    rows = msg.get("rows")
    if not isinstance(rows, list) or len(rows) > _MAX_ROWS \
            or not all(isinstance(r, dict) for r in rows):
        raise _Refused("rows is not a list of objects")
    return rows


@dataclass
class SmokeResults:
    """What the job reported, gathered from its output lines.

    ``layout`` is the plan's rank -> node label and ``nodes`` the node labels in node-rank
    order: what a line's origin is checked against (empty: every report is refused)."""

    layout: Mapping[int, str] = field(default_factory=dict)
    nodes: Sequence[str] = ()
    ranks: dict[int, RankReport] = field(default_factory=dict)
    checks: dict[int, dict[str, int]] = field(default_factory=dict)
    sweep: list[dict[str, Any]] = field(default_factory=list)
    pairs: list[dict[str, Any]] = field(default_factory=list)
    # pairs whose exchange timed out: (a, b) node indexes -> (size, seconds), from an end
    failed_pairs: dict[tuple[int, int], tuple[int, float]] = field(default_factory=dict)
    backend: str | None = None
    refused: list[tuple[str, str]] = field(default_factory=list)  # (node, why)
    _pairs_from: set[int] = field(default_factory=set)

    def add_line(self, host: str, rank: int | None, text: str) -> bool:
        """Take one output line of ``host`` (``rank``: the rank the launcher attributed it
        to, None for node-level output); False when it is not a smoke report."""
        if not text.startswith(MARK):
            return False
        try:
            self._take(host, rank, text[len(MARK):])
        except _Refused as exc:
            if len(self.refused) < _MAX_REFUSED:
                self.refused.append((host, str(exc)))
        return True

    def _take(self, host: str, rank: int | None, body: str) -> None:
        try:
            msg = json.loads(body)
        except ValueError:
            raise _Refused("not JSON") from None
        if not isinstance(msg, dict):
            raise _Refused("not a JSON object")
        if rank is None or self.layout.get(rank) != host:
            raise _Refused("not from a rank of this node")
        kind = msg.get("kind")
        if kind in ("rank", "check"):
            if _int(msg.get("rank"), "rank") != rank:
                raise _Refused(f"rank {rank} reported for rank {msg.get('rank')!r}")
            if rank in (self.ranks if kind == "rank" else self.checks):
                raise _Refused(f"a second {kind} report from rank {rank}")
            if kind == "rank":
                self.ranks[rank] = self._rank(host, rank, msg)
            else:
                self.checks[rank] = self._check(msg)
        elif kind == "sweep":
            if rank != 0 or self.sweep:
                raise _Refused(f"a sweep from rank {rank}" if rank else "a second sweep")
            backend = _text(msg.get("backend"), "backend")
            self.sweep = [self._sweep_row(r) for r in _rows(msg)]
            self.backend = backend
        elif kind == "pair_failed":
            a, b = _int(msg.get("a"), "a"), _int(msg.get("b"), "b")
            self._ends(host, a, b)
            if len(self.failed_pairs) < _MAX_ROWS:
                self.failed_pairs.setdefault((min(a, b), max(a, b)), (
                    _int(msg.get("size"), "size"), _num(msg.get("timeout"), "timeout")))
        elif kind == "pairs":
            if rank in self._pairs_from:
                raise _Refused(f"a second pairs report from rank {rank}")
            rows = [self._pair_row(host, r) for r in _rows(msg)]
            self._pairs_from.add(rank)
            self.pairs += rows
        else:
            raise _Refused(f"unknown kind {kind!r}")

    def _rank(self, host: str, rank: int, msg: dict[str, Any]) -> RankReport:
        return RankReport(
            rank, host, _int(msg.get("node_rank"), "node_rank"),
            str(_text(msg.get("hostname"), "hostname")), str(_text(msg.get("torch"), "torch")),
            _text(msg.get("nccl"), "nccl", none=True), str(_text(msg.get("device"), "device")),
            _int(msg.get("device_count"), "device_count"),
            str(_text(msg.get("python"), "python")))

    @staticmethod
    def _check(msg: dict[str, Any]) -> dict[str, int]:
        bad = msg.get("mismatches")
        if not isinstance(bad, dict) or len(bad) > _MAX_ROWS:
            raise _Refused("mismatches is not an object")
        out = {}
        for size, n in bad.items():
            if not size.isdigit():
                raise _Refused("a mismatch size is not a number")
            out[size] = _int(n, "a mismatch count")
        return out

    @staticmethod
    def _sweep_row(row: dict[str, Any]) -> dict[str, Any]:
        return {"size": _int(row.get("size"), "size", 1), "count": _int(row.get("count"), "count"),
                "iters": _int(row.get("iters"), "iters"),
                "time_us": _num(row.get("time_us"), "time_us"),
                "algbw": _num(row.get("algbw"), "algbw"), "busbw": _num(row.get("busbw"), "busbw")}

    def _ends(self, host: str, a: int, b: int) -> None:
        """The pair (a, b) is a pair of this job's nodes, and ``host`` one of its ends."""
        ends = [self.nodes[i] for i in (a, b) if i < len(self.nodes)]
        if len(ends) != 2 or a == b:
            raise _Refused(f"pair ({a}, {b}) is not a pair of nodes of this job")
        if host not in ends:
            raise _Refused(f"a report on the pair {ends[0]} <-> {ends[1]}, which it is no "
                           "end of")

    def _pair_row(self, host: str, row: dict[str, Any]) -> dict[str, Any]:
        a, b = _int(row.get("a"), "a"), _int(row.get("b"), "b")
        self._ends(host, a, b)
        gbps = _num(row.get("gbps"), "gbps")
        if gbps <= 0:
            raise _Refused("gbps is not positive")
        return {"a": a, "b": b, "size": _int(row.get("size"), "size"),
                "time_us": _num(row.get("time_us"), "time_us"), "gbps": gbps}


@dataclass(frozen=True)
class SmokeFailure:
    """One failed check, naming the node(s) and rank(s) it is about."""

    check: str  # versions, ranks, correctness, busbw, pairs, job, preflight
    hosts: tuple[str, ...]
    message: str
    ranks: tuple[int, ...] = ()


@dataclass(frozen=True)
class PairResult:
    a: str
    b: str
    size: int
    time_us: float
    gbps: float
    slow: bool


@dataclass(frozen=True)
class SmokeVerdict:
    """Healthy or not, and why; the exit code is 0 or 1 unless the job itself failed."""

    code: int
    failures: tuple[SmokeFailure, ...]
    pairs: tuple[PairResult, ...]
    best_pair: float | None
    busbw: float | None  # at the largest size
    summary: str

    @property
    def ok(self) -> bool:
        return self.code == 0


def _odd_ones(values: Mapping[str, str | None], order: Sequence[str]
              ) -> dict[str, str | None] | None:
    """Hosts whose value differs from the majority's, in ``order``; None: no majority (a
    tie at the top: which side is odd cannot be told from the nodes' own reports, and
    picking node 0's value would let node 0's word name the other node, issue 50)."""
    counts = Counter(values.values())
    if len(counts) <= 1:
        return {}
    (majority, top), (_, second) = counts.most_common(2)
    if top == second:
        return None
    return {h: values[h] for h in [*order, *values] if h in values and values[h] != majority}


def version_failures(res: SmokeResults, order: Sequence[str]) -> list[SmokeFailure]:
    """torch, NCCL, device kind and count must agree across nodes: name the odd node (no
    node when there is no majority)."""
    out = []
    for key, what in (("torch", "torch"), ("nccl", "NCCL"), ("device", "device"),
                      ("device_count", "GPU count"), ("python", "Python")):
        per_host: dict[str, str | None] = {}
        for rep in sorted(res.ranks.values(), key=lambda r: r.rank):
            value = getattr(rep, key)
            per_host.setdefault(rep.host, None if value is None else str(value))
        odd = _odd_ones(per_host, order)
        if odd is None:
            every = [h for h in dict.fromkeys([*order, *per_host]) if h in per_host]
            out.append(SmokeFailure(
                "versions", (), f"{what} differs: "
                + ", ".join(f"{h} has {per_host[h]}" for h in every)
                + " (no majority: no node is named on another's word)"))
        elif odd:
            others = sorted({v for h, v in per_host.items() if h not in odd}, key=str)
            names = ", ".join(f"{h} has {v}" for h, v in odd.items())
            out.append(SmokeFailure(
                "versions", tuple(odd), f"{what} differs: {names} (the others: "
                f"{', '.join(str(o) for o in others)})"))
    return out


def pair_results(res: SmokeResults, node_labels: Sequence[str],
                 fraction: float) -> tuple[list[PairResult], float | None]:
    """Each measured pair, marked slow when under ``fraction`` x the best pair."""
    rows = [p for p in res.pairs if isinstance(p.get("gbps"), (int, float))]
    if not rows:
        return [], None
    best = max(float(p["gbps"]) for p in rows)

    def label(i: Any) -> str:
        i = int(i)
        return node_labels[i] if 0 <= i < len(node_labels) else f"node {i}"

    # both ends of a pair report; the slower view is the link's (a send may only have
    # reached the kernel's buffer, the receiving end waits for the data itself)
    slowest: dict[tuple[int, int], dict[str, Any]] = {}
    for p in rows:
        key = (int(p["a"]), int(p["b"]))
        if key not in slowest or float(p["gbps"]) < float(slowest[key]["gbps"]):
            slowest[key] = p
    out = [PairResult(label(p["a"]), label(p["b"]), int(p.get("size", 0)),
                      float(p.get("time_us", 0.0)), float(p["gbps"]),
                      float(p["gbps"]) < fraction * best) for p in slowest.values()]
    return out, best


def slow_failures(pairs: Sequence[PairResult], best: float | None,
                  fraction: float) -> list[SmokeFailure]:
    """A node all of whose pairs are slow is named; otherwise the slow links are."""
    slow = [p for p in pairs if p.slow]
    if not slow or best is None:
        return []
    mine: dict[str, list[PairResult]] = {}
    for p in pairs:
        mine.setdefault(p.a, []).append(p)
        mine.setdefault(p.b, []).append(p)
    nodes = [h for h, ps in mine.items() if len(mine) > 2 and all(p.slow for p in ps)]
    limit = f"< {fraction:g} x the best pair's {best:.3g} GB/s"
    if nodes:
        out = []
        for h in nodes:
            worst = max(p.gbps for p in mine[h])
            out.append(SmokeFailure("pairs", (h,), f"{h} is slow: every pair with it moves "
                                    f"at most {worst:.3g} GB/s ({limit})"))
        return out
    return [SmokeFailure("pairs", (p.a, p.b), f"link {p.a} <-> {p.b} is slow: "
                         f"{p.gbps:.3g} GB/s ({limit})") for p in slow]


def failed_pair_failures(res: SmokeResults, node_labels: Sequence[str]) -> list[SmokeFailure]:
    """Pairs whose exchange never finished: a node in two or more of them, and in no pair
    that finished, is named (its link, or the node itself); otherwise each link is."""
    if not res.failed_pairs:
        return []

    def label(i: int) -> str:
        return node_labels[i] if 0 <= i < len(node_labels) else f"node {i}"

    done = {(int(p["a"]), int(p["b"])) for p in res.pairs}
    count_of: Counter[int] = Counter()
    for a, b in res.failed_pairs:
        count_of.update((a, b))
    named = [i for i, n in count_of.items()
             if n >= 2 and not any(i in pair for pair in done)]
    out = []
    for i in sorted(named):
        others = sorted(label(b if a == i else a) for a, b in res.failed_pairs if i in (a, b))
        size, secs = next(v for k, v in res.failed_pairs.items() if i in k)
        out.append(SmokeFailure("pairs", (label(i),), f"{label(i)} is unreachable for the "
                                f"pair test: no exchange of {fmt_size(size)} with "
                                f"{', '.join(others)} within {secs:g} s (--pair-timeout)"))
    for (a, b), (size, secs) in sorted(res.failed_pairs.items()):
        if a in named or b in named:
            continue
        out.append(SmokeFailure("pairs", (label(a), label(b)), f"link {label(a)} <-> "
                                f"{label(b)} failed: no exchange of {fmt_size(size)} within "
                                f"{secs:g} s (--pair-timeout)"))
    return out


def evaluate(res: SmokeResults, *, node_labels: Sequence[str], world_size: int,
             job_code: int, job_summary: str, min_busbw: float | None = None,
             pair_fraction: float = DEFAULT_PAIR_FRACTION,
             ranks_of: Mapping[int, str] | None = None, line_rate: LineRate | None = None,
             line_fraction: float = 0.0) -> SmokeVerdict:
    """Every check over what the job reported; the code: the job's own when it failed
    (the usual codes), else 1 when a check failed, else 0."""
    failures: list[SmokeFailure] = []
    for host, why in res.refused:
        failures.append(SmokeFailure("ranks", (host,), f"{host}: a smoke report refused: {why}"))
    failures += version_failures(res, node_labels)
    ranks_of = ranks_of or {}
    for rank, bad in sorted(res.checks.items()):
        wrong = {size: n for size, n in bad.items() if n}
        if wrong:
            host = res.ranks[rank].host if rank in res.ranks else ranks_of.get(rank, "?")
            what = ", ".join(f"{n} of {int(size) // 4} elements at {fmt_size(int(size))}"
                             for size, n in wrong.items())
            failures.append(SmokeFailure("correctness", (host,), f"all-reduce sum wrong on "
                                         f"rank {rank} ({host}): {what}", (rank,)))
    pairs, best = pair_results(res, node_labels, pair_fraction)
    failures += slow_failures(pairs, best, pair_fraction)
    broken = failed_pair_failures(res, node_labels)
    failures += broken
    busbw = float(res.sweep[-1]["busbw"]) if res.sweep else None
    alone = world_size == 1  # an all-reduce over one rank moves nothing: busbw 0 means nothing
    if alone:
        busbw = None
        if min_busbw is not None:
            failures.append(SmokeFailure(
                "busbw", tuple(node_labels[:1]), f"--min-busbw {min_busbw:g}: one rank "
                "measures no bus bandwidth (an all-reduce over one rank moves no data); "
                "smoke 2 or more ranks (--nproc-per-node, more nodes)"))
    if job_code == 0:
        missing = sorted(set(range(world_size)) - set(res.ranks))
        unchecked = sorted(set(range(world_size)) - set(res.checks))
        if missing or unchecked or not res.sweep:
            gone = missing or unchecked
            hosts = tuple(dict.fromkeys(ranks_of.get(r, "?") for r in gone))
            failures.append(SmokeFailure("ranks", hosts, "the job ended without a full report"
                                         + (f" (ranks {gone})" if gone else ""), tuple(gone)))
    if min_busbw is not None and busbw is not None and busbw < min_busbw:
        size = fmt_size(int(res.sweep[-1]["size"]))
        # a node is blamed only through a slow pair (under --pair-fraction of the best):
        # when every pair is within it the whole fabric is slow, no node is (issue 24.7)
        slowest = _slowest(pairs)
        named = _slowest([p for p in pairs if p.slow])
        who = f"; slowest pair {slowest[0]} <-> {slowest[1]}" if slowest else ""
        if slowest and not named:
            who += " (within --pair-fraction of the best: the fabric as a whole is slow)"
        failures.append(SmokeFailure("busbw", named,
                                     f"all-reduce busbw {busbw:.3g} GB/s at {size} is under "
                                     f"--min-busbw {min_busbw:g}{who}"))
    if line_rate is not None and busbw is not None and len(node_labels) > 1 \
            and (text := below_line(busbw, line_rate, line_fraction)) is not None:
        named = _slowest([p for p in pairs if p.slow])
        failures.append(SmokeFailure("busbw", named, text))
    if job_code != 0 and not broken:
        code = job_code
        summary = f"the smoke job failed: {job_summary}"
    elif failures:
        code = EXIT_FAILED
        summary = "; ".join(f.message for f in failures)
    else:
        code = EXIT_OK
        bw = f"; busbw {busbw:.3g} GB/s at {fmt_size(int(res.sweep[-1]['size']))}" \
            if res.sweep and busbw is not None else ""
        if alone:
            bw = "; busbw not measured: one rank moves no data (smoke 2 or more ranks)"
        summary = (f"{count(len(node_labels), 'node')}, {count(world_size, 'rank')}, "
                   f"{res.backend or '?'}{bw}")
    return SmokeVerdict(code, tuple(failures), tuple(pairs), best, busbw, summary)


def _slowest(pairs: Sequence[PairResult]) -> tuple[str, ...]:
    if not pairs:
        return ()
    p = min(pairs, key=lambda p: p.gbps)
    return (p.a, p.b)


def fmt_size(n: int) -> str:
    """1024 -> '1K', 4194304 -> '4M' (nccl-tests style binary units)."""
    for unit, div in (("G", 1024 * MIB), ("M", MIB), ("K", KIB)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)
