"""`dtrain run`: probe every node, decide, then torchrun on every node under the supervisor.

Phases, each bounded: connect (--connect-timeout) -> probe facts (one short node program)
-> choose and validate the master (routes from every worker, a real TCP connect to the port)
-> decide each node's environment (pure) -> plan (pure) -> launch, stream, tear down.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from launcher.commands.entry import INTERRUPTED, Ended, Reports, run_command
from launcher.commands.launch import RunResult, Word, launch, run_extra
from launcher.decide.runplan.plan import (
    NODE_DIR,
    OFFLINE_FACTS,
    LaunchPlan,
    RunRequest,
    offline_plan,
    plan_json,
)
from launcher.decide.runplan.runoptions import RunOptions
from launcher.hosts.hostfile import fold, host_sources
from launcher.job.prepare import prepare
from launcher.models import Host
from launcher.nodeside.wire import DIR_PLACEHOLDER, SHIM_PLACEHOLDER
from launcher.text.words import count
from launcher.transports.ssh import SSHSettings

if TYPE_CHECKING:
    from launcher.commands.detach import Detacher
    from launcher.decide.outcome.restarts import NodeCount
    from launcher.output.report import CommandReport, NodeResult
# -- rendering -------------------------------------------------------------------------------

def render_plan(plan: LaunchPlan, out: Any = None, transport: str | None = None, *,
                workdir: str | None = None, setup: str | None = None,
                sources: Sequence[tuple[str, str, str]] = (), short: bool = False) -> None:
    """The dry run: per node, the exact command and each variable with its source
    (``short``: one line per node, the shared variables once: commands/planview.py)."""
    out = out or sys.stdout
    w = out.write
    if plan.offline:
        w("offline: not connected (--offline): node facts unknown; NCCL/GLOO variables are "
          "decided when the run connects\n" if short else f"offline: {OFFLINE_FACTS}\n")
    w(f"master {plan.master_addr}:{plan.master_port} ({plan.master_reason}); "
      f"world size {plan.world_size}; rendezvous {plan.rdzv}\n")
    hosts = [n.host for n in plan.nodes]
    w(f"hosts {fold(h.label for h in hosts)} from {host_sources(hosts)}\n")
    if transport:
        w(f"transport {transport}\n")
    if workdir:
        w(f"working directory on every node: {workdir}\n")
    if setup:
        w(f"setup, run first on every node: {setup}\n")
    for name, value, source in sources:  # CLI > environment > user config > built-in
        if name == "python":  # a hostfile's python= wins on its hosts
            value, source = _python_source(hosts, value, source)
        w(f"{name} {value}  [{source}]\n")
    if short:
        from launcher.commands.planview import short_lines

        out.writelines(short_lines(plan))
        out.flush()
        return
    blocks = [(node, _node_lines(plan, node)) for node in plan.nodes]
    explained = False  # the NCCL '=' note: once, at its first node, not on all 64
    for nodes, lines in _fold_nodes(blocks):
        node = nodes[0]
        ranks = f"{node.ranks.start}-{node.ranks.stop - 1}" if node.nproc > 1 else str(
            node.ranks.start)
        if len(nodes) == 1:
            w(f"\nnode {node.node_rank}  {node.host.label}  ranks {ranks}\n")
        else:
            last = nodes[-1]
            w(f"\nnodes {_ranges(n.node_rank for n in nodes)}  "
              f"{fold(n.host.label for n in nodes)}  ranks "
              f"{_ranges(r for n in nodes for r in n.ranks)} ({node.nproc} each; "
              f"{count(len(nodes), 'node')} alike: only the node rank differs, "
              f"{node.node_rank} to {last.node_rank})\n")
        for line in lines:
            w(line)
            var = next((v for v in node.env if v.name == "NCCL_SOCKET_IFNAME"), None) \
                if line.startswith("  NCCL_SOCKET_IFNAME=") else None
            if var is not None and var.value.startswith("=") and not explained:
                explained = True
                w(f"    (the leading '=' makes NCCL use exactly {var.value[1:]}; without it "
                  "the name is a prefix and would match every interface starting so; "
                  "the same on every node below)\n")
    out.flush()


def _python_source(hosts: Sequence[Host], value: str, source: str) -> tuple[str, str]:
    """The summary's python line: the hostfile's ``python=`` where hosts have it (it wins
    over --python, the config and the built-in default on those hosts)."""
    own: dict[str, list[str]] = {}
    for h in hosts:
        if h.python:
            own.setdefault(h.python, []).append(h.label)
    if not own:
        return value, source
    if sum(map(len, own.values())) == len(hosts):
        return ", ".join(own), "hostfile python="
    per = "; ".join(f"{fold(labels)}: {python}" for python, labels in own.items())
    return value, f"{source}; {per}, hostfile python="


FOLD_NODES = 16  # from this many nodes on, nodes alike but for their rank are one block


def _node_lines(plan: LaunchPlan, node: Any) -> list[str]:
    """One node's block of the dry run, below its header line."""
    out = []
    command = shlex.join(plan.shown_argv(node)).replace(repr(SHIM_PLACEHOLDER),
                                                        "<dtrain-rank-shim>")
    if node.container is not None:  # env by name only: values travel over the channel
        words = node.container.shown([v.name for v in node.env if v.exported])
        text = shlex.join(words).replace(repr(f"{DIR_PLACEHOLDER}:{DIR_PLACEHOLDER}"),
                                         "<dtrain-node-dir>:<dtrain-node-dir>")
        out.append(f"  container ({node.container.runtime}): {text}\n")
    out.append(f"  command: {command}\n")
    shown = plan.shown_env(node)
    for var in node.env:
        state = "" if var.exported else " (already set on the node, not exported)"
        value = shown[var.name]
        value = value if value == "***" else shlex.quote(value)
        out.append(f"  {var.name}={value}  [{var.source}: {var.reason}]{state}\n")
    for var in node.node_added():
        # the node's private dir is a placeholder (its path is made there): shown as is
        value = shlex.quote(var.value.replace(NODE_DIR, "@")).replace("@", NODE_DIR) \
            if "@" not in var.value else shlex.quote(var.value)
        out.append(f"  + {var.name}={value}  [{var.source}: {var.reason}]\n")
    out += [f"  warning: {warning}\n" for warning in node.warnings]
    return out


