"""Transports: how commands reach nodes. SSH or srun for remote hosts, subprocesses for
localhost; ``AutoTransport`` picks per ``--transport`` (see ``srun.decide_transport``)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from launcher.models import Host
from launcher.transports.base import Connection, Process, Transport
from launcher.transports.fake import INSTALLED
from launcher.transports.local import LocalTransport
from launcher.transports.srun import Choice, decide_transport

if TYPE_CHECKING:
    from launcher.transports.ssh import SSHSettings

__all__ = ["AutoTransport", "Choice", "Connection", "LocalTransport", "Process", "Transport"]


class AutoTransport(Transport):
    """Local subprocesses for localhost entries; SSH (imported lazily) or srun for the rest.

    ``mode`` is ``--transport`` (auto, ssh, srun); ``choose(hosts)`` resolves it before
    anything connects (a forced srun that cannot work is a UsageError, exit 2). ``say``
    prints a line of dtrain's own (the command's ``render.note``: transports print nothing
    themselves); with ``--verbose`` it says when the connection keeper is not used.
    """

    def __init__(self, settings: SSHSettings | None = None, mode: str = "auto",
                 environ: Mapping[str, str] | None = None, *, keeper: bool = True,
                 say: Callable[[str], None] | None = None) -> None:
        self._settings = settings
        self._keeper = keeper  # False: never through the connection keeper (run, smoke)
        self._say = say
        self._mode = mode
        self._environ = dict(os.environ if environ is None else environ)
        self._local = LocalTransport()
        self._remote: Transport | None = None
        self.choice: Choice | None = None

    def choose(self, hosts: Sequence[Host]) -> Choice:
        """Decide SSH or srun for these hosts (localhost entries always run locally)."""
        remote = [h for h in hosts if not h.is_local]
        srun = shutil.which("srun", path=self._environ.get("PATH"))
        self.choice = decide_transport(self._mode, remote, self._environ, srun)
        return self.choice

    def remote(self) -> Transport:
        if self._remote is None:
            kind = self.choice.kind if self.choice else "ssh"
            if kind == "srun":
                from launcher.transports.srun import SrunTransport

                self._remote = SrunTransport(self._environ)
            elif self._keeper and self._settings is not None and self._settings.persist \
                    and self._settings.password is None:
                self._remote = _keeper_transport(self._settings, self._say)
            else:
                from launcher.transports.ssh import SSHTransport

                self._remote = SSHTransport(self._settings)
        return self._remote

    async def connect(self, host: Host) -> Connection:
        fake = INSTALLED.get()
        if fake is not None:  # tests: transports/fake.py
            return await fake.connect(host)
        if host.is_local:
            return await self._local.connect(host)
        return await self.remote().connect(host)

    async def aclose(self) -> None:
        if self._remote is not None:
            await self._remote.aclose()


def _keeper_transport(settings: SSHSettings, say: Callable[[str], None] | None) -> Transport:
    """Channels through the user's connection keeper, direct SSH when it cannot serve
    (docs/connections.md); no asyncssh import unless it falls back."""
    from launcher.transports.keeper.client import KeeperTransport

    def direct() -> Transport:
        from launcher.transports.ssh import SSHTransport

        return SSHTransport(settings)

    assert settings.persist is not None
    return KeeperTransport(settings, settings.persist, direct=direct,
                           say=say if settings.verbose else None)
