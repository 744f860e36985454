"""The parsed command lines' shared parts and `exec`'s own (issue 35 item 4): small, since
`dtrain exec` is the hot path (its start is measured: bench/bench_persist.py,
tests/test_cli_lean.py) and every dataclass costs its import.

- :class:`Parsed`: a command's parsed command line, a frozen dataclass made from the command
  function's parameters (``XArgs.of(locals())``);
- :class:`HostArgs` (the hosts group of cli/groups.py, with ``read_hosts``: the I/O) and
  :class:`ConnArgs` (the connection group, with ``settings``), declared once;
- :class:`ExecArgs` and :func:`exec_config`: exec's command line into its ``ExecRequest``.

`run`'s are in cli/runconfig.py (it also reads files before it decides), the other commands'
in cli/configs.py. Each ``x_config`` is pure: every check of the options (exit 2 naming the
option, before any host is read or anything connects), then the request and SSH settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self

from launcher import defaults


class Parsed:
    """A command's parsed command line (a frozen dataclass of its parameters)."""

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> Self:
        """From the command function's parameters (its ``locals()``), every one a field."""
        fields = cls.__dataclass_fields__  # type: ignore[attr-defined]
        return cls(**{k: values[k] for k in fields if k in values})


@dataclass(frozen=True, kw_only=True)
class HostArgs(Parsed):
    """The hosts group (cli/groups.py): which hosts, and ``-l USER``."""

    hostfile: str | None = None
    hosts: str | None = None
    include: str | None = None
    exclude: str | None = None
    group: str | None = None
    exclude_group: str | None = None
    genders: str | None = None
    user: str | None = None

    def read_hosts(self) -> list[Any]:
        """The host list these options name (I/O: exit 2 with the hostfile's line)."""
        from launcher.cli import groups

        return groups.hosts(self.hostfile, self.hosts, self.include, self.exclude,
                            user=self.user, group=self.group,
                            exclude_group=self.exclude_group, genders=self.genders)


@dataclass(frozen=True, kw_only=True)
class ConnArgs(Parsed):
    """The connection group (cli/groups.py); ``persist`` and ``verbose`` stay at their
    defaults for the commands that do not take them."""

    fanout: int = defaults.FANOUT
    connect_timeout: float = defaults.CONNECT_TIMEOUT_S
    accept_new: bool = False
    ssh_option: list[str] | None = None
    transport: str = "auto"
    persist: str | None = None
    verbose: bool = False

    def settings(self) -> Any:
        """The SSH settings (a bad -o, --persist or --transport: exit 2)."""
        from launcher.cli import groups

        groups.check_transport(self.transport)
        return groups.connection(self.connect_timeout, self.accept_new, self.ssh_option,
                                 persist=self.persist, verbose=self.verbose)


# ---------------------------------------------------------------------------------- exec


@dataclass(frozen=True, kw_only=True)
class ExecArgs(HostArgs, ConnArgs):
    """`dtrain exec`'s parsed command line, as typer gives it (``cli/exec.py`` ``exec_cmd``).
    Its only I/O is the host list (``read_hosts``), read by exec_cmd after exec_config."""

    command: list[str]
    gather: bool = False
    timeout: float | None = None
    grace: float = defaults.EXEC_GRACE_S
    no_prefix: bool = False
    heartbeat_timeout: float = defaults.HEARTBEAT_TIMEOUT_S
    python: str = "python3"
    color: bool | None = None
    raw: bool = False
    as_json: bool = False
    junit: str | None = None
    timestamps: bool = False
    image: str | None = None
    container_runtime: str | None = None
    mount: list[str] | None = None
    container_arg: list[str] | None = None


def exec_config(a: ExecArgs) -> tuple[Any, Any]:
    """Pure: every check of exec's options (exit 2 naming them) and its ``ExecRequest`` and
    SSH settings; nothing is read."""
    from launcher.cli import groups
    from launcher.commands.exec import ExecRequest
    from launcher.errors import UsageError

    groups.node(a.python)
    if a.no_prefix and a.gather:
        raise UsageError("-N does not go with --gather: the gathered outputs are "
                         "printed under their hosts", hint="use one of them")
    if a.timestamps and a.gather:
        raise UsageError("--timestamps does not go with --gather: the gathered outputs "
                         "are printed once, grouped across hosts, after the job",
                         hint="use one of them")
    req = ExecRequest(command=tuple(a.command), gather=a.gather, timeout=a.timeout,
                      fanout=a.fanout, python=a.python, color=a.color, raw=a.raw,
                      grace=a.grace, heartbeat_timeout=a.heartbeat_timeout,
                      transport=a.transport, as_json=a.as_json, junit=a.junit,
                      timestamps=a.timestamps, prefix=not a.no_prefix,
                      container=groups.container(a.image, a.container_runtime, a.mount,
                                                 a.container_arg))
    settings = a.settings()
    return req, settings
