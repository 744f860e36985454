"""One probe per node for a whole preflight: facts first, then ops on the same program.

`dtrain run`'s preflight asks every node three things: its facts, now and then the route
to another candidate master address, and whether node 0's master port is reachable from
it. Each used to be a node program of its own (three interpreters on node 0, two on every
other node, one after the other). ``NodeProbes`` starts probe.py once per node in
``facts`` mode with ``stay``: after the facts line it answers one JSON op a line
(``routes``, ``listen``, ``connect``; nodeside/probe.py) until the launcher closes its
stdin (issue 26: what `dtrain run` adds before the first rank line).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from launcher.aio import cleanup
from launcher.decide.fabric.checks import PYTHON_FIX, fold_by_message
from launcher.decide.outcome.startup import clock_offset
from launcher.decide.runplan.container import NodeContainerFacts, command_for, for_host
from launcher.decide.runplan.facts import NodeFacts, Route
from launcher.decide.runplan.plan import RunRequest, expand_home
from launcher.errors import DtrainError, PreflightFailed, RemoteCommandError
from launcher.job.remote import read_json_line, start_program
from launcher.models import Host
from launcher.nodeside import wire
from launcher.transports.base import Connection, Process

CLOSE_S = 5.0  # bound on the probes' exit after EOF


async def gather_named(coros: Mapping[str, Any]) -> None:
    """Run per-host coroutines; raise one PreflightFailed listing every host that failed,
    in the given (hostfile) order, hosts with the same failure folded."""
    failures: dict[str, str] = {}
    hints: set[str | None] = set()

    async def guard(label: str, coro: Any) -> None:
        try:
            await coro
        except DtrainError as exc:
            failures[label] = exc.message
            hints.add(exc.hint)

    async with asyncio.TaskGroup() as tg:
        for label, coro in coros.items():
            tg.create_task(guard(label, coro), name=f"probe:{label}")
    if failures:
        error = PreflightFailed(fold_by_message((h, failures[h]) for h in coros
                                                if h in failures),
                                hint=hints.pop() if len(hints) == 1 and None not in hints
                                else PYTHON_FIX)
        error.hosts = tuple(h for h in coros if h in failures)  # a restarting run fences them
        raise error


HOST_PYTHON = "python3"  # --image: the host's interpreter for dtrain's node programs


class NodeProbes:
    """probe.py running on every node from the facts to the end of the preflight."""

    def __init__(self, req: RunRequest, timeout: float) -> None:
        self._req = req
        self._timeout = timeout
        self._procs: dict[str, Process] = {}
        # per node: its clock's offset to the launcher's and the +/- of that (half the
        # facts' round trip), as doctor's clock check measures it (decide/outcome/startup.py)
        self.clock: dict[str, tuple[float, float]] = {}

    async def facts(self, conns: Mapping[str, Connection], targets: Sequence[str]
                    ) -> dict[str, NodeFacts]:
        """Start the probe on every node; each node's facts (routes towards ``targets``)."""
        req = self._req
        params = {"mode": "facts", "workdir": req.workdir, "targets": list(targets),
                  "entry": {"name": req.script, "module": req.module}, "stay": True}
        results: dict[str, NodeFacts] = {}

        async def one(label: str, conn: Connection) -> None:
            sent = time.time()
            try:
                async with asyncio.timeout(self._timeout):
                    ctr = for_host(req.container, conn.host.image)
                    # --image: --python is the image's; dtrain's node program runs on the
                    # host with its python3 (docs/containers.md)
                    proc = await start_program(conn, "probe", {
                        **params, **({"container": ctr.probe_params()} if ctr else {})},
                                               python=HOST_PYTHON if ctr else
                                               conn.host.python or req.python,
                                               setup=req.setup)
                    self._procs[label] = proc
                    raw = await read_json_line(proc, label, "probe")
            except TimeoutError:
                raise RemoteCommandError(f"the probe did not answer within "
                                         f"{self._timeout:g} s", host=label) from None
            received = time.time()
            results[label] = f = NodeFacts.from_json(raw)
            if f.time is not None:
                self.clock[label] = (clock_offset(f.time, sent, received),
                                     (received - sent) / 2)

        await gather_named({label: one(label, c) for label, c in conns.items()})
        return results

    async def ask(self, label: str, op: Mapping[str, Any]) -> dict[str, Any]:
        """One op to a node's probe and its answer (a DtrainError naming the node when the
        probe is gone or silent for the probe timeout)."""
        proc = self._procs[label]
        try:
            async with asyncio.timeout(self._timeout):
                await proc.write(json.dumps(dict(op)).encode() + b"\n")
                return await read_json_line(proc, label, f"probe ({op.get('op')})")
        except TimeoutError:
            raise RemoteCommandError(f"the probe did not answer {op.get('op')} within "
                                     f"{self._timeout:g} s", host=label) from None
        except (ConnectionError, OSError) as exc:
            raise RemoteCommandError(f"the probe's channel closed ({exc})",
                                     host=label) from None

    async def routes(self, facts: Mapping[str, NodeFacts], targets: Sequence[str]
                     ) -> dict[str, NodeFacts]:
        """These nodes' facts with their routes towards ``targets`` added (the probes that
        already reported the facts answer; no new program)."""
        out: dict[str, NodeFacts] = {}

        async def one(label: str) -> None:
            got = await self.ask(label, {"op": "routes", "targets": list(targets)})
            if not got.get("ok"):
                raise RemoteCommandError(f"probe: {got.get('error')}", host=label)
            routes = {str(k): Route.from_json(str(k), v if isinstance(v, dict) else {})
                      for k, v in dict(got.get("routes") or {}).items()}
            out[label] = dataclasses.replace(facts[label],
                                             routes={**facts[label].routes, **routes})

        await gather_named({label: one(label) for label in facts})
        return out

    async def in_image(self, hosts: Sequence[Host], facts: Mapping[str, NodeFacts],
                       grace: float) -> dict[str, NodeFacts]:
        """--image: the probe again, inside each node's image (the runtime's command
        decided as the job's, decide/runplan/container.py), so python, torch, NCCL, /dev/infiniband,
        memlock and /dev/shm are the container's; the host's runtime facts are kept. A node
        whose image cannot run it is named (PreflightFailed)."""
        req = self._req
        params: dict[str, object] = {"mode": "facts", "workdir": req.workdir, "targets": [],
                  "entry": {"name": req.script, "module": req.module}}
        source = wire.program_source("probe").decode()
        out: dict[str, NodeFacts] = {}
        errors: list[str] = []

        async def one(host: Host) -> None:
            f = facts[host.label]
            ctr = for_host(req.container, host.image)
            if ctr is None or f.container is None or f.container.runtime is None:
                return
            node = NodeContainerFacts(f.gpus, bool(f.rdma), f.shm_bytes)
            cmd = command_for(ctr, f.container.runtime, node, run_id=req.run_id,
                              host=host.name, attempt=req.attempt,
                              workdir=req.workdir or f.home, grace=grace, probe=True)
            python = expand_home(host.python or req.python, f.home)
            argv = [*cmd.head, *cmd.image, python, "-c", wire.IN_IMAGE_BOOT]
            got = await self.ask(host.label, {"op": "in_image", "argv": argv,
                                              "prepare": [list(c) for c in cmd.prepare],
                                              "input": json.dumps(params) + "\n" + source,
                                              "timeout": max(60.0, self._timeout)})
            if not got.get("ok") or not isinstance(got.get("facts"), dict):
                errors.append(f"{host.label}: {got.get('error') or 'no answer'}")
                return
            inside = NodeFacts.from_json(got["facts"])
            # the network is the host's (--network host); the runtime facts are the host's
            # and so are the node's other runs (the container has its own process table)
            out[host.label] = dataclasses.replace(inside, routes=f.routes,
                                                  container=f.container, others=f.others)

        await gather_named({h.label: one(h) for h in hosts})
        if errors:
            raise PreflightFailed("inside the image: " + "; ".join(errors),
                                  hint="the image needs Python >= 3.8 (and torch for run) "
                                       "at --python's path; --mount what it lacks")
        return out

    async def become(self, label: str, workdir: str | None) -> Process | None:
        """The node's probe turned into its supervisor's interpreter (probe.py ``become``:
        an exec in the working directory, under the shell, --setup and channel the probe
        ran with), ready for the supervisor's payload; None when there is no probe left
        there or it refused (that probe is ended: start the supervisor as usual)."""
        proc = self._procs.get(label)
        if proc is None:
            return None
        try:
            got = await self.ask(label, {"op": "become", "workdir": workdir,
                                         "bootstrap": wire.BOOTSTRAP})
        except DtrainError:
            got = {}
        if got.get("ok") and self._procs.pop(label, None) is proc:
            return proc
        await self.aclose(only=[label])
        return None

    async def aclose(self, only: Sequence[str] | None = None) -> None:
        """End every probe (``only``: these nodes' probes): EOF on its stdin (a listening
        port is released), its exit awaited for at most CLOSE_S, then the channel dropped."""
        labels = list(self._procs) if only is None else [h for h in only if h in self._procs]
        procs = [self._procs.pop(label) for label in labels]

        async def end(proc: Process) -> None:
            try:
                proc.write_eof()
                await proc.wait()
            finally:
                proc.abort()

        await cleanup(asyncio.gather(*(end(p) for p in procs), return_exceptions=True),
                      CLOSE_S)
