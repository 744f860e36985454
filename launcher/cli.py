"""The typer app: parse options, call one function, render, exit.

Heavy modules (asyncssh, rich tables, the orchestrator) are imported inside the commands so
`dtrain --help` stays fast. Every command goes through ``_run``, the one place that turns a
DtrainError into a message and an exit code; anything else is a bug and shows a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
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
    timeout: Annotated[float | None, typer.Option("--timeout", min=0.1, help="Kill the "
                                                  "command everywhere after S s (exit 124).")] = None,
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
                          fanout=fanout, python=python, color=color)
        return run_exec(host_list, req, _ssh_settings(connect_timeout, accept_new))

    _run(body)


def _register_subapps() -> None:
    from launcher.cli_keys import keys_app

    app.add_typer(keys_app, name="keys", help="Passwordless SSH bootstrap for every node.")


def main() -> None:
    """Console-script entry point."""
    _register_subapps()
    app()


if __name__ == "__main__":
    sys.exit(main())
