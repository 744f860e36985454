"""Incidents remembered across runs (issue 53, docs/incidents.md): each failed attempt's
explained failure recorded in the store (job/incidents.py) with what the policy reads of it
(decide/outcome/incidents.py ``recall``), and `dtrain incidents`: the fingerprints with their
counts, nodes, runs and commits, one fingerprint's runs, ``--json`` (dtrain.incidents/1)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from launcher.decide.outcome import incidents as inc
from launcher.decide.outcome.incidents import Incident, Recall
from launcher.decide.outcome.restarts import FINAL, AttemptEnd, classify
from launcher.errors import UsageError
from launcher.job.incidents import IncidentStore, StoreRefused, commit_of
from launcher.text.termsafe import inert

INCIDENTS_SCHEMA = "dtrain.incidents/1"


@dataclass(frozen=True)
class Remembered:
    """What recording one attempt's failure gave: the record (None: nothing explained), the
    policy's reading (None: the store could not be used) and lines to say."""

    incident: Incident | None
    recall: Recall | None
    notes: tuple[str, ...] = ()
    # the word to people (--notify): "fingerprint F (label), seen N times on M nodes since
    # D", with its fields; None: nothing recorded
    seen: str | None = None
    seen_fields: Mapping[str, Any] | None = None


def remember(end: AttemptEnd, *, run_id: str, attempt: int, script: str,
             workdir: str | None, hosts: Sequence[str], fault: str | None = None,
             versions: Mapping[str, str] | None = None, store: IncidentStore | None = None,
             commit: str | None = None,
             seconds: Mapping[str, float | None] | None = None) -> Remembered:
    """Record attempt ``attempt``'s explained failure and read the policy's evidence
    (``fault``: the fault it was classified as alone; classified here when None;
    ``seconds``: the time it cost, when the run's goodput ledger is already made)."""
    fault = fault or classify(end).kind
    if fault == FINAL:  # success, Ctrl-C, --timeout: nothing failed on its own
        return Remembered(None, None)
    found = inc.explained(reason=end.reason, stderr=end.stderr, code=end.code,
                          root_kind=end.root_kind, host=end.host, where=end.where,
                          place=end.place, hosts=hosts)
    if found is None:
        return Remembered(None, None)
    host, kind, print_ = found
    from launcher import __version__

    now = time.time()
    record = Incident(print_.digest, print_.label, kind, fault, host,
                      run_id, attempt, now, script,
                      commit if commit is not None else commit_of(workdir, script),
                      {"dtrain": __version__, **(versions or {})},
                      None if seconds is None else dict(seconds))
    store = store or IncidentStore()
    notes: list[str] = []
    try:
        every = store.record([record], now)
    except StoreRefused as exc:
        return Remembered(record, None, (f"warning: incident not recorded: {exc}",))
    except OSError as exc:
        return Remembered(record, None, (f"warning: incident not recorded in {store.path} "
                                         f"({exc.strerror or exc})",))
    if store.kept_aside:
        notes.append(f"warning: {store.path} was not readable: kept as {store.kept_aside}, "
                     "a new incident store begun")
    said, fields = seen_words(every, record)
    return Remembered(record, inc.recall(every, record), tuple(notes), said, fields)


def seen_words(records: Sequence[Incident], record: Incident
               ) -> tuple[str, dict[str, Any]]:
    """The --notify word of a failure (issue 53 item 5): ``fingerprint F (label), seen N
    times on M nodes since D``, and its fields."""
    n, nodes, first = inc.seen(records, record.fingerprint) or (1, 1, record.t)
    text = (f"fingerprint {record.fingerprint} ({record.label}), seen {n} "
            f"time{'s' if n != 1 else ''} on {nodes} node{'s' if nodes != 1 else ''} "
            f"since {_when(first)}")
    return text, {"fingerprint": record.fingerprint, "label": record.label,
                  "host": record.host, "seen": n, "nodes": nodes, "since": first}


def charge_run(run_id: str, ledger: Any, store: IncidentStore | None = None
               ) -> str | None:
    """At a run's end: its incidents charged the seconds their attempts cost, from the
    goodput ledger just made (meta.json ``goodput``); a warning line when the store cannot
    be used, else None."""
    store = store or IncidentStore()
    try:
        store.charge(run_id, inc.costs(ledger))
    except StoreRefused as exc:
        return f"warning: the time lost not recorded with the incidents: {exc}"
    except OSError as exc:
        return (f"warning: the time lost not recorded in {store.path} "
                f"({exc.strerror or exc})")
    return None


