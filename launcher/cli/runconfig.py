"""`dtrain run`'s command line turned into its request: read, then decided (issue 35 item 4).

On the model of torch's ``run.py`` ``config_from_args``, in two halves:

* ``read_run_inputs(args)``: the I/O. The host list (hostfile, -H, Slurm), the user
  config's ``[env]``, ``.deepspeed_env``, ``--env-file`` (each as it is, one
  ``netenv.EnvLayer``), ``--profile``, ``--topology``,
  the launcher's environment (``--env NAME`` takes its value there), the command line as
  typed (for meta.json, redacted), the current directory (the default ``--workdir``) and
  where each setting came from (the config or the command line).
* ``run_config(args, inputs)``: pure. Every check of the options (exit 2 naming the option,
  before anything connects) and the ``RunRequest``, ``RunOptions`` and SSH settings. The
  environment's layers are passed to ``decide/runplan/netenv.user_env``, which alone orders them
  (config ``[env]`` < ``.deepspeed_env`` < ``--env-file`` < ``--env``).

``cli/run.py`` ``run_cmd`` is then: read, decide, run (or detach).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher import defaults
from launcher.cli.args import ConnArgs, HostArgs
from launcher.models import Host

# the warm start (docs/warm-start.md) without --preload or --no-preload: on
WARM_DEFAULT = True

if TYPE_CHECKING:  # the plan is imported only by run_config, when it runs
    from launcher.decide.runplan.netenv import EnvLayer
    from launcher.decide.runplan.plan import RunRequest
    from launcher.decide.runplan.runoptions import RunOptions


@dataclass(frozen=True, kw_only=True)
class RunArgs(HostArgs, ConnArgs):
    """`dtrain run`'s parsed command line, as typer gives it (``cli/run.py`` ``run_cmd``)."""

    script: str
    args: list[str] | None = None
    nproc_per_node: str | None = None
    python: str = "python3"
    setup: str | None = None
    workdir: str | None = None
    env: list[str] | None = None
    env_file: str | None = None
    master_addr: str | None = None
    master_port: int | None = None
    rdzv: str = "static"
    max_restarts: int = 0
    module: bool = False
    archive_dir: str = "~/.local/state/dtrain/runs"
    run_id: str | None = None
    dry_run: bool = False
    offline: bool = False
    as_json: bool = False
    junit: str | None = None
    timestamps: bool = False
    rank: list[str] | None = None
    host: list[str] | None = None
    profile: str | None = None
    no_auto: list[str] | None = None
    preflight: bool = True
    topology: str | None = None
    health_check: bool = False
    dcgm: int = 0
    exclusive: bool = False
    grace: float = defaults.GRACE_S
    timeout: float | None = None
    start_timeout: float = 120.0
    hang_timeout: float = 300.0
    progress: str | None = None
    checkpoint: str | None = None
    preload: str | None = None
    no_preload: bool = False
    notify: str | None = None
    require_fabric: str | None = None
    on_hang: str | None = None
    restarts: int = 0
    nnodes: str | None = None
    restart_backoff: float = 1.0
    heartbeat_timeout: float = defaults.HEARTBEAT_TIMEOUT_S
    color: bool | None = None
    raw: bool = False
    detach: bool = False
    sample_interval: float = 10.0
    straggler_window: float = 30.0
    straggler_hold: float = 30.0
    straggler_ratio: float = 2.0
    image: str | None = None
    container_runtime: str | None = None
    mount: list[str] | None = None
    container_arg: list[str] | None = None


@dataclass(frozen=True)
class RunInputs:
    """What `run` reads before it decides (``read_run_inputs``)."""

    hosts: tuple[Host, ...]
    # the hostfile's hosts before --include/--exclude, when either has a ':' (HOST:PORT
    # of a host is that host, not DeepSpeed's GPUs: decide/runplan/devices.split_spec)
    spelled_hosts: tuple[Host, ...] = ()
    # the user config's [env], .deepspeed_env and --env-file as read (None: none); their
    # order is decide/runplan/netenv.user_env's
    config_env: EnvLayer | None = None
    deepspeed_env: EnvLayer | None = None
    env_file: EnvLayer | None = None
    environ: Mapping[str, str] = field(default_factory=dict)  # the launcher's environment
    argv: tuple[str, ...] = ()  # the command line as typed, after `dtrain`
    profile_env: Any = None  # --profile's settings (decide/runplan/netenv.load_profile)
    topology: str | None = None  # --topology FILE's text
    default_workdir: str | None = None  # the current directory
    setting_sources: Mapping[str, str] = field(default_factory=dict)  # config or command line


