"""`dtrain run`: torchrun on every node with per-node network environment."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from launcher import defaults
from launcher.cli import groups
from launcher.cli.common import run_body
from launcher.cli.defaults import from_config
from launcher.cli.groups import (
    FAILURE,
    LAUNCH,
    NODE,
    AcceptNewOpt,
    ArchiveDirOpt,
    ColorOpt,
    ConnectTimeoutOpt,
    EnvFileOpt,
    EnvOpt,
    ExcludeOpt,
    FanoutOpt,
    HeartbeatTimeoutOpt,
    HostfileOpt,
    HostFilterOpt,
    HostsOpt,
    IncludeOpt,
    PythonOpt,
    RankFilterOpt,
    RawOpt,
    RunIdOpt,
    SetupOpt,
    StartTimeoutOpt,
    TimeoutOpt,
    TimestampsOpt,
    TransportOpt,
    WorkdirOpt,
    archive_hint,
)
from launcher.cli.watching import (
    SampleIntervalOpt,
    StragglerHoldOpt,
    StragglerRatioOpt,
    StragglerWindowOpt,
)

# decide/outcome/hang.DEFAULT_HANG_TIMEOUT, spelled here: every command's start would import the
# hang decisions for this default (tests/test_cmd_configs.py checks they agree)
DEFAULT_HANG_TIMEOUT = 300.0
JsonOpt = Annotated[bool, groups.json_opt(
    "One JSON document on stdout: the plan with --dry-run, else the result "
    "(dtrain.run/1); human output to stderr.")]

def run_cmd(
    script: Annotated[str, typer.Argument(metavar="SCRIPT",
                                          help="Training script (or module with -m).")],
    args: Annotated[list[str] | None, typer.Argument(
        metavar="ARGS", help="Script arguments, untouched.")] = None,
    hostfile: HostfileOpt = None,
    hosts: HostsOpt = None,
    include: IncludeOpt = None,
    exclude: ExcludeOpt = None,
    group: groups.GroupOpt = None,
    exclude_group: groups.ExcludeGroupOpt = None,
    genders: groups.GendersOpt = None,
    nproc_per_node: Annotated[str | None, typer.Option(
        "--nproc-per-node", "--nproc_per_node", "--num_gpus", "--num-gpus",
        metavar="N|gpu|auto", rich_help_panel=LAUNCH,
        help="N, gpu or auto (default: the hostfile's slots, else gpu).")] = None,
    python: PythonOpt = "python3",
    setup: SetupOpt = None,
    workdir: WorkdirOpt = None,
    env: EnvOpt = None,
    env_file: EnvFileOpt = None,
    master_addr: Annotated[str | None, typer.Option(
        "--master-addr", "--master_addr", metavar="ADDR", rich_help_panel=LAUNCH,
        help="Rendezvous address (default: node 0's address every node "
             "reaches, probed).")] = None,
    master_port: Annotated[int | None, typer.Option(
        "--master-port", "--master_port", min=1, max=65535, metavar="PORT", rich_help_panel=LAUNCH,
        help="Rendezvous port (default: a free one on "
             "node 0, checked from every node).")] = None,
    rdzv: Annotated[str, typer.Option("--rdzv", metavar="static|c10d",
                                      rich_help_panel=LAUNCH,
                                      help="static (deterministic ranks) or c10d "
                                           "(elastic).")] = "static",
    max_restarts: Annotated[int, typer.Option("--max-restarts", "--max_restarts", min=0,
                                              metavar="N",
                                              rich_help_panel=LAUNCH, help="torchrun "
                                              "restarts of the worker group.")] = 0,
    module: Annotated[bool, typer.Option("-m", "--module", rich_help_panel=LAUNCH,
                                         help="SCRIPT is a module.")] = False,
    archive_dir: ArchiveDirOpt = groups.DEFAULT_ARCHIVE_DIR,
    run_id: RunIdOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", rich_help_panel=LAUNCH,
                                          help="Probe and print each node's "
                                               "command and environment; start nothing.")] = False,
    offline: Annotated[bool, typer.Option(
        "--offline", rich_help_panel=LAUNCH,
        help="With --dry-run: plan from the hostfile alone, connecting to nothing (each "
             "node's facts unknown: no detected NCCL/GLOO variables, master not checked).")
    ] = False,
    verbose: Annotated[bool, typer.Option(
        "--verbose", "-v", rich_help_panel=LAUNCH,
        help="With --dry-run --offline: every node's full block, each variable with its "
             "source and reason (default: one line per node).")] = False,
    as_json: JsonOpt = False,
    junit: groups.JunitOpt = None,
    timestamps: TimestampsOpt = False,
    rank: RankFilterOpt = None,
    host: HostFilterOpt = None,
    profile: Annotated[str | None, typer.Option("--profile", metavar="FILE",
                                                rich_help_panel=groups.ENVIRONMENT,
                                                help="Fabric profile YAML "
                                                     "(NCCL_IB_TC, ...).")] = None,
    no_auto: Annotated[list[str] | None, typer.Option("--no-auto", metavar="NAME",
                                                      rich_help_panel=groups.ENVIRONMENT,
                                                      help="Do not set this "
                                                      "detected variable (repeatable).")] = None,
    preflight: Annotated[bool, typer.Option("--preflight/--no-preflight",
                                            rich_help_panel=NODE, help="Run doctor's "
                                            "fast checks first (torch, python, hostnames, "
                                            "shm, memlock).")] = True,
    topology: Annotated[str | None, typer.Option(
        "--topology", metavar="FILE", rich_help_panel=NODE,
        help="Slurm's topology.conf: node ranks ordered so neighbours share a switch, then "
             "a segment (the hostfile's switch=/segment= win; docs/fabric.md).")] = None,
    health_check: Annotated[bool, typer.Option(
        "--health-check", rich_help_panel=NODE,
        help="The health gate before the job (`doctor --health`, docs/fabric.md): "
             "isolate-tier nodes go on the lemon list and are left out while --nnodes "
             "leaves hosts to spare, else the run is refused naming them.")] = False,
    exclusive: Annotated[bool, typer.Option(
        "--exclusive", rich_help_panel=NODE,
        help="Refuse (exit 1, nothing started) when another user's dtrain run is on a "
             "node; without it, one warning line per such node (docs/runs.md).")] = False,
    dcgm: Annotated[int, typer.Option(
        "--dcgm", min=0, max=3, metavar="LEVEL", rich_help_panel=NODE,
        help="With --health-check: also `dcgmi diag -r LEVEL` where dcgmi exists.")] = 0,
    grace: groups.GraceOpt = defaults.GRACE_S,
    timeout: TimeoutOpt = None,
    start_timeout: StartTimeoutOpt = 120.0,
    hang_timeout: Annotated[float, typer.Option(
        "--hang-timeout", min=0, metavar="SECONDS", rich_help_panel=FAILURE,
        help="Declare a hang when no rank made progress for S s "
             "while every rank is alive: every rank's stacks, folded, the culprit named "
             "(0 = off; docs/hangs.md).")] = DEFAULT_HANG_TIMEOUT,
    progress: Annotated[str | None, typer.Option(
        "--progress", metavar="REGEX", rich_help_panel=FAILURE,
        help="REGEX: the output lines that show progress (default: step, "
             "iteration, epoch, loss lines and progress bars).")] = None,
    preload: Annotated[str | None, typer.Option(
        "--preload", metavar="MODULES", rich_help_panel=LAUNCH, callback=from_config("preload"),
        help="Modules (comma-separated) each node's warm interpreter imports besides torch: "
             "ranks are forked from it, not started cold (docs/warm-start.md).")] = None,
    no_preload: Annotated[bool, typer.Option(
        "--no-preload", rich_help_panel=LAUNCH,
        help="Start every rank as a fresh interpreter (no warm start).")] = False,
    checkpoint: Annotated[str | None, typer.Option(
        "--checkpoint", metavar="REGEX", rich_help_panel=FAILURE,
        help="REGEX: the output lines that say a checkpoint was saved, for the goodput "
             "ledger (docs/goodput.md).")] = None,
    notify: Annotated[str | None, typer.Option(
        "--notify", metavar="URL|COMMAND", rich_help_panel=FAILURE,
        callback=from_config("notify"),
        help="Tell URL (a JSON POST with a Slack-compatible text) or COMMAND (the event's "
             "JSON on stdin) when the run starts, hangs, fences a node, relaunches, "
             "ends.")] = None,
    require_fabric: Annotated[str | None, typer.Option(
        "--require-fabric", metavar="rdma|gdr|any", rich_help_panel=FAILURE,
        help="Stop the run (exit 123) when NCCL's own account shows a rank below this: rdma "
             "(IB/RoCE), gdr (RDMA with GPUDirect), any (an account from every rank); "
             "default: only warn (docs/fabric.md).")] = None,
    on_hang: Annotated[str | None, typer.Option(
        "--on-hang", metavar="dump|stop", rich_help_panel=FAILURE,
        help="dump (stacks, keep waiting) or stop (stacks, then stop every "
             "node: exit 125); default dump, stop with --restarts.")] = None,
    restarts: Annotated[int, typer.Option(
        "--restarts", min=0, metavar="N", rich_help_panel=FAILURE,
        help="Relaunch the whole gang up to N times after a failure, "
             "from the script's own checkpoint; a lost or faulty node is fenced (a spare takes "
             "its place), a deterministic error is not retried (docs/restarts.md).")] = 0,
    nnodes: Annotated[str | None, typer.Option(
        "--nnodes", "--num_nodes", "--num-nodes", metavar="K|MIN:MAX", rich_help_panel=LAUNCH,
        help="K or MIN:MAX (torchrun's spelling): use the first K (MAX) usable "
             "hosts, keep the rest as spares; with --restarts a run shrinks down to MIN when no "
             "spare is left.")] = None,
    restart_backoff: Annotated[float, typer.Option(
        "--restart-backoff", min=0, metavar="SECONDS", rich_help_panel=FAILURE,
        help="Seconds before the first relaunch, doubled for "
             "each next one, at most 30 (or this value, if larger).")] = 1.0,
    heartbeat_timeout: HeartbeatTimeoutOpt = defaults.HEARTBEAT_TIMEOUT_S,
    fanout: FanoutOpt = defaults.FANOUT,
    connect_timeout: ConnectTimeoutOpt = defaults.CONNECT_TIMEOUT_S,
    accept_new: AcceptNewOpt = False,
    user: groups.UserOpt = None,
    ssh_option: groups.SshOptionOpt = None,
    transport: TransportOpt = "auto",
    color: ColorOpt = None,
    raw: RawOpt = False,
    detach: Annotated[bool, typer.Option("--detach", rich_help_panel=LAUNCH,
                                         help="Once every node's job has "
                                              "started, leave the terminal: the run survives "
                                              "logout; `dtrain attach`, `ps`, `stop`.")] = False,
    sample_interval: SampleIntervalOpt = 10.0,
    straggler_window: StragglerWindowOpt = 30.0,
    straggler_hold: StragglerHoldOpt = 30.0,
    straggler_ratio: StragglerRatioOpt = 2.0,
    image: groups.ImageOpt = None,
    container_runtime: groups.ContainerRuntimeOpt = None,
    mount: groups.MountOpt = None,
    container_arg: groups.ContainerArgOpt = None,
) -> None:
    """torchrun on every node: node ranks, a validated master, per-node NCCL/GLOO env.

    Exit codes: the first failing rank's code (128+N for signal N), 130 Ctrl-C or `dtrain
    stop`, 143 SIGTERM, 129 SIGHUP (closing the terminal stops a run that is not detached),
    124 --timeout, 255 a node unreachable or lost, 2 bad input. With --detach: 0 once started
    (the run's own code is in its meta.json and `dtrain ps`).

    Example:

      dtrain run -f hosts --nproc-per-node gpu train.py --epochs 3
    """
    values = dict(locals())  # every parameter, as typer parsed it (runconfig.RunArgs)

    def body() -> int:
        from launcher.cli.runconfig import RunArgs, check_run_args, read_run_inputs, run_config
        from launcher.commands.run import run_sync

        a = RunArgs.of(values)
        check_run_args(a)  # a bad option before any file is read
        inputs = read_run_inputs(a)
        req, opts, settings = run_config(a, inputs)
        groups.warn_secret_env(a.env)
        if detach and not dry_run:
            from launcher.commands.detach import Detacher, run_detached

            detacher = Detacher.from_env()
            if detacher is None:  # the parent: the child does the run (see commands/detach)
                return run_detached(sys.argv[1:], archive_hint(archive_dir))
            return run_sync(list(inputs.hosts), req, opts, settings, detacher)
        return run_sync(list(inputs.hosts), req, opts, settings)

    run_body(body)
