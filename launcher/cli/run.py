"""`dtrain run`: torchrun on every node with per-node network environment."""

from __future__ import annotations

import sys
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
    TransportOpt,
    archive_hint,
    resolve,
    run_body,
    ssh_settings,
)
from launcher.cli.watching import (
    SampleIntervalOpt,
    StragglerHoldOpt,
    StragglerRatioOpt,
    StragglerWindowOpt,
)
from launcher.decide.hang import DEFAULT_HANG_TIMEOUT


def run_cmd(
    script: Annotated[str, typer.Argument(help="Training script (or module with -m).")],
    args: Annotated[list[str] | None, typer.Argument(help="Script arguments, untouched.")] = None,
    hostfile: HostfileOpt = None,
    hosts: HostsOpt = None,
    include: IncludeOpt = None,
    exclude: ExcludeOpt = None,
    nproc_per_node: Annotated[str | None, typer.Option(
        "--nproc-per-node",
        help="N, gpu or auto (default: the hostfile's slots, else gpu).")] = None,
    python: Annotated[str, typer.Option("--python", help="Python on the nodes (a host's "
                                        "python= key wins).")] = "python3",
    setup: Annotated[str | None, typer.Option("--setup", help="Shell snippet run first on "
                                              "each node (`source venv/bin/activate`).")] = None,
    workdir: Annotated[str | None, typer.Option("--workdir", help="Remote working directory "
                                                "(default: the current one).")] = None,
    env: Annotated[list[str] | None, typer.Option(
        "--env", "-e", help="K=V for every rank, or NAME alone: its value from this "
        "environment (use that or --env-file for secrets: a command line shows in ps). "
        "Repeatable; wins over site config.")] = None,
    env_file: Annotated[str | None, typer.Option("--env-file", help="dotenv file (NAME=VALUE "
                                                 "lines); the way to pass many secrets.")] = None,
    master_addr: Annotated[str | None, typer.Option(
        "--master-addr", help="Rendezvous address (default: node 0's address every node "
                              "reaches, probed).")] = None,
    master_port: Annotated[int | None, typer.Option(
        "--master-port", min=1, max=65535, help="Rendezvous port (default: a free one on "
                                                "node 0, checked from every node).")] = None,
    rdzv: Annotated[str, typer.Option("--rdzv", help="static (deterministic ranks) or c10d "
                                      "(elastic).")] = "static",
    max_restarts: Annotated[int, typer.Option("--max-restarts", min=0, help="torchrun "
                                              "restarts of the worker group.")] = 0,
    module: Annotated[bool, typer.Option("-m", "--module", help="SCRIPT is a module.")] = False,
    archive_dir: Annotated[str, typer.Option("--archive-dir", envvar="DTRAIN_ARCHIVE_DIR",
                                             help="Where run archives go.")] = "dtrain-runs",
    run_id: Annotated[str | None, typer.Option("--run-id", help="Name the run.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Probe and print each node's "
                                          "command and environment; start nothing.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout: the "
                                          "plan with --dry-run, else the result "
                                          "(dtrain.run/1); human output to stderr.")] = False,
    junit: Annotated[str | None, typer.Option("--junit", help="Write the result as JUnit "
                                              "XML here.")] = None,
    timestamps: Annotated[bool, typer.Option("--timestamps", help="Start each output line "
                                             "with the time dtrain received it "
                                             "(2026-11-30T12:34:56.789, local time).")
                          ] = False,
    ranks: Annotated[str | None, typer.Option("--ranks", help="Console shows only these "
                                              "ranks (0,3); the archive keeps all.")] = None,
    hosts_filter: Annotated[str | None, typer.Option("--hosts-filter", help="Console shows "
                                                     "only these hosts.")] = None,
    profile: Annotated[str | None, typer.Option("--profile", help="Fabric profile YAML "
                                                "(NCCL_IB_TC, ...).")] = None,
    no_auto: Annotated[list[str] | None, typer.Option("--no-auto", help="Do not set this "
                                                      "detected variable (repeatable).")] = None,
    preflight: Annotated[bool, typer.Option("--preflight/--no-preflight", help="Run doctor's "
                                            "fast checks first (torch, python, hostnames, "
                                            "shm, memlock).")] = True,
    grace: Annotated[float, typer.Option("--grace", min=0, help="TERM -> KILL delay when "
                                         "stopping.")] = 10.0,
    timeout: Annotated[float | None, typer.Option("--timeout", min=0.1, help="Whole job "
                                                  "limit in s (exit 124).")] = None,
    start_timeout: Annotated[float, typer.Option(
        "--start-timeout", min=1, help="Seconds for every node to start (exit 124, node "
                                       "named).")] = 120.0,
    hang_timeout: Annotated[float, typer.Option(
        "--hang-timeout", min=0, help="Declare a hang when no rank made progress for S s "
        "while every rank is alive: every rank's stacks, folded, the culprit named "
        "(0 = off; docs/hangs.md).")] = DEFAULT_HANG_TIMEOUT,
    progress: Annotated[str | None, typer.Option(
        "--progress", help="REGEX: the output lines that show progress (default: step, "
        "iteration, epoch, loss lines and progress bars).")] = None,
    on_hang: Annotated[str | None, typer.Option(
        "--on-hang", help="dump (stacks, keep waiting) or stop (stacks, then stop every "
        "node: exit 125); default dump, stop with --restarts.")] = None,
    restarts: Annotated[int, typer.Option(
        "--restarts", min=0, help="Relaunch the whole gang up to N times after a failure, "
        "from the script's own checkpoint; a lost or faulty node is fenced (a spare takes "
        "its place), a deterministic error is not retried (docs/restarts.md).")] = 0,
    nnodes: Annotated[str | None, typer.Option(
        "--nnodes", help="K or MIN:MAX (torchrun's spelling): use the first K (MAX) usable "
        "hosts, keep the rest as spares; with --restarts a run shrinks down to MIN when no "
        "spare is left.")] = None,
    restart_backoff: Annotated[float, typer.Option(
        "--restart-backoff", min=0, help="Seconds before the first relaunch, doubled for "
        "each next one, at most 30 (or this value, if larger).")] = 1.0,
    heartbeat_timeout: Annotated[float, typer.Option(
        "--heartbeat-timeout", min=1, help="Declare a silent node lost after S s "
                                           "(exit 255).")] = 30.0,
    fanout: FanoutOpt = 64,
    connect_timeout: ConnectTimeoutOpt = 10.0,
    accept_new: AcceptNewOpt = False,
    transport: TransportOpt = "auto",
    color: Annotated[bool | None, typer.Option("--color/--no-color", help="Force colours "
                                               "on or off (default: on a terminal).")] = None,
    raw: Annotated[bool, typer.Option("--raw", help="Pass the nodes' bytes to the terminal "
                                      "as they are (default: only colours pass, other "
                                      "control sequences are shown as ^[ ...).")] = False,
    detach: Annotated[bool, typer.Option("--detach", help="Once every node's job has "
                                         "started, leave the terminal: the run survives "
                                         "logout; `dtrain attach`, `ps`, `stop`.")] = False,
    sample_interval: SampleIntervalOpt = 10.0,
    straggler_window: StragglerWindowOpt = 30.0,
    straggler_hold: StragglerHoldOpt = 30.0,
    straggler_ratio: StragglerRatioOpt = 2.0,
) -> None:
    """torchrun on every node: node ranks, a validated master, per-node NCCL/GLOO env.

    Exit codes: the first failing rank's code (128+N for signal N), 130 Ctrl-C or `dtrain
    stop`, 143 SIGTERM, 129 SIGHUP (closing the terminal stops a run that is not detached),
    124 --timeout, 255 a node unreachable or lost, 2 bad input. With --detach: 0 once started
    (the run's own code is in its meta.json and `dtrain ps`).
    """
    def body() -> int:
        from launcher.commands.run import default_workdir, run_sync
        from launcher.decide.plan import RunOptions, RunRequest
        from launcher.decide.stragglers import StragglerSettings
        from launcher.errors import UsageError
        from launcher.hosts.envfile import from_environment, load_env_file, parse_env_args
        from launcher.nodeside.wire import check_value
        from launcher.output.redact import redact_command

        check_value(python, "--python", python=True)
        remote_dir = check_value(workdir, "--workdir") if workdir else check_value(
            default_workdir(), "the current directory (the default --workdir)")
        if rdzv not in ("static", "c10d"):
            raise UsageError(f"--rdzv {rdzv!r}: use static or c10d")
        from launcher.decide.hang import ON_HANG, HangPolicy, compile_progress

        if on_hang is not None and on_hang not in ON_HANG:
            raise UsageError(f"--on-hang {on_hang!r}: use dump or stop")
        from launcher.decide.restarts import RestartPolicy, parse_nnodes

        restart = RestartPolicy(restarts=restarts, count=parse_nnodes(nnodes),
                                backoff=restart_backoff)
        compile_progress(progress)  # a bad pattern: exit 2 before anything connects
        hang = HangPolicy(timeout=hang_timeout, progress=progress,
                          on_hang=on_hang or ("stop" if restarts else "dump"))
        host_list = resolve(hostfile, hosts, include, exclude)
        pairs = load_env_file(env_file) if env_file else []
        sources = {name: f"--env-file {env_file}" for name, _ in pairs}
        given = parse_env_args(env or [])
        sources.update((name, "--env") for name, _ in given)
        pairs += given
        hidden = from_environment(env or [])
        secrets = [*pairs, *(kv for h in host_list for kv in h.env)]
        command = redact_command(["dtrain", *sys.argv[1:]], env or [], secrets, hidden)
        profile_env = None
        if profile:
            from launcher.decide.netenv import load_profile

            profile_env = load_profile(profile)
        rank_set = None
        if ranks:
            try:
                rank_set = frozenset(int(r) for r in ranks.split(",") if r.strip())
            except ValueError:
                raise UsageError(f"--ranks {ranks!r}: expected numbers like 0,3") from None
        host_set = frozenset(h.label for h in resolve(None, hosts_filter, None, None)) \
            if hosts_filter else None
        req = RunRequest(script=script, args=tuple(args or ()), module=module,
                         nproc_per_node=nproc_per_node, python=python, setup=setup,
                         workdir=remote_dir, env=tuple(pairs), hidden_env=hidden,
                         env_sources=tuple(sources.items()),
                         master_addr=master_addr, master_port=master_port, rdzv=rdzv,
                         max_restarts=max_restarts, run_id=run_id or "")
        opts = RunOptions(fanout=fanout, grace=grace, timeout=timeout,
                          start_timeout=start_timeout, heartbeat_timeout=heartbeat_timeout,
                          archive_dir=Path(archive_dir), dry_run=dry_run, as_json=as_json,
                          color=color, raw=raw, ranks=rank_set, hosts_filter=host_set,
                          profile=profile_env, profile_name=Path(profile).stem if profile
                          else "profile", no_auto=frozenset(no_auto or ()),
                          preflight=preflight, command=tuple(command),
                          transport=transport, junit=junit, timestamps=timestamps,
                          hang=hang, restart=restart, sample_interval=sample_interval,
                          stragglers=StragglerSettings(window=straggler_window,
                                                       hold=straggler_hold,
                                                       ratio=straggler_ratio))
        settings = ssh_settings(connect_timeout, accept_new)
        if detach and not dry_run:
            from launcher.commands.detach import Detacher, run_detached

            detacher = Detacher.from_env()
            if detacher is None:  # the parent: the child does the run (see commands/detach)
                return run_detached(sys.argv[1:], archive_hint(archive_dir))
            return run_sync(host_list, req, opts, settings, detacher)
        return run_sync(host_list, req, opts, settings)

    run_body(body)
