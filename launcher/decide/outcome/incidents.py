"""Pure: the incidents remembered across runs, and what the restart policy reads of them
(issue 53, docs/incidents.md).

An ``Incident`` is one failure dtrain explained at the end of a failed attempt of `dtrain
run`: its fingerprint (``decide.outcome.fingerprint``) and, beside it, the node whose own rank
failed, the run, the attempt, the time, the script, the commit and the versions. The store
(``job/incidents.py``) keeps at most ``MAX_RECORDS`` of them, none older than
``MAX_AGE_S``, in a document ``{"incidents_version": 2, "incidents": [...]}`` (version 1,
without the time each failure cost, is still read: its records' ``seconds`` are None).

``recall`` reads them for the policy, the current failure included:

* **the code's**: its fingerprint already failed on ``CODE_NODES`` (2) different nodes with
  the same commit: a restart fails the same way, the run stops whatever ``--restarts``
  says. Only kinds that say something of the code count (an exception, a native crash, an
  OOM kill, an exit with its story, a hang in the script's own code); a signal from
  outside, an Xid or a communication error is the same everywhere for other reasons.
* **the machine's**: ``MACHINE_PRINTS`` (2) different fingerprints on one node within
  ``WINDOW_S`` (7 days), across runs and scripts, each a *process* fault on its own (not a
  deterministic user error, not a communication error, which may be a peer's victim, and
  not a print that is the code's): the node is fenced, tier ``suspect``, ``isolate`` from
  ``ISOLATE_PRINTS`` (3).

Trust (docs/threat-model.md): an incident is recorded against the node whose own rank
failed (the verdict's root cause, from that node's own report) or the hang culprit named on
its own stack; never against a node that another node's output names.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from launcher.decide.outcome.failures import FailureReason
from launcher.decide.outcome.fingerprint import Fingerprint, of_failure, of_hang

VERSION = 2  # 2: each record's ``seconds`` (the time it cost); 1 had none
READS = (1, 2)  # the versions this dtrain reads
MAX_RECORDS = 2000
MAX_AGE_S = 90 * 86400.0
WINDOW_S = 7 * 86400.0
CODE_NODES = 2
MACHINE_PRINTS = 2
ISOLATE_PRINTS = 3
CODE_KINDS = ("exception", "segfault", "abort", "oom", "exit", "hang-script")
# the restart fault (decide.outcome.restarts.classify) an incident must have had to count against
# its node
MACHINE_FAULTS = ("process",)
SUSPECT, ISOLATE = "suspect", "isolate"
# the goodput ledger's causes (decide/outcome/goodput.py) an incident is charged with, of the
# attempt
# it ended: its steps done again, the time until dtrain noticed (a hang's too), the stop and
# decision, the start-up the attempt had spent, and a failed last attempt's tail (the
# ledger's winddown: its noticing and stop, unsplit without --restarts)
COST_CAUSES = ("lost", "detection", "hang", "restart", "startup", "winddown")


class BadStore(ValueError):
    """The document is not an incident store this dtrain can read (the message says why)."""


@dataclass(frozen=True)
class Incident:
    """One explained failure of one attempt."""

    fingerprint: str
    label: str
    kind: str  # the print's kind (decide.outcome.fingerprint); a hang in the script: hang-script
    fault: str  # the restart fault it was classified as alone: user, process, node
    host: str
    run_id: str
    attempt: int
    t: float
    script: str = ""
    commit: str | None = None
    versions: Mapping[str, str] = field(default_factory=dict)
    # the time this failure cost, by the ledger's cause (COST_CAUSES; a value None: not
    # measured); None: not recorded (a version 1 record, a launcher that ended before its
    # ledger was made)
    seconds: Mapping[str, float | None] | None = None

    @property
    def time_lost(self) -> float | None:
        """The seconds it cost, every measured cause together (None: not recorded)."""
        if self.seconds is None:
            return None
        return sum(v for v in self.seconds.values() if v is not None)

    def json(self) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint, "label": self.label, "kind": self.kind,
                "fault": self.fault, "host": self.host, "run_id": self.run_id,
                "attempt": self.attempt, "t": self.t, "script": self.script,
                "commit": self.commit, "versions": dict(self.versions),
                "seconds": None if self.seconds is None else dict(self.seconds)}

    @classmethod
    def from_json(cls, data: Any) -> Incident:
        """A record; BadStore when it is not one."""
        try:
            fp, host, t = data["fingerprint"], data["host"], float(data["t"])
            attempt = data.get("attempt", 1)
            versions = data.get("versions") or {}
            commit = data.get("commit")
            seconds = _seconds(data.get("seconds"))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BadStore(f"a record is not well formed ({exc!r})") from None
        if not (isinstance(fp, str) and fp and isinstance(host, str) and host
                and math.isfinite(t) and isinstance(attempt, int)
                and isinstance(versions, dict) and (commit is None or isinstance(commit, str))):
            raise BadStore("a record is not well formed")
        return cls(fp, str(data.get("label", "")), str(data.get("kind", "")),
                   str(data.get("fault", "")), host, str(data.get("run_id", "")), attempt, t,
                   str(data.get("script", "")), commit,
                   {str(k): str(v) for k, v in versions.items()}, seconds)


def _seconds(raw: Any) -> dict[str, float | None] | None:
    """A record's ``seconds`` (None: not recorded); ValueError when it is not one."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValueError("seconds is not an object")
    out: dict[str, float | None] = {}
    for cause, v in raw.items():
        if v is None:
            out[str(cause)] = None
        elif isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) \
                and v >= 0:
            out[str(cause)] = float(v)
        else:
            raise ValueError(f"seconds[{cause!r}] is not a number of seconds")
    return out