def _fold_nodes(blocks: list[tuple[Any, list[str]]]) -> list[tuple[list[Any], list[str]]]:
    """From FOLD_NODES nodes on, nodes whose blocks differ only in their node rank are one
    block (``--node-rank <N>``), in first-node order; fewer nodes: one block each."""
    if len(blocks) < FOLD_NODES:
        return [([node], lines) for node, lines in blocks]
    groups: dict[tuple[str, ...], list[tuple[Any, list[str]]]] = {}
    for node, lines in blocks:
        rank = str(node.node_rank)
        generic = tuple(
            ln.replace(f"--node-rank {rank} ", "--node-rank <N> ").replace(
                f"DTRAIN_NODE_RANK={rank}  ", "DTRAIN_NODE_RANK=<N>  ")
            for ln in lines)
        groups.setdefault(generic, []).append((node, lines))
    return [([n for n, _ in members], list(generic) if len(members) > 1 else members[0][1])
            for generic, members in groups.items()]


def _ranges(numbers: Iterable[int]) -> str:
    from launcher.text.words import rank_ranges

    return rank_ranges(numbers)


def transport_text(kind: str, reason: str, hosts: Sequence[Host]) -> str:
    """What --dry-run says about the transport: localhost runs as a subprocess, never ssh."""
    local = [h for h in hosts if h.is_local]
    if local and len(local) == len(hosts):
        return "local (localhost runs as a subprocess: no ssh)"
    text = f"{kind} ({reason})"
    if local:
        text += f"; {fold(h.label for h in local)}: a local subprocess"
    return text


# -- the command -----------------------------------------------------------------------------

