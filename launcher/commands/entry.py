"""One way in for every command body that reaches nodes, and one way out: the event loop,
Ctrl-C, a DtrainError turned into its message and exit code, and the report finished
(--junit, the --json document, ``::error`` lines under GitHub Actions; the writers
themselves are output/report.py and output/junit.py).

pipx's habit: one dispatcher catches the project's error and renders what the command
returns. A body is a coroutine that returns its result (no output parameters); ``conclude``
turns how it ended (``Ended``) into an exit code, or into a ``CommandReport`` that is
finished here (JUnit, the JSON document, GitHub annotations).

Ctrl-C inside a job is the job's own business (it stops every node and its verdict says
"interrupted", exit 130). A Ctrl-C before or after the job, while connecting or probing,
ends the body: ``Ended.interrupted``, with no result.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TextIO, TypeVar

from launcher.errors import DtrainError
from launcher.exitcodes import EXIT_INTERRUPTED
from launcher.models import Host
from launcher.output import render

if TYPE_CHECKING:  # the report code is imported when a report is made (issue 26)
    from launcher.output.junit import ExtraCase
    from launcher.output.report import CommandReport

R = TypeVar("R")
INTERRUPTED = EXIT_INTERRUPTED  # 128 + SIGINT, as a shell reports Ctrl-C (its users' name)


@dataclass(frozen=True)
class Reports:
    """The machine-readable reports asked for (--json, --junit)."""

    as_json: bool = False
    junit: str | None = None

    @property
    def wanted(self) -> bool:
        return self.as_json or bool(self.junit)

    @property
    def made(self) -> bool:
        """Whether the command's report is to be built at all: asked for, or for the
        ``::error`` annotations under GitHub Actions. Otherwise a ``conclude`` returns the
        exit code alone and the report code is never imported (tests/test_cli_lean.py)."""
        return self.wanted or in_github_actions()


NO_REPORTS = Reports()


@dataclass(frozen=True)
class Ended(Generic[R]):
    """How a command body ended: with its result, with a DtrainError, or by Ctrl-C."""

    started: float  # time.time() when the body began
    result: R | None = None
    error: DtrainError | None = None
    interrupted: bool = False


def run_command(name: str, hosts: Sequence[Host], body: Callable[[], Coroutine[Any, Any, R]],
                conclude: Callable[[Ended[R]], int | CommandReport], *,
                reports: Reports = NO_REPORTS, concludes_errors: bool = False) -> int:
    """Run ``body`` to its end and conclude; the exit code.

    A DtrainError is printed here and becomes its exit code, or, with reports wanted, an
    error report naming the hosts (``concludes_errors``: ``conclude`` gets it instead, as
    `smoke` does, to print its verdict line too).
    """
    started = time.time()
    try:
        ended: Ended[R] = Ended(started, result=asyncio.run(body()))
    except KeyboardInterrupt:
        ended = Ended(started, interrupted=True)
    except DtrainError as exc:
        if not concludes_errors:
            render.error(exc)
            if not reports.wanted:
                return exc.exit_code
            return finish(error_report(name, exc, started, [h.label for h in hosts]),
                          as_json=reports.as_json, junit=reports.junit)
        ended = Ended(started, error=exc)
    out = conclude(ended)
    if isinstance(out, int):
        return out
    return finish(out, as_json=reports.as_json, junit=reports.junit)


# -- the reports --------------------------------------------------------------------------

def in_github_actions() -> bool:
    return os.environ.get("GITHUB_ACTIONS") == "true"


def annotate(report: CommandReport, stream: TextIO | None = None) -> None:
    """Each failed rank (or node without ranks) as an ``::error`` naming host and rank."""
    from launcher.output.render import github_error
    from launcher.output.report import ERROR, FAILED

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
    from launcher.output.junit import write_junit
    from launcher.output.report import write_json

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
    from launcher.output.report import ERROR, CommandReport, NodeResult

    nodes = tuple(NodeResult(h, ERROR, None, exc.message if exc.host in (None, h) else
                             "not started") for h in hosts)
    root = {"kind": "error", "host": exc.host, "rank": None, "exit_code": exc.exit_code,
            "summary": exc.message}
    return CommandReport(command, exc.exit_code, exc.message, started, time.time(), nodes,
                         root)
