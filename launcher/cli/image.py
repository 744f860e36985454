"""`dtrain image push IMAGE`: the container image onto every node (docs/containers.md)."""

from __future__ import annotations

from typing import Annotated

import typer

from launcher import defaults
from launcher.cli import groups
from launcher.cli.common import DtrainCommand, DtrainGroup, run_body
from launcher.cli.defaults import from_config
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

image_app = typer.Typer(cls=DtrainGroup, no_args_is_help=True,
                        help="Container images on the nodes: push.")


@image_app.command("push", cls=DtrainCommand)
def push_cmd(
    image: Annotated[str, typer.Argument(metavar="IMAGE", help="The image, as this machine's "
                                         "podman or docker names it.", show_default=False)],
    hostfile: HostfileOpt = None,
    hosts: HostsOpt = None,
    include: IncludeOpt = None,
    exclude: ExcludeOpt = None,
    group: groups.GroupOpt = None,
    exclude_group: groups.ExcludeGroupOpt = None,
    genders: groups.GendersOpt = None,
    container_runtime: groups.ContainerRuntimeOpt = None,
    fanout: FanoutOpt = defaults.FANOUT,
    connect_timeout: ConnectTimeoutOpt = defaults.CONNECT_TIMEOUT_S,
    accept_new: AcceptNewOpt = False,
    user: groups.UserOpt = None,
    ssh_option: groups.SshOptionOpt = None,
    transport: TransportOpt = "auto",
    python: SupervisorPythonOpt = "python3",
    progress: Annotated[bool | None, typer.Option(
        "--progress/--no-progress", help="Live progress line (default: on a terminal).")
    ] = None,
    via: Annotated[str | None, typer.Option(
        "--via", metavar="DIR", callback=from_config("image_via"),
        help="Where the archive lands on the nodes until they loaded it (default: "
        "~/.cache/dtrain/images; config: image_via): node-local scratch, or a directory the "
        "nodes share, which then gets one copy for all.", show_default=False)] = None,
) -> None:
    """Save IMAGE once here and load it on every node that lacks it or has another digest.

    The archive goes over cp's broadcast chain (read once, forwarded node to node); nodes
    whose image id already matches are skipped, and nodes that share the archive's
    directory (an NFS home) get one copy between them. Exit codes: 0 every node has it; 1 a node
    failed (named); 255 a node could not be reached; 2 bad input.

    Example:

      dtrain image push -f hosts nvcr.io/nvidia/pytorch:24.05-py3
    """
    values = dict(locals())  # every parameter, as typer parsed it (configs.PushArgs)

    def body() -> int:
        from launcher.cli.configs import PushArgs, push_config
        from launcher.commands.image import run_push

        a = PushArgs.of(values)
        req, settings = push_config(a)  # every check before the host list is read
        return run_push(a.read_hosts(), req, settings)

    run_body(body)
