"""`dtrain logs`: replay a run archive with the live console's tags and filters."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from launcher.cli import groups
from launcher.cli.common import run_body
from launcher.cli.completion import complete_run_id
from launcher.cli.groups import DISPLAY, ArchiveDirOpt, ColorOpt, HostFilterOpt, RankFilterOpt


def logs_cmd(
    run: Annotated[str | None, typer.Argument(
        autocompletion=complete_run_id, metavar="RUN",
        help="Run id or directory (default: latest).")] = None,
    archive_dir: ArchiveDirOpt = groups.DEFAULT_ARCHIVE_DIR,
    rank: RankFilterOpt = None,
    host: HostFilterOpt = None,
    grep: groups.GrepOpt = None,
    attempt: Annotated[int | None, typer.Option(
        "--attempt", min=1, metavar="N", rich_help_panel=DISPLAY,
        help="Only this attempt of a run with --restarts.")] = None,
    follow: Annotated[bool, typer.Option(
        "--follow", "-F", rich_help_panel=DISPLAY,
        help="Tail a running job until it ends (-F as in tail -F: -f means --hostfile in "
             "every dtrain command).")] = False,
    as_json: Annotated[bool, typer.Option("--json", rich_help_panel=groups.REPORTS,
                                          help="Print the archived objects.")] = False,
    color: ColorOpt = None,
    prune: Annotated[bool, typer.Option(
        "--prune", rich_help_panel=groups.ARCHIVE,
        help="Delete the runs that ended more than --older-than ago (never a live one), "
             "instead of replaying one.")] = False,
    older_than: Annotated[str, typer.Option(
        "--older-than", metavar="AGE", rich_help_panel=groups.ARCHIVE,
        help="With --prune: 30d, 12h, 90m or seconds.")] = "30d",
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", rich_help_panel=groups.ARCHIVE,
        help="With --prune: say what would be deleted, delete nothing.")] = False,
) -> None:
    """Replay a run archive with the live console's tags and filters.

    Example:

      dtrain logs --rank 0-1 --host node2 --grep loss
    """
    def body() -> int:
        from launcher.errors import UsageError
        from launcher.output.archive import read_meta, resolve_run
        from launcher.output.logview import replay

        if prune or dry_run:
            from launcher.commands.runs import prune as prune_runs
            from launcher.output.runstate import parse_age

            if run is not None or not prune:
                raise UsageError("--prune takes no run (it looks at every run), and "
                                 "--dry-run goes with --prune",
                                 hint="dtrain logs --prune --older-than 30d [--dry-run]")
            try:
                seconds = parse_age(older_than)
            except ValueError as exc:
                raise UsageError(f"--older-than {exc}") from None
            return prune_runs(Path(archive_dir), seconds, dry_run=dry_run)

        ranks = groups.rank_filter(rank)
        run_dir = resolve_run(Path(archive_dir), run)
        labels = [h for h in read_meta(run_dir).get("hosts", []) if isinstance(h, str)]
        return replay(run_dir, ranks=ranks, hosts=groups.host_filter(host, labels),
                      grep=grep, follow=follow, as_json=as_json, color=color,
                      attempt=attempt)

    run_body(body)