def read_run_inputs(a: RunArgs) -> RunInputs:
    """Everything `run` reads from files and the environment (a missing or bad file is exit 2
    with its name, or its file:line)."""
    import os
    import sys

    from launcher.cli import groups
    from launcher.cli.defaults import config_env, sources
    from launcher.commands.run import default_workdir
    from launcher.decide.runplan.devices import selection
    from launcher.decide.runplan.netenv import EnvLayer
    from launcher.hosts.envfile import load_env_file

    every: list[Host] = []
    if ":" in (a.include or "") + (a.exclude or ""):
        every = groups.hosts(a.hostfile, a.hosts, None, None, user=a.user, group=a.group,
                             exclude_group=a.exclude_group, genders=a.genders)
    include_hosts, exclude_hosts, _ = selection(a.include, a.exclude, every)
    host_list = groups.hosts(a.hostfile, a.hosts, include_hosts, exclude_hosts, user=a.user,
                             group=a.group, exclude_group=a.exclude_group, genders=a.genders)
    config_pairs, config_where = config_env()
    deepspeed, deepspeed_where = groups.deepspeed_env()
    from_file = load_env_file(a.env_file) if a.env_file else []
    profile_env = None
    if a.profile:
        from launcher.decide.runplan.netenv import load_profile

        profile_env = load_profile(a.profile)
    return RunInputs(hosts=tuple(host_list), spelled_hosts=tuple(every),
                     config_env=EnvLayer(tuple(config_pairs),
                                         sources=tuple(config_where.items())),
                     deepspeed_env=EnvLayer(tuple(deepspeed),
                                            sources=tuple(deepspeed_where.items())),
                     env_file=EnvLayer(tuple(from_file), source=f"--env-file {a.env_file}"),
                     environ=dict(os.environ), argv=tuple(sys.argv[1:]),
                     profile_env=profile_env, topology=read_topology(a.topology),
                     default_workdir=default_workdir(), setting_sources=dict(sources()))


def read_topology(path: str | None) -> str | None:
    """--topology FILE's text (a missing file is bad input, exit 2)."""
    if path is None:
        return None
    from launcher.errors import UsageError

    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(4 << 20)
    except OSError as exc:
        raise UsageError(f"--topology {path}: {exc.strerror or exc}") from None


def check_run_args(a: RunArgs) -> None:
    """The checks that need nothing read (pure; ``run_config`` makes them too): run_cmd
    makes them first, so a bad option is named before a hostfile is even opened."""
    from launcher.cli import groups
    from launcher.decide.copies.filters import check_choice, preload_modules
    from launcher.decide.fabric.nccl_account import REQUIRE
    from launcher.decide.outcome.hang import ON_HANG, compile_progress
    from launcher.decide.outcome.restarts import parse_nnodes
    from launcher.errors import UsageError

    groups.node(a.python, a.workdir)
    if a.offline and not a.dry_run:
        raise UsageError("--offline plans without connecting: it goes with --dry-run",
                         hint="add --dry-run")
    check_choice("--rdzv", a.rdzv, ("static", "c10d"))
    check_choice("--on-hang", a.on_hang, tuple(ON_HANG))
    check_choice("--require-fabric", a.require_fabric, REQUIRE)
    parse_nnodes(a.nnodes)
    compile_progress(a.progress)  # a bad pattern: exit 2 before anything connects
    preload_modules(a.preload, a.no_preload, WARM_DEFAULT)
    if a.checkpoint is not None:
        from launcher.decide.outcome.goodput import compile_checkpoint

        compile_checkpoint(a.checkpoint)


