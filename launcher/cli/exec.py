"""`dtrain exec`: a command on every node, output tagged by host (the pdsh replacement)."""

from __future__ import annotations

from typing import Annotated

import typer

from launcher import defaults
from launcher.cli import groups
from launcher.cli.common import run_body
from launcher.cli.groups import (
    FAILURE,
    AcceptNewOpt,
    ColorOpt,
    ConnectTimeoutOpt,
    ExcludeOpt,
    FanoutOpt,
    HeartbeatTimeoutOpt,
    HostfileOpt,
    HostsOpt,
    IncludeOpt,
    RawOpt,
    SupervisorPythonOpt,
    TimestampsOpt,
    TransportOpt,
)

JsonOpt = Annotated[bool, groups.json_opt(
    "One JSON document (dtrain.exec/1) on stdout at the end; the output goes to stderr.")]
JunitOpt = Annotated[str | None, groups.junit_opt(
    "Write JUnit XML to this file (a testcase per node).")]


def exec_cmd(
    command: Annotated[list[str], typer.Argument(
        metavar="COMMAND",
        help="One argument: a shell command line for the remote shell ('nvidia-smi | grep "
             "MiB'). Several: an argv that arrives exactly as typed, no shell "
             "(-- printf '%s|' 'a b' '$HOME' prints `a b|$HOME|`).")],
    hostfile: HostfileOpt = None,
    hosts: HostsOpt = None,
    include: IncludeOpt = None,
    exclude: ExcludeOpt = None,
    group: groups.GroupOpt = None,
    exclude_group: groups.ExcludeGroupOpt = None,
    genders: groups.GendersOpt = None,
    gather: Annotated[bool, typer.Option(
        "--gather", "-b", rich_help_panel=groups.DISPLAY,
        help="Print each distinct output once under the folded host set (dshbak -c).")
    ] = False,
    timeout: Annotated[float | None, typer.Option(
        "--timeout", min=0.1, metavar="SECONDS", rich_help_panel=FAILURE,
        help="Kill the command everywhere after this many seconds (exit 124).")] = None,
    grace: Annotated[float, typer.Option(
        "--grace", min=0, metavar="SECONDS", rich_help_panel=FAILURE,
        help="TERM -> KILL delay when stopping (timeout, Ctrl-C).")] = defaults.EXEC_GRACE_S,
    no_prefix: Annotated[bool, typer.Option(
        "-N", "--no-prefix", rich_help_panel=groups.DISPLAY,
        help="Print the nodes' lines without the host in front (pdsh's -N).")] = False,
    heartbeat_timeout: HeartbeatTimeoutOpt = defaults.HEARTBEAT_TIMEOUT_S,
    fanout: FanoutOpt = defaults.FANOUT,
    connect_timeout: ConnectTimeoutOpt = defaults.CONNECT_TIMEOUT_S,
    accept_new: AcceptNewOpt = False,
    user: groups.UserOpt = None,
    ssh_option: groups.SshOptionOpt = None,
    persist: groups.PersistOpt = None,
    verbose: groups.VerboseOpt = False,
    transport: TransportOpt = "auto",
    python: SupervisorPythonOpt = "python3",
    color: ColorOpt = None,
    raw: RawOpt = False,
    as_json: JsonOpt = False,
    junit: JunitOpt = None,
    timestamps: TimestampsOpt = False,
    image: groups.ImageOpt = None,
    container_runtime: groups.ContainerRuntimeOpt = None,
    mount: groups.MountOpt = None,
    container_arg: groups.ContainerArgOpt = None,
) -> None:
    """Run a command on every node; output tagged by host; exit = the largest remote code.

    Use `--` before the command. Exit codes: 0 all succeeded; the largest remote exit code;
    124 --timeout; 255 a node could not be reached; 2 bad input.

    Example:

      dtrain exec -w node[1-4] -- nvidia-smi -L
    """
    values = dict(locals())  # every parameter, as typer parsed it (runconfig.ExecArgs)

    def body() -> int:
        from launcher.cli.args import ExecArgs, exec_config
        from launcher.commands.exec import run_exec

        a = ExecArgs.of(values)
        req, settings = exec_config(a)  # every check before the host list is read
        return run_exec(a.read_hosts(), req, settings)

    run_body(body)
