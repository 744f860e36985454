"""The keeper's side of the node agent (launcher/nodeside/agent.py): warm node programs.

A kept connection saves the handshake, but each channel still costs the node sshd's
session, the user's shell and a fresh interpreter for dtrain's node program: most of a warm
``exec`` to many nodes (docs/connections.md, "Warm node programs"). For a command line that
only starts a node program (``wire.plain_program``: no --setup, no working directory), the
keeper keeps one agent per connection and command line, started with that very command
line, and asks it to fork each later program. The command sees the same channel: the same
bytes in and out, the same exit status, and a dropped channel is a dropped channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
from typing import Any

from launcher.aio import CLOSE_S, cancel_and_wait, cleanup
from launcher.nodeside import wire
from launcher.transports.base import Connection, Process
from launcher.transports.keeper import frames
from launcher.transports.keeper.frames import ABORT, EOF, ERR, EXIT, IN, OUT, REP, FrameError

MAGIC = b"\n\x00DTRAIN-AGENT-1\x00\n"  # agent.py's twin
HEAD = struct.Struct("!BII")
SPAWN, A_IN, A_EOF, DROP, PAUSE, RESUME, SOURCE, IN_SOURCE = 1, 2, 3, 4, 5, 6, 7, 8
READY, STARTED, FAILED, A_OUT, A_ERR, ACK, A_EXIT = 10, 11, 12, 13, 14, 15, 16
READY_WAIT = 15.0  # the agent's start: the command line's own start, bounded
SPAWN_WAIT = 10.0  # one fork on the node
WINDOW = 1 << 20  # a job's stdin bytes in flight to the agent before its client waits
HIGH = 4 << 20  # a job's output held for a slow client before the agent stops reading it
RETRY_S = 60.0  # a command line whose agent would not start is tried again after this
NOISE_MAX = 64 << 10  # what the login shell printed before the agent's MAGIC: dropped
SOURCES_MAX = 32  # program sources an agent keeps (a handful of programs x dtrain versions)
OUT_HIGH = 1 << 20  # queued bytes past which a sender waits for the write
HEADER_MAX = 200  # a payload's header line ("<source length> <spec length> <cache key>")


class SourceCut:
    """The first bytes of a job's stdin, where a node program's source goes by reference.

    A job's stdin starts with the payload (``wire.payload``): a header line, the program's
    source, its spec. The first time an agent sees a source (by its cache key) it goes as
    it came, and is also sent once as SOURCE to be kept (``known`` gets the key once that
    frame is written, so no job refers to a source the agent has not got); after that only
    IN_SOURCE and the key cross the network, and the agent puts the kept bytes in their
    place. Everything after the source passes unchanged, as does a stdin that does not start
    with a header.
    """

    def __init__(self, known: set[bytes]) -> None:
        self.known = known
        self.head = bytearray()
        self.state = "header"  # then "skip" or "learn" (the source), then "pass"
        self.left = 0
        self.key = b""
        self.learned = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """What to send the agent for these bytes: (frame type, payload) pairs, in order;
        IN_SOURCE and SOURCE carry the key (and the source)."""
        out: list[tuple[int, bytes]] = []
        if self.state == "header":
            self.head += data
            at = self.head.find(b"\n")
            if at < 0:
                if len(self.head) > HEADER_MAX:
                    self.state = "pass"
                    out.append((A_IN, bytes(self.head)))
                return out
            line, data = bytes(self.head[:at + 1]), bytes(self.head[at + 1:])
            self.head = bytearray()
            parsed = wire.payload_header(line)
            out.append((A_IN, line))
            if parsed is None or parsed[0] == 0:
                self.state = "pass"
            else:
                self.left, self.key = parsed
                if self.key in self.known:
                    self.state = "skip"
                    out.append((IN_SOURCE, self.key))
                else:
                    self.state = "learn" if len(self.known) < SOURCES_MAX else "pass"
        if self.state in ("skip", "learn") and data:
            part, data = data[:self.left], data[self.left:]
            self.left -= len(part)
            if self.state == "learn":
                out.append((A_IN, part))
                self.learned += part
            if self.left == 0:
                if self.state == "learn":  # known once it is sent (the caller adds it)
                    out.append((SOURCE, self.key + b"\n" + bytes(self.learned)))
                    self.learned = bytearray()
                self.state = "pass"
        if self.state == "pass" and data:
            out.append((A_IN, data))
        return out

    def flush(self) -> list[tuple[int, bytes]]:
        """At the command's EOF: a header line still waiting for its newline goes as it is."""
        if self.state == "header" and self.head:
            self.state = "pass"
            return [(A_IN, bytes(self.head))]
        return []



class AgentUnavailable(Exception):
    """No agent for this command line now: the keeper opens a channel as before."""


