"""`dtrain attach`: follow a run's live console; Ctrl-C detaches and leaves it running."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from launcher.cli.common import DEFAULT_ARCHIVE_DIR, ArchiveDirOpt, archive_hint, run_body
from launcher.cli.completion import complete_run_id


def attach_cmd(
    run: Annotated[str | None, typer.Argument(
        autocompletion=complete_run_id,
        help="Run id, unique prefix or directory (default: the latest).")] = None,
    archive_dir: ArchiveDirOpt = DEFAULT_ARCHIVE_DIR,
    rank: Annotated[list[int] | None, typer.Option("--rank", help="Only this rank "
                                                   "(repeatable).")] = None,
    host: Annotated[str | None, typer.Option("--host", help="Only these hosts.")] = None,
    grep: Annotated[str | None, typer.Option("--grep", help="Regular expression.")] = None,
    lines: Annotated[int, typer.Option("--lines", "-n", min=0, help="Start with the last N "
                                       "lines.")] = 20,
    color: Annotated[bool | None, typer.Option(
        "--color/--no-color", help="Force colours on or off (default: on a terminal).")] = None,
) -> None:
    """Follow a run's live console; Ctrl-C detaches and leaves the run running.

    The tags and filters of `dtrain logs --follow`, plus a status line. Exit: 0 after
    detaching, else the run's own code once it ends (255 if its launcher is lost).
    """
    def body() -> int:
        from launcher.commands.runs import attach

        return attach(Path(archive_dir), run, ranks=set(rank) if rank else None, host=host,
                      grep=grep, lines=lines, color=color, hint=archive_hint(archive_dir))

    run_body(body)
