"""`dtrain cp`: copy files to every node (pdcp) or, with --pull, from every node (rpdcp)."""

from __future__ import annotations

from typing import Annotated

import typer

from launcher import defaults
from launcher.cli import groups
from launcher.cli.common import run_body
from launcher.cli.groups import (
    AcceptNewOpt,
    ConnectTimeoutOpt,
    ExcludeOpt,
    FanoutOpt,
    HostfileOpt,
    HostsOpt,
    IncludeOpt,
    SupervisorPythonOpt,
    TransportOpt,
)

COPY = "Copy"


def cp_cmd(
    paths: Annotated[list[str], typer.Argument(
        metavar="SRC... DEST", help="SRC... DEST (push), or with --pull REMOTE... LOCALDIR.",
        show_default=False)],
    hostfile: HostfileOpt = None,
    hosts: HostsOpt = None,
    include: IncludeOpt = None,
    exclude: ExcludeOpt = None,
    group: groups.GroupOpt = None,
    exclude_group: groups.ExcludeGroupOpt = None,
    genders: groups.GendersOpt = None,
    pull: Annotated[bool, typer.Option(
        "--pull", rich_help_panel=COPY,
        help="Copy from the nodes: each node's files land in LOCALDIR/<host>/ "
             "(rpdcp). Globs in REMOTE are expanded on the node.")] = False,
    recursive: Annotated[bool, typer.Option("-r", "--recursive", rich_help_panel=COPY,
                                            help="Copy directories.")] = False,
    preserve: Annotated[bool, typer.Option(
        "-p", "--preserve", rich_help_panel=COPY,
        help="Keep permission bits exactly and directory mtimes (file "
             "mtimes are always kept: the delta check uses them).")] = False,
    keep_setuid: Annotated[bool, typer.Option(
        "--keep-setuid", rich_help_panel=COPY,
        help="With --pull -p: keep the setuid/setgid bits a node's files "
             "have (default: dropped).")] = False,
    checksum: Annotated[bool, typer.Option(
        "--checksum", rich_help_panel=COPY,
        help="Skip a file only when its sha256 matches (default: size and "
             "mtime).")] = False,
    delete: Annotated[bool, typer.Option(
        "--delete", rich_help_panel=COPY,
        help="Remove files under a copied directory that the source does not "
             "have (never outside it).")] = False,
    fanout: FanoutOpt = defaults.FANOUT,
    connect_timeout: ConnectTimeoutOpt = defaults.CONNECT_TIMEOUT_S,
    accept_new: AcceptNewOpt = False,
    user: groups.UserOpt = None,
    ssh_option: groups.SshOptionOpt = None,
    persist: groups.PersistOpt = None,
    verbose: groups.VerboseOpt = False,
    transport: TransportOpt = "auto",
    python: SupervisorPythonOpt = "python3",
    sftp: Annotated[bool, typer.Option(
        "--sftp", rich_help_panel=COPY,
        help="Push file by file over SFTP instead of one stream per node through "
             "dtrain's node program (the fallback when python is missing).")
    ] = False,
    progress: Annotated[bool | None, typer.Option(
        "--progress/--no-progress", rich_help_panel=COPY,
        help="Live progress line (default: on a terminal).")
    ] = None,
    broadcast: Annotated[bool | None, typer.Option(
        "--broadcast/--no-broadcast", rich_help_panel=COPY,
        help="Send each large file once and let the nodes forward it along a chain "
             "(default: on for files of --broadcast-min or more that 3 or more nodes "
             "receive; --broadcast: from 2 nodes).", show_default=False)] = None,
    broadcast_min: Annotated[str, typer.Option(
        "--broadcast-min", metavar="SIZE", rich_help_panel=COPY,
        help="Smallest file sent by broadcast (64M, 1G, bytes).")] = "64M",
) -> None:
    """Copy files to every node in parallel; with --pull, from every node.

    Nothing is installed on the nodes: a push is one stream per node to dtrain's node
    program (shipped over SSH, as exec's), a pull uses SFTP. Delta by default; each
    file appears atomically. Exit codes: 0 all done; 1 a file failed on some node; 255 a
    node could not be reached; 2 bad input.

    Example:

      dtrain cp -f hosts -r data/ /scratch/data
    """
    values = dict(locals())  # every parameter, as typer parsed it (configs.CpArgs)

    def body() -> int:
        from launcher.cli.configs import CpArgs, cp_config
        from launcher.commands.cp import run_cp

        a = CpArgs.of(values)
        req, settings = cp_config(a)  # every check before the host list is read
        return run_cp(a.read_hosts(), req, settings)

    run_body(body)
