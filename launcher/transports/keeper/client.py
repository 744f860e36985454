"""The command's side of the connection keeper: a Transport whose channels ride on the
keeper's warm SSH connections, and falls back to a direct connection whenever the keeper is
missing, busy, of another dtrain, or refuses (docs/connections.md).

It imports no asyncssh: a warm command pays neither that import nor a handshake.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import launcher
from launcher import private
from launcher.aio import CLOSE_S, cancel_and_wait, cleanup
from launcher.errors import AuthError, ConnectError, DtrainError, HostKeyError
from launcher.models import Host
from launcher.text import hops
from launcher.transports.base import Connection, FileSystem, Process, Transport
from launcher.transports.keeper import frames
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

if TYPE_CHECKING:
    from launcher.transports.ssh.settings import SSHSettings

PROTOCOL = 1
SOURCE = str(Path(launcher.__file__).resolve().parent)  # which dtrain a keeper runs
START_WAIT = 5.0  # seconds a command waits for a keeper it started to answer
REPLY_WAIT = 60.0  # a connect may handshake (cold): the connect timeout bounds it keeper-side
BUFFER = 8 << 20  # output held per stream before the keeper is made to wait
_ERRORS: dict[str, type[DtrainError]] = {
    "ConnectError": ConnectError, "AuthError": AuthError, "HostKeyError": HostKeyError,
    "DtrainError": DtrainError}


class KeeperUnavailable(Exception):
    """The keeper cannot serve this command (missing, busy, refused, broken): go direct."""


def settings_dict(settings: SSHSettings) -> dict[str, Any]:
    """The settings as JSON, for the keeper to connect exactly as this command would."""
    data = asdict(settings)
    data.pop("password", None)
    data["home"] = str(settings.home)
    if settings.user_known_hosts is not None:
        data["user_known_hosts"] = [str(p) for p in settings.user_known_hosts]
    data["global_known_hosts"] = [str(p) for p in settings.global_known_hosts]
    data["identities"] = list(settings.identities)
    data["options"] = list(settings.options)
    return data


def watched_paths(settings: SSHSettings) -> list[str]:
    """The files whose change makes a kept connection stale: ssh config, known_hosts, the
    keys offered (the keeper adds what a host's config names when it connects)."""
    from launcher.transports.ssh.settings import DEFAULT_KEY_NAMES, DTRAIN_KEY_NAME

    paths = [settings.config_path, *settings.known_hosts_files, *settings.global_known_hosts,
             *(Path(p).expanduser() for p in settings.identities),
             settings.ssh_dir / DTRAIN_KEY_NAME,
             *(settings.ssh_dir / n for n in DEFAULT_KEY_NAMES)]
    return [str(p) for p in dict.fromkeys(paths)]


def stamp(paths: list[str]) -> list[Any]:
    """What each path is now: (mtime_ns, size, inode) or None when it is missing."""
    out: list[Any] = []
    for p in paths:
        try:
            st = os.stat(p)
        except OSError:
            out.append(None)
        else:
            out.append([st.st_mtime_ns, st.st_size, st.st_ino])
    return out


async def request(sock: Path, req: dict[str, Any], timeout: float = REPLY_WAIT
                  ) -> tuple[dict[str, Any], asyncio.StreamReader, asyncio.StreamWriter]:
    """Send one request; its reply and the open stream (the caller closes it)."""
    try:
        async with asyncio.timeout(2.0):
            reader, writer = await asyncio.open_unix_connection(str(sock), limit=1 << 16)
    except (OSError, TimeoutError) as exc:
        raise KeeperUnavailable(f"no keeper answers on {sock}: {exc}") from None
    # the keeper is this user's own process, asked of the kernel before a byte is sent
    # (its directory was checked too: launcher/private.py)
    why = private.peer_is_me(writer.get_extra_info("socket"))
    if why is not None:
        writer.close()
        raise KeeperUnavailable(f"{sock}: {why}")
    try:
        writer.write(frames.encode_json(REQ, req))
        async with asyncio.timeout(timeout):
            frame = await frames.read_frame(reader)
        if frame is None or frame[0] != REP:
            raise KeeperUnavailable("the keeper closed the request without a reply")
        return frames.decode_json(frame[1]), reader, writer
    except (OSError, TimeoutError, FrameError) as exc:
        writer.close()
        raise KeeperUnavailable(f"the keeper did not answer: {exc or 'timeout'}") from None
    except BaseException:
        writer.close()
        raise


async def call(sock: Path, req: dict[str, Any], timeout: float = REPLY_WAIT) -> dict[str, Any]:
    """A request whose reply is all there is (ping, list, close)."""
    reply, _, writer = await request(sock, req, timeout)
    writer.close()
    return reply


def raise_error(error: Any, host: str) -> None:
    """Raise the DtrainError the keeper met on the node (its class, message and hint)."""
    if not isinstance(error, dict):
        raise ConnectError("the connection keeper failed", host=host)
    cls = _ERRORS.get(str(error.get("cls")), ConnectError)
    message = str(error.get("message") or "the connection keeper failed")
    hint = error.get("hint")
    raise cls(message, hint=str(hint) if hint else None, host=host)


def spawn(directory: Path, idle: float) -> None:
    """Start the keeper in its own session, detached from this command (it takes its own
    lock: a second one started at the same time exits at once)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(SOURCE).parent), *filter(None, [env.get("PYTHONPATH")])])
    log = directory / "keeper.log"
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    with open(fd, "ab") as out:
        os.fchmod(fd, 0o600)
        subprocess.Popen(  # noqa: S603 - our own interpreter and module, no shell
            [sys.executable, "-P", "-m", "launcher.transports.keeper", "--dir", str(directory),
             "--idle", str(idle)],
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, cwd="/", env=env,
            start_new_session=True, close_fds=True)


class KeeperTransport(Transport):
    """Channels over the keeper's kept connections; direct SSH when it cannot serve."""

    def __init__(self, settings: SSHSettings, persist: float, *,
                 direct: Callable[[], Transport], say: Callable[[str], None] | None = None,
                 directory: Path | None = None) -> None:
        self.settings = settings
        self.persist = persist
        self._direct_factory = direct
        self._direct: Transport | None = None
        self._say = say
        self.directory = directory or frames.keeper_dir()
        self.sock = frames.socket_path(self.directory)
        self._ready: asyncio.Future[None] | None = None
        self.fallback: str | None = None  # why this command connects directly
        self._paths = watched_paths(settings)

    def direct(self) -> Transport:
        if self._direct is None:
            self._direct = self._direct_factory()
        return self._direct

    def fall_back(self, why: str) -> None:
        if self.fallback is None:
            self.fallback = why
            if self._say is not None:
                self._say(f"connection keeper not used ({why}); connecting directly")

    def params(self, host: Host) -> dict[str, Any]:
        return {"host": {"name": host.name, "user": host.user, "port": host.port},
                "settings": settings_dict(self.settings), "paths": self._paths,
                "stamp": stamp(self._paths), "persist": self.persist}

    async def _ensure(self) -> None:
        """A keeper of this dtrain answers on the socket (started when none does)."""
        why = frames.private_dir(self.directory, create=True)
        if why is not None:
            raise KeeperUnavailable(why)
        try:
            pong = await call(self.sock, {"op": "ping"}, timeout=5.0)
        except KeeperUnavailable:
            pong = None
        if pong is not None and (pong.get("protocol") != PROTOCOL
                                 or pong.get("source") != SOURCE):
            # another dtrain's keeper: ask it to go once its channels end, start ours
            with contextlib.suppress(KeeperUnavailable):
                await call(self.sock, {"op": "quit"}, timeout=5.0)
            pong = None
            await _gone(self.sock)
        if pong is None:
            if _lock_held(self.directory):
                raise KeeperUnavailable(f"a keeper runs but does not answer on {self.sock} "
                                        "(dtrain connections close, or end it by its pid)")
            spawn(self.directory, self.persist)
            deadline = time.monotonic() + START_WAIT
            while True:
                await asyncio.sleep(0.02)
                try:
                    pong = await call(self.sock, {"op": "ping"}, timeout=5.0)
                    break
                except KeeperUnavailable:
                    if time.monotonic() > deadline:
                        raise KeeperUnavailable(
                            f"the keeper did not start (see {self.directory}/keeper.log)"
                        ) from None
        if not pong.get("ok"):
            raise KeeperUnavailable(str(pong.get("why") or "the keeper refused"))

    async def _keeper_ready(self) -> None:
        if self._ready is None:
            self._ready = asyncio.ensure_future(self._ensure())
        await asyncio.shield(self._ready)

    async def connect(self, host: Host) -> Connection:
        if self.fallback is None:
            try:
                await self._keeper_ready()
                reply = await call(self.sock, {"op": "connect", **self.params(host)})
            except KeeperUnavailable as exc:
                self.fall_back(str(exc))
            else:
                if reply.get("ok"):
                    hops.mark("connected")
                    return KeeperConnection(host, self, reply.get("peer"))
                if reply.get("busy"):
                    self.fall_back(str(reply.get("why") or "the keeper is busy"))
                else:
                    raise_error(reply.get("error"), host.label)
        return await self.direct().connect(host)

    async def aclose(self) -> None:
        if self._ready is not None and not self._ready.done():
            await cancel_and_wait(self._ready)
        if self._direct is not None:
            await cleanup(self._direct.aclose(), CLOSE_S)


def _lock_held(directory: Path) -> bool:
    """A keeper holds its lock (it runs, whether or not it answers)."""
    import fcntl

    try:
        fd = os.open(directory / "keeper.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


async def _gone(sock: Path, wait: float = 3.0) -> None:
    deadline = time.monotonic() + wait
    while sock.exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


class KeeperConnection(Connection):
    """One node's kept connection: each start() is one channel through the keeper."""

    def __init__(self, host: Host, transport: KeeperTransport, peer: Any) -> None:
        self.host = host
        self._transport = transport
        self.peer_addr = peer if isinstance(peer, str) else None
        self._direct: Connection | None = None

    async def _direct_conn(self) -> Connection:
        if self._direct is None:
            self._direct = await self._transport.direct().connect(self.host)
        return self._direct

    async def start(self, command: str) -> Process:
        t = self._transport
        if t.fallback is None:
            try:
                # DTRAIN_NODE_AGENT=0: this command's programs on channels of their own
                agent = os.environ.get("DTRAIN_NODE_AGENT", "1") != "0"
                reply, reader, writer = await request(
                    t.sock, {"op": "start", "command": command, "agent": agent,
                             **t.params(self.host)})
            except KeeperUnavailable as exc:
                t.fall_back(str(exc))
            else:
                if reply.get("ok"):
                    return KeeperProcess(reader, writer)
                writer.close()
                if reply.get("busy"):
                    t.fall_back(str(reply.get("why") or "the keeper is busy"))
                else:
                    raise_error(reply.get("error"), self.host.label)
        return await (await self._direct_conn()).start(command)

    async def files(self) -> FileSystem:
        # the keeper carries channels only: a node's files come over a direct SFTP session
        return await (await self._direct_conn()).files()

    async def aclose(self) -> None:
        if self._direct is not None:
            await cleanup(self._direct.aclose(), CLOSE_S)


class _Stream:
    """One output stream of a channel, fed by the frame reader, read by the command."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.eof = False
        self.changed = asyncio.Event()
        self.drained = asyncio.Event()
        self.drained.set()

    async def feed(self, chunk: bytes) -> None:
        self.data += chunk
        self.changed.set()
        if len(self.data) > BUFFER:
            self.drained.clear()
            await self.drained.wait()

    def close(self) -> None:
        self.eof = True
        self.changed.set()
        self.drained.set()

    async def read(self, n: int) -> bytes:
        while not self.data and not self.eof:
            self.changed.clear()
            await self.changed.wait()
        chunk = bytes(self.data[:n])
        del self.data[:n]
        if len(self.data) <= BUFFER:
            self.drained.set()
        return chunk


class KeeperProcess(Process):
    """A channel relayed by the keeper: its frames on one unix connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._out = _Stream()
        self._err = _Stream()
        self._status: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        self._pump = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        try:
            while True:
                frame = await frames.read_frame(self._reader)
                if frame is None:
                    break
                kind, payload = frame
                if kind == OUT:
                    hops.mark("first byte")
                    await self._out.feed(payload)
                elif kind == ERR:
                    hops.mark("first byte")
                    await self._err.feed(payload)
                elif kind == EXIT:
                    hops.mark("exit status", last=True)
                    status = frames.decode_json(payload).get("status")
                    if not self._status.done():
                        self._status.set_result(status if isinstance(status, int) else None)
                    break
                else:
                    break
        except (FrameError, OSError):
            pass
        finally:
            self._out.close()
            self._err.close()
            if not self._status.done():
                self._status.set_result(None)
            self._writer.close()

    async def write(self, data: bytes) -> None:
        if self._writer.is_closing():
            raise ConnectionError("the channel is closed")
        try:
            for i in range(0, len(data), CHUNK):
                self._writer.write(frames.encode(IN, data[i:i + CHUNK]))
            await self._writer.drain()
        except OSError as exc:
            raise ConnectionError(str(exc)) from exc

    def write_eof(self) -> None:
        if not self._writer.is_closing():
            with contextlib.suppress(OSError):
                self._writer.write(frames.encode(EOF, b""))

    async def read_stdout(self, n: int) -> bytes:
        return await self._out.read(n)

    async def read_stderr(self, n: int) -> bytes:
        return await self._err.read(n)

    async def wait(self) -> int | None:
        status = await asyncio.shield(self._status)
        await asyncio.shield(self._pump)  # its end follows the status at once: no task left
        return status

    def abort(self) -> None:
        if not self._writer.is_closing():
            with contextlib.suppress(OSError):
                self._writer.write(frames.encode(ABORT, b""))
            self._writer.close()
