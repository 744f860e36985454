"""Transports: how commands reach nodes. SSH for remote hosts, subprocesses for localhost."""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher.models import Host
from launcher.transports.base import Connection, Process, Transport
from launcher.transports.local import LocalTransport

if TYPE_CHECKING:
    from launcher.transports.ssh import SSHSettings

__all__ = ["AutoTransport", "Connection", "LocalTransport", "Process", "Transport"]


class AutoTransport(Transport):
    """Local subprocesses for localhost entries, SSH (imported lazily) for the rest."""

    def __init__(self, settings: SSHSettings | None = None) -> None:
        self._settings = settings
        self._local = LocalTransport()
        self._ssh: Transport | None = None

    def ssh(self) -> Transport:
        if self._ssh is None:
            from launcher.transports.ssh import SSHTransport

            self._ssh = SSHTransport(self._settings)
        return self._ssh

    async def connect(self, host: Host) -> Connection:
        if host.is_local:
            return await self._local.connect(host)
        return await self.ssh().connect(host)

    async def aclose(self) -> None:
        if self._ssh is not None:
            await self._ssh.aclose()
