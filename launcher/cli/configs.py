"""Each command's parsed command line into its request (issue 35 item 4), on the model of
torch's ``run.py`` ``config_from_args``: a frozen dataclass of what typer parsed
(``XArgs.of(locals())``) and one pure function, ``x_config``, that makes every check of the
options (exit 2 naming the option, before anything is read or connects) and builds the
command's request and SSH settings. The command's body then reads the host list
(``HostArgs.read_hosts``: the hostfile, -H, Slurm, WCOLL, the config) and runs.

`run`'s is in cli/runconfig.py (it also reads files before it decides: its environment's
layers), `exec`'s in cli/args.py with the parameters every command shares (:class:`HostArgs`,
:class:`ConnArgs`); `smoke`, `cp`, `doctor`, `top` and `image push` are here.

Nothing heavy is imported at module level (the CLI's start is measured:
tests/test_cli_lean.py); each config imports its request type when called.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from launcher.cli.args import ConnArgs, HostArgs

IFACE = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}$")  # what Linux allows in an interface name

# ---------------------------------------------------------------------------------- smoke


@dataclass(frozen=True, kw_only=True)
class SmokeArgs(HostArgs, ConnArgs):
    """`dtrain smoke`'s parsed command line (cli/smoke.py)."""

    python: str = "python3"
    setup: str | None = None
    env: list[str] | None = None
    backend: str | None = None
    max_size: str | None = None
    min_busbw: float | None = None
    pair_fraction: float = 0.25
    pair_timeout: float = 30.0
    pairs: bool = False
    line_fraction: float | None = None
    nproc_per_node: str | None = None
    as_json: bool = False
    junit: str | None = None
    timestamps: bool = False
    archive_dir: str = "~/.local/state/dtrain/runs"
    run_id: str | None = None
    timeout: float | None = 300.0
    start_timeout: float = 120.0
    color: bool | None = None
    image: str | None = None
    container_runtime: str | None = None
    mount: list[str] | None = None
    container_arg: list[str] | None = None


def smoke_config(a: SmokeArgs, environ: Mapping[str, str]) -> tuple[Any, Any, Any]:
    """Pure: smoke's checks and its ``SmokeRequest``, ``RunOptions`` (the gang's start,
    shared with run) and SSH settings; ``--env NAME`` takes its value from ``environ``."""
    from pathlib import Path

    from launcher.cli import groups
    from launcher.commands.smoke import SmokeRequest
    from launcher.decide.copies.filters import check_choice
    from launcher.decide.fabric.smoke import parse_size
    from launcher.decide.runplan.runoptions import Connection, Display, Limits, Reports, RunOptions
    from launcher.hosts.envfile import parse_env_args

    groups.node(a.python)
    check_choice("--backend", a.backend, ("nccl", "gloo"))
    settings = a.settings()
    size = parse_size(a.max_size) if a.max_size else None
    req = SmokeRequest(python=a.python, setup=a.setup,
                       env=tuple(parse_env_args(a.env or [], environ)),
                       backend=a.backend, max_size=size, min_busbw=a.min_busbw,
                       pair_fraction=a.pair_fraction, nproc_per_node=a.nproc_per_node,
                       pairs=a.pairs, pair_timeout=a.pair_timeout,
                       line_fraction=a.line_fraction, run_id=a.run_id or "",
                       as_json=a.as_json, junit=a.junit,
                       container=groups.container(a.image, a.container_runtime, a.mount,
                                                  a.container_arg))
    opts = RunOptions(
        connection=Connection(fanout=a.fanout, transport=a.transport),
        limits=Limits(grace=5.0, timeout=a.timeout, start_timeout=a.start_timeout),
        display=Display(color=a.color, timestamps=a.timestamps),
        reports=Reports(as_json=a.as_json, archive_dir=Path(a.archive_dir)))
    return req, opts, settings


# ---------------------------------------------------------------------------------- cp


@dataclass(frozen=True, kw_only=True)
class CpArgs(HostArgs, ConnArgs):
    """`dtrain cp`'s parsed command line (cli/cp.py)."""

    paths: list[str]
    pull: bool = False
    recursive: bool = False
    preserve: bool = False
    keep_setuid: bool = False
    checksum: bool = False
    delete: bool = False
    python: str = "python3"
    sftp: bool = False
    progress: bool | None = None
    broadcast: bool | None = None
    broadcast_min: str = "64M"


def cp_config(a: CpArgs) -> tuple[Any, Any]:
    """Pure: cp's checks (a source and a destination, the broadcast's size) and its
    ``CopyRequest`` and SSH settings."""
    from launcher.cli import groups
    from launcher.commands.cp import CopyRequest
    from launcher.decide.copies.broadcast import parse_size
    from launcher.errors import UsageError

    groups.node(a.python)
    settings = a.settings()
    try:
        min_size = parse_size(a.broadcast_min)
    except ValueError as exc:
        raise UsageError(f"--broadcast-min: {exc}") from None
    if len(a.paths) < 2:
        raise UsageError("need at least one source and a destination",
                         hint="dtrain cp -H HOSTS SRC... DEST")
    req = CopyRequest(sources=tuple(a.paths[:-1]), dest=a.paths[-1], pull=a.pull,
                      recursive=a.recursive, preserve=a.preserve, checksum=a.checksum,
                      delete=a.delete, fanout=a.fanout, python=a.python,
                      progress=a.progress, broadcast=a.broadcast, broadcast_min=min_size,
                      stream=not a.sftp, keep_setuid=a.keep_setuid, transport=a.transport)
    return req, settings


