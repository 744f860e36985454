"""The typer app: parse options, call one function, render, exit.

Heavy modules (asyncssh, rich tables, the orchestrator) are imported inside the commands so
`dtrain --help` stays fast. Every command goes through ``_run``, the one place that turns a
DtrainError into a message and an exit code; anything else is a bug and shows a traceback.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from launcher import __version__
from launcher.errors import DtrainError

app = typer.Typer(
    name="dtrain", no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False,
    help="Multi-node PyTorch launcher over SSH: exec (the pdsh replacement), run (torchrun on "
         "every node), keys, doctor, logs.",
)

PASSTHROUGH = {"allow_interspersed_args": False, "ignore_unknown_options": True}

HostfileOpt = Annotated[str | None, typer.Option(
    "-f", "--hostfile", envvar="DTRAIN_HOSTFILE", show_envvar=True,
    help="Hostfile: text (`[user@]host[:port] slots=N`, ranges like gpu[01-16]) or YAML.")]
HostsOpt = Annotated[str | None, typer.Option(
    "-H", "--hosts", help="Hosts, pdsh style: 'dtuser@node[1-4],login2:2222'.")]
IncludeOpt = Annotated[str | None, typer.Option("--include", help="Keep only these hosts "
                                                "(hostlist expression).")]
ExcludeOpt = Annotated[str | None, typer.Option("--exclude", help="Drop these hosts.")]
FanoutOpt = Annotated[int, typer.Option("--fanout", min=1, help="Connections opened at once.")]
ConnectTimeoutOpt = Annotated[float, typer.Option("--connect-timeout", min=0.1,
                                                  help="Seconds to connect to one node.")]
AcceptNewOpt = Annotated[bool, typer.Option(
    "--accept-new", help="Record unknown host keys in ~/.ssh/known_hosts (never changed ones).")]


def _run(fn: Callable[[], int]) -> None:
    """Run a command body: DtrainError -> message on stderr + its exit code."""
    try:
        code = fn()
    except DtrainError as exc:
        from launcher import render

        render.error(exc)
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    raise typer.Exit(code)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"dtrain {__version__}")
        raise typer.Exit(0)


@app.callback()
def main_callback(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Show the version and exit.")] = False,
) -> None:
    """dtrain: launch and supervise multi-node jobs over SSH."""


def _hosts(hostfile: str | None, hosts: str | None, include: str | None,
           exclude: str | None) -> list[Any]:
    from launcher.hostfile import resolve_hosts

    return resolve_hosts(hostfile=hostfile, hosts=hosts, include=include, exclude=exclude)


def _ssh_settings(connect_timeout: float, accept_new: bool, **extra: Any) -> Any:
    from launcher.transports.ssh import SSHSettings

    return SSHSettings(connect_timeout=connect_timeout, accept_new=accept_new, **extra)


@app.command("exec", context_settings=PASSTHROUGH)
def exec_cmd(
    command: Annotated[list[str], typer.Argument(
        help="One argument: a shell command line for the remote shell ('nvidia-smi | grep "
             "MiB'). Several: an argv that arrives exactly as typed, no shell "
             "(-- printf '%s|' 'a b' '$HOME' prints `a b|$HOME|`).")],
    hostfile: HostfileOpt = None,
    hosts: HostsOpt = None,
    include: IncludeOpt = None,
    exclude: ExcludeOpt = None,
    gather: Annotated[bool, typer.Option("--gather", "-b", help="Print each distinct output "
                                         "once under the folded host set (dshbak -c).")] = False,
    timeout: Annotated[float | None, typer.Option(
        "--timeout", min=0.1, help="Kill the command everywhere after S s (exit 124).")] = None,
    grace: Annotated[float, typer.Option("--grace", min=0, help="TERM -> KILL delay when "
                                         "stopping (timeout, Ctrl-C).")] = 2.0,
    heartbeat_timeout: Annotated[float, typer.Option(
        "--heartbeat-timeout", min=1, help="Declare a silent node lost after S s.")] = 30.0,
    fanout: FanoutOpt = 64,
    connect_timeout: ConnectTimeoutOpt = 10.0,
    accept_new: AcceptNewOpt = False,
    python: Annotated[str, typer.Option("--python", help="Interpreter for dtrain's node "
                                        "supervisor (any Python >= 3.8).")] = "python3",
    color: Annotated[bool | None, typer.Option("--color/--no-color", help="Force colours "
                                               "on or off (default: on a terminal).")] = None,
) -> None:
    """Run a command on every node; output tagged by host; exit = the largest remote code.

    Use `--` before the command. Exit codes: 0 all succeeded; the largest remote exit code;
    124 --timeout; 255 a node could not be reached; 2 bad input.
    """
    def body() -> int:
        from launcher.execjob import ExecRequest, run_exec

        host_list = _hosts(hostfile, hosts, include, exclude)
        req = ExecRequest(command=tuple(command), gather=gather, timeout=timeout,
                          fanout=fanout, python=python, color=color, grace=grace,
                          heartbeat_timeout=heartbeat_timeout)
        return run_exec(host_list, req, _ssh_settings(connect_timeout, accept_new))

    _run(body)


@app.command("run", context_settings=PASSTHROUGH)
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
    env: Annotated[list[str] | None, typer.Option("--env", "-e", help="K=V for every rank "
                                                  "(repeatable; wins over site config).")] = None,
    env_file: Annotated[str | None, typer.Option("--env-file", help="dotenv file.")] = None,
    master_addr: Annotated[str | None, typer.Option("--master-addr")] = None,
    master_port: Annotated[int | None, typer.Option("--master-port", min=1, max=65535)] = None,
    rdzv: Annotated[str, typer.Option("--rdzv", help="static (deterministic ranks) or c10d "
                                      "(elastic).")] = "static",
    max_restarts: Annotated[int, typer.Option("--max-restarts", min=0)] = 0,
    module: Annotated[bool, typer.Option("-m", "--module", help="SCRIPT is a module.")] = False,
    archive_dir: Annotated[str, typer.Option("--archive-dir", envvar="DTRAIN_ARCHIVE_DIR",
                                             help="Where run archives go.")] = "dtrain-runs",
    run_id: Annotated[str | None, typer.Option("--run-id", help="Name the run.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Probe and print each node's "
                                          "command and environment; start nothing.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable dry run.")] = False,
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
    start_timeout: Annotated[float, typer.Option("--start-timeout", min=1)] = 120.0,
    heartbeat_timeout: Annotated[float, typer.Option("--heartbeat-timeout", min=1)] = 30.0,
    fanout: FanoutOpt = 64,
    connect_timeout: ConnectTimeoutOpt = 10.0,
    accept_new: AcceptNewOpt = False,
    color: Annotated[bool | None, typer.Option("--color/--no-color")] = None,
) -> None:
    """torchrun on every node: node ranks, a validated master, per-node NCCL/GLOO env.

    Exit codes: the first failing rank's code (128+N for signal N), 130 Ctrl-C, 143 SIGTERM,
    124 --timeout, 255 a node unreachable or lost, 2 bad input.
    """
    def body() -> int:
        from launcher.envfile import load_env_file, parse_env_args
        from launcher.errors import UsageError
        from launcher.plan import RunOptions, RunRequest
        from launcher.runjob import default_workdir, run_sync

        if rdzv not in ("static", "c10d"):
            raise UsageError(f"--rdzv {rdzv!r}: use static or c10d")
        host_list = _hosts(hostfile, hosts, include, exclude)
        pairs = load_env_file(env_file) if env_file else []
        pairs += parse_env_args(env or [])
        profile_env = None
        if profile:
            from launcher.netenv import load_profile

            profile_env = load_profile(profile)
        rank_set = None
        if ranks:
            try:
                rank_set = frozenset(int(r) for r in ranks.split(",") if r.strip())
            except ValueError:
                raise UsageError(f"--ranks {ranks!r}: expected numbers like 0,3") from None
        host_set = frozenset(h.label for h in _hosts(None, hosts_filter, None, None)) \
            if hosts_filter else None
        req = RunRequest(script=script, args=tuple(args or ()), module=module,
                         nproc_per_node=nproc_per_node, python=python, setup=setup,
                         workdir=workdir or default_workdir(), env=tuple(pairs),
                         master_addr=master_addr, master_port=master_port, rdzv=rdzv,
                         max_restarts=max_restarts, run_id=run_id or "")
        opts = RunOptions(fanout=fanout, grace=grace, timeout=timeout,
                          start_timeout=start_timeout, heartbeat_timeout=heartbeat_timeout,
                          archive_dir=Path(archive_dir), dry_run=dry_run, as_json=as_json,
                          color=color, ranks=rank_set, hosts_filter=host_set,
                          profile=profile_env, profile_name=Path(profile).stem if profile
                          else "profile", no_auto=frozenset(no_auto or ()),
                          preflight=preflight)
        return run_sync(host_list, req, opts, _ssh_settings(connect_timeout, accept_new))

    _run(body)


@app.command("logs")
def logs_cmd(
    run: Annotated[str | None, typer.Argument(
        help="Run id or directory (default: latest).")] = None,
    archive_dir: Annotated[str, typer.Option("--archive-dir", envvar="DTRAIN_ARCHIVE_DIR")]
    = "dtrain-runs",
    rank: Annotated[list[int] | None, typer.Option("--rank", help="Only this rank "
                                                   "(repeatable).")] = None,
    host: Annotated[str | None, typer.Option("--host", help="Only these hosts.")] = None,
    grep: Annotated[str | None, typer.Option("--grep", help="Regular expression.")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-F", help="Tail a running job.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the archived objects.")] = False,
    color: Annotated[bool | None, typer.Option("--color/--no-color")] = None,
) -> None:
    """Replay a run archive with the live console's tags and filters."""
    def body() -> int:
        from launcher.archive import resolve_run
        from launcher.logview import replay

        run_dir = resolve_run(Path(archive_dir), run)
        return replay(run_dir, ranks=set(rank) if rank else None, host=host, grep=grep,
                      follow=follow, as_json=as_json, color=color)

    _run(body)


def _register_subapps() -> None:
    from launcher.cli_keys import keys_app

    app.add_typer(keys_app, name="keys", help="Passwordless SSH bootstrap for every node.")
    try:
        from launcher.cli_doctor import register
    except ImportError:  # doctor not built yet
        return
    register(app)


def main() -> None:
    """Console-script entry point."""
    _register_subapps()
    app()


if __name__ == "__main__":
    main()
