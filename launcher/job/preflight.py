"""`dtrain run`'s preflight: probe every node, choose and validate the master: facts only.

A node's environment is decided from these facts by the plan (``decide.plan.build_plan``).

Each step is bounded (--connect-timeout for the links, the probe timeout for every node
program). An unreachable master is found here, with a real TCP connect from every worker
to the port node 0 has bound, instead of as a rendezvous hang after launch.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from launcher.decide.checks import PYTHON_FIX, fold_by_message
from launcher.decide.facts import NodeFacts
from launcher.decide.netenv import choose_master, pick_master_addr
from launcher.decide.plan import RunOptions, RunRequest
from launcher.errors import DtrainError, PreflightFailed, RemoteCommandError
from launcher.hosts.hostfile import fold
from launcher.job.remote import read_json_line, run_program, start_program
from launcher.models import Host
from launcher.transports.base import Connection


@dataclass
class Preflight:
    """What the probe phase learned: every node's facts and the master that works."""

    facts: dict[str, NodeFacts] = field(default_factory=dict)
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
    params = {"mode": "facts", "workdir": req.workdir, "targets": list(targets),
              "entry": {"name": req.script, "module": req.module}}
    results: dict[str, NodeFacts] = {}

    async def one(label: str, conn: Connection) -> None:
        results[label] = NodeFacts.from_json(await _probe(conn, params, req, timeout))

    await _gather_named({label: one(label, c) for label, c in conns.items()})
    return results


async def _gather_named(coros: Mapping[str, Any]) -> None:
    """Run per-host coroutines; raise one PreflightFailed listing every host that failed,
    in the given (hostfile) order, hosts with the same failure folded."""
    failures: dict[str, str] = {}

    async def guard(label: str, coro: Any) -> None:
        try:
            await coro
        except DtrainError as exc:
            failures[label] = exc.message

    async with asyncio.TaskGroup() as tg:
        for label, coro in coros.items():
            tg.create_task(guard(label, coro), name=f"probe:{label}")
    if failures:
        raise PreflightFailed(fold_by_message((h, failures[h]) for h in coros if h in failures),
                              hint=PYTHON_FIX)


def entry_missing(req: RunRequest, hosts: Sequence[str]) -> PreflightFailed:
    """The script (or module) is not on those nodes: refused before anything starts."""
    if req.module:
        return PreflightFailed(
            f"module {req.script} not found on {fold(hosts)} (looked in {req.workdir} and "
            "the nodes' Python path); nothing was started",
            hint="install it for that Python (--python/--setup), or check --workdir; "
                 "--no-preflight skips this check")
    return PreflightFailed(
        f"{req.script} not found in {req.workdir} on {fold(hosts)}; nothing was started",
        hint="the script's path is relative to the working directory (--workdir, default: "
             "the current one), which must hold the same files on every node")


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
                try:
                    got = await _probe(conn, {"mode": "connect", "addr": addr, "port": port,
                                              "timeout": 3}, req, timeout)
                except DtrainError as exc:  # kept out of the TaskGroup's ExceptionGroup
                    got = {"ok": False, "error": exc.message}
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
    """Probe, choose and validate the master."""
    ordered = [conns[h.label] for h in hosts]
    pre = Preflight()
    guess = req.master_addr or ordered[0].peer_addr
    first_guess: list[str] = [guess] if guess and _is_ip(guess) else []
    if len(hosts) == 1:
        first_guess = [req.master_addr or "127.0.0.1"]
    pre.facts = await probe_facts(conns, req, first_guess, opts.probe_timeout)
    if opts.preflight:
        from launcher.decide.checks import failure_hint, failure_message, fast_checks

        rows = fast_checks(pre.facts, hosts)
        problem = failure_message(rows)
        if problem:
            raise PreflightFailed(problem, hint=failure_hint(rows))
    missing = [h.label for h in hosts if pre.facts[h.label].workdir_ok is False]
    if missing:
        raise PreflightFailed(f"working directory {req.workdir} does not exist on "
                              f"{fold(missing)}", hint="create it there, or pass --workdir")
    absent = [h.label for h in hosts if pre.facts[h.label].entry_ok is False]
    if absent and opts.preflight:
        raise entry_missing(req, absent)
    master_facts = pre.facts[hosts[0].label]
    if len(hosts) == 1:
        pre.master_addr, pre.master_reason = first_guess[0], "single node: loopback"
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
    return pre
