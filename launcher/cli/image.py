"""`dtrain image push IMAGE`: the container image onto every node (docs/containers.md)."""

from __future__ import annotations

from typing import Annotated

import typer

from launcher.cli import groups
from launcher.cli.common import DtrainCommand, DtrainGroup, run_body
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
    fanout: FanoutOpt = 64,
    connect_timeout: ConnectTimeoutOpt = 10.0,
    accept_new: AcceptNewOpt = False,
    user: groups.UserOpt = None,
    ssh_option: groups.SshOptionOpt = None,
    transport: TransportOpt = "auto",
    python: SupervisorPythonOpt = "python3",
    progress: Annotated[bool | None, typer.Option(
        "--progress/--no-progress", help="Live progress line (default: on a terminal).")
    ] = None,
) -> None:
    """Save IMAGE once here and load it on every node that lacks it or has another digest.

    The archive goes over cp's broadcast chain (read once, forwarded node to node); nodes
    whose image id already matches are skipped. Exit codes: 0 every node has it; 1 a node
    failed (named); 255 a node could not be reached; 2 bad input.

    Example:

      dtrain image push -f hosts nvcr.io/nvidia/pytorch:24.05-py3
    """
    def body() -> int:
        from launcher.commands.image import PushRequest, run_push
        from launcher.decide.container import ContainerRequest

        groups.node(python)
        groups.check_transport(transport)
        ContainerRequest(image, runtime=container_runtime)  # bad values: exit 2 here
        host_list = groups.hosts(hostfile, hosts, include, exclude, user=user,
                                 group=group, exclude_group=exclude_group, genders=genders)
        req = PushRequest(image=image, runtime=container_runtime, fanout=fanout,
                          python=python, transport=transport, progress=progress)
        return run_push(host_list, req, groups.connection(connect_timeout, accept_new,
                                                          ssh_option))

    run_body(body)
