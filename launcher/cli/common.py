"""What every command shares: the host and SSH option types, host resolution, SSH settings,
and ``run_body``, the one place that turns a DtrainError into a message and an exit code
(anything else is a bug and shows a traceback). Command modules import this; nothing here
imports a command module, so the CLI has no import circle.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup

from launcher.cli import coerce
from launcher.cli.completion import complete_hostfile
from launcher.errors import DtrainError

# Everything after the first positional (the script, the remote command) belongs to it; an
# unknown option *before* it is a typo and an error (never the script's name).
PASSTHROUGH = {"allow_interspersed_args": False}


def _click_exceptions() -> Any:
    """click's exception module as typer uses it (typer >= 0.20 vendors click as _click)."""
    try:
        return importlib.import_module("typer._click.exceptions")
    except ImportError:  # older typer: plain click
        return importlib.import_module("click.exceptions")


def no_such_option(name: str, possibilities: Sequence[str] | None) -> str:
    """`no such option --nproc-per-nod (did you mean --nproc-per-node?)`."""
    if possibilities:  # best match first (difflib)
        return f"no such option {name} (did you mean {possibilities[0]}?)"
    return (f"no such option {name} (options for the script or command go after it, "
            "options for dtrain before it)")


def _no_flag_metavars(params: list[Any]) -> list[Any]:
    """A flag takes no value: no `<bool>` in its help row (typer >= 0.2x prints one)."""
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    return params


class DtrainGroup(TyperGroup):
    """typer's group without `<bool>` on its flags (--help, --version)."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _no_flag_metavars(super().get_params(ctx))

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        coerce.install(self.get_params(ctx))
        return super().parse_args(ctx, args)


class DtrainCommand(TyperCommand):
    """typer's command with dtrain's wording for an unknown option and no `<bool>` on flags."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _no_flag_metavars(super().get_params(ctx))

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        coerce.install(self.get_params(ctx))  # no pydantic for plain values (cli/coerce.py)
        exceptions = _click_exceptions()
        try:
            return super().parse_args(ctx, args)
        except exceptions.NoSuchOption as exc:
            raise exceptions.UsageError(no_such_option(exc.option_name, exc.possibilities),
                                        ctx=ctx) from None

HostfileOpt = Annotated[str | None, typer.Option(
    "-f", "--hostfile", envvar="DTRAIN_HOSTFILE", show_envvar=True,
    autocompletion=complete_hostfile,
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


ArchiveDirOpt = Annotated[str, typer.Option(
    "--archive-dir", envvar="DTRAIN_ARCHIVE_DIR", show_envvar=True,
    help="Where run archives are.")]
DEFAULT_ARCHIVE_DIR = "dtrain-runs"


def archive_hint(archive_dir: str) -> str:
    """The ``--archive-dir`` to repeat in a suggested command ('' for the default)."""
    import os
    import shlex

    if archive_dir == DEFAULT_ARCHIVE_DIR or os.environ.get("DTRAIN_ARCHIVE_DIR") == archive_dir:
        return ""
    return f" --archive-dir {shlex.quote(os.path.abspath(archive_dir))}"


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
