"""`dtrain doctor` (registered on the main app by launcher.cli).

Only option parsing lives here; the checks are in launcher.decide, the I/O and the table in
launcher.commands.doctor,
imported inside the command so `dtrain --help` stays fast.
"""

from __future__ import annotations

from typing import Annotated

import typer

from launcher import defaults
from launcher.cli import groups
from launcher.cli.common import run_body
from launcher.cli.groups import (
    AcceptNewOpt,
    ConnectTimeoutOpt,
    ExcludeOpt,
    FanoutOpt,
    HostfileOpt,
    HostsOpt,
    IncludeOpt,
    PythonOpt,
    SetupOpt,
    TransportOpt,
)

CHECKS = "Checks"
JsonOpt = Annotated[bool, groups.json_opt(
    "One JSON document (dtrain.doctor/1) on stdout; the table goes to stderr.")]
JunitOpt = Annotated[str | None, groups.junit_opt(
    "Write JUnit XML to this file (a testcase per node and check).")]


def doctor_cmd(
    hostfile: HostfileOpt = None,
    hosts: HostsOpt = None,
    include: IncludeOpt = None,
    exclude: ExcludeOpt = None,
    group: groups.GroupOpt = None,
    exclude_group: groups.ExcludeGroupOpt = None,
    genders: groups.GendersOpt = None,
    python: PythonOpt = "python3",
    setup: SetupOpt = None,
    master_addr: Annotated[str | None, typer.Option(
        "--master-addr", metavar="ADDR", rich_help_panel=CHECKS,
        help="Test this master address instead of choosing one.")] = None,
    master_port: Annotated[int | None, typer.Option(
        "--master-port", min=1, max=65535, metavar="PORT", rich_help_panel=CHECKS,
        help="Test this port (default: any free one, as `run` picks).")] = None,
    as_json: JsonOpt = False,
    junit: JunitOpt = None,
    strict: Annotated[bool, typer.Option("--strict", rich_help_panel=CHECKS,
                                         help="Warnings fail too (exit 1).")] = False,
    failures: Annotated[bool, typer.Option(
        "--failures", rich_help_panel=groups.DISPLAY,
        help="Show only the FAIL and warn rows (failures first); the summary still counts "
             "every check.")] = False,
    per_node: Annotated[bool, typer.Option(
        "--per-node", rich_help_panel=groups.DISPLAY,
        help="One row per node and check (default: nodes with the same result are one row, "
             "node[1-4], FAIL rows first). --json always has every node's.")] = False,
    probe_timeout: Annotated[float, typer.Option(
        "--probe-timeout", min=1, metavar="SECONDS", rich_help_panel=CHECKS,
        help="Seconds for one node's probe.")] = 30.0,
    fanout: FanoutOpt = defaults.FANOUT,
    connect_timeout: ConnectTimeoutOpt = defaults.CONNECT_TIMEOUT_S,
    accept_new: AcceptNewOpt = False,
    user: groups.UserOpt = None,
    ssh_option: groups.SshOptionOpt = None,
    persist: groups.PersistOpt = None,
    verbose: groups.VerboseOpt = False,
    transport: TransportOpt = "auto",
    color: Annotated[bool | None, typer.Option("--color/--no-color",
                                               rich_help_panel=groups.DISPLAY,
                                               help="Rich table or "
                                                    "plain columns (default: rich on a "
                                                    "terminal or with FORCE_COLOR, never "
                                                    "with NO_COLOR).")] = None,
    image: groups.ImageOpt = None,
    container_runtime: groups.ContainerRuntimeOpt = None,
    health: Annotated[bool, typer.Option(
        "--health", rich_help_panel=CHECKS,
        help="The health gate instead (docs/fabric.md): GPU ECC, row remaps, retired pages, "
             "Xids, slowdown, temperature; IB/RoCE port state and error counters read twice; "
             "memlock, /dev/shm. Findings tiered isolate/reset/monitor; isolated nodes go on "
             "the lemon list. --json: dtrain.health/1. Exit 1: a node isolated.")] = False,
    dcgm: Annotated[int, typer.Option(
        "--dcgm", min=0, max=3, metavar="LEVEL", rich_help_panel=CHECKS,
        help="With --health: also `dcgmi diag -r LEVEL` where dcgmi exists (1: seconds, "
             "2: ~2 min, 3: ~15 min).")] = 0,
    health_interval: Annotated[float, typer.Option(
        "--health-interval", min=0, max=600, metavar="SECONDS", rich_help_panel=CHECKS,
        help="With --health: seconds between the two readings of the port counters.")] = 1.0,
) -> None:
    """Check every node before a launch: ssh, python, torch, GPUs, network, RDMA, limits.

    One row per check and result (ok / warn / FAIL / skip): nodes with the same result are
    one row (node[1-4]), FAIL rows first; --per-node gives one row per node and check.
    Exit codes: 0 nothing failed (warnings allowed unless --strict); 1 some check failed;
    255 some node could not be reached; 2 bad input.

    Example:

      dtrain doctor -f hosts --python ~/venv/bin/python
    """
    values = dict(locals())  # every parameter, as typer parsed it (configs.DoctorArgs)

    def body() -> int:
        from launcher.cli.configs import DoctorArgs, doctor_config

        a = DoctorArgs.of(values)
        opts, settings = doctor_config(a)  # every check before the host list is read
        host_list = a.read_hosts()
        if a.health or a.dcgm:
            from launcher.commands.health import run_health

            return run_health(host_list, opts, settings, as_json=a.as_json)
        # (imported here: the health gate needs none of doctor's checks, ~0.1 s of imports)
        from launcher.commands.doctor import run_doctor

        return run_doctor(host_list, opts, settings, as_json=a.as_json, junit=a.junit,
                          strict=a.strict, color=a.color, failures_only=a.failures,
                          per_node=a.per_node)

    run_body(body)

