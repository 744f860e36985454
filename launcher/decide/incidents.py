"""Pure: the incidents remembered across runs, and what the restart policy reads of them
(issue 53, docs/incidents.md).

An ``Incident`` is one failure dtrain explained at the end of a failed attempt of `dtrain
run`: its fingerprint (``decide.fingerprint``) and, beside it, the node whose own rank
failed, the run, the attempt, the time, the script, the commit and the versions. The store
(``job/incidents.py``) keeps at most ``MAX_RECORDS`` of them, none older than
``MAX_AGE_S``, in a document ``{"incidents_version": 1, "incidents": [...]}``.

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

from launcher.decide.failures import FailureReason
from launcher.decide.fingerprint import Fingerprint, of_failure, of_hang

VERSION = 1
MAX_RECORDS = 2000
MAX_AGE_S = 90 * 86400.0
WINDOW_S = 7 * 86400.0
CODE_NODES = 2
MACHINE_PRINTS = 2
ISOLATE_PRINTS = 3
CODE_KINDS = ("exception", "segfault", "abort", "oom", "exit", "hang-script")
# the restart fault (decide.restarts.classify) an incident must have had to count against
# its node
MACHINE_FAULTS = ("process",)
SUSPECT, ISOLATE = "suspect", "isolate"


class BadStore(ValueError):
    """The document is not an incident store this dtrain can read (the message says why)."""


@dataclass(frozen=True)
class Incident:
    """One explained failure of one attempt."""

    fingerprint: str
    label: str
    kind: str  # the print's kind (decide.fingerprint); a hang in the script: hang-script
    fault: str  # the restart fault it was classified as alone: user, process, node
    host: str
    run_id: str
    attempt: int
    t: float
    script: str = ""
    commit: str | None = None
    versions: Mapping[str, str] = field(default_factory=dict)

    def json(self) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint, "label": self.label, "kind": self.kind,
                "fault": self.fault, "host": self.host, "run_id": self.run_id,
                "attempt": self.attempt, "t": self.t, "script": self.script,
                "commit": self.commit, "versions": dict(self.versions)}

    @classmethod
    def from_json(cls, data: Any) -> Incident:
        """A record; BadStore when it is not one."""
        try:
            fp, host, t = data["fingerprint"], data["host"], float(data["t"])
            attempt = data.get("attempt", 1)
            versions = data.get("versions") or {}
            commit = data.get("commit")
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BadStore(f"a record is not well formed ({exc!r})") from None
        if not (isinstance(fp, str) and fp and isinstance(host, str) and host
                and math.isfinite(t) and isinstance(attempt, int)
                and isinstance(versions, dict) and (commit is None or isinstance(commit, str))):
            raise BadStore("a record is not well formed")
        return cls(fp, str(data.get("label", "")), str(data.get("kind", "")),
                   str(data.get("fault", "")), host, str(data.get("run_id", "")), attempt, t,
                   str(data.get("script", "")), commit,
                   {str(k): str(v) for k, v in versions.items()})


def document(records: Sequence[Incident]) -> dict[str, Any]:
    return {"incidents_version": VERSION, "incidents": [r.json() for r in records]}


def parse(doc: Any) -> list[Incident]:
    """The records of a store's document; BadStore for another version or shape."""
    if not isinstance(doc, dict) or "incidents_version" not in doc:
        raise BadStore("not an incident store (no incidents_version)")
    version = doc["incidents_version"]
    if version != VERSION:
        raise BadStore(f"incidents_version {version!r}: this dtrain reads version {VERSION} "
                       "(written by another dtrain)")
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

    def json(self) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint, "label": self.label, "kind": self.kind,
                "count": self.count, "nodes": list(self.nodes), "runs": list(self.runs),
                "first_seen": self.first, "last_seen": self.last,
                "commits": list(self.commits), "scripts": list(self.scripts)}


def _uniq(values: Iterable[str]) -> tuple[str, ...]:
    out: list[str] = []
    for v in values:
        if v and v not in out:
            out.append(v)
    return tuple(out)


def summarize(records: Sequence[Incident], since: float | None = None) -> list[Summary]:
    """One row per fingerprint (only records at or after ``since``), the most frequent
    first, then the latest."""
    groups: dict[str, list[Incident]] = {}
    for r in sorted(records, key=lambda r: r.t):
        if since is None or r.t >= since:
            groups.setdefault(r.fingerprint, []).append(r)
    rows = [Summary(fp, rs[-1].label, rs[-1].kind, len(rs), _uniq(r.host for r in rs),
                    _uniq(r.run_id for r in rs), rs[0].t, rs[-1].t,
                    _uniq(r.commit or "" for r in rs), _uniq(r.script for r in rs))
            for fp, rs in groups.items()]
    return sorted(rows, key=lambda s: (-s.count, -s.last))


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
    hang culprit's (named on its own stack, decide/stacks.py): never a node that some
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
