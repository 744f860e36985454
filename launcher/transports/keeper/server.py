"""The connection keeper: one background process per user that holds authenticated SSH
connections and relays channels over them for later commands (docs/connections.md).

Connections are keyed by (host, user, port, the settings, what the watched files are):
a request whose ssh config, known_hosts or keys changed gets a new connection, and the old
one is closed once its channels end. Only this user may talk to it (SO_PEERCRED).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher import private
from launcher.aio import CLOSE_S, cancel_and_wait, cleanup
from launcher.errors import DtrainError, SessionRefused
from launcher.models import Host
from launcher.nodeside import wire
from launcher.transports.base import Process
from launcher.transports.keeper import frames
from launcher.transports.keeper.client import PROTOCOL, SOURCE, stamp
from launcher.transports.keeper.frames import (
    ABORT,
    CHUNK,
    EOF,
    ERR,
    EXIT,
    IN,
    OUT,
    REP,
    REQ,
    FrameError,
)
from launcher.transports.keeper.nodeagent import RETRY_S, AgentUnavailable, NodeAgent
from launcher.transports.keeper.nodeagent import row as agent_row
from launcher.transports.ssh.settings import SSHSettings
from launcher.transports.ssh.transport import SSHConnection, SSHTransport

MAX_CHANNELS = 4096  # open channels at once; past it a command is told to go direct
# pending connections on the socket: an exec to N nodes opens 2N at once (asyncio's default
# of 100 made some of a 128-node exec go direct); the kernel caps it at net.core.somaxconn
BACKLOG = 4096
TICK = 1.0  # housekeeping: idle connections, changed files, the keeper's own exit
RESIDENT_STALE = 3  # launcher/cli/resident.STALE: dtrain was changed, start a new resident


@dataclass
class Entry:
    """One kept connection."""

    key: str
    host: Host
    conn: SSHConnection
    paths: list[str]
    stamp: list[Any]
    persist: float
    created: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.monotonic)
    channels: int = 0
    stale: str | None = None  # why it is to be closed once its channels end
    # node agents (warm node programs), by the command line they were started with
    agents: dict[str, NodeAgent] = field(default_factory=dict)
    agent_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    agent_failed: dict[str, float] = field(default_factory=dict)  # command -> when

    def row(self) -> dict[str, Any]:
        return {"host": self.host.name, "user": self.host.user, "port": self.host.port,
                "peer": self.conn.peer_addr, "age_s": round(time.time() - self.created, 1),
                "idle_s": round(time.monotonic() - self.last_used, 1),
                "channels": self.channels, "persist_s": self.persist, "stale": self.stale,
                "key": self.key[:12],
                "agents": [agent_row(a) for a in self.agents.values() if not a.dead]}

    async def agent(self, command: str) -> NodeAgent | None:
        """This connection's agent for ``command``, started when there is none; None when
        it cannot be had now (sshd's sessions are full, it would not start)."""
        async with self.agent_lock:
            agent = self.agents.get(command)
            if agent is not None and not agent.dead:
                return agent
            failed = self.agent_failed.get(command)
            if failed is not None and time.monotonic() - failed < RETRY_S:
                return None
            try:
                agent = await NodeAgent.start(self.conn, command)
            except SessionRefused:
                return None
            except (AgentUnavailable, DtrainError) as exc:
                self.agent_failed[command] = time.monotonic()
                print(f"dtrain keeper: {self.host.label}: no node agent: {exc}", flush=True)
                return None
            self.agents[command] = agent
            return agent


def _key(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def settings_from(data: Any) -> SSHSettings:
    """SSHSettings from a request's JSON (ValueError when it is not one)."""
    if not isinstance(data, dict):
        raise ValueError("settings must be an object")
    ukh = data.get("user_known_hosts")
    return SSHSettings(
        connect_timeout=float(data["connect_timeout"]), accept_new=bool(data["accept_new"]),
        identities=tuple(str(x) for x in data["identities"]),
        keepalive_interval=float(data["keepalive_interval"]),
        keepalive_count_max=int(data["keepalive_count_max"]), retries=int(data["retries"]),
        home=Path(str(data["home"])), options=tuple(str(x) for x in data["options"]),
        user_known_hosts=None if ukh is None else tuple(Path(str(p)) for p in ukh),
        global_known_hosts=tuple(Path(str(p)) for p in data["global_known_hosts"]))


def host_from(data: Any) -> Host:
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        raise ValueError("host must be an object with a name")
    user, port = data.get("user"), data.get("port")
    if user is not None and not isinstance(user, str):
        raise ValueError("host.user must be a string")
    if port is not None and (not isinstance(port, int) or isinstance(port, bool)):
        raise ValueError("host.port must be a number")
    return Host(name=data["name"], user=user, port=port)


class Keeper:
    def __init__(self, directory: Path, idle: float) -> None:
        self.directory = directory
        self.sock = frames.socket_path(directory)
        self.idle = idle
        self.entries: dict[str, Entry] = {}
        # connections being closed (close() does not wait): kept, and awaited at the end
        self.closing: set[asyncio.Task[None]] = set()
        self.transports: dict[str, SSHTransport] = {}
        self.locks: dict[str, asyncio.Lock] = {}
        self.clients = 0
        self.channels = 0
        self.last_activity = time.monotonic()
        self.quitting = False
        self.stopped = asyncio.Event()
        self.resident: subprocess.Popen[bytes] | None = None
        # DTRAIN_NODE_AGENT=0 in the keeper's environment: a channel per program, always
        self.agents_on = os.environ.get("DTRAIN_NODE_AGENT", "1") != "0"

    # ------------------------------------------------------------------ connections
    async def entry(self, req: dict[str, Any]) -> Entry:
        host = host_from(req.get("host"))
        settings = settings_from(req.get("settings"))
        paths = [str(p) for p in req.get("paths") or []]
        now = req.get("stamp")
        persist = float(req.get("persist") or self.idle)
        self.idle = max(self.idle, persist)
        tkey = _key(req.get("settings"), paths, now)
        key = _key(tkey, req.get("host"))
        async with self.locks.setdefault(key, asyncio.Lock()):
            entry = self.entries.get(key)
            if entry is not None and entry.stale is None and not entry.conn.is_closed():
                entry.persist = persist
                entry.last_used = time.monotonic()
                return entry
            if entry is not None:
                self.close(entry, "replaced")
            # the same node with other settings or changed files: its old one goes
            for other in list(self.entries.values()):
                if other.host == host and other.key != key and other.stale is None:
                    other.stale = "ssh config, known_hosts or keys changed"
                    if other.channels == 0:
                        self.close(other, other.stale)
            transport = self.transports.get(tkey)
            if transport is None:
                transport = self.transports[tkey] = SSHTransport(settings)
            conn = await transport.connect(host)
            assert isinstance(conn, SSHConnection)
            watched = list(dict.fromkeys([*paths, *transport.watched_files(host)]))
            entry = Entry(key, host, conn, watched, stamp(watched), persist)
            self.entries[key] = entry
            return entry

    def close(self, entry: Entry, why: str) -> None:
        if self.entries.get(entry.key) is entry:
            del self.entries[entry.key]
        entry.stale = entry.stale or why
        task = asyncio.ensure_future(self._close(entry))
        self.closing.add(task)
        task.add_done_callback(self.closing.discard)

    @staticmethod
    async def _close(entry: Entry) -> None:
        for agent in list(entry.agents.values()):
            await cleanup(agent.aclose(), CLOSE_S)
        entry.agents.clear()
        await cleanup(entry.conn.aclose(), CLOSE_S)

    async def housekeeping(self) -> None:
        while not self.stopped.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(TICK):
                    await self.stopped.wait()
            now = time.monotonic()
            if self.resident is not None and self.resident.poll() == RESIDENT_STALE:
                self.start_resident()  # dtrain was changed: a new one imports the new code
            for entry in list(self.entries.values()):
                if entry.conn.is_closed():
                    self.close(entry, "closed by the node")
                elif entry.stale is None and stamp(entry.paths) != entry.stamp:
                    entry.stale = "ssh config, known_hosts or keys changed"
                if entry.channels:
                    continue
                if entry.stale is not None:
                    self.close(entry, entry.stale)
                elif now - entry.last_used > entry.persist:
                    self.close(entry, "idle")
            # unused transports (jump connections) go with their last entry
            if not self.entries:
                for t in self.transports.values():
                    await cleanup(t.aclose(), CLOSE_S)
                self.transports.clear()
            quiet = not self.entries and not self.clients
            if quiet and (self.quitting or now - self.last_activity > self.idle):
                self.stopped.set()

    # ------------------------------------------------------------------ the resident
    def start_resident(self) -> None:
        """The warm starts of exec and cp (launcher/cli/resident.py): a child of this keeper
        that ends when the keeper does. ``DTRAIN_RESIDENT=0`` in the keeper's environment
        leaves it out."""
        if os.environ.get("DTRAIN_RESIDENT", "1") == "0":
            return
        try:
            self.resident = subprocess.Popen(  # noqa: S603 - our interpreter and module
                [sys.executable, "-P", "-m", "launcher.cli.resident", "--dir",
                 str(self.directory), "--keeper", str(os.getpid())],
                stdin=subprocess.DEVNULL, cwd="/", close_fds=True)
        except OSError as exc:
            print(f"dtrain keeper: no resident ({exc})", flush=True)

    def resident_pid(self) -> int | None:
        r = self.resident
        return r.pid if r is not None and r.poll() is None else None

    def stop_resident(self) -> None:
        r = self.resident
        if r is not None and r.poll() is None:
            r.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                r.wait(1.0)

    # ------------------------------------------------------------------ requests
    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.clients += 1
        self.last_activity = time.monotonic()
        try:
            if not _same_user(writer):
                writer.write(frames.encode_json(REP, {"ok": False, "why": "not your keeper"}))
                return
            async with asyncio.timeout(10):
                frame = await frames.read_frame(reader)
            if frame is None or frame[0] != REQ:
                return
            await self.handle(frames.decode_json(frame[1]), reader, writer)
        except (FrameError, OSError, TimeoutError, ValueError, KeyError, TypeError):
            pass
        finally:
            self.clients -= 1
            self.last_activity = time.monotonic()
            await _hang_up(reader, writer)

    async def handle(self, req: dict[str, Any], reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        op = req.get("op")
        reply: dict[str, Any]
        if op == "ping":
            reply = {"ok": True, "protocol": PROTOCOL, "source": SOURCE, "pid": os.getpid(),
                     "resident": self.resident_pid(),
                     "connections": len(self.entries), "channels": self.channels}
        elif op == "list":
            reply = {"ok": True, "pid": os.getpid(), "idle_s": self.idle,
                     "resident": self.resident_pid(),
                     "connections": [e.row() for e in self.entries.values()]}
        elif op in ("close", "quit"):
            names = req.get("hosts")
            closed = []
            for e in list(self.entries.values()):
                if op == "quit" or not names or e.host.name in names:
                    closed.append(e.host.name)
                    if e.channels:
                        e.stale = "closed by dtrain connections close"
                    else:
                        self.close(e, "closed by request")
            if op == "quit" or not names:
                self.quitting = True
            reply = {"ok": True, "closed": closed}
        elif op in ("connect", "start"):
            if self.quitting:
                reply = {"ok": False, "busy": True, "why": "the keeper is shutting down"}
            elif op == "start" and self.channels >= MAX_CHANNELS:
                reply = {"ok": False, "busy": True,
                         "why": f"the keeper holds {MAX_CHANNELS} channels"}
            else:
                try:
                    entry = await self.entry(req)
                    if op == "start":
                        await self.channel(entry, str(req["command"]), reader, writer,
                                           agent=req.get("agent", True) is not False)
                        return
                    reply = {"ok": True, "peer": entry.conn.peer_addr}
                except DtrainError as exc:
                    reply = {"ok": False, "error": {"cls": type(exc).__name__,
                                                    "message": exc.message, "hint": exc.hint}}
        else:
            reply = {"ok": False, "why": f"unknown request {op!r}"}
        writer.write(frames.encode_json(REP, reply))
        await writer.drain()

    async def channel(self, entry: Entry, command: str, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter, *, agent: bool = True) -> None:
        """Start one channel and relay it until it ends or the command goes away: a fork of
        the node's agent when the command line only starts a node program, else (and
        whenever the agent cannot serve) a channel of its own."""
        entry.channels += 1
        self.channels += 1
        try:
            if agent and self.agents_on and wire.plain_program(command):
                node_agent = await entry.agent(command)
                if node_agent is not None:
                    try:
                        await node_agent.run_job(reader, writer)
                        return
                    except AgentUnavailable:
                        pass  # nothing answered yet: a channel of its own
            try:
                proc = await entry.conn.start(command)
            except SessionRefused as exc:  # this connection is full (sshd's MaxSessions):
                # the command connects directly, as for a busy keeper
                writer.write(frames.encode_json(REP, {
                    "ok": False, "busy": True,
                    "why": f"{entry.host.label}: {exc.message} on the kept connection, "
                           "whose sessions sshd's MaxSessions bounds (10 by default)"}))
                return
            except DtrainError as exc:
                writer.write(frames.encode_json(REP, {"ok": False, "error": {
                    "cls": type(exc).__name__, "message": exc.message, "hint": exc.hint}}))
                return
            writer.write(frames.encode_json(REP, {"ok": True}))
            await relay(proc, reader, writer)
        finally:
            entry.channels -= 1
            self.channels -= 1
            entry.last_used = time.monotonic()


async def relay(proc: Process, reader: asyncio.StreamReader,
                writer: asyncio.StreamWriter) -> None:
    """Frames both ways; the command gone (EOF, ABORT, a broken socket) drops the channel,
    as a dead launcher's does."""
    async def up(read: Any, kind: bytes) -> None:
        while True:
            chunk = await read(CHUNK)
            if not chunk:
                return
            writer.write(frames.encode(kind, chunk))
            await writer.drain()

    async def down() -> None:
        try:
            while True:
                frame = await frames.read_frame(reader)
                if frame is None or frame[0] == ABORT:
                    break
                if frame[0] == IN:
                    await proc.write(frame[1])
                elif frame[0] == EOF:
                    proc.write_eof()
        except (FrameError, OSError, ConnectionError):
            pass
        proc.abort()

    inbound = asyncio.ensure_future(down())
    try:
        await asyncio.gather(up(proc.read_stdout, OUT), up(proc.read_stderr, ERR))
        status = await proc.wait()
        writer.write(frames.encode_json(EXIT, {"status": status}))
        await writer.drain()
    except (OSError, ConnectionError):
        proc.abort()
    finally:
        await cancel_and_wait(inbound)


LINGER_S = 5.0  # how long a finished request waits for its command to hang up


async def _hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """End a request without losing what the command has not read yet: shut down our side
    for writing, read what the command still sends until it closes (bounded), then close.
    Closing at once made a command's next write (a heartbeat right after a fast job) fail
    with EPIPE, and asyncio then raises that on the command's reader before the frames
    still buffered there: a job that had ended with its status read as 'exited with status
    None' (found at 128 nodes, the node agent's jobs ending within milliseconds)."""
    try:
        if writer.can_write_eof():
            writer.write_eof()
        async with asyncio.timeout(LINGER_S):
            while await reader.read(1 << 16):
                pass
    except (OSError, TimeoutError, ValueError):
        pass
    writer.close()


def _same_user(writer: asyncio.StreamWriter) -> bool:
    sock = writer.get_extra_info("socket")
    if sock is None:
        return False
    return private.peer_is_me(sock) is None


async def main_async(directory: Path, idle: float) -> int:
    why = frames.private_dir(directory, create=True)
    if why is not None:
        print(f"dtrain keeper: {why}", flush=True)
        return 1
    lock = os.open(directory / "keeper.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return 0  # another keeper serves this user
    keeper = Keeper(directory, idle)
    with contextlib.suppress(FileNotFoundError):
        keeper.sock.unlink()
    server = await asyncio.start_unix_server(keeper.serve, path=str(keeper.sock),
                                            backlog=BACKLOG)
    os.chmod(keeper.sock, 0o600)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, keeper.stopped.set)
    print(f"dtrain keeper {os.getpid()}: serving {keeper.sock} (idle {idle:g} s)", flush=True)
    keeper.start_resident()
    house = asyncio.ensure_future(keeper.housekeeping())
    try:
        await keeper.stopped.wait()
    finally:
        server.close()
        keeper.stop_resident()
        with contextlib.suppress(FileNotFoundError):
            keeper.sock.unlink()
        await cancel_and_wait(house)
        for e in list(keeper.entries.values()):
            keeper.close(e, "keeper exiting")
        for t in keeper.transports.values():
            await cleanup(t.aclose(), CLOSE_S)
        if keeper.closing:  # every connection's close, bounded
            await cleanup(asyncio.gather(*keeper.closing, return_exceptions=True), 5.0)
        os.close(lock)
    print(f"dtrain keeper {os.getpid()}: exit", flush=True)
    return 0
