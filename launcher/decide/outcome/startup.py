"""Pure: where an attempt's start-up went, per node (docs/goodput.md, "Where start-up goes").

The goodput ledger's ``startup`` runs from an attempt's start to its first progress line.
Each node reports the instants its own start-up passed (meta.json ``startup[]``, one record
per attempt, written by commands/startup.py from the supervisor's messages), on the
launcher's clock:

    supervisor  the node's supervisor started the job (its ``hello``)
    agent       torchrun's agent has imported torch and its elastic agent (the rank shim's
                ``agent`` report, sent by the line that starts torchrun)
    rank_start  the node's first rank process is up (its shim's ``rank_start``): torchrun's
                rendezvous is over and its workers are spawned
    script      the node's first rank hands over to the user's script (the rank's ``arm``
                report, carried by its ``rank_exit`` as ``script_t``)

so that the ledger's start-up splits, per node, into five parts whose sum is ``startup``:

    connect_probe  the attempt's start to ``supervisor`` (connect, probe, preflight, plan,
                   the supervisor's start)
    agent_start    ``supervisor`` to ``agent`` (torchrun's interpreter and its imports)
    rendezvous     ``agent`` to ``rank_start`` (torchrun's rendezvous, waiting for every
                   node's agent, and its workers' spawn)
    rank_start     ``rank_start`` to ``script`` (the rank's interpreter, dtrain's arming)
    script         ``script`` to the first progress line (the script's imports, its data,
                   the process group, a checkpoint's load)

A checkpoint restore the ledger carves out of start-up is carved out of the part it falls
in. An instant a node did not report (a node lost before its ranks' exit reports, stacks
off: no ``arm``) is not guessed: the two parts it bounds are ``None`` and their time is
``unsplit``, so that the parts and ``unsplit`` always sum to ``startup``. Node instants
come corrected by the probe's clock offset (``clock_offset``) and are then kept in order:
each one no earlier than the one before it, no later than the end of start-up.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

PARTS = ("connect_probe", "agent_start", "rendezvous", "rank_start", "script")
INSTANTS = ("supervisor", "agent", "rank_start", "script")  # the bounds between the parts


def clock_offset(node_time: float, sent: float, received: float) -> float:
    """How far a node's clock is ahead of the launcher's (negative: behind), from one
    reading the node took between the launcher's ``sent`` and ``received``: only what lies
    outside that window counts (doctor's ``clock`` check; conservative: an offset smaller
    than the round trip reads 0)."""
    if sent <= node_time <= received:
        return 0.0
    return node_time - received if node_time > received else node_time - sent


def to_launcher(t: float | None, offset: float | None) -> float | None:
    """A node's instant on the launcher's clock."""
    if t is None:
        return None
    return round(t - (offset or 0.0), 6)


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _measure(segs: Sequence[tuple[float, float]], a: float, b: float) -> float:
    """The time of the segments inside [a, b]."""
    return sum(max(0.0, min(y, b) - max(x, a)) for x, y in segs)


def split(start: float, segs: Sequence[tuple[float, float]],
          node: Mapping[str, Any]) -> dict[str, float | None]:
    """One node's parts of one attempt's start-up (and ``unsplit``): ``start`` is the
    attempt's start, ``segs`` the ledger's start-up segments (checkpoint time carved out),
    ``node`` the node's instants (``INSTANTS``, launcher clock; a missing one is None)."""
    end = max((y for _, y in segs), default=start)
    bounds: list[float | None] = [start]
    low = start
    for name in INSTANTS:
        t = _num(node.get(name))
        if t is not None:
            t = min(max(t, low), end)
            low = t
        bounds.append(t)
    bounds.append(end)
    out: dict[str, float | None] = dict.fromkeys(PARTS, None)
    unsplit = 0.0
    known = [(i, t) for i, t in enumerate(bounds) if t is not None]
    for (i, a), (j, b) in zip(known, known[1:], strict=False):
        seconds = _measure(segs, a, b)
        if j == i + 1:
            out[PARTS[i]] = seconds
        else:
            unsplit += seconds
    return {**out, "unsplit": unsplit}


def attempt_split(start: float, segs: Sequence[tuple[float, float]],
                  record: Mapping[str, Any] | None, ref_host: str | None
                  ) -> dict[str, Any] | None:
    """An attempt's start-up split: per node, and the attempt's own from ``ref_host``'s
    (the reference rank's node; without one, the first node recorded). None: the attempt
    recorded no node instants (an archive from before this split, a job that never
    started)."""
    nodes = record.get("nodes") if isinstance(record, Mapping) else None
    if not isinstance(nodes, list):
        return None
    per = {str(n["host"]): split(start, segs, n) for n in nodes
           if isinstance(n, Mapping) and isinstance(n.get("host"), str)}
    if not per:
        return None
    host = ref_host if ref_host in per else next(iter(per))
    return {"node": host, "seconds": per[host], "nodes": per}


def total(splits: Sequence[tuple[Mapping[str, Any] | None, float]]
          ) -> dict[str, float | None] | None:
    """The run's parts from each attempt's (split, start-up seconds): each attempt's own
    parts summed (None where an attempt measured that part and another did not); an
    attempt without a split adds its whole start-up to ``unsplit``. None: no attempt has a
    split."""
    if all(s is None for s, _ in splits):
        return None
    out: dict[str, float | None] = dict.fromkeys(PARTS, 0.0)
    unsplit = 0.0
    for s, startup in splits:
        if s is None:
            unsplit += startup
            continue
        seconds = s["seconds"]
        unsplit += float(seconds.get("unsplit") or 0.0)
        for part in PARTS:
            v, have = seconds.get(part), out[part]
            out[part] = None if v is None or have is None else have + float(v)
    # a part one attempt could not measure: its other attempts' time is in unsplit too
    for s, _ in splits:
        if s is None:
            continue
        for part in PARTS:
            v = s["seconds"].get(part)
            if out[part] is None and v is not None:
                unsplit += float(v)
    return {**out, "unsplit": unsplit}


def rounded(parts: Mapping[str, float | None]) -> dict[str, float | None]:
    return {k: None if v is None else round(v, 3) for k, v in parts.items()}
