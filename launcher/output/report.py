"""Machine-readable results: one ``CommandReport`` per command, written as the ``--json``
document (``dtrain.<command>/1``, docs/schemas.md) or turned into JUnit XML (junit.py).

Commands build a report from their own results; nothing here knows about sockets, jobs or
nodes' programs. The JSON Schema files beside this module (schemas/) are the contract
tests validate against.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import resources
from typing import Any, TextIO

SCHEMA_VERSION = 1
PASSED, FAILED, ERROR, SKIPPED = "passed", "failed", "error", "skipped"


@dataclass(frozen=True)
class RankResult:
    """One rank of a run/smoke job."""

    rank: int
    status: str  # passed, failed, error (no exit report), skipped
    exit_code: int | None = None
    signal: int | None = None
    role: str | None = None  # root cause, failed, stopped, ok, unknown
    message: str | None = None
    duration: float | None = None
    stderr_tail: tuple[str, ...] = ()


@dataclass(frozen=True)
class NodeResult:
    """One node (host) of any command."""

    host: str
    status: str  # passed, failed, error (unreachable, lost), skipped
    exit_code: int | None = None
    message: str | None = None
    duration: float | None = None
    ranks: tuple[RankResult, ...] = ()
    stderr_tail: tuple[str, ...] = ()
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CommandReport:
    """Everything --json prints and --junit writes for one command."""

    command: str  # exec, run, smoke, doctor, keys-setup, keys-check
    exit_code: int
    summary: str
    started: float
    ended: float
    nodes: tuple[NodeResult, ...] = ()
    root_cause: Mapping[str, Any] | None = None
    archive: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)  # the command's own section

    @property
    def schema(self) -> str:
        return f"dtrain.{self.command}/{SCHEMA_VERSION}"

    @property
    def outcome(self) -> str:
        return "ok" if self.exit_code == 0 else "failed"

    @property
    def duration(self) -> float:
        return max(0.0, self.ended - self.started)


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds")


def _rank_json(r: RankResult) -> dict[str, Any]:
    return {"rank": r.rank, "status": r.status, "exit_code": r.exit_code, "signal": r.signal,
            "role": r.role, "message": r.message, "duration": r.duration,
            "stderr_tail": list(r.stderr_tail)}


def _node_json(n: NodeResult) -> dict[str, Any]:
    return {"host": n.host, "status": n.status, "exit_code": n.exit_code,
            "message": n.message, "duration": n.duration,
            "ranks": [_rank_json(r) for r in n.ranks], "stderr_tail": list(n.stderr_tail),
            "details": dict(n.details)}


def to_json(report: CommandReport) -> dict[str, Any]:
    """The --json document (docs/schemas.md)."""
    from launcher import __version__

    return {
        "schema": report.schema, "command": report.command, "dtrain_version": __version__,
        "outcome": report.outcome, "exit_code": report.exit_code, "summary": report.summary,
        "root_cause": dict(report.root_cause) if report.root_cause is not None else None,
        "started": _iso(report.started), "ended": _iso(report.ended),
        "duration": round(report.duration, 3), "archive": report.archive,
        "nodes": [_node_json(n) for n in report.nodes],
        report.command.replace("-", "_"): dict(report.extra),
    }


def write_json(report: CommandReport, stream: TextIO | None = None) -> None:
    """Exactly one JSON document on stdout (the human output went to stderr)."""
    stream = stream or sys.stdout
    stream.write(json.dumps(to_json(report), indent=2, default=str) + "\n")
    stream.flush()


def schema_text(command: str) -> str:
    """The shipped JSON Schema for ``dtrain.<command>/1``."""
    name = f"{command}.schema.json"
    return resources.files("launcher.output").joinpath("schemas", name).read_text()
