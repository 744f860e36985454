"""`dtrain run`: probe every node, decide, then torchrun on every node under the supervisor.

Phases, each bounded: connect (--connect-timeout) -> probe facts (one short node program)
-> choose and validate the master (routes from every worker, a real TCP connect to the port)
-> decide each node's environment (pure) -> plan (pure) -> launch, stream, tear down.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from launcher import __version__
from launcher.decide.plan import LaunchPlan, RunOptions, RunRequest, build_plan, plan_json
from launcher.errors import ConnectError
from launcher.hosts.where import failed_hosts_lines, leave_out_hint
from launcher.job.node import JobSpec
from launcher.job.orchestrate import Job, LineRouter, NodeLaunch, Policy, connect_all
from launcher.job.preflight import Preflight, preflight
from launcher.job.verdict import TailKeeper, node_results, root_cause_json, summary_lines, verdict
from launcher.models import Host, OutputLine
from launcher.nodeside.wire import SHIM_PLACEHOLDER
from launcher.output import render
from launcher.output.pipeline import OutputPipeline
from launcher.output.redact import redact_env
from launcher.transports import AutoTransport
from launcher.transports.base import Connection, Transport
from launcher.transports.ssh import SSHSettings

# -- rendering -------------------------------------------------------------------------------

def render_plan(plan: LaunchPlan, out: Any = None, *, workdir: str | None = None,
                setup: str | None = None) -> None:
    """The dry run: per node, the exact command and each variable with its source."""
    out = out or sys.stdout
    w = out.write
    w(f"master {plan.master_addr}:{plan.master_port} ({plan.master_reason}); "
      f"world size {plan.world_size}; rendezvous {plan.rdzv}\n")
    if workdir:
        w(f"working directory on every node: {workdir}\n")
    if setup:
        w(f"setup, run first on every node: {setup}\n")
    for node in plan.nodes:
        ranks = f"{node.ranks.start}-{node.ranks.stop - 1}" if node.nproc > 1 else str(
            node.ranks.start)
        w(f"\nnode {node.node_rank}  {node.host.label}  ranks {ranks}\n")
        command = node.command_line().replace(repr(SHIM_PLACEHOLDER), "<dtrain-rank-shim>")
        w(f"  command: {command}\n")
        shown = redact_env([(v.name, v.value) for v in node.env])
        for var in node.env:
            state = "" if var.exported else " (already set on the node, not exported)"
            value = shown[var.name]
            value = value if value == "***" else shlex.quote(value)
            w(f"  {var.name}={value}  [{var.source}: {var.reason}]"
              f"{state}\n")
            if var.name == "NCCL_SOCKET_IFNAME" and var.value.startswith("="):
                w(f"    (the leading '=' makes NCCL use exactly {var.value[1:]}; without it "
                  "the name is a prefix and would match every interface starting so)\n")
        for warning in node.warnings:
            w(f"  warning: {warning}\n")
    out.flush()


class RunPipeline(OutputPipeline):
    """The output pipeline, keeping stderr tails on the way."""

    def __init__(self, *args: Any, tails: TailKeeper, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tails = tails

    def emit(self, lines: Sequence[OutputLine], **kwargs: Any) -> None:
        self.tails.add(lines)
        super().emit(lines, **kwargs)


class NodeBoard:
    """The live status line on a terminal: per-node state from the supervisors' messages."""

    def __init__(self, labels: Sequence[str], world_size: int) -> None:
        self.state = dict.fromkeys(labels, "starting")
        self.world_size = world_size
        self.ranks_done = 0
        self.ranks_failed = 0
        self.start = time.monotonic()

    def event(self, host: Host, msg: Mapping[str, object]) -> None:
        kind = msg.get("type")
        if kind == "hello":
            self.state[host.label] = "running"
        elif kind == "stopping":
            self.state[host.label] = "stopping"
        elif kind == "exit":
            self.state[host.label] = f"exit {msg.get('code')}"
        elif kind == "rank_exit":
            self.ranks_done += 1
            self.ranks_failed += msg.get("code") not in (0, None)

    def render(self) -> str:
        counts: dict[str, int] = {}
        for state in self.state.values():
            counts[state] = counts.get(state, 0) + 1
        elapsed = int(time.monotonic() - self.start)
        nodes = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        failed = f" ({self.ranks_failed} failed)" if self.ranks_failed else ""
        return (f"dtrain {elapsed // 60:02d}:{elapsed % 60:02d} | "
                f"{render.count(len(self.state), 'node')}: "
                f"{nodes} | ranks finished {self.ranks_done}/{self.world_size}{failed}")


# -- the command -----------------------------------------------------------------------------

async def run_async(hosts: Sequence[Host], req: RunRequest, opts: RunOptions,
                    settings: SSHSettings) -> int:
    """The whole `dtrain run`."""
    from dataclasses import replace

    from launcher.output.archive import check_run_id, new_run_id

    req = replace(req, run_id=check_run_id(req.run_id) if req.run_id else new_run_id())
    async with AutoTransport(settings) as transport:
        conns, errors = await connect_all(transport, hosts, fanout=opts.fanout,
                                          timeout=settings.connect_timeout)
        try:
            if errors:
                raise unreachable_error(hosts, errors)
            pre = await preflight(conns, hosts, req, opts)
            plan = build_plan(req, hosts, pre.facts, pre.decisions,
                              master_addr=pre.master_addr, master_port=pre.master_port,
                              master_reason=pre.master_reason)
            for warning in pre.warnings:
                render.note(f"warning: {warning}")
            if opts.dry_run:
                if opts.as_json:
                    sys.stdout.write(json.dumps(plan_json(plan), indent=2) + "\n")
                else:
                    render_plan(plan, workdir=req.workdir, setup=req.setup)
                return 0
            return await launch(plan, req, opts, transport, conns, pre)
        finally:
            for conn in conns.values():
                with contextlib.suppress(Exception):
                    await conn.aclose()


