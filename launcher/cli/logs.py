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
    grep: Annotated[str | None, typer.Option("--grep", metavar="REGEX", rich_help_panel=DISPLAY,
                                             help="Only lines matching.")] = None,
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
) -> None:
    """Replay a run archive with the live console's tags and filters.

    Example:

      dtrain logs --rank 0-1 --host node2 --grep loss
    """
    def body() -> int:
        from launcher.output.archive import read_meta, resolve_run
        from launcher.output.logview import replay

        ranks = groups.rank_filter(rank)
        run_dir = resolve_run(Path(archive_dir), run)
        labels = [h for h in read_meta(run_dir).get("hosts", []) if isinstance(h, str)]
        return replay(run_dir, ranks=ranks, hosts=groups.host_filter(host, labels),
                      grep=grep, follow=follow, as_json=as_json, color=color,
                      attempt=attempt)

    run_body(body)
