"""`dtrain exec`: a command on every node, output tagged by host (the pdsh replacement)."""

from __future__ import annotations

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
    resolve,
    run_body,
    ssh_settings,
)


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
    transport: TransportOpt = "auto",
    python: Annotated[str, typer.Option("--python", help="Interpreter for dtrain's node "
                                        "supervisor (any Python >= 3.8).")] = "python3",
    color: Annotated[bool | None, typer.Option("--color/--no-color", help="Force colours "
                                               "on or off (default: on a terminal).")] = None,
    raw: Annotated[bool, typer.Option("--raw", help="Pass the nodes' bytes to the terminal "
                                      "as they are (default: only colours pass, other "
                                      "control sequences are shown as ^[ ...).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document (dtrain.exec/1) "
                                          "on stdout at the end; the output goes to stderr.")
                       ] = False,
    junit: Annotated[str | None, typer.Option("--junit", help="Write JUnit XML here (a "
                                              "testcase per node).")] = None,
    timestamps: Annotated[bool, typer.Option("--timestamps", help="Start each output line "
                                             "with the time dtrain received it "
                                             "(2026-11-30T12:34:56.789, local time).")
                          ] = False,
) -> None:
    """Run a command on every node; output tagged by host; exit = the largest remote code.

    Use `--` before the command. Exit codes: 0 all succeeded; the largest remote exit code;
    124 --timeout; 255 a node could not be reached; 2 bad input.
    """
    def body() -> int:
        from launcher.commands.exec import ExecRequest, run_exec
        from launcher.nodeside.wire import check_value

        check_value(python, "--python", python=True)
        if timestamps and gather:
            from launcher.errors import UsageError

            raise UsageError("--timestamps does not go with --gather: the gathered outputs "
                             "are printed once, grouped across hosts, after the job",
                             hint="use one of them")
        host_list = resolve(hostfile, hosts, include, exclude)
        req = ExecRequest(command=tuple(command), gather=gather, timeout=timeout,
                          fanout=fanout, python=python, color=color, raw=raw, grace=grace,
                          heartbeat_timeout=heartbeat_timeout, transport=transport,
                          as_json=as_json, junit=junit, timestamps=timestamps)
        return run_exec(host_list, req, ssh_settings(connect_timeout, accept_new))

    run_body(body)