def run_config(a: RunArgs, i: RunInputs) -> tuple[RunRequest, RunOptions, Any]:
    """The request, the options and the SSH settings of one `dtrain run` (pure: every
    check is exit 2 naming its option; nothing is read)."""
    from launcher.cli import groups
    from launcher.cli.defaults import setting_sources_from
    from launcher.decide.copies.filters import preload_modules
    from launcher.decide.outcome.hang import HangPolicy
    from launcher.decide.outcome.restarts import RestartPolicy, parse_nnodes
    from launcher.decide.outcome.stragglers import StragglerSettings
    from launcher.decide.runplan.devices import selection
    from launcher.decide.runplan.netenv import EnvLayer, user_env
    from launcher.decide.runplan.plan import RunRequest
    from launcher.decide.runplan.runoptions import (
        Connection,
        Display,
        Limits,
        NodeChecks,
        Reports,
        RunOptions,
        Watching,
    )
    from launcher.hosts.envfile import from_environment, parse_env_args
    from launcher.text.redact import redact_command

    check_run_args(a)
    remote_dir = groups.node(a.python, a.workdir, default_workdir=i.default_workdir)
    restart = RestartPolicy(restarts=a.restarts, count=parse_nnodes(a.nnodes),
                            backoff=a.restart_backoff)
    hang = HangPolicy(timeout=a.hang_timeout, progress=a.progress,
                      on_hang=a.on_hang or ("stop" if a.restarts else "dump"))
    _, _, devices = selection(a.include, a.exclude, i.spelled_hosts)
    none = EnvLayer()
    layers = {"config": i.config_env or none, "deepspeed_env": i.deepspeed_env or none,
              "env_file": i.env_file or none,
              "env": EnvLayer(tuple(parse_env_args(a.env or [], i.environ)), source="--env")}
    user = user_env(**layers)  # their order is netenv's
    hidden = from_environment(a.env or [])
    # every value a layer gave is a secret wherever it shows, the overridden ones too
    secrets = [*(kv for layer in layers.values() for kv in layer.pairs),
               *(kv for h in i.hosts for kv in h.env)]
    command = redact_command(["dtrain", *i.argv], a.env or [], secrets, hidden)
    if a.notify:
        from launcher.job.notify import redact_argv

        command = redact_argv(command)
    req = RunRequest(script=a.script, args=tuple(a.args or ()), module=a.module,
                     nproc_per_node=a.nproc_per_node, python=a.python, setup=a.setup,
                     workdir=remote_dir, env=user.env, hidden_env=hidden,
                     shadowed_env=tuple(kv for layer in layers.values() for kv in layer.pairs
                                        if kv not in user.env),
                     env_sources=user.sources,
                     master_addr=a.master_addr, master_port=a.master_port, rdzv=a.rdzv,
                     max_restarts=a.max_restarts, run_id=a.run_id or "", devices=devices,
                     container=groups.container(a.image, a.container_runtime, a.mount,
                                                a.container_arg))
    opts = RunOptions(
        connection=Connection(fanout=a.fanout, transport=a.transport),
        limits=Limits(grace=a.grace, timeout=a.timeout, start_timeout=a.start_timeout,
                      heartbeat_timeout=a.heartbeat_timeout),
        checks=NodeChecks(
            preflight=a.preflight, profile=i.profile_env,
            profile_name=Path(a.profile).stem if a.profile else "profile",
            no_auto=frozenset(a.no_auto or ()), topology=i.topology,
            health_check=a.health_check or bool(a.dcgm), health_dcgm=a.dcgm,
            exclusive=a.exclusive),
        watch=Watching(
            hang=hang, restart=restart, sample_interval=a.sample_interval,
            stragglers=StragglerSettings(window=a.straggler_window, hold=a.straggler_hold,
                                         ratio=a.straggler_ratio),
            require_fabric=a.require_fabric, checkpoint=a.checkpoint, notify=a.notify),
        display=Display(color=a.color, raw=a.raw, timestamps=a.timestamps,
                        ranks=groups.rank_filter(a.rank),
                        hosts_filter=groups.host_filter(a.host, [h.label for h in i.hosts]),
                        verbose=a.verbose),
        reports=Reports(as_json=a.as_json, junit=a.junit, archive_dir=Path(a.archive_dir)),
        dry_run=a.dry_run, offline=a.offline, command=tuple(command),
        preload=preload_modules(a.preload, a.no_preload, WARM_DEFAULT),
        sources=setting_sources_from(i.setting_sources, python=a.python, setup=a.setup,
                                     workdir=remote_dir, archive_dir=a.archive_dir))
    settings = a.settings()
    return req, opts, settings