async def run_async(hosts: Sequence[Host], req: RunRequest, opts: RunOptions,
                    settings: SSHSettings, detacher: Detacher | None = None
                    ) -> RunResult | None:
    """The whole `dtrain run`: the lemon list and --nnodes choose the nodes, then prepare,
    plan, launch (None: a dry run, printed); --restarts relaunches (commands/restarts.py)."""
    from dataclasses import replace

    from launcher.commands.restarts import run_restarting
    from launcher.output.archive import check_run_id, new_run_id
    from launcher.output.rundir import check_archive_dir

    req = replace(req, run_id=check_run_id(req.run_id) if req.run_id else new_run_id(),
                  restarts=opts.watch.restart.restarts)
    if not opts.dry_run:
        check_archive_dir(opts.reports.archive_dir)  # exit 2 before anything connects
    if opts.checks.health_check and not opts.dry_run:
        from launcher.commands.health import gate

        await gate(hosts, req, opts, settings)
    # --topology's, else inside a Slurm allocation its controller's (docs/fabric.md)
    from launcher.hosts.sources import topology_source

    found, where = topology_source(opts.checks.topology, opts.checks.topology_from,
                                   os.environ, offline=opts.offline)
    opts = replace(opts, checks=replace(opts.checks, topology=found, topology_from=where))
    hosts, count, spares = first_gang(hosts, opts)
    hosts = place(hosts, opts)
    if opts.watch.restart.restarts and not opts.dry_run:
        return await run_restarting(hosts, spares, count, req, opts, settings, detacher)
    labels = [h.label for h in [*hosts, *spares]]

    def ending(result: RunResult) -> Word:
        """The one attempt's explained failure, remembered for later runs with the time it
        cost (its ledger is made: docs/incidents.md); the word for --notify's ``ended``."""
        if result.code == 0:
            return None
        from launcher.commands.restarts import attempt_end, remember_attempt
        from launcher.decide.outcome.incidents import costs
        from launcher.output import render

        got = remember_attempt(attempt_end(result), result, req, 1, labels,
                               seconds=costs(result.goodput).get(1))
        for note in got.notes:
            render.note(note, sys.stderr if opts.reports.as_json else sys.stdout)
        return (got.seen, got.seen_fields or {}) if got.seen else None

    return await launch_plain(hosts, req, opts, settings, detacher, ending)


def first_gang(hosts: Sequence[Host], opts: RunOptions
               ) -> tuple[list[Host], NodeCount, list[Host]]:
    """(the first attempt's hosts, the node count, the spares), as ``decide.outcome.restarts.
    choose_gang`` chose them from the lemon list in force; its lines said once."""
    from launcher.decide.outcome import lemons as lm
    from launcher.decide.outcome.restarts import choose_gang
    from launcher.job.lemons import LemonStore
    from launcher.output import render

    now = time.time()
    gang = choose_gang([h.label for h in hosts], opts.watch.restart,
                       lm.current(LemonStore().load(), now), now)
    to = sys.stderr if opts.reports.as_json else sys.stdout
    for line in gang.lemon_lines:
        render.note(line, to)
    if gang.spares_line and not opts.dry_run:
        render.note(gang.spares_line, to)
    by_label = {h.label: h for h in hosts}
    return ([by_label[h] for h in gang.active], gang.count,
            [by_label[h] for h in gang.spares])


def place(hosts: Sequence[Host], opts: RunOptions) -> list[Host]:
    """The hostfile's switch=/segment=, then --topology's topology.conf: ranks ordered so
    neighbours share a switch, then a segment (decide/runplan/placement.py); one line of why per
    group (also under --dry-run)."""
    from launcher.decide.runplan import placement as pl
    from launcher.output import render

    places = pl.host_places(hosts, opts.checks.topology, opts.checks.topology_from)
    if not places:
        return list(hosts)
    order, why = pl.order([h.label for h in hosts], places)
    by_label = {h.label: h for h in hosts}
    for line in why:
        render.note(f"placement: {line}", sys.stderr if opts.reports.as_json else sys.stdout)
    return [by_label[h] for h in order]


