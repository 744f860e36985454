"""`dtrain doctor`: every preflight check on every node, as one table and one exit code.

Why a separate command: a 64-node job that dies at NCCL init after 10 minutes of scheduling
usually had a cause visible in seconds (a node without torch, an odd torch version, a port
that is DOWN, a firewall, memlock limited). The doctor shows *all* such causes at once, per
node, instead of the first one ``dtrain run`` trips over.

Shape (docs/doctor.md): the checks are pure and live in ``launcher.decide.fabric.checks`` and
``launcher.decide.fabric.fabric_checks``; ``gather`` here does all the I/O; ``report`` evaluates and
prints. This module re-exports the whole doctor API under one name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from launcher.commands.doctor.gather import DoctorOptions, gather, gather_with
from launcher.commands.doctor.report import (
    doctor_report,
    evaluate,
    exit_code,
    junit_cases,
    node_status,
    render_plain,
    report,
    summary,
)
from launcher.decide.fabric.checks import (
    CHECKS,
    FAIL,
    FAST_CHECKS,
    OK,
    SKIP,
    WARN,
    CheckResult,
    Gathered,
    MasterPick,
    PortProbe,
    check_clock,
    check_gpudirect,
    check_gpus,
    check_hostnames,
    check_limits,
    check_memlock,
    check_nccl,
    check_python,
    check_setup,
    check_shm,
    check_ssh,
    check_torch,
    failure_message,
    failures,
    fast_checks,
)
from launcher.decide.fabric.fabric_checks import (
    check_hca,
    check_master,
    check_master_port,
    check_mtu,
    check_roce_gid,
    check_socket,
    pick_master,
    socket_choices,
)
from launcher.models import Host


def run_doctor(hosts: Sequence[Host], opts: DoctorOptions, settings: Any, *,
               as_json: bool = False, junit: str | None = None, strict: bool = False,
               color: bool | None = None, failures_only: bool = False,
               per_node: bool = False) -> int:
    """The whole command: gather, evaluate, report."""
    from launcher.commands.entry import INTERRUPTED, Ended, run_command

    def conclude(ended: Ended[Gathered]) -> int:
        from launcher.commands.nodes import fenced_notes
        from launcher.output import render

        if ended.result is None:
            return INTERRUPTED
        code = report(evaluate(ended.result), [h.label for h in hosts], started=ended.started,
                      timing=ended.result.timing, as_json=as_json, junit=junit, strict=strict,
                      color=color, failures_only=failures_only, per_node=per_node)
        for line in fenced_notes([h.label for h in hosts]):
            render.note(line)
        return code

    return run_command("doctor", hosts, lambda: gather(hosts, opts, settings), conclude)


__all__ = [
    "CHECKS", "FAIL", "FAST_CHECKS", "OK", "SKIP", "WARN", "CheckResult", "DoctorOptions",
    "Gathered", "MasterPick", "PortProbe", "check_clock", "check_gpudirect", "check_gpus",
    "check_hca", "check_hostnames", "check_limits", "check_master", "check_master_port",
    "check_memlock", "check_mtu", "check_nccl", "check_python",
    "check_setup", "check_roce_gid",
    "check_shm", "check_socket", "check_ssh", "check_torch", "doctor_report", "evaluate",
    "exit_code", "failure_message", "failures", "fast_checks", "gather", "gather_with",
    "junit_cases", "node_status", "pick_master", "render_plain", "report", "run_doctor",
    "socket_choices", "summary",
]
