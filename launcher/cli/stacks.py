"""`dtrain stacks`: every rank's stacks of a run, folded, from any shell."""

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


def stacks_cmd(
    run: Annotated[str | None, typer.Argument(
        metavar="RUN", help="Run id, unique prefix or directory (default: the latest run).",
        autocompletion=complete_run_id)] = None,
    archive_dir: ArchiveDirOpt = DEFAULT_ARCHIVE_DIR,
) -> None:
    """Every rank's Python stacks (all threads), folded: where each rank stands now.

    Works for foreground and detached runs, from any shell of the user who started the run;
    the dump is archived under stacks/ in the run's directory (docs/hangs.md). For a run that
    has ended, shows its last dump.

    Example:

      dtrain stacks
    """
    def body() -> int:
        from launcher.commands.stacks import stacks

        return stacks(Path(archive_dir), run)

    run_body(body)