def cost(attempt: Mapping[str, Any]) -> dict[str, float | None]:
    """What one attempt of the goodput ledger (meta.json ``goodput.attempts[]``) charges the
    incident that ended it: its ``COST_CAUSES`` seconds (None: not measured)."""
    secs = attempt.get("seconds")
    secs = secs if isinstance(secs, Mapping) else {}
    out: dict[str, float | None] = {}
    for cause in COST_CAUSES:
        v = secs.get(cause)
        out[cause] = round(float(v), 3) if isinstance(v, int | float) \
            and not isinstance(v, bool) and math.isfinite(v) and v >= 0 else None
    return out


def costs(ledger: Any) -> dict[int, dict[str, float | None]]:
    """Every attempt's charge (``cost``) of a goodput ledger's JSON (meta.json's
    ``goodput``), by attempt number; {} when there is none."""
    attempts = ledger.get("attempts") if isinstance(ledger, Mapping) else None
    if not isinstance(attempts, list):
        return {}
    return {a["n"]: cost(a) for a in attempts
            if isinstance(a, Mapping) and type(a.get("n")) is int}


def charge(records: Sequence[Incident], run_id: str,
           by_attempt: Mapping[int, Mapping[str, float | None]]) -> list[Incident]:
    """The records with run ``run_id``'s incidents charged the seconds of the attempts they
    ended (a record already charged stays as it is)."""
    from dataclasses import replace

    return [replace(r, seconds=dict(by_attempt[r.attempt]))
            if r.run_id == run_id and r.seconds is None and r.attempt in by_attempt else r
            for r in records]


def document(records: Sequence[Incident]) -> dict[str, Any]:
    return {"incidents_version": VERSION, "incidents": [r.json() for r in records]}


def parse(doc: Any) -> list[Incident]:
    """The records of a store's document; BadStore for another version or shape."""
    if not isinstance(doc, dict) or "incidents_version" not in doc:
        raise BadStore("not an incident store (no incidents_version)")
    version = doc["incidents_version"]
    if version not in READS:
        raise BadStore(f"incidents_version {version!r}: this dtrain reads versions "
                       f"{', '.join(map(str, READS))} (written by another dtrain)")
    items = doc.get("incidents")
    if not isinstance(items, list):
        raise BadStore("incidents is not a list")
    return [Incident.from_json(x) for x in items]


def bound(records: Iterable[Incident], now: float, limit: int = MAX_RECORDS,
          max_age: float = MAX_AGE_S) -> list[Incident]:
    """The newest ``limit`` records of the last ``max_age`` seconds, oldest first."""
    kept = sorted((r for r in records if now - r.t <= max_age), key=lambda r: r.t)
    return kept[-limit:] if limit > 0 else []


def add(records: Sequence[Incident], new: Sequence[Incident], now: float) -> list[Incident]:
    """The records with ``new`` added (the same run, attempt, host and print once), bounded."""
    seen = {(r.run_id, r.attempt, r.host, r.fingerprint) for r in records}
    fresh = [n for n in new if (n.run_id, n.attempt, n.host, n.fingerprint) not in seen]
    return bound([*records, *fresh], now)


@dataclass(frozen=True)
class Summary:
    """One fingerprint over the records: `dtrain incidents`' row."""

    fingerprint: str
    label: str
    kind: str
    count: int
    nodes: tuple[str, ...]
    runs: tuple[str, ...]
    first: float
    last: float
    commits: tuple[str, ...]
    scripts: tuple[str, ...]
    # the seconds its failures cost, those with a recorded cost together (None: none has
    # one), and how many of its failures had one
    time_lost: float | None = None
    measured: int = 0

    def json(self) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint, "label": self.label, "kind": self.kind,
                "count": self.count, "nodes": list(self.nodes), "runs": list(self.runs),
                "first_seen": self.first, "last_seen": self.last,
                "commits": list(self.commits), "scripts": list(self.scripts),
                "time_lost_s": None if self.time_lost is None else round(self.time_lost, 3),
                "time_lost_measured": self.measured}


def _uniq(values: Iterable[str]) -> tuple[str, ...]:
    out: list[str] = []
    for v in values:
        if v and v not in out:
            out.append(v)
    return tuple(out)


