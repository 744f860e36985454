"""`dtrain ps`: the runs of an archive directory, with their state."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from launcher import defaults
from launcher.cli import groups
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
    everyone: Annotated[bool, typer.Option(
        "--everyone", "-e", rich_help_panel="Display",
        help="Every user's live dtrain runs on this login node, from the process table: "
             "user, run id, start (docs/runs.md).")] = False,
    hostfile: Annotated[str | None, typer.Option(
        "-f", "--hostfile", metavar="FILE", rich_help_panel=groups.HOSTS,
        help="With --everyone: ask these nodes too (whose run holds which node).")] = None,
    hosts: Annotated[str | None, typer.Option(
        "-w", "-H", "--hosts", "--nodes", metavar="HOSTS", rich_help_panel=groups.HOSTS,
        help="With --everyone: ask these nodes too, pdsh style (node[1-8]).")] = None,
    user: groups.UserOpt = None,
    connect_timeout: groups.ConnectTimeoutOpt = defaults.CONNECT_TIMEOUT_S,
    ssh_option: groups.SshOptionOpt = None,
    as_json: Annotated[bool, typer.Option("--json", rich_help_panel="Reports",
                                          help="Versioned JSON (ps_version 1; with "
                                               "--everyone dtrain.ps-everyone/1).")]
    = False,
) -> None:
    """Runs and their state: starting, running, stopping, finished (exit code), launcher lost.

    A launcher is alive while it holds its run's lock file; one that died without recording
    an end (kill -9, reboot) shows as "launcher lost": its nodes stopped the job by themselves.

    --everyone: every user's runs as the process table shows them (user, run id, start,
    never their arguments); with -w HOSTS or -f FILE each node is asked too.

    Example:

      dtrain ps --active
      dtrain ps --everyone -w node7
    """
    def body() -> int:
        from launcher.commands.runs import ps

        if everyone or hostfile or hosts:
            from launcher.commands.everyone import ps_everyone

            named = groups.hosts(hostfile, hosts, None, None, user=user) \
                if hostfile or hosts else []
            settings = groups.connection(connect_timeout, False, ssh_option) if named else None
            return ps_everyone(named, settings, as_json=as_json)

        return ps(Path(archive_dir), as_json=as_json, active=active, show_all=show_all)

    run_body(body)
