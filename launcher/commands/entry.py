"""One way in for every command body that reaches nodes: the event loop, Ctrl-C, and a
DtrainError turned into its message, its exit code and (with --json/--junit) its report.

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
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from launcher.commands.reporting import error_report, finish
from launcher.errors import DtrainError
from launcher.models import Host
from launcher.output import render
from launcher.output.report import CommandReport

R = TypeVar("R")
INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C


@dataclass(frozen=True)
class Reports:
    """The machine-readable reports asked for (--json, --junit)."""

    as_json: bool = False
    junit: str | None = None

    @property
    def wanted(self) -> bool:
        return self.as_json or bool(self.junit)


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
    if isinstance(out, CommandReport):
        return finish(out, as_json=reports.as_json, junit=reports.junit)
    return out
