"""`dtrain doctor`'s verdict and output: every check over what was gathered, the exit code,
the versioned JSON envelope, and the table (rich on a terminal, aligned columns otherwise).
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from launcher.decide.fabric.checks import (
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
    check_setup,
    check_shm,
    check_ssh,
    check_torch,
    fold_by_message,
)
from launcher.decide.fabric.fabric_checks import (
    check_hca,
    check_master,
    check_master_port,
    check_mtu,
    check_roce_gid,
    check_socket,
    socket_choices,
)
from launcher.exitcodes import EXIT_UNREACHABLE
from launcher.hosts.hostfile import fold
from launcher.output.hostgroups import folded
from launcher.output.junit import ExtraCase
from launcher.output.render import should_color
from launcher.output.report import ERROR, FAILED, PASSED, SKIPPED, CommandReport, NodeResult
from launcher.text.termsafe import inert
from launcher.text.words import count


def evaluate(g: Gathered) -> list[CheckResult]:
    """Every check over what ``gather`` learned, ordered check by check, node 0 first."""
    labels = [h.label for h in g.hosts]
    facts = {h: g.facts[h] for h in labels if h in g.facts}
    pick = g.master
    sockets = socket_choices(facts, pick)
    slots = {h.label: h.slots for h in g.hosts}
    reached = [h for h in labels if h not in g.connect_errors]
    rows = (check_ssh(g.hosts, g.connect_errors)
            + check_setup(g.setup, reached, facts, g.setup_errors)
            + check_python(facts, [h for h in labels if h not in g.connect_errors],
                           g.probe_errors)
            + check_hostnames(facts) + check_torch(facts) + check_nccl(facts)
            + check_gpus(facts, slots) + check_master(pick) + check_socket(facts, pick, sockets)
            + check_master_port(g.port, pick, facts) + check_mtu(facts, sockets)
            + check_hca(facts, sockets) + check_roce_gid(facts, sockets)
            + check_memlock(facts) + check_gpudirect(facts, sockets) + check_shm(facts)
            + check_limits(facts) + check_clock(facts, g.timing))
    if g.images:  # --image: which nodes lack it (docs/containers.md)
        from launcher.decide.runplan.container import image_rows

        rows += [CheckResult(h, "image", OK if ok else FAIL, detail) for h, ok, detail in
                 image_rows({h: r for h, r in g.images.items() if h in facts},
                            {h: facts[h].container for h in facts})]
    return rows


def exit_code(results: Sequence[CheckResult], *, strict: bool = False) -> int:
    """255 if a node was unreachable (as exec/run), 1 on any FAIL (or warn with --strict)."""
    if any(r.check == "ssh" and r.failed for r in results):
        return EXIT_UNREACHABLE
    bad = {FAIL, WARN} if strict else {FAIL}
    return 1 if any(r.status in bad for r in results) else 0


def node_status(rows: Sequence[CheckResult], *, strict: bool = False) -> str:
    """A node's JSON/JUnit status: ``error`` unreachable, ``failed`` a FAIL (or a warn with
    --strict), else ``passed``."""
    if any(r.check == "ssh" and r.failed for r in rows):
        return ERROR
    return FAILED if any(_bad(r, strict) for r in rows) else PASSED


def _bad(r: CheckResult, strict: bool) -> bool:
    return r.status == FAIL or (strict and r.status == WARN)


def _case_status(r: CheckResult, strict: bool) -> str:
    if r.check == "ssh" and r.failed:
        return ERROR
    if _bad(r, strict):
        return FAILED
    return SKIPPED if r.status == SKIP else PASSED


def _root_cause(results: Sequence[CheckResult], code: int, strict: bool
                ) -> dict[str, Any] | None:
    bad = [r for r in results if _bad(r, strict)]
    if not bad:
        return None
    first = next((r for r in bad if r.check == "ssh"), bad[0])
    return {"kind": "unreachable" if first.check == "ssh" else "check", "host": first.host,
            "rank": None, "exit_code": code, "check": first.check,
            "summary": fold_by_message((r.host, f"{r.check}: {r.detail}") for r in bad),
            "fix": first.fix}


def doctor_report(results: Sequence[CheckResult], hosts: Sequence[str], *, started: float,
                  ended: float, timing: Mapping[str, tuple[float, float]] | None = None,
                  strict: bool = False) -> CommandReport:
    """The ``dtrain.doctor/1`` document's report: one node per host with its checks."""
    timing = timing or {}
    code = exit_code(results, strict=strict)
    nodes = []
    for host in hosts:
        rows = [r for r in results if r.host == host]
        status = node_status(rows, strict=strict)
        bad = [r for r in rows if _bad(r, strict)]
        message = "; ".join(f"{r.check}: {r.detail}" for r in bad) or None
        sent, got = timing.get(host, (None, None))
        duration = round(got - sent, 3) if sent is not None and got is not None else None
        checks = [{"name": r.check, "status": r.status, "message": r.detail, "fix": r.fix}
                  for r in rows]
        nodes.append(NodeResult(host, status, None, message, duration,
                                details={"checks": checks}))
    counts = Counter(r.status for r in results)
    extra = {"strict": strict, "counts": {s: counts.get(s, 0) for s in STATUSES},
             "checks": [r.to_json() for r in results]}
    return CommandReport("doctor", code, summary(results, len(hosts)), started, ended,
                         tuple(nodes), _root_cause(results, code, strict), None, extra)


