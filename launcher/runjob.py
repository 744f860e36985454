"""`dtrain run`: probe every node, decide, then torchrun on every node under the supervisor.

Phases, each bounded: connect (--connect-timeout) -> probe facts (one short node program)
-> choose and validate the master (routes from every worker, a real TCP connect to the port)
-> decide each node's environment (pure) -> plan (pure) -> launch, stream, tear down.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import shlex
import signal
import sys
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher import __version__, render
from launcher.errors import ConnectError, DtrainError, PreflightFailed, RemoteCommandError
from launcher.facts import NodeFacts
from launcher.hostfile import fold
from launcher.models import Host, OutputLine
from launcher.netenv import EnvDecision, choose_master, decide_env, pick_master_addr
from launcher.node import JobSpec
from launcher.orchestrate import Job, JobOutcome, LineRouter, NodeLaunch, Policy, connect_all
from launcher.pipeline import OutputPipeline
from launcher.plan import LaunchPlan, RunRequest, build_plan, plan_json
from launcher.redact import redact_env
from launcher.remote import read_json_line, run_program, start_program
from launcher.transports import AutoTransport
from launcher.transports.base import Connection
from launcher.transports.ssh import SSHSettings
from launcher.wire import SHIM_PLACEHOLDER


@dataclass(frozen=True)
class RunOptions:
    """How to run (as opposed to what: that is the RunRequest)."""

    fanout: int = 64
    grace: float = 10.0
    timeout: float | None = None
    start_timeout: float | None = 120.0
    heartbeat_timeout: float = 30.0
    archive_dir: Path = Path("dtrain-runs")
    dry_run: bool = False
    as_json: bool = False
    color: bool | None = None
    ranks: frozenset[int] | None = None
    hosts_filter: frozenset[str] | None = None
    profile: Mapping[str, str] | None = None
    profile_name: str = "profile"
    probe_timeout: float = 30.0
    no_auto: frozenset[str] = frozenset()
    preflight: bool = True


@dataclass
class Preflight:
    """What the probe phase learned and decided."""

    facts: dict[str, NodeFacts] = field(default_factory=dict)
    decisions: dict[str, EnvDecision] = field(default_factory=dict)
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    master_reason: str = ""
    warnings: list[str] = field(default_factory=list)


# -- probing ---------------------------------------------------------------------------------

async def _probe(conn: Connection, params: Mapping[str, Any], req: RunRequest,
                 timeout: float) -> dict[str, Any]:
    python = conn.host.python or req.python
    try:
        return await run_program(conn, "probe", params, python=python, setup=req.setup,
                                 timeout=timeout)
    except TimeoutError:
        raise RemoteCommandError(f"the probe did not answer within {timeout:g} s",
                                 host=conn.host.label) from None


async def probe_facts(conns: Mapping[str, Connection], req: RunRequest, targets: Sequence[str],
                      timeout: float) -> dict[str, NodeFacts]:
    """Facts of every node, in parallel."""
    params = {"mode": "facts", "workdir": req.workdir, "targets": list(targets)}
    results: dict[str, NodeFacts] = {}

    async def one(label: str, conn: Connection) -> None:
        results[label] = NodeFacts.from_json(await _probe(conn, params, req, timeout))

    await _gather_named({label: one(label, c) for label, c in conns.items()})
    return results


async def _gather_named(coros: Mapping[str, Any]) -> None:
    """Run per-host coroutines; raise one PreflightFailed listing every host that failed."""
    failures: list[str] = []

    async def guard(label: str, coro: Any) -> None:
        try:
            await coro
        except DtrainError as exc:
            failures.append(f"{label}: {exc.message}")

    async with asyncio.TaskGroup() as tg:
        for label, coro in coros.items():
            tg.create_task(guard(label, coro), name=f"probe:{label}")
    if failures:
        raise PreflightFailed("; ".join(sorted(failures)),
                              hint="check the --python/--setup for those nodes")


def _is_ip(text: str | None) -> bool:
    try:
        ipaddress.ip_address(text or "")
    except ValueError:
        return False
    return True


async def check_master_port(conns: Sequence[Connection], req: RunRequest, addr: str,
                            port: int, timeout: float) -> int:
    """Bind the master port on node 0 and connect to it from every other node.

    Port 0 lets node 0 pick a free one. An unreachable master is a preflight error here,
    not a 15-minute rendezvous hang later.
    """
    master, workers = conns[0], conns[1:]
    python = master.host.python or req.python
    async with asyncio.timeout(timeout):
        proc = await start_program(master, "probe", {"mode": "listen", "addr": addr,
                                                     "port": port},
                                   python=python, setup=req.setup)
        try:
            res = await read_json_line(proc, master.host.label, "master port check")
            if not res.get("ok"):
                raise PreflightFailed(f"cannot bind the master port {addr}:{port}: "
                                      f"{res.get('error')}", host=master.host.label,
                                      hint="pick another --master-port")
            port = int(res["port"])
            failures: list[str] = []

            async def one(conn: Connection) -> None:
                got = await _probe(conn, {"mode": "connect", "addr": addr, "port": port,
                                          "timeout": 3}, req, timeout)
                if not got.get("ok"):
                    failures.append(f"{conn.host.label} ({got.get('error')})")

            async with asyncio.TaskGroup() as tg:
                for conn in workers:
                    tg.create_task(one(conn))
            if failures:
                raise PreflightFailed(
                    f"the master {addr}:{port} is unreachable from {', '.join(failures)}",
                    hint="check firewalls between the nodes, or pass --master-addr")
        finally:
            proc.write_eof()
            proc.abort()
    return port


async def preflight(conns: dict[str, Connection], hosts: Sequence[Host], req: RunRequest,
                    opts: RunOptions) -> Preflight:
    """Probe, choose and validate the master, decide every node's environment."""
    ordered = [conns[h.label] for h in hosts]
    pre = Preflight()
    first_guess = [a for a in ([req.master_addr] if req.master_addr else
                               [ordered[0].peer_addr]) if _is_ip(a)]
    if len(hosts) == 1:
        first_guess = [req.master_addr or "127.0.0.1"]
    pre.facts = await probe_facts(conns, req, first_guess, opts.probe_timeout)
    if opts.preflight:
        from launcher.doctor import failure_message, fast_checks

        problem = failure_message(fast_checks(pre.facts, hosts))
        if problem:
            raise PreflightFailed(problem, hint="`dtrain doctor` shows every check; "
                                                "--no-preflight skips these")
    missing = [h.label for h in hosts if pre.facts[h.label].workdir_ok is False]
    if missing:
        raise PreflightFailed(f"working directory {req.workdir} does not exist on "
                              f"{fold(missing)}", hint="create it there, or pass --workdir")
    master_facts = pre.facts[hosts[0].label]
    if len(hosts) == 1:
        candidates = first_guess
        pre.master_addr, pre.master_reason = candidates[0], "single node: loopback"
    else:
        candidates = [req.master_addr] if req.master_addr else pick_master_addr(master_facts)
        workers = {h.label: pre.facts[h.label] for h in hosts[1:]}
        if any(c not in f.routes for c in candidates for f in workers.values()):
            more = await probe_facts({h.label: conns[h.label] for h in hosts[1:]}, req,
                                     candidates, opts.probe_timeout)
            workers.update(more)
        choice = choose_master(candidates, {k: f.routes for k, f in workers.items()})
        pre.master_addr, pre.master_reason = choice.addr, choice.reason
        if choice.warning:
            pre.warnings.append(choice.warning)
        pre.facts.update(workers)
    pre.master_port = req.master_port or 0
    pre.master_port = await check_master_port(ordered, req, pre.master_addr, pre.master_port,
                                              opts.probe_timeout)
    errors: list[str] = []
    for i, host in enumerate(hosts):
        decision = decide_env(pre.facts[host.label], master_addr=pre.master_addr,
                              is_master=i == 0, user_env={**dict(host.env), **dict(req.env)},
                              profile=opts.profile, nnodes=len(hosts),
                              profile_name=opts.profile_name, no_auto=opts.no_auto)
        errors += [f"{host.label}: {e}" for e in decision.errors]
        pre.decisions[host.label] = decision
    if errors:
        raise PreflightFailed("; ".join(errors))
    return pre


