"""--json, --junit and GitHub annotations for any command: one place that finishes a
CommandReport (the writers themselves are in output/report.py and output/junit.py)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from typing import TextIO

from launcher.errors import DtrainError
from launcher.output.junit import ExtraCase, write_junit
from launcher.output.render import github_error
from launcher.output.report import ERROR, FAILED, CommandReport, NodeResult, write_json


def in_github_actions() -> bool:
    return os.environ.get("GITHUB_ACTIONS") == "true"


def annotate(report: CommandReport, stream: TextIO | None = None) -> None:
    """Each failed rank (or node without ranks) as an ``::error`` naming host and rank."""
    stream = stream or sys.stderr
    for node in report.nodes:
        bad_ranks = [r for r in node.ranks if r.status in (FAILED, ERROR)]
        for r in bad_ranks:
            github_error(f"dtrain {report.command}: {r.message or f'exit {r.exit_code}'}",
                         hosts=(node.host,), ranks=(r.rank,), stream=stream)
        if not bad_ranks and node.status in (FAILED, ERROR):
            github_error(f"dtrain {report.command}: {node.message or f'exit {node.exit_code}'}",
                         hosts=(node.host,), stream=stream)
    if report.exit_code and not any(n.status in (FAILED, ERROR) for n in report.nodes):
        github_error(f"dtrain {report.command}: {report.summary}", stream=stream)


def finish(report: CommandReport, *, as_json: bool, junit: str | None,
           extra_cases: Sequence[ExtraCase] = (), annotations: bool = True,
           node_cases: bool = True) -> int:
    """Write what was asked (the JUnit file, then the one JSON document on stdout) and
    return the report's exit code."""
    if annotations and in_github_actions():
        annotate(report)
    if junit:
        write_junit(junit, report, extra_cases, node_cases=node_cases)
    if as_json:
        write_json(report)
    return report.exit_code


def error_report(command: str, exc: DtrainError, started: float,
                 hosts: Sequence[str] = ()) -> CommandReport:
    """A command that failed before it had per-node results (bad host, preflight)."""
    nodes = tuple(NodeResult(h, ERROR, None, exc.message if exc.host in (None, h) else
                             "not started") for h in hosts)
    root = {"kind": "error", "host": exc.host, "rank": None, "exit_code": exc.exit_code,
            "summary": exc.message}
    return CommandReport(command, exc.exit_code, exc.message, started, time.time(), nodes,
                         root)