async def launch_plain(hosts: Sequence[Host], req: RunRequest, opts: RunOptions,
                       settings: SSHSettings, detacher: Detacher | None = None,
                       ending: Callable[[RunResult], Word] | None = None
                       ) -> RunResult | None:
    """One attempt: prepare, plan, launch (None: a dry run, printed; ``ending``: launch's)."""
    if opts.dry_run and opts.offline:  # nothing is contacted: the hostfile's plan
        plan = offline_plan(req, opts, hosts)
        if opts.reports.as_json:
            sys.stdout.write(json.dumps(plan_json(plan), indent=2) + "\n")
        else:
            render_plan(plan, workdir=req.workdir, setup=req.setup, sources=opts.sources,
                        short=not opts.display.verbose)
        return None
    async with prepare(hosts, req, opts, settings) as prep:
        plan = prep.plan(req, opts)
        if opts.dry_run:
            if opts.reports.as_json:
                sys.stdout.write(json.dumps(plan_json(plan), indent=2) + "\n")
            else:
                render_plan(plan, transport=transport_text(prep.choice.kind,
                                                           prep.choice.reason, hosts),
                            workdir=req.workdir, setup=req.setup, sources=opts.sources)
            return None
        return await launch(prep, plan, req, opts, detacher=detacher, ending=ending)


def run_sync(hosts: Sequence[Host], req: RunRequest, opts: RunOptions,
             settings: SSHSettings, detacher: Detacher | None = None) -> int:
    """`dtrain run` (``detacher``: this is a detached child); --json (without --dry-run)
    and --junit report the run's result (dtrain.run/1)."""
    if opts.dry_run:
        return run_command("run", hosts, lambda: run_async(hosts, req, opts, settings),
                           lambda ended: INTERRUPTED if ended.interrupted else 0)

    reports = Reports(opts.reports.as_json, opts.reports.junit)

    def conclude(ended: Ended[RunResult | None]) -> int | CommandReport:
        from launcher.output.report import CommandReport

        result = ended.result
        code = result.code if result is not None else INTERRUPTED
        if not reports.made:
            return code
        summary = result.verdict.outcome if result is not None else "interrupted"
        return CommandReport(
            "run", code, summary, ended.started, time.time(), report_nodes(result),
            (result.root_cause or None) if result else None,
            str(result.archive_path) if result else None, run_extra(result))

    return run_command("run", hosts, lambda: run_async(hosts, req, opts, settings, detacher),
                       conclude, reports=reports)


def default_workdir() -> str:
    """The shared-filesystem convention: the current directory, as the login node sees it."""
    return os.getcwd()


# -- reports (--json, --junit) ----------------------------------------------------------------

def report_nodes(result: RunResult | None) -> tuple[NodeResult, ...]:
    """meta.json's per-node results as report NodeResults (a rank stopped by dtrain as
    collateral of the root cause fails too, with that said)."""
    from launcher.output.report import ERROR, FAILED, PASSED, NodeResult, RankResult

    if result is None:
        return ()
    tails = result.tails.tails
    v = result.verdict
    out = []
    for node in result.nodes:
        host = node["host"]
        ranks = []
        for rank_s, r in node["ranks"].items():
            rank, role = int(rank_s), r.get("role")
            status = PASSED if role == "ok" else ERROR if role == "unknown" else FAILED
            why = f": {result.failure.summary}" if result.failure is not None else ""
            msg = {"root cause": (v.outcome if v else "root cause") + why,
                   "failed": f"rank {rank} failed too (exit {r['exit_code']})",
                   "stopped": "stopped by dtrain",
                   "unknown": "no exit report (killed along with its node)"}.get(role or "")
            ranks.append(RankResult(rank, status, r["exit_code"], r["signal"], role, msg,
                                    r["duration"], tuple(tails.get((host, rank), ()))))
        code = node["exit_code"]
        status = PASSED if code == 0 else ERROR if code is None or node["lost"] else FAILED
        msg = node["error"] or (None if code == 0 else f"exit {code}")
        out.append(NodeResult(host, status, code, msg, node["duration"], tuple(ranks),
                              tuple(tails.get((host, None), ()))))
    return tuple(out)
