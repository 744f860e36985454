"""The transport boundary: how a command reaches a node (SSH or a local subprocess).

Everything above this package speaks only these types; asyncssh never leaks upward.
A Process is a started command with byte streams; a Connection starts processes on one
node; a Transport makes connections.
"""

from __future__ import annotations

import abc
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from types import TracebackType

from launcher.errors import ConnectError
from launcher.models import Host


class Process(abc.ABC):
    """A command started on a node: byte stdin/stdout/stderr and an exit status."""

    @abc.abstractmethod
    async def write(self, data: bytes) -> None:
        """Write to the command's stdin (raises ConnectionError once the channel is gone)."""

    @abc.abstractmethod
    def write_eof(self) -> None:
        """Close the command's stdin."""

    @abc.abstractmethod
    async def read_stdout(self, n: int) -> bytes:
        """Up to n bytes of stdout; b"" at EOF."""

    @abc.abstractmethod
    async def read_stderr(self, n: int) -> bytes:
        """Up to n bytes of stderr; b"" at EOF."""

    @abc.abstractmethod
    async def wait(self) -> int | None:
        """The exit status (None when the channel closed without one)."""

    @abc.abstractmethod
    def abort(self) -> None:
        """Drop the channel at once (the node-side supervisor then sees EOF and cleans up)."""


@dataclass(frozen=True)
class FileStat:
    """lstat (or stat) of a path: the st_mode bits, size and mtime (whole seconds)."""

    st_mode: int
    size: int
    mtime: int


class Reader(abc.ABC):
    """An open file being read."""

    @abc.abstractmethod
    async def read(self, n: int) -> bytes:
        """Up to n bytes; b"" at the end."""


class Writer(abc.ABC):
    """An open file being written."""

    @abc.abstractmethod
    async def write(self, data: bytes) -> None:
        """Append data."""


class FileSystem(abc.ABC):
    """A node's files (SFTP over the connection) or this machine's, with one interface.

    Paths are absolute. Failures raise ``TransferError`` (the path and the reason), or
    ``ConnectError`` when the link itself is gone. Nothing follows a symlink except
    ``stat``.
    """

    @abc.abstractmethod
    async def home(self) -> str:
        """The user's home directory there."""

    @abc.abstractmethod
    async def lstat(self, path: str) -> FileStat | None:
        """The path itself (a link is a link); None when it does not exist."""

    @abc.abstractmethod
    async def stat(self, path: str) -> FileStat | None:
        """The path with symlinks followed; None when it (or its target) does not exist."""

    @abc.abstractmethod
    async def listdir(self, path: str) -> list[tuple[str, FileStat]]:
        """Names in a directory with their lstat (no '.' or '..')."""

    @abc.abstractmethod
    async def readlink(self, path: str) -> str:
        """A symlink's target."""

    @abc.abstractmethod
    async def glob(self, pattern: str) -> list[str]:
        """Paths matching a shell pattern, expanded there (sorted; [] when none)."""

    @abc.abstractmethod
    async def mkdir(self, path: str, *, parents: bool = False) -> None:
        """Create a directory (with parents: like mkdir -p)."""

    @abc.abstractmethod
    async def remove(self, path: str) -> None:
        """Remove a file or symlink."""

    @abc.abstractmethod
    async def rmdir(self, path: str) -> None:
        """Remove an empty directory."""

    @abc.abstractmethod
    async def symlink(self, target: str, path: str) -> None:
        """Create the symlink path → target."""

    @abc.abstractmethod
    async def rename(self, src: str, dst: str) -> None:
        """Rename src over dst atomically (POSIX rename: dst replaced if it exists)."""

    @abc.abstractmethod
    async def set_attrs(self, path: str, *, mode: int | None = None,
                        mtime: int | None = None) -> None:
        """Set permission bits and/or the mtime (atime too) of a file or directory."""

    @abc.abstractmethod
    def open_read(self, path: str) -> AbstractAsyncContextManager[Reader]:
        """Open a file for reading."""

    @abc.abstractmethod
    def open_write(self, path: str, mode: int) -> AbstractAsyncContextManager[Writer]:
        """Create a new file with these permission bits (the umask applies); one that
        exists already is an error (O_EXCL: cp writes to random temp names only)."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release the session."""


class Connection(abc.ABC):
    """A live link to one node."""

    host: Host
    peer_addr: str | None = None  # the address actually connected to, when known

    @abc.abstractmethod
    async def start(self, command: str) -> Process:
        """Start a shell command line under the node user's shell."""

    async def files(self) -> FileSystem:
        """The node's files (one session per call); not every transport has them."""
        raise ConnectError("this transport cannot copy files", host=self.host.label)

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Close the link (idempotent)."""

    async def __aenter__(self) -> Connection:
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()


class Transport(abc.ABC):
    """Makes connections to nodes."""

    @abc.abstractmethod
    async def connect(self, host: Host) -> Connection:
        """Connect to host, raising a ConnectError subclass with a usable message."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release shared resources (jump-host connections)."""

    async def __aenter__(self) -> Transport:
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()