# ---------------------------------------------------------------------------------- doctor


@dataclass(frozen=True, kw_only=True)
class DoctorArgs(HostArgs, ConnArgs):
    """`dtrain doctor`'s parsed command line (cli/doctor.py)."""

    python: str = "python3"
    setup: str | None = None
    master_addr: str | None = None
    master_port: int | None = None
    as_json: bool = False
    junit: str | None = None
    strict: bool = False
    failures: bool = False
    per_node: bool = False
    probe_timeout: float = 30.0
    color: bool | None = None
    image: str | None = None
    container_runtime: str | None = None
    health: bool = False
    dcgm: int = 0
    health_interval: float = 1.0


def doctor_config(a: DoctorArgs) -> tuple[Any, Any]:
    """Pure: doctor's checks and its request (``HealthOptions`` with --health or --dcgm,
    else ``DoctorOptions``) and SSH settings. Only the request's own command is imported:
    the health gate needs none of doctor's checks (~0.1 s of imports)."""
    from launcher.cli import groups

    groups.node(a.python)
    settings = a.settings()
    if a.health or a.dcgm:
        from launcher.commands.health import HealthOptions

        return HealthOptions(python=a.python, setup=a.setup, interval=a.health_interval,
                             dcgm=a.dcgm, fanout=a.fanout,
                             timeout=a.probe_timeout + a.health_interval,
                             transport=a.transport), settings
    from launcher.commands.doctor import DoctorOptions

    return DoctorOptions(python=a.python, setup=a.setup, master_addr=a.master_addr,
                         master_port=a.master_port, fanout=a.fanout,
                         probe_timeout=a.probe_timeout, transport=a.transport,
                         image=groups.container(a.image, a.container_runtime, None, None)
                         ), settings


# ---------------------------------------------------------------------------------- top


@dataclass(frozen=True, kw_only=True)
class TopArgs(HostArgs, ConnArgs):
    """`dtrain top`'s parsed command line (cli/top.py)."""

    run: str | None = None
    archive_dir: str = "~/.local/state/dtrain/runs"
    interval: float = 1.0
    once: bool = False
    as_json: bool = False
    count: int | None = None
    sort: str = "node"
    reverse: bool = False
    filter_: str = ""
    fold: bool = False
    per_gpu: bool = False
    iface: list[str] | None = None
    no_gpu: bool = False
    straggler_window: float = 30.0
    straggler_hold: float = 30.0
    straggler_ratio: float = 2.0
    progress: str | None = None
    python: str = "python3"
    color: bool | None = None


def top_config(a: TopArgs) -> tuple[Any, Any]:
    """Pure: top's checks (interface names, the sort column, the progress pattern) and its
    ``TopRequest`` and SSH settings."""
    from launcher.cli import groups
    from launcher.commands.top import TopRequest
    from launcher.commands.top.view import SORT_KEYS, ViewOptions
    from launcher.decide.outcome.stragglers import StragglerSettings
    from launcher.errors import UsageError

    groups.node(a.python)
    for name in a.iface or ():
        if not IFACE.match(name):
            raise UsageError(f"--iface {name!r}: not an interface name",
                             hint="a name as `ip link` shows it, e.g. ens1f0")
    if a.sort not in SORT_KEYS:
        raise UsageError(f"--sort {a.sort!r}: not a column",
                         hint=f"one of {', '.join(SORT_KEYS)}")
    if a.progress is not None:
        from launcher.decide.outcome.hang import compile_progress

        compile_progress(a.progress)  # a bad pattern: exit 2 before anything connects
    settings = a.settings()
    view = ViewOptions(sort=a.sort, reverse=a.reverse, filter=a.filter_, fold=a.fold,
                       gpus=a.per_gpu)
    req = TopRequest(interval=a.interval, once=a.once, as_json=a.as_json, count=a.count,
                     view=view, color=a.color, python=a.python, transport=a.transport,
                     fanout=a.fanout, connect_timeout=a.connect_timeout,
                     ifaces=tuple(a.iface or ()), gpu=not a.no_gpu, progress=a.progress,
                     stragglers=StragglerSettings(window=a.straggler_window,
                                                  hold=a.straggler_hold,
                                                  ratio=a.straggler_ratio))
    return req, settings


# ---------------------------------------------------------------------------------- image push


@dataclass(frozen=True, kw_only=True)
class PushArgs(HostArgs, ConnArgs):
    """`dtrain image push`'s parsed command line (cli/image.py)."""

    image: str
    container_runtime: str | None = None
    python: str = "python3"
    progress: bool | None = None
    via: str | None = None


def push_config(a: PushArgs) -> tuple[Any, Any]:
    """Pure: the image and runtime checked (exit 2) and the ``PushRequest`` and SSH
    settings."""
    from launcher.cli import groups
    from launcher.commands.image import PushRequest
    from launcher.decide.runplan.container import ContainerRequest
    from launcher.errors import UsageError

    groups.node(a.python)
    settings = a.settings()
    ContainerRequest(a.image, runtime=a.container_runtime)  # bad values: exit 2 here
    if a.via is not None and (not a.via.strip() or any(c in a.via for c in "\0\n\r")):
        raise UsageError(f"--via {a.via!r} is not a directory",
                         hint="a node's directory, e.g. --via /scratch/images or ~/images")
    req = PushRequest(image=a.image, runtime=a.container_runtime, fanout=a.fanout,
                      python=a.python, transport=a.transport, progress=a.progress, via=a.via)
    return req, settings
