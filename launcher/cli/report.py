"""`dtrain report`: a run's archive as one self-contained HTML page (docs/report.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from launcher.cli.common import run_body
from launcher.cli.completion import complete_run_id
from launcher.cli.groups import (
    DEFAULT_ARCHIVE_DIR,
    ArchiveDirOpt,
)


def report_cmd(
    run: Annotated[str | None, typer.Argument(
        autocompletion=complete_run_id, metavar="RUN",
        help="Run id, prefix or directory (default: the "
             "latest).")] = None,
    output: Annotated[str | None, typer.Option(
        "-o", "--output", metavar="FILE",
        help="Where to write the page (default: ./dtrain-report-<run>.html;"
             " a directory: that file in it; '-': stdout).")] = None,
    archive_dir: ArchiveDirOpt = DEFAULT_ARCHIVE_DIR,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print the summary as JSON (schema dtrain.report/1) instead of writing "
                       "the page (both with -o).")] = False,
    metric: Annotated[list[str] | None, typer.Option(
        "--metric", metavar="REGEX", help="Metric pattern replacing the default name=value / "
        "name: value one: a `value` group (and optionally `name`), or one group. "
        "Repeatable.")] = None,
    compare: Annotated[tuple[str, str] | None, typer.Option(
        "--compare", metavar="RUN1 RUN2", help="Two runs side by side: curves and "
                                               "durations.")] = None,
    lanes: Annotated[str, typer.Option(
        "--lanes", metavar="rank|node|auto",
        help="Timeline lanes: rank, node, or auto (per node above 64 ranks).")]
    = "auto",
) -> None:
    """Write a run's report: header, timeline, training curves, utilisation, logs, stacks.

    One HTML file with everything inline (no network), to open on an air-gapped login node
    or attach to a ticket.

    Example:

      dtrain report -o report.html
    """
    def body() -> int:
        from launcher.commands.report import ReportRequest, report
        from launcher.errors import UsageError

        if compare is not None and run is not None:
            raise UsageError("give either RUN or --compare RUN1 RUN2, not both")
        runs: tuple[str | None, ...] = tuple(compare) if compare else (run,)
        return report(ReportRequest(runs=runs, archive_dir=Path(archive_dir), output=output,
                                    as_json=as_json, metrics=tuple(metric or ()), lanes=lanes))

    run_body(body)
