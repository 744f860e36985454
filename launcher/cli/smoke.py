"""`dtrain smoke`: a built-in all-reduce + node-pair job that names the slow or odd node."""

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
    PythonOpt,
    SetupOpt,
    TransportOpt,
)

SMOKE = "Smoke test"
JsonOpt = Annotated[bool, groups.json_opt(
    "One JSON document (dtrain.smoke/1) on stdout; the human output goes to stderr.")]


def smoke_cmd(
    hostfile: HostfileOpt = None,
    hosts: HostsOpt = None,
    include: IncludeOpt = None,
    exclude: ExcludeOpt = None,
    group: groups.GroupOpt = None,
    exclude_group: groups.ExcludeGroupOpt = None,
    genders: groups.GendersOpt = None,
    python: PythonOpt = "python3",
    setup: SetupOpt = None,
    env: Annotated[list[str] | None, typer.Option(
        "--env", "-e", metavar="K=V", rich_help_panel=groups.ENVIRONMENT,
        help="K=V for every rank (repeatable).")] = None,
    backend: Annotated[str | None, typer.Option(
        "--backend", metavar="nccl|gloo", rich_help_panel=SMOKE,
        help="nccl or gloo (default: nccl where every node has a GPU).")] = None,
    max_size: Annotated[str | None, typer.Option(
        "--max-size", metavar="SIZE", rich_help_panel=SMOKE,
        help="Largest all-reduce size (4M, 512K; default 64M on NCCL, "
             "4M on gloo).")] = None,
    min_busbw: Annotated[float | None, typer.Option(
        "--min-busbw", min=0, metavar="GB/S", rich_help_panel=SMOKE,
        help="Fail when the all-reduce bus bandwidth at the largest "
             "size is under this many GB/s.")] = None,
    pair_fraction: Annotated[float, typer.Option(
        "--pair-fraction", min=0, max=1, metavar="FRACTION", rich_help_panel=SMOKE,
        help="A node pair under this fraction of the best "
             "pair's bandwidth is slow.")] = 0.25,
    pair_timeout: Annotated[float, typer.Option(
        "--pair-timeout", min=0.1, metavar="SECONDS", rich_help_panel=SMOKE,
        help="A pair exchange not done in this many seconds is a failed link: named, "
             "and the job ends at once.")] = 30.0,
    pairs: Annotated[bool, typer.Option(
        "--pairs", rich_help_panel=SMOKE,
        help="Node pairs in O(log n) rounds (16 nodes: 4) that name "
             "the slow node or link (docs/fabric.md).")] = False,
    line_fraction: Annotated[float | None, typer.Option(
        "--line-fraction", min=0, max=1, metavar="FRACTION", rich_help_panel=SMOKE,
        help="Fail when busbw is under this fraction of the line "
             "rate (HCA port rates or NIC speed); default 0.8 on NCCL, off on gloo; 0: off.")
    ] = None,
    nproc_per_node: Annotated[str | None, typer.Option(
        "--nproc-per-node", metavar="N", rich_help_panel=SMOKE,
        help="Ranks per node (default: the hostfile's slots=, as run; else "
             "one per GPU on NCCL, one per node on gloo).")] = None,
    as_json: JsonOpt = False,
    junit: groups.JunitOpt = None,
    timestamps: groups.TimestampsOpt = False,
    archive_dir: groups.ArchiveDirOpt = groups.DEFAULT_ARCHIVE_DIR,
    run_id: groups.RunIdOpt = None,
    timeout: groups.TimeoutOpt = 300.0,
    start_timeout: groups.StartTimeoutOpt = 120.0,
    fanout: FanoutOpt = defaults.FANOUT,
    connect_timeout: ConnectTimeoutOpt = defaults.CONNECT_TIMEOUT_S,
    accept_new: AcceptNewOpt = False,
    user: groups.UserOpt = None,
    ssh_option: groups.SshOptionOpt = None,
    transport: TransportOpt = "auto",
    color: groups.ColorOpt = None,
    image: groups.ImageOpt = None,
    container_runtime: groups.ContainerRuntimeOpt = None,
    mount: groups.MountOpt = None,
    container_arg: groups.ContainerArgOpt = None,
) -> None:
    """Check that every node can train together: versions, an exact all-reduce, a bandwidth
    sweep (nccl-tests' algbw/busbw) and a node-pair test naming the slow node or link.

    Exit codes: 0 healthy, 1 a check failed (named), otherwise as `dtrain run` (255 a node
    unreachable or lost, 124 --timeout, 2 bad input, a rank's own code if the job crashed).

    Example:

      dtrain smoke -f hosts --min-busbw 100
    """
    values = dict(locals())  # every parameter, as typer parsed it (configs.SmokeArgs)

    def body() -> int:
        import os

        from launcher.cli.configs import SmokeArgs, smoke_config
        from launcher.commands.smoke import smoke_sync

        a = SmokeArgs.of(values)
        req, opts, settings = smoke_config(a, os.environ)  # every check first
        host_list = a.read_hosts()
        groups.warn_secret_env(a.env)
        return smoke_sync(host_list, req, opts, settings)

    run_body(body)
