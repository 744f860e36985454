"""`dtrain cp` over every node: each node, at most ``--fanout`` at once, through its engine.

Push goes through dtrain's node program (``stream``) and falls back to SFTP (``sftp``)
where that program cannot start (no such python: a note says so); pull is SFTP.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence

from launcher.commands.cp.relay import Broadcaster
from launcher.commands.cp.request import CopyRequest, SourceData, prepare_pull, prepare_push
from launcher.commands.cp.sftp import pull_node, push_sftp
from launcher.commands.cp.shared import Copy, Target
from launcher.commands.cp.stream import NodeFiles, StreamPush
from launcher.commands.cp.view import CopyView
from launcher.commands.entry import INTERRUPTED, run_command
from launcher.decide.copies import copyplan as cpl
from launcher.errors import ConnectError, DtrainError, RemoteCommandError
from launcher.models import CopyResult, Host
from launcher.output import render
from launcher.text.words import count
from launcher.transports import AutoTransport
from launcher.transports.base import Connection, Transport
from launcher.transports.ssh import SSHSettings


async def push_node(conn: Connection, copy: Copy, result: CopyResult) -> None:
    """Push every source to one node: as one stream through dtrain's node program, or over
    SFTP when that program cannot start there (no such python: a note says so)."""
    req = copy.req
    if req.stream:
        python = req.python_on(conn.host)
        try:
            nf, home = await NodeFiles.start(conn, python)
        except (RemoteCommandError, TimeoutError) as exc:
            why = exc.message if isinstance(exc, DtrainError) else "no answer in time"
            render.note(f"{result.label}: {why}; copying over SFTP instead")
        else:
            if copy.data is None:
                copy.data = SourceData(req.python)
            await StreamPush(nf, copy, Target(conn, result, python)).run(home)
            return
    await push_sftp(conn, copy, result)


async def cp_async(hosts: Sequence[Host], req: CopyRequest, settings: SSHSettings) -> int:
    """Copy to (or from) every host; the exit code as exec's."""
    sources = [] if req.pull else await prepare_push(req)
    if req.pull:
        prepare_pull(req)
    view = CopyView(len(hosts), live=req.progress, verb="received" if req.pull else "sent",
                    order=[h.label for h in hosts])
    # each source file read once per push, not once per node
    copy = Copy(req, view, sources, SourceData(req.python))
    results = {h.label: CopyResult(h.label) for h in hosts}
    sem = asyncio.Semaphore(req.fanout)
    if not req.pull and req.broadcast is not False:
        if len(hosts) <= req.fanout:  # a chain needs every node connected at once
            copy.bcast = Broadcaster([h.label for h in hosts], len(sources), req, view)
        elif req.broadcast:
            render.note(f"--broadcast needs --fanout >= the number of nodes ({len(hosts)}); "
                        "sending directly")
    bcast = copy.bcast

    async def one(host: Host, transport: Transport) -> None:
        result = results[host.label]
        async with sem:
            try:
                async with await transport.connect(host) as conn:
                    if req.pull:
                        await pull_node(conn, copy, result)
                    else:
                        await push_node(conn, copy, result)
            except ConnectError as exc:
                result.unreachable = exc.message
            except DtrainError as exc:
                result.errors.append(exc.message)
            finally:
                if bcast is not None:
                    bcast.leave(host.label)
        view.node_done(result)

    auto = AutoTransport(settings, req.transport, say=render.note)
    try:
        auto.choose(hosts)  # a forced srun that cannot work: exit 2 before anything connects
        async with auto as transport, asyncio.TaskGroup() as tg:
            for h in hosts:
                tg.create_task(one(h, transport), name=h.label)
    finally:
        if bcast is not None:
            await bcast.aclose()
        view.close()
    _report(results.values())
    return cpl.exit_code(results.values())


def _report(results: Iterable[CopyResult]) -> None:
    failed = [r for r in results if r.exit_code]
    if failed:
        render.note(f"{count(len(failed), 'node')} failed: "
                    + ", ".join(r.label for r in failed))


def run_cp(hosts: Sequence[Host], req: CopyRequest, settings: SSHSettings) -> int:
    """`dtrain cp`: the exit code as exec's."""
    return run_command("cp", hosts, lambda: cp_async(hosts, req, settings),
                       lambda ended: INTERRUPTED if ended.result is None else ended.result)
