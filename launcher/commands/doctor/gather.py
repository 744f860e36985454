"""`dtrain doctor`'s I/O: connect, probe every node (twice when workers need routes to more
master candidates), choose the master, test its port. Per-node failures become data.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from launcher import defaults
from launcher.aio import CLOSE_S, cleanup, cleanup_now
from launcher.decide.fabric.checks import Gathered, MasterPick, PortProbe
from launcher.decide.fabric.fabric_checks import master_candidates, pick_master
from launcher.decide.runplan.container import ContainerRequest, for_host
from launcher.decide.runplan.facts import NodeFacts
from launcher.errors import DtrainError, PreflightFailed
from launcher.models import Host
from launcher.output import render


@dataclass(frozen=True)
class DoctorOptions:
    """What the doctor runs on the nodes and how long it waits."""

    python: str = "python3"
    setup: str | None = None
    master_addr: str | None = None
    master_port: int | None = None  # None: any free port (what `dtrain run` picks by default)
    fanout: int = defaults.FANOUT
    probe_timeout: float = 30.0
    transport: str = "auto"  # --transport
    image: ContainerRequest | None = None  # --image: does every node have it?


# --------------------------------------------------------------------------- helpers



async def _start_probe(conn: Any, params: Mapping[str, Any], opts: DoctorOptions) -> Any:
    """Start the probe and hand it its params; tolerate a command that already exited.

    When the interpreter is missing the remote shell exits 98 before reading stdin, so the
    write may find the channel closed: that is not the error to report, its stderr is
    (``read_json_line`` reads it once stdout turns out empty).
    """
    from launcher.nodeside import wire

    python = conn.host.python or opts.python
    proc = await conn.start(wire.remote_command(python, setup=opts.setup))
    body = json.dumps(dict(params)).encode() + b"\n"
    with contextlib.suppress(ConnectionError):
        await proc.write(wire.payload(wire.program_source("probe")) + body)
    return proc


async def _probe(conn: Any, params: Mapping[str, Any], opts: DoctorOptions) -> dict[str, Any]:
    """Run the probe in one mode to completion: its JSON answer, or a DtrainError."""
    from launcher.job.remote import read_json_line

    try:
        async with asyncio.timeout(opts.probe_timeout):
            proc = await _start_probe(conn, params, opts)
            try:
                proc.write_eof()
                return await read_json_line(proc, conn.host.label, "probe")
            finally:
                proc.abort()
    except TimeoutError:
        raise PreflightFailed(f"the probe did not answer within {opts.probe_timeout:g} s",
                              host=conn.host.label) from None


def _why(exc: BaseException) -> str:
    if isinstance(exc, DtrainError):
        return f"{exc.message} ({exc.hint})" if exc.hint else exc.message
    return f"{type(exc).__name__}: {exc}"


async def _probe_all(conns: Mapping[str, Any], targets: Sequence[str], opts: DoctorOptions,
                     facts: dict[str, NodeFacts], errors: dict[str, str],
                     timing: dict[str, tuple[float, float]]) -> None:
    async def one(label: str, conn: Any) -> None:
        sent = time.time()
        ctr = for_host(opts.image, conn.host.image)
        params = {"mode": "facts", "targets": list(targets),
                  **({"container": ctr.probe_params()} if ctr else {})}
        try:
            raw = await _probe(conn, params, opts)
        except (DtrainError, OSError, TimeoutError) as exc:
            # a failed --setup: its own message (the fix is the setup row's)
            setup = isinstance(exc, DtrainError) and getattr(exc, "kind", None) == "setup"
            errors[label] = exc.message if isinstance(exc, DtrainError) and setup else _why(exc)
            return
        timing.setdefault(label, (sent, time.time()))
        if raw.get("ok") is False:
            errors[label] = f"probe failed: {raw.get('error')}"
            return
        facts[label] = NodeFacts.from_json(raw)

    async with asyncio.TaskGroup() as tg:
        for label, conn in conns.items():
            tg.create_task(one(label, conn), name=f"doctor-probe:{label}")


async def _port_test(conns: Mapping[str, Any], pick: MasterPick, port: int,
                     opts: DoctorOptions) -> PortProbe:
    """Listen on node 0 with the probe's ``listen`` mode, connect from every other node."""
    from launcher.job.remote import read_json_line

    addr = pick.probe_addr or "127.0.0.1"
    proc = None
    try:
        async with asyncio.timeout(opts.probe_timeout):
            proc = await _start_probe(conns[pick.host], {"mode": "listen", "addr": addr,
                                                         "port": port}, opts)
            listen = await read_json_line(proc, pick.host, "master port check")
            if not listen.get("ok"):
                return PortProbe(addr, port, listen)
            port = int(listen["port"])
            connects: dict[str, Mapping[str, Any] | str] = {}

            async def one(label: str, conn: Any) -> None:
                try:
                    connects[label] = await _probe(conn, {"mode": "connect", "addr": addr,
                                                          "port": port, "timeout": 3}, opts)
                except (DtrainError, OSError, TimeoutError) as exc:
                    connects[label] = _why(exc)

            async with asyncio.TaskGroup() as tg:
                for label, conn in conns.items():
                    if label != pick.host:
                        tg.create_task(one(label, conn))
            return PortProbe(addr, port, listen, connects)
    except (DtrainError, OSError, TimeoutError) as exc:
        return PortProbe(addr, port, _why(exc))
    finally:
        if proc is not None:
            cleanup_now(proc.write_eof)
            proc.abort()


