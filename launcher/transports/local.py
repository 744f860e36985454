"""Local transport: localhost entries run as subprocesses, no sshd needed; this machine's
files behind the same FileSystem interface as a node's (the local side of `dtrain cp`)."""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import signal
from collections.abc import AsyncIterator, Callable, Iterator
from typing import IO

from launcher.aio import cancel_and_wait
from launcher.errors import TransferError
from launcher.models import Host
from launcher.transports.base import (
    Connection,
    FileStat,
    FileSystem,
    Process,
    Reader,
    Transport,
    Writer,
)

# how long a local command may take to end after its connection closed, before its KILL
CLOSE_WAIT_S = 2.0


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
        self._procs: list[asyncio.subprocess.Process] = []

    async def start(self, command: str) -> Process:
        shell = os.environ.get("SHELL") or "/bin/sh"
        proc = await asyncio.create_subprocess_exec(
            shell, "-c", command, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        self._procs = [p for p in self._procs if p.returncode is None] + [proc]
        return LocalProcess(proc)

    async def files(self) -> FileSystem:
        return LocalFileSystem(self.host.label)

    async def aclose(self) -> None:
        """As sshd when its connection closes: every command of this connection ends (its
        stdin is closed, as a dropped channel's is), and is reaped here, inside the event
        loop: a child that exits after the loop closed makes asyncio's child watcher log
        ``Loop ... that handles pid N is closed`` (issue 40). A command still running
        ``CLOSE_WAIT_S`` later is killed (its session)."""
        procs, self._procs = [p for p in self._procs if p.returncode is None], []
        for proc in procs:
            if proc.stdin is not None:
                proc.stdin.close()
        if not procs:
            return
        waits = [asyncio.ensure_future(proc.wait()) for proc in procs]
        await asyncio.wait(waits, timeout=CLOSE_WAIT_S)  # together: one deadline for all
        for proc in procs:
            if proc.returncode is None:
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, signal.SIGKILL)
        # bounded too: asyncio's wait() also waits for the pipes, and a pipe nobody reads any
        # more (a hostile node's endless stdout, already refused) is paused and never closes
        _, late = await asyncio.wait(waits, timeout=CLOSE_WAIT_S)
        if late:
            await cancel_and_wait(*late)  # none left behind


@contextlib.contextmanager
def _errors(path: str, host: str | None) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        raise TransferError(exc.strerror or str(exc), path=path, host=host) from exc


def _fstat(st: os.stat_result) -> FileStat:
    return FileStat(st.st_mode, st.st_size, int(st.st_mtime))


class _LocalReader(Reader):
    def __init__(self, f: IO[bytes]) -> None:
        self._f = f

    async def read(self, n: int) -> bytes:
        return self._f.read(n)


class _LocalWriter(Writer):
    def __init__(self, f: IO[bytes]) -> None:
        self._f = f

    async def write(self, data: bytes) -> None:
        self._f.write(data)


class LocalFileSystem(FileSystem):
    """This machine's files: the local side of `dtrain cp`, and localhost entries.

    Plain blocking system calls: each is short (metadata, or one chunk of data from the
    page cache), and a thread per call would cost more than it saves.
    """

    def __init__(self, host: str | None = None) -> None:
        self._host = host

    async def home(self) -> str:
        return os.path.expanduser("~")

    async def lstat(self, path: str) -> FileStat | None:
        return self._stat(os.lstat, path)

    async def stat(self, path: str) -> FileStat | None:
        return self._stat(os.stat, path)

    def _stat(self, call: Callable[[str], os.stat_result], path: str) -> FileStat | None:
        """``call(path)`` (os.stat or os.lstat); None when nothing is there."""
        try:
            return _fstat(call(path))
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise TransferError(exc.strerror or str(exc), path=path, host=self._host) from exc

    async def listdir(self, path: str) -> list[tuple[str, FileStat]]:
        with _errors(path, self._host), os.scandir(path) as it:
            return [(d.name, _fstat(d.stat(follow_symlinks=False))) for d in it]

    async def readlink(self, path: str) -> str:
        with _errors(path, self._host):
            return os.readlink(path)

    async def glob(self, pattern: str) -> list[str]:
        return sorted(glob.glob(pattern))

    async def mkdir(self, path: str, *, parents: bool = False) -> None:
        with _errors(path, self._host):
            if parents:
                os.makedirs(path, exist_ok=True)
            else:
                os.mkdir(path)

    async def remove(self, path: str) -> None:
        with _errors(path, self._host):
            os.unlink(path)

    async def rmdir(self, path: str) -> None:
        with _errors(path, self._host):
            os.rmdir(path)

    async def symlink(self, target: str, path: str) -> None:
        with _errors(path, self._host):
            os.symlink(target, path)

    async def rename(self, src: str, dst: str) -> None:
        with _errors(dst, self._host):
            os.replace(src, dst)

    async def set_attrs(self, path: str, *, mode: int | None = None,
                        mtime: int | None = None) -> None:
        with _errors(path, self._host):
            if mode is not None:
                os.chmod(path, mode)
            if mtime is not None:
                os.utime(path, (mtime, mtime))

    @contextlib.asynccontextmanager
    async def open_read(self, path: str) -> AsyncIterator[Reader]:
        with _errors(path, self._host):
            f = open(path, "rb")  # noqa: SIM115 - closed below
        with f:
            yield _LocalReader(f)

    @contextlib.asynccontextmanager
    async def open_write(self, path: str, mode: int) -> AsyncIterator[Writer]:
        with _errors(path, self._host):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        with os.fdopen(fd, "wb") as f, _errors(path, self._host):
            yield _LocalWriter(f)


class LocalTransport(Transport):
    """Connections to this machine."""

    async def connect(self, host: Host) -> Connection:
        return LocalConnection(host)
