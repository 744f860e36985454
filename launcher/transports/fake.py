"""A transport for tests, in the tree (httpx's ``MockTransport`` is the model): every node
is this machine, reached as a local subprocess under the node's name, so the whole stack
above the transport (the job, the hang watch, the restart loop, the verdict) runs without
sshd or the test cluster.

    fake = FakeTransport(unreachable={"node3"})
    with fake.installed():          # every AutoTransport connects through it
        ...run a command body...
    fake.freeze("node2")            # its processes stop: no heartbeat, a lost node
    fake.kill("node2")              # its processes die at once (SIGKILL, every group)

What a test may set: nodes that cannot be reached (``unreachable``), a ``handler`` that
answers a node's command itself (return None to run it), a scripted node's job per
attempt (``scripts``: its real probe answers the preflight, then transports/scripted.py's
``Script`` plays the supervisor: ranks that exit, hang or lose their link, no torch), and
the environment each node's processes get (``DTRAIN_FAKE_NODE`` is the node's label),
and, as root, a hostname of each node's own (``own_hostname``: a UTS namespace per
command, so the preflight sees distinct machines). What it records: ``connects`` and
``started`` (label, command), in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from contextvars import ContextVar

from launcher.errors import ConnectError
from launcher.models import Host
from launcher.transports.base import Connection, FileSystem, Process, Transport
from launcher.transports.local import LocalFileSystem, LocalProcess
from launcher.transports.scripted import Script, ScriptedProcess

Handler = Callable[[Host, str], Awaitable[Process | None]]

# set by FakeTransport.installed(): AutoTransport then connects every host through it
INSTALLED: ContextVar[Transport | None] = ContextVar("dtrain_fake_transport", default=None)


class FakeTransport(Transport):
    """Every host is this machine; see the module's docstring."""

    def __init__(self, *, unreachable: Iterable[str] = (), handler: Handler | None = None,
                 env: Mapping[str, str] | None = None, own_hostname: bool = False,
                 scripts: Mapping[str, Script | Sequence[Script]] | None = None) -> None:
        self.unreachable = set(unreachable)
        self.scripts = dict(scripts or {})  # label -> its script, or one per attempt
        self.own_hostname = own_hostname  # root only: each node its own hostname
        self.handler = handler
        self.env = dict(env or {})
        self.connects: list[str] = []
        self.started: list[tuple[str, str]] = []
        self.pids: dict[str, list[int]] = {}  # each node's process groups
        self.frozen: set[str] = set()

    @contextlib.contextmanager
    def installed(self) -> Iterator[FakeTransport]:
        token = INSTALLED.set(self)
        try:
            yield self
        finally:
            INSTALLED.reset(token)

    async def connect(self, host: Host) -> Connection:
        self.connects.append(host.label)
        if host.label in self.unreachable:
            raise ConnectError("the fake node is down", host=host.label,
                               hint=f"leave it out: --exclude {host.label}")
        return FakeConnection(host, self)

    def freeze(self, label: str) -> None:
        """The node stops answering (SIGSTOP to its process groups): no output, no
        heartbeat, as when its network is cut. The launcher dropping its channel then ends
        it, as the node's own supervisor would once it saw the channel go."""
        self.frozen.add(label)
        self._signal(label, signal.SIGSTOP)

    def kill(self, label: str) -> None:
        """Every process the node started dies at once (SIGKILL to its process groups)."""
        self._signal(label, signal.SIGKILL)

    def _signal(self, label: str, sig: int) -> None:
        for pgid in self.pids.get(label, []):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, sig)


class FakeConnection(Connection):
    def __init__(self, host: Host, transport: FakeTransport) -> None:
        self.host = host
        self.peer_addr = "127.0.0.1"
        self._t = transport

    async def start(self, command: str) -> Process:
        t = self._t
        t.started.append((self.host.label, command))
        if t.handler is not None:
            answered = await t.handler(self.host, command)
            if answered is not None:
                return answered
        if self.host.label in t.scripts and "DTRAIN_SOURCE" in command:  # a node program
            return ScriptedProcess(t.scripts[self.host.label], lambda: self._spawn(command))
        return await self._spawn(command)

    async def _spawn(self, command: str) -> Process:
        t = self._t
        env = {**os.environ, **t.env, "DTRAIN_FAKE_NODE": self.host.label}
        shell = os.environ.get("SHELL") or "/bin/sh"
        argv = [shell, "-c", command]
        if t.own_hostname:  # a UTS namespace of its own: `hostname` is the node's name
            argv = ["unshare", "--uts", "--", shell, "-c",
                    'hostname "$DTRAIN_FAKE_NODE" && exec "$0" -c "$1"', shell, command]
        proc = await asyncio.create_subprocess_exec(
            *argv, env=env,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True)
        t.pids.setdefault(self.host.label, []).append(proc.pid)
        return _FakeProcess(proc, t, self.host.label)

    async def files(self) -> FileSystem:
        return LocalFileSystem(self.host.label)

    async def aclose(self) -> None:
        return None


class _FakeProcess(LocalProcess):
    def __init__(self, proc: asyncio.subprocess.Process, transport: FakeTransport,
                 label: str) -> None:
        super().__init__(proc)
        self._t = transport
        self._label = label

    def abort(self) -> None:
        super().abort()
        if self._label in self._t.frozen:  # it cannot tear itself down while stopped
            self._t.kill(self._label)
