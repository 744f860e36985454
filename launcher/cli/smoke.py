"""`dtrain smoke`: a built-in all-reduce + node-pair job that names the slow or odd node."""

from __future__ import annotations

from pathlib import Path
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


def smoke_cmd(
    hostfile: HostfileOpt = None,
    hosts: HostsOpt = None,
    include: IncludeOpt = None,
    exclude: ExcludeOpt = None,
    python: Annotated[str, typer.Option("--python", help="Python on the nodes (a host's "
                                        "python= key wins).")] = "python3",
    setup: Annotated[str | None, typer.Option("--setup", help="Shell snippet run first on "
                                              "each node (`source venv/bin/activate`).")] = None,
    env: Annotated[list[str] | None, typer.Option("--env", "-e", help="K=V for every rank "
                                                  "(repeatable).")] = None,
    backend: Annotated[str | None, typer.Option(
        "--backend", help="nccl or gloo (default: nccl where every node has a GPU).")] = None,
    max_size: Annotated[str | None, typer.Option(
        "--max-size", help="Largest all-reduce size (4M, 512K; default 64M on NCCL, "
        "4M on gloo).")] = None,
    min_busbw: Annotated[float | None, typer.Option(
        "--min-busbw", min=0, help="Fail when the all-reduce bus bandwidth at the largest "
        "size is under this many GB/s.")] = None,
    pair_fraction: Annotated[float, typer.Option(
        "--pair-fraction", min=0, max=1, help="A node pair under this fraction of the best "
        "pair's bandwidth is slow.")] = 0.25,
    nproc_per_node: Annotated[str | None, typer.Option(
        "--nproc-per-node", help="Ranks per node (default: one per GPU on NCCL, one per "
        "node on gloo).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document (dtrain.smoke/1)"
                                          " on stdout; the human output goes to stderr.")
                       ] = False,
    junit: Annotated[str | None, typer.Option("--junit", help="Write JUnit XML here.")] = None,
    timestamps: Annotated[bool, typer.Option("--timestamps", help="Start each output line "
                                             "with the time dtrain received it "
                                             "(2026-11-30T12:34:56.789, local time).")
                          ] = False,
    archive_dir: Annotated[str, typer.Option("--archive-dir", envvar="DTRAIN_ARCHIVE_DIR",
                                             help="Where run archives go.")] = "dtrain-runs",
    run_id: Annotated[str | None, typer.Option("--run-id", help="Name the run.")] = None,
    timeout: Annotated[float | None, typer.Option("--timeout", min=0.1, help="Whole job "
                                                  "limit in s (exit 124).")] = 300.0,
    start_timeout: Annotated[float, typer.Option(
        "--start-timeout", min=1, help="Seconds for every node to start its job.")] = 120.0,
    fanout: FanoutOpt = 64,
    connect_timeout: ConnectTimeoutOpt = 10.0,
    accept_new: AcceptNewOpt = False,
    color: Annotated[bool | None, typer.Option(
        "--color/--no-color", help="Force colours on or off (default: on a terminal).")] = None,
) -> None:
    """Check that every node can train together: versions, an exact all-reduce, a bandwidth
    sweep (nccl-tests' algbw/busbw) and a node-pair test naming the slow node or link.

    Exit codes: 0 healthy, 1 a check failed (named), otherwise as `dtrain run` (255 a node
    unreachable or lost, 124 --timeout, 2 bad input, a rank's own code if the job crashed).
    """
    def body() -> int:
        from launcher.commands.smoke import SmokeRequest, smoke_sync
        from launcher.decide.plan import RunOptions
        from launcher.decide.smoke import parse_size
        from launcher.errors import UsageError
        from launcher.hosts.envfile import parse_env_args

        if backend not in (None, "nccl", "gloo"):
            raise UsageError(f"--backend {backend!r}: use nccl or gloo")
        size = parse_size(max_size) if max_size else None
        host_list = resolve(hostfile, hosts, include, exclude)
        req = SmokeRequest(python=python, setup=setup, env=tuple(parse_env_args(env or [])),
                           backend=backend, max_size=size, min_busbw=min_busbw,
                           pair_fraction=pair_fraction, nproc_per_node=nproc_per_node,
                           run_id=run_id or "", as_json=as_json, junit=junit)
        opts = RunOptions(fanout=fanout, timeout=timeout, start_timeout=start_timeout,
                          archive_dir=Path(archive_dir), as_json=as_json, color=color,
                          timestamps=timestamps,
                          grace=5.0)
        return smoke_sync(host_list, req, opts, ssh_settings(connect_timeout, accept_new))

    run_body(body)
