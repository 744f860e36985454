"""`dtrain logs`: replay a run archive with the live console's tags and filters."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from launcher.cli.common import (
    run_body,
)
from launcher.cli.completion import complete_run_id


def logs_cmd(
    run: Annotated[str | None, typer.Argument(
        autocompletion=complete_run_id, help="Run id or directory (default: latest).")] = None,
    archive_dir: Annotated[str, typer.Option("--archive-dir", envvar="DTRAIN_ARCHIVE_DIR",
                                             help="Where run archives are.")] = "dtrain-runs",
    rank: Annotated[list[int] | None, typer.Option("--rank", help="Only this rank "
                                                   "(repeatable).")] = None,
    host: Annotated[str | None, typer.Option("--host", help="Only these hosts.")] = None,
    grep: Annotated[str | None, typer.Option("--grep", help="Regular expression.")] = None,
    attempt: Annotated[int | None, typer.Option("--attempt", min=1, help="Only this "
                                                "attempt of a run with --restarts.")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-F", help="Tail a running job until it "
                                         "ends (-F as in tail -F: -f means --hostfile in "
                                         "every dtrain command).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the archived objects.")] = False,
    color: Annotated[bool | None, typer.Option("--color/--no-color", help="Force colours "
                                               "on or off (default: on a terminal).")] = None,
) -> None:
    """Replay a run archive with the live console's tags and filters."""
    def body() -> int:
        from launcher.output.archive import resolve_run
        from launcher.output.logview import replay

        run_dir = resolve_run(Path(archive_dir), run)
        return replay(run_dir, ranks=set(rank) if rank else None, host=host, grep=grep,
                      follow=follow, as_json=as_json, color=color, attempt=attempt)

    run_body(body)
