"""--image for commands without the run's preflight (exec, image push): the probe's container
facts from every node, over connections that are closed again (docs/containers.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from launcher.aio import CLOSE_S, cleanup
from launcher.decide.runplan.container import ContainerFacts, ContainerRequest
from launcher.errors import DtrainError
from launcher.job.orchestrate import connect_all
from launcher.job.remote import run_program
from launcher.models import Host
from launcher.transports.base import Connection, Transport


@dataclass(frozen=True)
class NodeFactsHome:
    """The few host facts exec's container needs (home: the working directory)."""

    home: str | None
    gpus: int
    rdma: bool
    shm_bytes: int | None


async def container_facts_on(conns: Mapping[str, Connection],
                             reqs: Mapping[str, ContainerRequest], *,
                             python: str = "python3", timeout: float = 60.0
                             ) -> tuple[dict[str, ContainerFacts], dict[str, NodeFactsHome]]:
    """Each node's runtime and image (``ContainerFacts``) and its home (where exec runs),
    or the reason it could not be asked (in ``ContainerFacts.error``)."""
    facts: dict[str, ContainerFacts] = {}
    homes: dict[str, NodeFactsHome] = {}
    async def one(label: str, conn: Connection) -> None:
        params = {"mode": "facts", "python_check": False,
                  "container": reqs[label].probe_params()}
        try:
            raw = await run_program(conn, "probe", params,
                                    python=conn.host.python or python, timeout=timeout)
        except (DtrainError, OSError, TimeoutError) as exc:
            why = exc.message if isinstance(exc, DtrainError) else str(exc) or type(exc).__name__
            facts[label] = ContainerFacts(error=f"the probe failed: {why}")
            return
        got = ContainerFacts.from_json(raw.get("container"))
        facts[label] = got if got is not None else ContainerFacts(
            error="the probe reported no container facts: " +
            str(dict(raw.get("errors") or {}).get("container", "unknown")))
        shm = raw.get("shm_bytes")
        homes[label] = NodeFactsHome(str(raw.get("home") or "") or None,
                                     int(dict(raw.get("gpus") or {}).get("count") or 0),
                                     bool(dict(raw.get("rdma") or {}).get("devices")),
                                     shm if isinstance(shm, int) else None)

    async with asyncio.TaskGroup() as tg:
        for label, conn in conns.items():
            if label in reqs:
                tg.create_task(one(label, conn), name=f"container-probe:{label}")
    return facts, homes


async def probe_containers(transport: Transport, hosts: Sequence[Host],
                           reqs: Mapping[str, ContainerRequest],
                           *, fanout: int, connect_timeout: float, python: str = "python3"
                           ) -> tuple[dict[str, ContainerFacts], dict[str, NodeFactsHome],
                                      dict[str, str]]:
    """Connect, probe, close: (container facts, host facts, connect errors) per node."""
    conns, errors = await connect_all(transport, hosts, fanout=fanout, timeout=connect_timeout)
    try:
        facts, homes = await container_facts_on(conns, reqs, python=python)
    finally:
        for conn in conns.values():
            await cleanup(conn.aclose(), CLOSE_S)
    return facts, homes, errors