def unreachable_error(hosts: Sequence[Host], errors: Mapping[str, str]) -> ConnectError:
    """Each unreachable host once, with its hostfile line and the exact --exclude."""
    lines = failed_hosts_lines(hosts, errors)
    failed = [h for h in hosts if h.label in errors]
    text = (f"cannot reach {lines[0]}; nothing was started" if len(lines) == 1 else
            f"cannot reach {render.count(len(failed), 'node')}; nothing was started:\n  "
            + "\n  ".join(lines))
    return ConnectError(text, hint=leave_out_hint(failed))


def redact_argv(argv: Sequence[str]) -> list[str]:
    """The command line with secret-looking --env values shown as ***."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        value = arg
        if arg.startswith("--env="):
            value = "--env=" + _redact_pair(arg[len("--env="):])
        elif i > 0 and argv[i - 1] in ("--env", "-e"):
            value = _redact_pair(arg)
        out.append(value)
    return out


def _redact_pair(pair: str) -> str:
    name, sep, value = pair.partition("=")
    return f"{name}{sep}{redact_env({name: value})[name]}" if sep else pair


def _meta_start(req: RunRequest, plan: LaunchPlan, pre: Preflight) -> dict[str, Any]:
    torch_versions = {label: f.torch_version for label, f in pre.facts.items()}
    return {
        "run_id": req.run_id, "dtrain_version": __version__,
        "command": redact_argv(["dtrain", *sys.argv[1:]]),
        "script": req.script, "args": list(req.args), "module": req.module,
        "workdir": req.workdir, "torch_versions": torch_versions,
        "start": time.time(), "plan": plan_json(plan),
        "hosts": [n.host.label for n in plan.nodes], "world_size": plan.world_size,
        "layout": [{"host": n.host.label, "node_rank": n.node_rank, "ranks": list(n.ranks)}
                   for n in plan.nodes],
    }


async def launch(plan: LaunchPlan, req: RunRequest, opts: RunOptions, transport: Transport,
                 conns: dict[str, Connection], pre: Preflight) -> int:
    """Start torchrun on every node and follow the job to its verdict."""
    from launcher.output.archive import RunArchive
    from launcher.output.console import Console

    archive = RunArchive.create(opts.archive_dir, req.run_id)
    archive.write_meta({**archive.meta, **_meta_start(req, plan, pre)})
    console = Console(sys.stdout, color=opts.color, ranks=opts.ranks, hosts=opts.hosts_filter,
                      labels=[n.host.label for n in plan.nodes], world_size=plan.world_size)
    launches = {}
    for node in plan.nodes:
        spec = JobSpec(argv=node.argv, env=node.exported_env(),
                       rank_shim=True, grace=opts.grace,
                       heartbeat_timeout=opts.heartbeat_timeout,
                       heartbeat_interval=min(2.0, opts.heartbeat_timeout / 4))
        launches[node.host.label] = NodeLaunch(spec, python=node.python, workdir=req.workdir,
                                               setup=req.setup, node_rank=node.node_rank)
    policy = Policy(grace=opts.grace, timeout=opts.timeout, start_timeout=opts.start_timeout,
                    fail_fast=True, fanout=opts.fanout, rank_fail_fast=req.max_restarts == 0)
    tails = TailKeeper()
    node_ranks = {n.host.label: n.node_rank for n in plan.nodes}
    hosts = [n.host for n in plan.nodes]
    board = NodeBoard([n.host.label for n in plan.nodes], plan.world_size)
    console.status = board.render
    async with RunPipeline(console, archive, tails=tails) as out:
        nodes = render.count(len(hosts), "node")
        out.message(f"run {archive.run_id}: {nodes}, world size {plan.world_size}, "
                    f"master {plan.master_addr}:{plan.master_port}; archive {archive.path}")
        job = Job(hosts, launches, policy, LineRouter(out, node_ranks), on_event=board.event)
        outcome = await job.run(transport, conns)
        v = verdict(outcome, plan, tails)
        for line in summary_lines(outcome, plan, v):
            out.message(line)
    archive.update_meta(end=time.time(), exit_code=v.code, outcome=v.outcome,
                        root_cause=root_cause_json(outcome, v, tails),
                        nodes=node_results(outcome, plan, v),
                        console_skipped=out.skipped)
    return v.code


def run_sync(hosts: Sequence[Host], req: RunRequest, opts: RunOptions,
             settings: SSHSettings) -> int:
    """Synchronous entry for the CLI."""
    try:
        return asyncio.run(run_async(hosts, req, opts, settings))
    except KeyboardInterrupt:
        return 130


def default_workdir() -> str:
    """The shared-filesystem convention: the current directory, as the login node sees it."""
    return os.getcwd()
