"""What every command shares: the host and SSH option types, host resolution, SSH settings,
and ``run_body``, the one place that turns a DtrainError into a message and an exit code
(anything else is a bug and shows a traceback). Command modules import this; nothing here
imports a command module, so the CLI has no import circle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import typer

from launcher.errors import DtrainError

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
TransportOpt = Annotated[str, typer.Option(
    "--transport", envvar="DTRAIN_TRANSPORT", show_envvar=True,
    help="ssh, srun, or auto: srun inside a Slurm allocation (srun on PATH, every host one of "
         "its nodes), SSH otherwise.")]
AcceptNewOpt = Annotated[bool, typer.Option(
    "--accept-new", help="Record unknown host keys in ~/.ssh/known_hosts (never changed ones).")]


def run_body(fn: Callable[[], int]) -> None:
    """Run a command body: DtrainError -> message on stderr + its exit code."""
    try:
        code = fn()
    except DtrainError as exc:
        from launcher.output import render

        render.error(exc)
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    raise typer.Exit(code)


def resolve(hostfile: str | None, hosts: str | None, include: str | None,
           exclude: str | None) -> list[Any]:
    from launcher.hosts.hostfile import resolve_hosts

    return resolve_hosts(hostfile=hostfile, hosts=hosts, include=include, exclude=exclude)


def ssh_settings(connect_timeout: float, accept_new: bool, **extra: Any) -> Any:
    from launcher.transports.ssh import SSHSettings

    return SSHSettings(connect_timeout=connect_timeout, accept_new=accept_new, **extra)