def _when(t: float) -> str:
    try:
        return datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M")
    except (OverflowError, OSError, ValueError):
        return "?"


def _table(rows: list[tuple[str, ...]]) -> str:
    n = len(rows[0]) - 1
    widths = [max(len(r[i]) for r in rows) for i in range(n)]
    return "".join("  ".join(c.ljust(w) for c, w in zip(r[:n], widths, strict=True))
                   + "  " + r[n] + "\n" for r in rows)


def _fold(values: Sequence[str], most: int = 3) -> str:
    shown = ", ".join(values[:most])
    return shown + (f" +{len(values) - most}" if len(values) > most else "")


def _short(commit: str) -> str:
    return commit[:7] if len(commit) == 40 else commit


def lost_text(seconds: float | None) -> str:
    """A TIME LOST cell: ``40.2 s``, ``12.5 min``, ``3.1 h``; ``-`` when not recorded."""
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def list_incidents(fingerprint: str | None = None, *, since: float | None = None,
                   as_json: bool = False, store: IncidentStore | None = None) -> int:
    """`dtrain incidents [FINGERPRINT] [--since AGE] [--json]`."""
    store = store or IncidentStore()
    records = store.load()
    now = time.time()
    start = now - since if since is not None else None
    if fingerprint is not None:
        return _one(store, records, fingerprint, start, as_json)
    rows = inc.summarize(records, start)
    if as_json:
        doc = {"schema": INCIDENTS_SCHEMA, "path": str(store.path), "since": start,
               "fingerprints": [r.json() for r in rows]}
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return 0
    if not rows:
        sys.stdout.write(f"no incidents ({store.path})\n")
        return 0
    table: list[tuple[str, ...]] = [("FINGERPRINT", "TIME LOST", "COUNT", "NODES", "RUNS",
                                     "FIRST", "LAST", "COMMITS", "FAILURE")]
    for r in rows:
        table.append(tuple(inert(c) for c in (
            r.fingerprint, lost_text(r.time_lost), str(r.count), _fold(r.nodes),
            str(len(r.runs)), _when(r.first), _when(r.last),
            _fold([_short(c) for c in r.commits]) or "-", r.label)))
    sys.stdout.write(_table(table))
    sys.stdout.write(f"{store.path}; ranked by the time lost (the goodput ledger's lost, "
                     "detection, restart and startup seconds of the attempts each ended); "
                     "`dtrain incidents FINGERPRINT` shows its runs\n")
    return 0


def _one(store: IncidentStore, records: list[Incident], prefix: str, start: float | None,
         as_json: bool) -> int:
    if not prefix or not all(c in "0123456789abcdefABCDEF" for c in prefix):
        raise UsageError(f"FINGERPRINT {prefix!r}: give its hex digits (12, or a prefix)",
                         hint="`dtrain incidents` lists them")
    found = [r for r in inc.matching(records, prefix) if start is None or r.t >= start]
    prints = sorted({r.fingerprint for r in found})
    if len(prints) > 1:
        raise UsageError(f"FINGERPRINT {prefix!r} names {len(prints)} fingerprints "
                         f"({', '.join(prints[:5])}): give more digits")
    if as_json:
        doc = {"schema": INCIDENTS_SCHEMA, "path": str(store.path), "since": start,
               "fingerprint": prints[0] if prints else None,
               "incidents": [{**r.json(), "logs": f"dtrain logs {r.run_id} --attempt "
                              f"{r.attempt}"} for r in found]}
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return 0 if found else 1
    if not found:
        sys.stdout.write(f"no incident with fingerprint {inert(prefix)} ({store.path})\n")
        return 1
    last = found[-1]
    sys.stdout.write(f"fingerprint {last.fingerprint}: {inert(last.label)} "
                     f"({len(found)} failure{'s' if len(found) != 1 else ''})\n")
    table: list[tuple[str, ...]] = [("WHEN", "NODE", "RUN", "ATTEMPT", "TIME LOST", "COMMIT",
                                     "SCRIPT", "LOGS")]
    for r in found:
        table.append(tuple(inert(c) for c in (
            _when(r.t), r.host, r.run_id, str(r.attempt), lost_text(r.time_lost),
            _short(r.commit or "-"), r.script or "-",
            f"dtrain logs {r.run_id} --attempt {r.attempt}")))
    sys.stdout.write(_table(table))
    return 0