def junit_cases(results: Sequence[CheckResult], *, strict: bool = False) -> list[ExtraCase]:
    """One JUnit testcase per node and check, ``<host> <check>`` (docs/schemas.md)."""
    cases = []
    for r in results:
        status = _case_status(r, strict)
        text = f"{r.check} on {r.host}: {LABELS[r.status]}: {r.detail}"
        if r.fix:
            text += f"\nfix: {r.fix}"
        message = f"{r.host}: {r.check}: {r.detail}" if status in (FAILED, ERROR) else r.detail
        cases.append(ExtraCase(f"{r.host} {r.check}", status, message, text))
    return cases


# --------------------------------------------------------------------------- I/O



# --------------------------------------------------------------------------- rendering

LABELS = {OK: "ok", WARN: "warn", FAIL: "FAIL", SKIP: "skip"}
STYLES = {OK: "green", WARN: "yellow", FAIL: "bold red", SKIP: "dim"}


RANK = {FAIL: 0, WARN: 1, OK: 2, SKIP: 2}
MAX_OK_ROWS = 2  # folded: more distinct ok details than this for one check are one row


def table_rows(results: Sequence[CheckResult], nhosts: int, *, failures_only: bool = False,
               per_node: bool = False) -> list[tuple[str, str, str, str]]:
    """(check, hosts, status, detail) rows as shown. The hosts of a check with the same
    status and detail are one row (``node[1-4]``), at every node count, the FAIL rows
    first, then warn, then the rest, each in check order; a check that is ok everywhere
    with a value per node (hostname, clock) is one row. ``per_node`` (``--per-node``): one
    row per node and check, in check order. ``failures_only``: FAIL and warn rows alone
    (``--failures``). ``nhosts`` is kept for callers; folding no longer depends on it."""
    shown = [r for r in results if r.status in (FAIL, WARN)] if failures_only else list(results)
    if per_node:
        rows = [(r.check, r.host, r.status, r.detail) for r in shown]
        return rows if not failures_only else sorted(rows, key=lambda row: RANK[row[2]])
    folded_rows = []
    for check in dict.fromkeys(r.check for r in shown):
        mine = [(r.host, (r.status, r.detail)) for r in shown if r.check == check]
        groups = folded(mine)
        fine = [g for g in groups if g[1][0] == OK]
        if len(fine) > MAX_OK_ROWS:  # ok everywhere, a value per node (hostname, clock)
            hostlist = fold(h for h, (status, _) in mine if status == OK)
            first = fine[0][1][1]
            merged = (hostlist, (OK, f"{first}; {len(fine) - 1} other values (--per-node "
                                     "has each node's)"))
            groups = [g for g in groups if g[1][0] != OK] + [merged]
        folded_rows += [(check, hostlist, status, detail)
                        for hostlist, (status, detail) in groups]
    return sorted(folded_rows, key=lambda row: RANK[row[2]])  # stable: check order kept


