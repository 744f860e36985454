"""The transport boundary: how a command reaches a node (SSH or a local subprocess).

Everything above this package speaks only these types; asyncssh never leaks upward.
A Process is a started command with byte streams; a Connection starts processes on one
node; a Transport makes connections.
"""

from __future__ import annotations

import abc
from types import TracebackType

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


class Connection(abc.ABC):
    """A live link to one node."""

    host: Host
    peer_addr: str | None = None  # the address actually connected to, when known

    @abc.abstractmethod
    async def start(self, command: str) -> Process:
        """Start a shell command line under the node user's shell."""

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