def _lost(rs: Sequence[Incident]) -> tuple[float | None, int]:
    costs = [c for c in (r.time_lost for r in rs) if c is not None]
    return (sum(costs) if costs else None), len(costs)


def summarize(records: Sequence[Incident], since: float | None = None) -> list[Summary]:
    """One row per fingerprint (only records at or after ``since``), ranked by the time
    its failures cost (what to fix first), then the most frequent, then the latest."""
    groups: dict[str, list[Incident]] = {}
    for r in sorted(records, key=lambda r: r.t):
        if since is None or r.t >= since:
            groups.setdefault(r.fingerprint, []).append(r)
    rows = [Summary(fp, rs[-1].label, rs[-1].kind, len(rs), _uniq(r.host for r in rs),
                    _uniq(r.run_id for r in rs), rs[0].t, rs[-1].t,
                    _uniq(r.commit or "" for r in rs), _uniq(r.script for r in rs),
                    *_lost(rs))
            for fp, rs in groups.items()]
    return sorted(rows, key=lambda s: (-(s.time_lost or 0.0), -s.count, -s.last))


def seen(records: Sequence[Incident], fingerprint: str) -> tuple[int, int, float] | None:
    """(how many failures, on how many nodes, since when) a print has in the records;
    None when it has none."""
    mine = [r for r in records if r.fingerprint == fingerprint]
    if not mine:
        return None
    return len(mine), len({r.host for r in mine}), min(r.t for r in mine)


def matching(records: Sequence[Incident], prefix: str) -> list[Incident]:
    """The records of the fingerprints that start with ``prefix``, oldest first."""
    p = prefix.lower()
    return sorted((r for r in records if r.fingerprint.startswith(p)), key=lambda r: r.t)


@dataclass(frozen=True)
class Recall:
    """What the records say of the current failure (None: nothing)."""

    code: str | None = None  # the line that stops the run
    fence: tuple[str, str, str] | None = None  # (host, tier, line)


def _and(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _short(commit: str) -> str:
    return commit[:7] if len(commit) == 40 else commit


def code_nodes(records: Sequence[Incident], fingerprint: str, commit: str | None
               ) -> list[str]:
    """The nodes a code print failed on with this commit (in order of first failure)."""
    if commit is None:
        return []
    return list(_uniq(r.host for r in sorted(records, key=lambda r: r.t)
                      if r.fingerprint == fingerprint and r.commit == commit
                      and r.kind in CODE_KINDS))


def recall(records: Sequence[Incident], now: Incident, window: float = WINDOW_S) -> Recall:
    """The policy's reading of ``records`` (``now`` among them or not) for the failure
    ``now`` (module doc)."""
    every = [*records, *([] if now in records else [now])]
    if now.kind in CODE_KINDS:
        nodes = code_nodes(every, now.fingerprint, now.commit)
        if len(nodes) >= CODE_NODES and now.commit is not None:
            return Recall(code=(f"stopping: fingerprint {now.fingerprint} ({now.label}) "
                                f"already failed on {_and(nodes)} with commit "
                                f"{_short(now.commit)}; restarts would fail the same way"))
    if now.fault not in MACHINE_FAULTS or now.kind == "comm":
        return Recall()
    mine = [r for r in every if r.host == now.host and now.t - r.t <= window
            and r.fault in MACHINE_FAULTS and r.kind != "comm"
            and len(code_nodes(every, r.fingerprint, r.commit)) < CODE_NODES]
    prints: dict[str, Incident] = {}
    for r in sorted(mine, key=lambda r: r.t):
        prints.setdefault(r.fingerprint, r)
    if len(prints) < MACHINE_PRINTS:
        return Recall()
    tier = ISOLATE if len(prints) >= ISOLATE_PRINTS else SUSPECT
    days = f"{window / 86400:g} days"
    said = ", ".join(f"{fp} ({r.label}, run {r.run_id})" for fp, r in prints.items())
    return Recall(fence=(now.host, tier,
                         f"{len(prints)} different failures on {now.host} within {days} "
                         f"({said}): the machine's, not the code's (tier {tier})"))


def explained(*, reason: FailureReason | None, stderr: Sequence[str], code: int | None,
              root_kind: str | None, host: str | None, where: str | None = None,
              place: str | None = None, hosts: Sequence[str] = ()
              ) -> tuple[str, str, Fingerprint] | None:
    """(the node the failure counts against, the incident's kind, its print) of an
    attempt's root cause; None when dtrain explained nothing. The node is the failed rank's
    own (``reason.host``: the verdict's root cause, from that node's own report) or the
    hang culprit's (named on its own stack, decide/outcome/stacks.py): never a node that some
    output line names."""
    if root_kind == "hang":
        if not host:
            return None
        return host, "hang-script" if where == "script" else "hang", of_hang(where, place,
                                                                             hosts)
    if reason is None or not reason.host:
        return None
    made = of_failure(reason, stderr, code=code, hosts=hosts)
    if made is None:
        return None
    return reason.host, made.kind, made