async def gather_with(transport: Any, hosts: Sequence[Host], opts: DoctorOptions,
                      connect_timeout: float) -> Gathered:
    """Connect, probe (twice when the workers need routes to more master candidates),
    choose the master, test its port. Every per-node failure becomes data, never raises."""
    from launcher.job.orchestrate import connect_all

    conns, connect_errors = await connect_all(transport, hosts, fanout=opts.fanout,
                                              timeout=connect_timeout)
    try:
        ordered = {h.label: conns[h.label] for h in hosts if h.label in conns}
        facts: dict[str, NodeFacts] = {}
        probe_errors: dict[str, str] = {}
        timing: dict[str, tuple[float, float]] = {}
        first = next(iter(ordered.values()), None)
        guess = [opts.master_addr] if opts.master_addr else (
            [first.peer_addr] if first is not None and first.peer_addr else [])
        await _probe_all(ordered, [a for a in guess if a], opts, facts, probe_errors, timing)
        probed = {h: facts[h] for h in ordered if h in facts}
        pick = None
        if probed:
            master_host = next(iter(probed))
            wanted = master_candidates(probed[master_host], opts.master_addr, len(probed))
            lacking = {h: ordered[h] for h, f in probed.items() if h != master_host
                       and any(c not in f.routes for c in wanted)}
            if lacking:
                more: dict[str, NodeFacts] = {}
                await _probe_all(lacking, wanted, opts, more, probe_errors, timing)
                for h, f in more.items():
                    probed[h] = f
            pick = pick_master(probed, opts.master_addr)
        port = None
        if pick is not None and pick.probe_addr is not None:
            port = await _port_test({h: ordered[h] for h in probed}, pick,
                                    opts.master_port or 0, opts)
        setup_errors = {h: e for h, e in probe_errors.items() if e.startswith("--setup failed")}
        images = {h.label: c for h in hosts if (c := for_host(opts.image, h.image))}
        return Gathered(tuple(hosts), connect_errors, probe_errors, probed, timing, pick, port,
                        opts.setup, setup_errors, images)
    finally:
        for conn in conns.values():
            await cleanup(conn.aclose(), CLOSE_S)


async def gather(hosts: Sequence[Host], opts: DoctorOptions, settings: Any) -> Gathered:
    """``gather_with`` over dtrain's normal transport (SSH, local for localhost)."""
    from launcher.transports import AutoTransport

    transport = AutoTransport(settings, opts.transport, say=render.note)
    transport.choose(hosts)
    async with transport:
        return await gather_with(transport, hosts, opts, settings.connect_timeout)


