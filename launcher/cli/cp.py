"""`dtrain cp`: copy files to every node (pdcp) or, with --pull, from every node (rpdcp)."""

from __future__ import annotations

from typing import Annotated

import typer

from launcher.cli.common import (
    AcceptNewOpt,
    ConnectTimeoutOpt,
    ExcludeOpt,
    FanoutOpt,
    HostfileOpt,
    HostsOpt,
    IncludeOpt,
    resolve,
    run_body,
    ssh_settings,
)


def cp_cmd(
    paths: Annotated[list[str], typer.Argument(
        help="SRC... DEST (push), or with --pull REMOTE... LOCALDIR.", show_default=False)],
    hostfile: HostfileOpt = None,
    hosts: HostsOpt = None,
    include: IncludeOpt = None,
    exclude: ExcludeOpt = None,
    pull: Annotated[bool, typer.Option(
        "--pull", help="Copy from the nodes: each node's files land in LOCALDIR/<host>/ "
                       "(rpdcp). Globs in REMOTE are expanded on the node.")] = False,
    recursive: Annotated[bool, typer.Option("-r", "--recursive",
                                            help="Copy directories.")] = False,
    preserve: Annotated[bool, typer.Option(
        "-p", "--preserve", help="Keep permission bits exactly and directory mtimes (file "
                                 "mtimes are always kept: the delta check uses them).")] = False,
    keep_setuid: Annotated[bool, typer.Option(
        "--keep-setuid", help="With --pull -p: keep the setuid/setgid bits a node's files "
                              "have (default: dropped).")] = False,
    checksum: Annotated[bool, typer.Option(
        "--checksum", help="Skip a file only when its sha256 matches (default: size and "
                           "mtime).")] = False,
    delete: Annotated[bool, typer.Option(
        "--delete", help="Remove files under a copied directory that the source does not "
                         "have (never outside it).")] = False,
    fanout: FanoutOpt = 64,
    connect_timeout: ConnectTimeoutOpt = 10.0,
    accept_new: AcceptNewOpt = False,
    python: Annotated[str, typer.Option("--python", help="Interpreter for dtrain's node "
                                        "program (a push's stream, --checksum).")
                      ] = "python3",
    sftp: Annotated[bool, typer.Option(
        "--sftp", help="Push file by file over SFTP instead of one stream per node through "
                       "dtrain's node program (the fallback when python is missing).")
    ] = False,
    progress: Annotated[bool | None, typer.Option(
        "--progress/--no-progress", help="Live progress line (default: on a terminal).")
    ] = None,
    broadcast: Annotated[bool | None, typer.Option(
        "--broadcast/--no-broadcast",
        help="Send each large file once and let the nodes forward it along a chain "
             "(default: on for files of --broadcast-min or more that 3 or more nodes "
             "receive; --broadcast: from 2 nodes).", show_default=False)] = None,
    broadcast_min: Annotated[str, typer.Option(
        "--broadcast-min", metavar="SIZE",
        help="Smallest file sent by broadcast (64M, 1G, bytes).")] = "64M",
) -> None:
    """Copy files to every node in parallel; with --pull, from every node.

    Nothing is installed on the nodes: a push is one stream per node to dtrain's node
    program (shipped over SSH, as exec's), a pull uses SFTP. Delta by default; each
    file appears atomically. Exit codes: 0 all done; 1 a file failed on some node; 255 a
    node could not be reached; 2 bad input.
    """
    def body() -> int:
        from launcher.commands.cp import CopyRequest, run_cp
        from launcher.decide.broadcast import parse_size
        from launcher.errors import UsageError

        try:
            min_size = parse_size(broadcast_min)
        except ValueError as exc:
            raise UsageError(f"--broadcast-min: {exc}") from None

        if len(paths) < 2:
            raise UsageError("need at least one source and a destination",
                             hint="dtrain cp -H HOSTS SRC... DEST")
        host_list = resolve(hostfile, hosts, include, exclude)
        req = CopyRequest(sources=tuple(paths[:-1]), dest=paths[-1], pull=pull,
                          recursive=recursive, preserve=preserve, checksum=checksum,
                          delete=delete, fanout=fanout, python=python, progress=progress,
                          broadcast=broadcast, broadcast_min=min_size, stream=not sftp,
                          keep_setuid=keep_setuid)
        return run_cp(host_list, req, ssh_settings(connect_timeout, accept_new))

    run_body(body)