# -- rendering -------------------------------------------------------------------------------

def render_plan(plan: LaunchPlan, out: Any = None) -> None:
    """The dry run: per node, the exact command and each variable with its source."""
    out = out or sys.stdout
    w = out.write
    w(f"master {plan.master_addr}:{plan.master_port} ({plan.master_reason}); "
      f"world size {plan.world_size}; rendezvous {plan.rdzv}\n")
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
        for warning in node.warnings:
            w(f"  warning: {warning}\n")
    out.flush()


class TailKeeper:
    """The last stderr lines of each rank, for the failure summary."""

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self.tails: dict[tuple[str, int | None], deque[str]] = {}

    def add(self, lines: Sequence[OutputLine]) -> None:
        for line in lines:
            if line.stream == "err":
                key = (line.host, line.rank)
                if key not in self.tails:
                    self.tails[key] = deque(maxlen=self.size)
                self.tails[key].append(line.text)


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
        return (f"dtrain {elapsed // 60:02d}:{elapsed % 60:02d} | {len(self.state)} nodes: "
                f"{nodes} | ranks finished {self.ranks_done}/{self.world_size}{failed}")


# -- outcome ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class RankExit:
    host: str
    rank: int
    code: int
    signal: int | None
    t: float
    duration: float | None


@dataclass
class Verdict:
    """The exit code and the story behind it (see docs/exit-codes.md)."""

    code: int
    outcome: str
    root_host: str | None = None
    root_rank: int | None = None
    lines: list[str] = field(default_factory=list)
    root_kind: str | None = None  # rank, node, lost, start, interrupted, timeout


