"""What a node sends, checked against the plan before anything believes it (docs/security.md).

A node's supervisor and sampler are programs on a machine someone else may control: their
messages are claims. Every control message and every sample is checked with these readers
once, where job/events.py decodes it (each event's own ``decode``: its checks, then its
fields), so every consumer (the hang watch, the verdict, the failure reasons, the stragglers,
samples.jsonl) gets checked data:

* JSON is decoded without NaN/Infinity (``NaN``, ``1e999``: null) and without a nesting
  deeper than Python's recursion allows (that message is refused, never a RecursionError);
* a rank is accepted from a host only when the plan put it there, and only once: a rank key
  is an int or the canonical decimal text of one (``"3"``; not ``"03"``, ``"+3"``, ``"²"``),
  and per-rank maps (``stacks``, ``flight``, ``exit``, a sample's ``ranks``) keep only the
  host's own ranks; a ``rank_start``/``rank_raised``/``rank_exit`` of another host's rank is
  dropped;
* a time ``t`` is a finite number or is left out.
"""

from __future__ import annotations

import json
import math
from collections.abc import Container, Mapping, Sequence
from typing import Any


class BadMessage(ValueError):
    """Not a message any dtrain node program sends (that node's error)."""


def _no_constant(name: str) -> None:
    return None  # NaN, Infinity, -Infinity: null


def _finite_float(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None  # 1e999 parses as inf


def loads(data: bytes | str) -> Any:
    """JSON as a node may send it: non-finite numbers become None; nesting too deep to
    decode is BadMessage (never a RecursionError); anything else undecodable: ValueError."""
    try:
        return json.loads(data, parse_constant=_no_constant, parse_float=_finite_float)
    except RecursionError:
        raise BadMessage("a JSON message nested too deeply") from None


def finite(value: object, low: float = -math.inf, high: float = math.inf) -> float | None:
    """A real number (not bool) within [low, high], else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int past float's range
        return None
    return number if math.isfinite(number) and low <= number <= high else None


def rank_of(key: object) -> int | None:
    """A rank as a node may name it: a non-negative int, or its canonical decimal text."""
    if isinstance(key, bool):
        return None
    if isinstance(key, int):
        return key if key >= 0 else None
    if isinstance(key, str) and 0 < len(key) <= 9 and key.isascii() and key.isdigit() \
            and (key == "0" or not key.startswith("0")):
        return int(key)
    return None


def owned(key: object, ranks: Container[int] | None) -> int | None:
    """The rank ``key`` names if the host may speak for it (``ranks``: the plan's ranks of
    that host; None: any rank)."""
    rank = rank_of(key)
    if rank is None or (ranks is not None and rank not in ranks):
        return None
    return rank


def rank_map(value: object, ranks: Container[int] | None, kind: type | tuple[type, ...]
             = dict) -> dict[str, Any]:
    """A per-rank map keeping the host's own ranks, each once, whose value is a ``kind``."""
    if not isinstance(value, Mapping):
        return {}
    out: dict[str, Any] = {}
    for key, entry in value.items():
        rank = owned(key, ranks)
        if rank is not None and isinstance(entry, kind) and str(rank) not in out:
            out[str(rank)] = entry
    return out


class ClaimedRanks:
    """``--rdzv c10d``: torchrun's rendezvous, not the plan, numbers the ranks. A host may
    then speak for as many ranks as it runs, each rank in [0, world) for one host only: the
    first host to name it (``owners`` is shared by every host of the job)."""

    def __init__(self, host: str, count: int, world: int, owners: dict[int, str],
                 counts: dict[str, int]) -> None:
        self.host, self.count, self.world = host, count, world
        self.owners, self.counts = owners, counts

    def __contains__(self, rank: object) -> bool:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world:
            return False
        owner = self.owners.get(rank)
        if owner is None and self.counts.get(self.host, 0) < self.count:
            self.owners[rank] = owner = self.host
            self.counts[self.host] = self.counts.get(self.host, 0) + 1
        return owner == self.host


def rank_owners(layout: Mapping[str, Sequence[int]], *, planned: bool
                ) -> dict[str, Container[int]]:
    """Per host, the ranks it may speak for: the plan's (``planned``: static rendezvous), or
    as many as it runs, claimed first come (``ClaimedRanks``)."""
    if planned:
        return {host: frozenset(ranks) for host, ranks in layout.items()}
    world = sum(len(r) for r in layout.values())
    owners: dict[int, str] = {}
    counts: dict[str, int] = {}
    return {host: ClaimedRanks(host, len(ranks), world, owners, counts)
            for host, ranks in layout.items()}


MAX_NCCL_LINES = 400  # one nccl message's lines (the supervisor ships at most 400 per rank)


# a rank's CPU seconds: a sample's ``cpu`` outside this is not a process's CPU time
MAX_CPU_S = 1e9


def checked_sample(msg: Mapping[str, Any], ranks: Container[int] | None) -> dict[str, Any]:
    """A sampler's sample with only the host's own ranks, each with a plausible ``cpu``."""
    out = dict(msg)
    if "t" in out and finite(out["t"], 0.0, 1e11) is None:
        del out["t"]
    if "ranks" in out:
        kept = {}
        for key, entry in rank_map(out["ranks"], ranks).items():
            entry = dict(entry)
            if "cpu" in entry and finite(entry["cpu"], 0.0, MAX_CPU_S) is None:
                del entry["cpu"]
            kept[key] = entry
        out["ranks"] = kept
    return out
