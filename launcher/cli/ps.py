"""`dtrain ps`: the runs of an archive directory, with their state."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from launcher.cli.common import run_body
from launcher.cli.groups import (
    DEFAULT_ARCHIVE_DIR,
    ArchiveDirOpt,
)


def ps_cmd(
    archive_dir: ArchiveDirOpt = DEFAULT_ARCHIVE_DIR,
    active: Annotated[bool, typer.Option("--active", rich_help_panel="Display",
                                         help="Only runs whose launcher is "
                                              "alive (starting, running, stopping).")] = False,
    show_all: Annotated[bool, typer.Option("--all", rich_help_panel="Display",
                                           help="Every run (default: the live ones and "
                                           "the 20 newest others).")] = False,
    as_json: Annotated[bool, typer.Option("--json", rich_help_panel="Reports",
                                          help="Versioned JSON (ps_version 1).")]
    = False,
) -> None:
    """Runs and their state: starting, running, stopping, finished (exit code), launcher lost.

    A launcher is alive while it holds its run's lock file; one that died without recording
    an end (kill -9, reboot) shows as "launcher lost": its nodes stopped the job by themselves.

    Example:

      dtrain ps --active
    """
    def body() -> int:
        from launcher.commands.runs import ps

        return ps(Path(archive_dir), as_json=as_json, active=active, show_all=show_all)

    run_body(body)