class AgentJob:
    """One node program forked by an agent, relayed to one command's unix connection."""

    def __init__(self, agent: NodeAgent, jid: int, writer: asyncio.StreamWriter) -> None:
        self.agent = agent
        self.jid = jid
        self.writer = writer
        loop = asyncio.get_running_loop()
        self.started: asyncio.Future[int] = loop.create_future()
        self.done: asyncio.Future[int | None] = loop.create_future()
        self.unacked = 0
        self.credit = asyncio.Event()
        self.credit.set()
        self.paused = False

    def output(self, kind: bytes, data: bytes) -> None:
        if self.writer.is_closing():
            return
        self.writer.write(frames.encode(kind, data))
        transport = self.writer.transport
        if not self.paused and transport.get_write_buffer_size() > HIGH:
            self.paused = True
            self.agent.spawn_task(self._slow_client())

    async def _slow_client(self) -> None:
        """The client reads slowly: stop reading this job's output on the node (its own
        pipe fills and the program waits, as on a channel's window) until it catches up."""
        try:
            await self.agent.send(PAUSE, self.jid)
            with contextlib.suppress(OSError, ConnectionError):
                await self.writer.drain()
            await self.agent.send(RESUME, self.jid)
        except (OSError, ConnectionError):
            pass
        finally:
            self.paused = False

    def acked(self, n: int) -> None:
        self.unacked = max(0, self.unacked - n)
        if self.unacked <= WINDOW:
            self.credit.set()

    def end(self, status: int | None) -> None:
        if not self.started.done():
            self.started.set_exception(AgentUnavailable("the agent ended"))
        if not self.done.done():
            self.done.set_result(status)
        self.credit.set()