def rank_exits(outcome: JobOutcome) -> list[RankExit]:
    exits = []
    for label, node in outcome.nodes.items():
        for rank, msg in node.ranks.items():
            code, sig = msg.get("code"), msg.get("signal")
            t, dur = msg.get("t"), msg.get("duration")
            exits.append(RankExit(label, int(rank), code if isinstance(code, int) else 0,
                                  sig if isinstance(sig, int) else None,
                                  float(t) if isinstance(t, (int, float)) else 0.0,
                                  float(dur) if isinstance(dur, (int, float)) else None))
    return sorted(exits, key=lambda e: e.t)


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _how(code: int | None, sig: int | None) -> str:
    if sig:
        return f"was killed by {_signame(sig)}"
    return f"exited {code}"


def verdict(outcome: JobOutcome, plan: LaunchPlan, tails: TailKeeper) -> Verdict:
    """The exit code: the root cause's (the first failure dtrain saw before it started
    stopping the job): a rank's own code (128+N for signal N), 255 a node lost or unreachable,
    124 --timeout or --start-timeout; 130/143 when interrupted first; 0 when every node ended
    well."""
    root = outcome.root
    lines: list[str] = []
    if outcome.interrupted and (root is None or outcome.interrupted_t is None
                                or root.seen > outcome.interrupted_t):
        how = "interrupted by Ctrl-C" if outcome.interrupted == signal.SIGINT else \
            f"interrupted by {_signame(outcome.interrupted)}"
        if outcome.killed:
            how += ", then killed"
        v = Verdict(128 + outcome.interrupted, how, root_kind="interrupted")
    elif outcome.timed_out and root is None:
        v = Verdict(124, "timed out (--timeout): every node stopped", root_kind="timeout")
    elif root is not None and root.kind == "start":
        late = fold(outcome.start_timed_out) or root.host
        v = Verdict(124, f"{late} {root.error}", root.host, root_kind="start")
    elif root is not None and root.kind == "rank":
        v = Verdict(root.code or 1,
                    f"rank {root.rank} on {root.host} {_how(root.code, root.signal)}",
                    root.host, root.rank, root_kind="rank")
        tail = list(tails.tails.get((root.host, root.rank), ()))
        if tail:
            lines.append(f"last stderr lines of rank {root.rank} on {root.host}:")
            lines += [f"  {t}" for t in tail]
    elif root is not None and root.kind == "lost":
        v = Verdict(255, f"node {root.host} lost: {root.error or 'connection lost'}", root.host,
                    root_kind="lost")
    elif root is not None and (first := _first_failed_rank(outcome, root.host)) is not None:
        # torchrun gave up on this node (say after --max-restarts): its ranks tell why
        v = Verdict(first.code, f"rank {first.rank} on {first.host} "
                                f"{_how(first.code, first.signal)}", first.host, first.rank,
                    root_kind="rank")
        tail = list(tails.tails.get((first.host, first.rank), ()))
        if tail:
            lines.append(f"last stderr lines of rank {first.rank} on {first.host}:")
            lines += [f"  {t}" for t in tail]
    elif root is not None:
        if root.code is None:
            v = Verdict(255, f"node {root.host} failed: {root.error}", root.host,
                        root_kind="node")
        else:
            v = Verdict(root.code, f"torchrun on {root.host} {_how(root.code, root.signal)}",
                        root.host, root_kind="node")
        node = outcome.nodes.get(root.host)
        tail = list(tails.tails.get((root.host, None), ())) or list(
            node.stderr_tail if node else ())
        if tail:
            lines.append(f"last stderr lines of {root.host}:")
            lines += [f"  {t}" for t in tail]
    else:
        missing = [h.label for h in (n.host for n in plan.nodes)
                   if h.label not in outcome.nodes or outcome.nodes[h.label].exit_code is None]
        bad = {label: n.exit_code for label, n in outcome.nodes.items() if n.exit_code}
        if missing:
            v = Verdict(255, f"{fold(missing)} never reported an end", missing[0],
                        root_kind="lost")
        elif bad:
            label = next(iter(bad))
            v = Verdict(bad[label] or 1, f"torchrun on {label} exited {bad[label]}", label,
                        root_kind="node")
        else:
            v = Verdict(0, "succeeded")
    v.lines = lines
    return v


