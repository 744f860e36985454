"""`dtrain attach`: follow a run's live console; Ctrl-C detaches and leaves it running."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from launcher.cli import groups
from launcher.cli.common import run_body
from launcher.cli.completion import complete_run_id
from launcher.cli.groups import DISPLAY, ArchiveDirOpt, ColorOpt, HostFilterOpt, RankFilterOpt


def attach_cmd(
    run: Annotated[str | None, typer.Argument(
        autocompletion=complete_run_id, metavar="RUN",
        help="Run id, unique prefix or directory (default: the latest).")] = None,
    archive_dir: ArchiveDirOpt = groups.DEFAULT_ARCHIVE_DIR,
    rank: RankFilterOpt = None,
    host: HostFilterOpt = None,
    grep: groups.GrepOpt = None,
    lines: Annotated[int, typer.Option("--lines", "-n", min=0, metavar="N",
                                       rich_help_panel=DISPLAY,
                                       help="Start with the last N lines.")] = 20,
    color: ColorOpt = None,
) -> None:
    """Follow a run's live console; Ctrl-C detaches and leaves the run running.

    The tags and filters of `dtrain logs --follow`, plus a status line. Exit: 0 after
    detaching, else the run's own code once it ends (255 if its launcher is lost).

    Example:

      dtrain attach --rank 0
    """
    def body() -> int:
        from launcher.commands.runs import attach

        ranks = groups.rank_filter(rank)
        return attach(Path(archive_dir), run, ranks=ranks,
                      host=",".join(host) if host else None, grep=grep, lines=lines,
                      color=color, hint=groups.archive_hint(archive_dir))

    run_body(body)
