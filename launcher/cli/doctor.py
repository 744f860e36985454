"""`dtrain doctor` (registered on the main app by launcher.cli).

Only option parsing lives here; the checks are in launcher.decide, the I/O and the table in
launcher.commands.doctor,
imported inside the command so `dtrain --help` stays fast.
"""

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


def doctor_cmd(
    hostfile: HostfileOpt = None,
    hosts: HostsOpt = None,
    include: IncludeOpt = None,
    exclude: ExcludeOpt = None,
    python: Annotated[str, typer.Option("--python", help="Python on the nodes, as for `run` "
                                        "(a host's python= key wins).")] = "python3",
    setup: Annotated[str | None, typer.Option("--setup", help="Shell snippet run first on "
                                              "each node (`source venv/bin/activate`).")] = None,
    master_addr: Annotated[str | None, typer.Option("--master-addr", help="Test this master "
                                                    "address instead of choosing one.")] = None,
    master_port: Annotated[int | None, typer.Option("--master-port", min=1, max=65535,
                                                    help="Test this port (default: any free "
                                                         "one, as `run` picks).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document (dtrain.doctor/1) "
                                          "on stdout; the table goes to stderr.")] = False,
    junit: Annotated[str | None, typer.Option("--junit", help="Write JUnit XML here (a "
                                              "testcase per node and check).")] = None,
    strict: Annotated[bool, typer.Option("--strict", help="Warnings fail too (exit 1).")]
    = False,
    probe_timeout: Annotated[float, typer.Option("--probe-timeout", min=1, help="Seconds for "
                                                 "one node's probe.")] = 30.0,
    fanout: FanoutOpt = 64,
    connect_timeout: ConnectTimeoutOpt = 10.0,
    accept_new: AcceptNewOpt = False,
    transport: TransportOpt = "auto",
    color: Annotated[bool | None, typer.Option("--color/--no-color", help="Rich table or "
                                               "plain columns (default: rich on a "
                                               "terminal or with FORCE_COLOR, never "
                                               "with NO_COLOR).")] = None,
) -> None:
    """Check every node before a launch: ssh, python, torch, GPUs, network, RDMA, limits.

    One row per node and check (ok / warn / FAIL / skip). Exit codes: 0 nothing failed
    (warnings allowed unless --strict); 1 some check failed; 255 some node could not be
    reached; 2 bad input.
    """
    def body() -> int:
        from launcher.commands.doctor import DoctorOptions, run_doctor
        from launcher.nodeside.wire import check_value

        check_value(python, "--python", python=True)
        host_list = resolve(hostfile, hosts, include, exclude)
        opts = DoctorOptions(python=python, setup=setup, master_addr=master_addr,
                             master_port=master_port, fanout=fanout,
                             probe_timeout=probe_timeout, transport=transport)
        return run_doctor(host_list, opts, ssh_settings(connect_timeout, accept_new),
                          as_json=as_json, junit=junit, strict=strict, color=color)

    run_body(body)