def _first_failed_rank(outcome: JobOutcome, host: str) -> RankExit | None:
    """The earliest failing rank of a node that failed as a whole (its own clock)."""
    if outcome.root is None or outcome.root.kind != "node":
        return None
    failed = [e for e in rank_exits(outcome) if e.host == host and e.code != 0]
    return failed[0] if failed else None


def _rank_role(outcome: JobOutcome, v: Verdict, host: str, rank: int,
               e: RankExit | None) -> str:
    """root cause, failed (on its own, before the stop), stopped (by dtrain or as collateral
    of the root cause), ok, or unknown (no exit report: killed along with its node)."""
    if e is None:
        return "unknown"
    if (host, rank) == (v.root_host, v.root_rank) and v.root_kind == "rank":
        return "root cause"
    if e.code == 0:
        return "ok"
    if any(f.kind == "rank" and (f.host, f.rank) == (host, rank) for f in outcome.failures):
        return "failed"
    return "stopped"


def _exit_text(code: int | None, sig: int | None) -> str:
    if sig:
        return f"{_signame(sig)} ({code})"
    return f"exit {code}"


def summary_lines(outcome: JobOutcome, plan: LaunchPlan, v: Verdict) -> list[str]:
    """Per node and rank: how it ended and after how long; the root cause first, followers
    marked as stopped by dtrain; then the last stderr lines of the root cause."""
    out = [f"{'FAILED' if v.code else 'ok'}: {v.outcome} (exit {v.code})"]
    exits = {(e.host, e.rank): e for e in rank_exits(outcome)}
    order = sorted(plan.nodes, key=lambda n: (n.host.label != v.root_host, n.node_rank))
    by_dtrain = outcome.stop_reason is not None
    for node in order:
        label = node.host.label
        res = outcome.nodes.get(label)
        if res is None:
            out.append(f"  {label} (node {node.node_rank}): not started")
            continue
        ranks = sorted(node.ranks, key=lambda r: (r != v.root_rank or label != v.root_host, r))
        parts = []
        for rank in ranks:
            e = exits.get((label, rank))
            role = _rank_role(outcome, v, label, rank, e)
            if e is None:
                why = " (node lost)" if res.lost else " (killed by dtrain)" if by_dtrain else ""
                parts.append(f"r{rank} no exit report{why}")
                continue
            dur = f" after {e.duration:.1f}s" if e.duration is not None else ""
            mark = {"root cause": " (ROOT CAUSE)", "failed": " (failed too)",
                    "stopped": " (stopped by dtrain)" if by_dtrain else "",
                    "ok": ""}[role]
            parts.append(f"r{rank} {_exit_text(e.code, e.signal)}{dur}{mark}")
        if res.lost:
            state = f"LOST: {res.error}"
        elif res.exit_code is None:
            state = res.error or "no exit status"
        else:
            state = f"torchrun {_exit_text(res.exit_code, res.signal)}"
            if res.duration is not None:
                state += f" after {res.duration:.1f}s"
            if res.stopped and label != v.root_host:
                state += " (stopped by dtrain)"
        out.append(f"  {label} (node {node.node_rank}): {', '.join(parts) or 'no ranks'}; "
                   f"{state}")
    out += v.lines
    return out