class NodeAgent:
    """One agent on one node, started over a kept connection with one command line."""

    def __init__(self, label: str, proc: Process) -> None:
        self.label = label
        self.proc = proc
        self.jobs: dict[int, AgentJob] = {}
        self.next_id = 1
        self.pid: int | None = None
        self.ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.dead = False
        self.closing = False
        self.why: str | None = None  # why the agent ended, when it was not closed by us
        self.err_tail = b""  # the end of the agent's own stderr (a traceback, if it died)
        self.tasks: set[asyncio.Task[Any]] = set()
        self.sources: set[bytes] = set()  # the cache keys of the sources it keeps
        self.outbuf = bytearray()  # frames queued for the agent (send)
        self.flusher: asyncio.Task[None] | None = None
        self.pump = asyncio.ensure_future(self._pump())
        self.errs = asyncio.ensure_future(self._stderr())
        self.started_at = time.time()

    @classmethod
    async def start(cls, conn: Connection, command: str) -> NodeAgent:
        """An agent on conn's node, ready; AgentUnavailable (or SessionRefused, which the
        caller treats as sshd's MaxSessions) when it cannot be had."""
        proc = await conn.start(command)
        agent = cls(conn.host.label, proc)
        try:
            await proc.write(wire.agent_payload())
            async with asyncio.timeout(READY_WAIT):
                agent.pid = await agent.ready
        except (ConnectionError, OSError, TimeoutError, AgentUnavailable) as exc:
            await cleanup(agent.aclose(), CLOSE_S)
            raise AgentUnavailable(f"{conn.host.label}: no node agent ({exc or 'timed out'})"
                                   ) from None
        return agent

    def spawn_task(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def send(self, kind: int, jid: int, data: bytes = b"") -> None:
        """Queue a frame for the agent. What every job queues in one turn of the loop goes
        in one write (one SSH packet where it fits): at 128 nodes the keeper's time went to
        the kernel's send of one packet per frame. Waits only when much is queued."""
        if self.dead:
            raise ConnectionError("the node agent is gone")
        self.outbuf += HEAD.pack(kind, jid, len(data)) + data
        if self.flusher is None or self.flusher.done():
            self.flusher = asyncio.ensure_future(self._flush())
        if len(self.outbuf) > OUT_HIGH:
            await asyncio.shield(self.flusher)

    async def _flush(self) -> None:
        await asyncio.sleep(0)  # this turn's other frames join
        try:
            while self.outbuf:
                data = bytes(self.outbuf)
                self.outbuf.clear()
                await self.proc.write(data)
        except (ConnectionError, OSError):
            self.outbuf.clear()  # the pump sees the channel end and ends every job

    async def _stderr(self) -> None:
        """The agent's own stderr (its jobs' is theirs): read and dropped, so it never
        fills; a traceback there ends the agent, which the pump sees."""
        while chunk := await self.proc.read_stderr(65536):
            self.err_tail = (self.err_tail + chunk)[-4096:]

    async def _pump(self) -> None:
        buf = bytearray()
        synced = False
        try:
            while True:
                data = await self.proc.read_stdout(1 << 16)
                if not data:
                    break
                buf += data
                if not synced:
                    at = buf.find(MAGIC)
                    if at < 0:
                        if len(buf) > NOISE_MAX:
                            del buf[:len(buf) - len(MAGIC)]
                        continue
                    del buf[:at + len(MAGIC)]
                    synced = True
                pos = 0
                while len(buf) - pos >= HEAD.size:
                    kind, jid, size = HEAD.unpack_from(buf, pos)
                    if size > frames.MAX_FRAME:
                        raise FrameError(f"an agent frame of {size} bytes")
                    if len(buf) - pos - HEAD.size < size:
                        break
                    start = pos + HEAD.size
                    self._frame(kind, jid, bytes(buf[start:start + size]))
                    pos = start + size
                del buf[:pos]
            self.why = "its channel ended"
        except (FrameError, ValueError, OSError, ConnectionError, struct.error) as exc:
            self.why = f"{type(exc).__name__}: {exc}"
        finally:
            self.dead = True
            if not self.closing and self.ready.done():
                tail = self.err_tail.decode("utf-8", "replace").strip().splitlines()
                print(f"dtrain keeper: {self.label}: node agent {self.pid} ended "
                      f"({self.why}; {len(self.jobs)} jobs)"
                      + (f": {tail[-1][:300]}" if tail else ""), flush=True)
            if not self.ready.done():
                self.ready.set_exception(AgentUnavailable("it ended before it was ready"))
            for job in list(self.jobs.values()):
                job.end(None)  # as a channel whose connection died: no status
            self.jobs.clear()

    def _frame(self, kind: int, jid: int, data: bytes) -> None:
        if kind == READY:
            if not self.ready.done():
                self.ready.set_result(int(data or b"0"))
            return
        job = self.jobs.get(jid)
        if job is None:
            return
        if kind == STARTED:
            if not job.started.done():
                job.started.set_result(int(data))
        elif kind == FAILED:
            if not job.started.done():
                job.started.set_exception(AgentUnavailable(data.decode("utf-8", "replace")))
            self.jobs.pop(jid, None)
        elif kind == A_OUT:
            job.output(OUT, data)
        elif kind == A_ERR:
            job.output(ERR, data)
        elif kind == ACK:
            job.acked(struct.unpack("!I", data)[0])
        elif kind == A_EXIT:
            self.jobs.pop(jid, None)
            job.end(int(data))

    async def run_job(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Fork one program and relay it to this command until it ends or the command goes.
        AgentUnavailable before anything was answered: the caller opens a channel instead."""
        jid = self.next_id
        self.next_id += 1
        job = self.jobs[jid] = AgentJob(self, jid, writer)
        try:
            await self.send(SPAWN, jid)
            async with asyncio.timeout(SPAWN_WAIT):
                await job.started
        except (ConnectionError, OSError, TimeoutError) as exc:
            self.jobs.pop(jid, None)
            if not self.dead:  # a fork that may still come: its channel is dropped
                with contextlib.suppress(ConnectionError, OSError):
                    await self.send(DROP, jid)
            raise AgentUnavailable(str(exc) or "no answer") from None
        except AgentUnavailable:
            self.jobs.pop(jid, None)
            raise
        writer.write(frames.encode_json(REP, {"ok": True}))
        inbound = asyncio.ensure_future(self._down(job, reader))
        try:
            status = await asyncio.shield(job.done)
            if status is not None:  # None: the agent or the command went, as a dropped channel
                writer.write(frames.encode_json(EXIT, {"status": status}))
                await writer.drain()
        except (OSError, ConnectionError):
            pass
        finally:
            await cancel_and_wait(inbound)

    async def _down(self, job: AgentJob, reader: asyncio.StreamReader) -> None:
        """The command's frames to the job; the command gone drops the job's channel."""
        cut = SourceCut(self.sources)
        try:
            while True:
                frame = await frames.read_frame(reader)
                if frame is None or frame[0] == ABORT:
                    break
                if frame[0] == IN:
                    while job.unacked > WINDOW:
                        job.credit.clear()
                        await job.credit.wait()
                    if job.done.done():
                        continue
                    for kind, data in cut.feed(frame[1]):
                        if kind == A_IN:
                            job.unacked += len(data)
                        await self.send(kind, 0 if kind == SOURCE else job.jid, data)
                        if kind == SOURCE:  # only now may another job send IN_SOURCE
                            self.sources.add(data.partition(b"\n")[0])
                elif frame[0] == EOF:
                    for _, data in cut.flush():
                        job.unacked += len(data)
                        await self.send(A_IN, job.jid, data)
                    await self.send(A_EOF, job.jid)
        except (FrameError, OSError, ConnectionError):
            pass
        if not job.done.done():
            self.jobs.pop(job.jid, None)
            job.end(None)
            with contextlib.suppress(OSError, ConnectionError):
                await self.send(DROP, job.jid)

    async def aclose(self) -> None:
        self.closing = True
        self.proc.abort()
        extra = [self.flusher] if self.flusher is not None else []
        await cancel_and_wait(self.pump, self.errs, *self.tasks, *extra)



def row(agent: NodeAgent) -> dict[str, Any]:
    """What ``dtrain connections`` shows of one agent."""
    return {"pid": agent.pid, "jobs": len(agent.jobs),
            "held": sum(1 for j in agent.jobs.values() if j.paused),
            "age_s": round(time.time() - agent.started_at, 1)}
