"""Local transport: localhost entries run as subprocesses, no sshd needed."""

from __future__ import annotations

import asyncio
import contextlib
import os

from launcher.models import Host
from launcher.transports.base import Connection, Process, Transport


class LocalProcess(Process):
    """An asyncio subprocess with the Process interface."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self._proc = proc

    async def write(self, data: bytes) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.write(data)
        await self._proc.stdin.drain()

    def write_eof(self) -> None:
        assert self._proc.stdin is not None
        with contextlib.suppress(OSError, RuntimeError):
            self._proc.stdin.write_eof()

    async def read_stdout(self, n: int) -> bytes:
        assert self._proc.stdout is not None
        return await self._proc.stdout.read(n)

    async def read_stderr(self, n: int) -> bytes:
        assert self._proc.stderr is not None
        return await self._proc.stderr.read(n)

    async def wait(self) -> int | None:
        return await self._proc.wait()

    def abort(self) -> None:
        # like a dropped SSH channel: the supervisor sees stdin EOF and tears down
        if self._proc.stdin is not None:
            self._proc.stdin.close()


class LocalConnection(Connection):
    """Runs commands as the current user through /bin/sh, like sshd would."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.peer_addr = "127.0.0.1"

    async def start(self, command: str) -> Process:
        shell = os.environ.get("SHELL") or "/bin/sh"
        proc = await asyncio.create_subprocess_exec(
            shell, "-c", command, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        return LocalProcess(proc)

    async def aclose(self) -> None:
        return None


class LocalTransport(Transport):
    """Connections to this machine."""

    async def connect(self, host: Host) -> Connection:
        return LocalConnection(host)