def node_results(outcome: JobOutcome, plan: LaunchPlan,
                 v: Verdict | None = None) -> list[dict[str, Any]]:
    """meta.json ``nodes``: per node and rank, how it ended."""
    exits = {(e.host, e.rank): e for e in rank_exits(outcome)}
    results = []
    for node in plan.nodes:
        label = node.host.label
        res = outcome.nodes.get(label)
        ranks = {}
        for rank in node.ranks:
            e = exits.get((label, rank))
            entry: dict[str, Any] = {"exit_code": e.code if e else None,
                                     "signal": e.signal if e else None,
                                     "duration": e.duration if e else None}
            if v is not None:
                entry["role"] = _rank_role(outcome, v, label, rank, e)
            ranks[str(rank)] = entry
        results.append({
            "host": label, "node_rank": node.node_rank,
            "exit_code": res.exit_code if res else None,
            "signal": res.signal if res else None,
            "error": res.error if res else "not started", "lost": bool(res and res.lost),
            "abandoned": bool(res and res.abandoned),
            "stopped": res.stopped if res else None,
            "duration": res.duration if res else None,
            "supervisor_pid": res.supervisor_pid if res else None,
            "pid": res.pid if res else None,
            "ranks": ranks,
        })
    return results


def root_cause_json(outcome: JobOutcome, v: Verdict, tails: TailKeeper) -> dict[str, Any]:
    """meta.json ``root_cause``."""
    root = outcome.root
    data: dict[str, Any] = {"kind": v.root_kind, "host": v.root_host, "rank": v.root_rank,
                            "exit_code": v.code, "summary": v.outcome}
    if root is not None and v.root_kind in ("rank", "node", "lost", "start"):
        data.update(signal=root.signal, error=root.error, t=root.t)
        data["stderr_tail"] = list(tails.tails.get((root.host, root.rank), ()))
    if outcome.stop_reason:
        data["stop_reason"] = outcome.stop_reason
    return data


# -- the command -----------------------------------------------------------------------------

async def run_async(hosts: Sequence[Host], req: RunRequest, opts: RunOptions,
                    settings: SSHSettings) -> int:
    """The whole `dtrain run`."""
    from dataclasses import replace

    from launcher.archive import check_run_id, new_run_id

    req = replace(req, run_id=check_run_id(req.run_id) if req.run_id else new_run_id())
    async with AutoTransport(settings) as transport:
        conns, errors = await connect_all(transport, hosts, fanout=opts.fanout,
                                          timeout=settings.connect_timeout)
        try:
            if errors:
                for label, why in errors.items():
                    render.note(f"{label}: {why}")
                raise ConnectError(f"cannot reach {fold(errors)}; nothing was started",
                                   hint="fix the nodes or leave them out with --exclude")
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
                    render_plan(plan)
                return 0
            return await launch(plan, req, opts, transport, conns, pre)
        finally:
            for conn in conns.values():
                with contextlib.suppress(Exception):
                    await conn.aclose()


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


async def launch(plan: LaunchPlan, req: RunRequest, opts: RunOptions, transport: AutoTransport,
                 conns: dict[str, Connection], pre: Preflight) -> int:
    """Start torchrun on every node and follow the job to its verdict."""
    from launcher.archive import RunArchive
    from launcher.console import Console

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
        out.message(f"run {archive.run_id}: {len(hosts)} nodes, world size {plan.world_size}, "
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
