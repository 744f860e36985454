"""`dtrain stop`: stop a run from any shell of the user who started it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from launcher.cli.common import run_body
from launcher.cli.completion import complete_run_id
from launcher.cli.groups import (
    DEFAULT_ARCHIVE_DIR,
    ArchiveDirOpt,
    archive_hint,
)


def stop_cmd(
    run: Annotated[str, typer.Argument(
        metavar="RUN", help="Run id, unique prefix or directory.", autocompletion=complete_run_id)],
    archive_dir: ArchiveDirOpt = DEFAULT_ARCHIVE_DIR,
    grace: Annotated[float | None, typer.Option("--grace", min=0, metavar="SECONDS",
                                                help="TERM -> KILL delay "
                                                     "(default: the run's --grace).")] = None,
    kill: Annotated[bool, typer.Option("--kill", help="KILL at once, no grace.")] = False,
) -> None:
    """Stop a run from any shell, as Ctrl-C would in the foreground, and wait for its end.

    TERM, the grace period, then KILL; exit 130 is recorded in meta.json. Only the user who
    started the run may stop it.

    Example:

      dtrain stop 20261130-123456-ab12
    """
    def body() -> int:
        from launcher.commands.runs import stop

        return stop(Path(archive_dir), run, grace=grace, kill=kill,
                    hint=archive_hint(archive_dir))

    run_body(body)