def render_plain(results: Sequence[CheckResult], stream: TextIO, *, nhosts: int = 0,
                 failures_only: bool = False, per_node: bool = False) -> None:
    """Aligned columns for pipes and CI logs: check, host, status, detail."""
    table = table_rows(results, nhosts, failures_only=failures_only, per_node=per_node)
    if not table:
        return
    rows = [(inert(c), inert(h), status, inert(d)) for c, h, status, d in table]
    cw = max(len(c) for c, _, _, _ in rows)
    hw = max(len(h) for _, h, _, _ in rows)
    for check, host, status, detail in rows:  # a node's text, every control inert
        line = f"{check:<{cw}}  {host:<{hw}}  {LABELS[status]:<4}  {detail}"
        stream.write(line.rstrip() + "\n")
    stream.flush()


def render_rich(results: Sequence[CheckResult], title: str, stream: TextIO | None = None,
                *, nhosts: int = 0, failures_only: bool = False, per_node: bool = False) -> None:
    """The terminal table (rich imported here: `dtrain --help` stays fast)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for column in ("check", "host", "status", "detail"):
        table.add_column(column, overflow="fold")
    previous = None
    for check, host, status, detail in table_rows(results, nhosts, failures_only=failures_only,
                                                  per_node=per_node):
        table.add_row(inert(check) if check != previous else "", escape(inert(host)),
                      f"[{STYLES[status]}]{LABELS[status]}[/]", escape(inert(detail)))
        previous = check
    Console(file=stream or sys.stdout, force_terminal=True).print(table)


def summary(results: Sequence[CheckResult], nhosts: int) -> str:
    """`3 node(s), 51 checks: 45 ok, 3 warn, 0 FAIL, 3 skip`."""
    counts = Counter(r.status for r in results)
    parts = ", ".join(f"{counts.get(s, 0)} {LABELS[s]}" for s in STATUSES)
    return f"{count(nhosts, 'node')}, {count(len(results), 'check')}: {parts}"


def show(results: Sequence[CheckResult], stream: TextIO, color: bool | None = None, *,
         nhosts: int = 0, failures_only: bool = False, per_node: bool = False) -> None:
    """The table: rich when colour is on (``render.should_color``: a terminal, or
    FORCE_COLOR; never with NO_COLOR), aligned columns otherwise; identical rows folded
    across nodes unless ``per_node`` (``table_rows``)."""
    use_rich = color if color is not None else should_color(stream)
    if use_rich:
        render_rich(results, "dtrain doctor", stream, nhosts=nhosts,
                    failures_only=failures_only, per_node=per_node)
    else:
        render_plain(results, stream, nhosts=nhosts, failures_only=failures_only,
                     per_node=per_node)


def report(results: Sequence[CheckResult], hosts: Sequence[str], *, started: float,
           timing: Mapping[str, tuple[float, float]] | None = None, as_json: bool = False,
           junit: str | None = None, strict: bool = False, stream: TextIO | None = None,
           color: bool | None = None, failures_only: bool = False,
           per_node: bool = False) -> int:
    """Print the table (to stderr under --json), the summary, then what --json/--junit
    asked for (and ``::error`` lines under GitHub Actions); return the exit code."""
    from launcher.commands.entry import finish
    from launcher.output import render

    stream = stream or (sys.stderr if as_json else sys.stdout)
    rep = doctor_report(results, hosts, started=started, ended=time.time(), timing=timing,
                        strict=strict)
    show(results, stream, color, nhosts=len(hosts), failures_only=failures_only,
         per_node=per_node)
    render.note(rep.summary + ("" if rep.exit_code == 0 else f"; exit {rep.exit_code}"))
    return finish(rep, as_json=as_json, junit=junit,
                  extra_cases=junit_cases(results, strict=strict), node_cases=False)
