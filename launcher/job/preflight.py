"""`dtrain run`'s preflight: probe every node, choose and validate the master: facts only.

A node's environment is decided from these facts by the plan (``decide.runplan.plan.build_plan``).

Each step is bounded (--connect-timeout for the links, the probe timeout for every node
program). An unreachable master is found here, with a real TCP connect from every worker
to the port node 0 has bound, instead of as a rendezvous hang after launch.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, field

from launcher.decide.fabric.checks import unreachable_fence
from launcher.decide.runplan.container import for_host, image_problems
from launcher.decide.runplan.facts import NodeFacts
from launcher.decide.runplan.netenv import choose_master, given_hint, pick_master_addr
from launcher.decide.runplan.plan import RunRequest
from launcher.decide.runplan.runoptions import RunOptions
from launcher.errors import DtrainError, PreflightFailed
from launcher.hosts.hostfile import fold
from launcher.job.probes import NodeProbes
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
    # per node, its clock's offset to the launcher's and its +/- (job/probes.py; the
    # start-up split, docs/goodput.md)
    clock: dict[str, tuple[float, float]] = field(default_factory=dict)
    # every node's probe, still running once the preflight is over: each becomes its node's
    # supervisor (NodeProbes.become); whoever holds the connections ends the rest
    # (NodeProbes.aclose, job/prepare.py) before they close
    probes: NodeProbes | None = None


# -- probing: one probe per node (job/probes.py) -----------------------------------------------

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


def _refuse_denied(facts: dict[str, NodeFacts], denied: list[str], what: str, why: str,
                   access: str) -> None:
    """Refuse the run when the remote user may not reach ``what`` on the ``denied`` nodes:
    ``why`` says how (its ``{user}`` is the user of the first one), ``access`` what to give."""
    if denied:
        user = facts[denied[0]].user or "the remote user"
        raise PreflightFailed(f"{what} on {fold(denied)}: permission denied "
                              f"({why.format(user=user)}); nothing was started",
                              hint=f"give {user} {access}")


def _is_ip(text: str | None) -> bool:
    try:
        ipaddress.ip_address(text or "")
    except ValueError:
        return False
    return True


async def check_master_port(probes: NodeProbes, labels: Sequence[str], addr: str,
                            port: int, timeout: float, *, given: str | None = None) -> int:
    """Bind the master port on node 0 and connect to it from every other node, through the
    probes that reported their facts (no new node program).

    Port 0 lets node 0 pick a free one. An unreachable master is a preflight error here,
    not a 15-minute rendezvous hang later. The port stays bound until the probes close.
    """
    master, workers = labels[0], labels[1:]
    async with asyncio.timeout(timeout):
        res = await probes.ask(master, {"op": "listen", "addr": addr, "port": port})
        if not res.get("ok"):
            raise PreflightFailed(f"cannot bind the master port {addr}:{port}: "
                                  f"{res.get('error')}", host=master,
                                  hint="pick another --master-port")
        port = int(res["port"])
        failures: list[str] = []
        failed: list[str] = []

        async def one(label: str) -> None:
            try:
                got = await probes.ask(label, {"op": "connect", "addr": addr, "port": port,
                                               "timeout": 3})
            except DtrainError as exc:  # kept out of the TaskGroup's ExceptionGroup
                got = {"ok": False, "error": exc.message}
            if not got.get("ok"):
                failures.append(f"{label} ({got.get('error')})")
                failed.append(label)

        async with asyncio.TaskGroup() as tg:
            for label in workers:
                tg.create_task(one(label))
        if failures:
            error = PreflightFailed(
                f"the master {addr}:{port} is unreachable from {', '.join(failures)}",
                hint=given_hint(given, "check firewalls between the nodes, or pass "
                                "--master-addr", "check firewalls between the nodes, and "
                                "that --master-addr {addr} is node 0's address on the "
                                "network they share"))
            error.hosts = unreachable_fence(workers, failed)  # a restarting run fences them
            raise error
    return port


async def preflight(conns: dict[str, Connection], hosts: Sequence[Host], req: RunRequest,
                    opts: RunOptions) -> Preflight:
    """Probe, choose and validate the master: one probe program per node throughout."""
    probes = NodeProbes(req, opts.connection.probe_timeout)
    try:
        pre = await _preflight(probes, conns, hosts, req, opts)
        # node 0's probe closes the master port now, before torchrun binds it
        await probes.ask(hosts[0].label, {"op": "unlisten"})
    except BaseException:
        await probes.aclose()
        raise
    # the probes stay: each becomes its node's supervisor (issue 26: no new channel, shell,
    # --setup and interpreter per node before the first rank line)
    pre.probes = probes
    return pre


async def _preflight(probes: NodeProbes, conns: dict[str, Connection], hosts: Sequence[Host],
                     req: RunRequest, opts: RunOptions) -> Preflight:
    ordered = [conns[h.label] for h in hosts]
    pre = Preflight()
    guess = req.master_addr or ordered[0].peer_addr
    first_guess: list[str] = [guess] if guess and _is_ip(guess) else []
    if len(hosts) == 1:
        first_guess = [req.master_addr or "127.0.0.1"]
    pre.facts = await probes.facts(conns, first_guess)
    pre.clock = dict(probes.clock)
    images = {h.label: c for h in hosts if (c := for_host(req.container, h.image))}
    if images:  # --image: every node has it, then the facts are the container's
        problems = image_problems(images, {k: pre.facts[k].container for k in images})
        if problems:
            raise PreflightFailed("; ".join(problems), hint="nothing was started")
        pre.facts.update(await probes.in_image(hosts, pre.facts, opts.limits.grace))
    if opts.checks.preflight:
        from launcher.decide.fabric.checks import failure_hint, failure_message, fast_checks

        rows = fast_checks(pre.facts, hosts)
        problem = failure_message(rows)
        if problem:
            raise PreflightFailed(problem, hint=failure_hint(rows))
    _refuse_denied(pre.facts, [h.label for h in hosts if pre.facts[h.label].workdir_denied],
                   f"working directory {req.workdir}",
                   "it exists, but {user} may not enter or read it",
                   "access to it (chmod/chown, e.g. chmod o+rx), or pass a --workdir it may use")
    missing = [h.label for h in hosts if pre.facts[h.label].workdir_ok is False]
    if missing:
        raise PreflightFailed(f"working directory {req.workdir} does not exist on "
                              f"{fold(missing)}", hint="create it there, or pass --workdir")
    if opts.checks.preflight:
        _refuse_denied(pre.facts, [h.label for h in hosts if pre.facts[h.label].entry_denied],
                       f"{req.script} in {req.workdir}",
                       "{user} may not read it, or a directory on its path",
                       "read access to the script and search access to its directories")
    absent = [h.label for h in hosts if pre.facts[h.label].entry_ok is False]
    if absent and opts.checks.preflight:
        raise entry_missing(req, absent)
    master_facts = pre.facts[hosts[0].label]
    if len(hosts) == 1:
        pre.master_addr, pre.master_reason = first_guess[0], "single node: loopback"
    else:
        candidates = [req.master_addr] if req.master_addr else pick_master_addr(master_facts)
        workers = {h.label: pre.facts[h.label] for h in hosts[1:]}
        if any(c not in f.routes for c in candidates for f in workers.values()):
            workers.update(await probes.routes(workers, candidates))
        choice = choose_master(candidates, {k: f.routes for k, f in workers.items()},
                               given=req.master_addr)
        pre.master_addr, pre.master_reason = choice.addr, choice.reason
        if choice.warning:
            pre.warnings.append(choice.warning)
        pre.facts.update(workers)
    pre.master_port = req.master_port or 0
    pre.master_port = await check_master_port(probes, [h.label for h in hosts],
                                              pre.master_addr, pre.master_port,
                                              opts.connection.probe_timeout,
                                              given=req.master_addr)
    return pre
