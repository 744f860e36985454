"""`dtrain doctor`'s verdict and output: every check over what was gathered, the exit code,
the versioned JSON envelope, and the table (rich on a terminal, aligned columns otherwise).
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from collections.abc import Sequence
from typing import Any, TextIO

from launcher.decide.checks import (
    FAIL,
    OK,
    SKIP,
    STATUSES,
    WARN,
    CheckResult,
    Gathered,
    check_clock,
    check_gpudirect,
    check_gpus,
    check_hostnames,
    check_limits,
    check_memlock,
    check_nccl,
    check_python,
    check_shm,
    check_ssh,
    check_torch,
)
from launcher.decide.fabric_checks import (
    check_hca,
    check_master,
    check_master_port,
    check_mtu,
    check_roce_gid,
    check_socket,
    socket_choices,
)
from launcher.output.render import count

DOCTOR_VERSION = 1  # bump when the JSON envelope changes incompatibly


def evaluate(g: Gathered) -> list[CheckResult]:
    """Every check over what ``gather`` learned, ordered check by check, node 0 first."""
    labels = [h.label for h in g.hosts]
    facts = {h: g.facts[h] for h in labels if h in g.facts}
    pick = g.master
    sockets = socket_choices(facts, pick)
    slots = {h.label: h.slots for h in g.hosts}
    rows = (check_ssh(labels, g.connect_errors)
            + check_python(facts, [h for h in labels if h not in g.connect_errors],
                           g.probe_errors)
            + check_hostnames(facts) + check_torch(facts) + check_nccl(facts)
            + check_gpus(facts, slots) + check_master(pick) + check_socket(facts, pick, sockets)
            + check_master_port(g.port, pick, facts) + check_mtu(facts, sockets)
            + check_hca(facts, sockets) + check_roce_gid(facts, sockets)
            + check_memlock(facts) + check_gpudirect(facts, sockets) + check_shm(facts)
            + check_limits(facts) + check_clock(facts, g.timing))
    return rows


def exit_code(results: Sequence[CheckResult], *, strict: bool = False) -> int:
    """255 if a node was unreachable (as exec/run), 1 on any FAIL (or warn with --strict)."""
    if any(r.check == "ssh" and r.failed for r in results):
        return 255
    bad = {FAIL, WARN} if strict else {FAIL}
    return 1 if any(r.status in bad for r in results) else 0


def envelope(results: Sequence[CheckResult], code: int) -> dict[str, Any]:
    """The versioned ``--json`` document."""
    return {"doctor_version": DOCTOR_VERSION, "ok": code == 0,
            "checks": [r.to_json() for r in results]}


# --------------------------------------------------------------------------- I/O



# --------------------------------------------------------------------------- rendering

LABELS = {OK: "ok", WARN: "warn", FAIL: "FAIL", SKIP: "skip"}
STYLES = {OK: "green", WARN: "yellow", FAIL: "bold red", SKIP: "dim"}


def render_plain(results: Sequence[CheckResult], stream: TextIO) -> None:
    """Aligned columns for pipes and CI logs: check, host, status, detail."""
    if not results:
        return
    cw = max(len(r.check) for r in results)
    hw = max(len(r.host) for r in results)
    for r in results:
        line = f"{r.check:<{cw}}  {r.host:<{hw}}  {LABELS[r.status]:<4}  {r.detail}"
        stream.write(line.rstrip() + "\n")
    stream.flush()


def render_rich(results: Sequence[CheckResult], title: str) -> None:
    """The terminal table (rich imported here: `dtrain --help` stays fast)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for column in ("check", "host", "status", "detail"):
        table.add_column(column, overflow="fold")
    previous = None
    for r in results:
        table.add_row(r.check if r.check != previous else "", escape(r.host),
                      f"[{STYLES[r.status]}]{LABELS[r.status]}[/]", escape(r.detail))
        previous = r.check
    Console().print(table)


def summary(results: Sequence[CheckResult], nhosts: int) -> str:
    """`3 node(s), 51 checks: 45 ok, 3 warn, 0 FAIL, 3 skip`."""
    counts = Counter(r.status for r in results)
    parts = ", ".join(f"{counts.get(s, 0)} {LABELS[s]}" for s in STATUSES)
    return f"{count(nhosts, 'node')}, {count(len(results), 'check')}: {parts}"


def report(results: Sequence[CheckResult], nhosts: int, *, as_json: bool, strict: bool = False,
           stream: TextIO | None = None, color: bool | None = None) -> int:
    """Print the table (or JSON) and return the exit code."""
    from launcher.output import render

    stream = stream or sys.stdout
    code = exit_code(results, strict=strict)
    if as_json:
        stream.write(json.dumps(envelope(results, code), indent=2) + "\n")
        stream.flush()
    else:
        use_rich = color if color is not None else (
            not os.environ.get("NO_COLOR") and stream.isatty())
        if use_rich and stream is sys.stdout:
            render_rich(results, "dtrain doctor")
        else:
            render_plain(results, stream)
    render.note(summary(results, nhosts) + ("" if code == 0 else f"; exit {code}"))
    return code


