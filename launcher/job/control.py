"""The launcher's control socket: how `dtrain stop` reaches a run from any shell.

    <run_dir>/control.sock   unix stream socket, mode 0600, served by the run's launcher

Protocol (version 1): the client sends one JSON line, the launcher answers one JSON line.

    -> {"control_version": 1, "op": "stop", "grace": 5.0 | null, "kill": false}
    <- {"ok": true, "state": "stopping"}           or {"ok": false, "error": "..."}
    -> {"control_version": 1, "op": "stacks"}      (`dtrain stacks`, docs/hangs.md)
    <- {"ok": true, "id": "s1", "lines": [...], "culprit": {...} | null, "dir": "...", ...}

Only the user who started the run may stop it. Two locks on that door: the socket file is
0600 (another user's ``connect`` fails with EACCES), and the launcher checks the peer's uid
with ``SO_PEERCRED`` on every connection (a copied or loosened socket still refuses). A
signal to a pid read from a file was the alternative; it needs the same ownership checks,
cannot carry ``--grace`` or an answer, and two quick SIGINTs (for ``--kill``) may merge.

Both ends reach the socket through ``/proc/self/fd/<dirfd>/control.sock`` (Linux resolves
the directory from the open fd): the launcher binds it in the run directory it holds open
(output/rundir.py), whatever the path now names, and fits in sockaddr_un's 107 bytes
whatever the run directory's length. The client opens the run directory with the readers'
checks (a directory of this user, not a symlink) and talks only to a socket this user owns:
a ``control.sock`` planted by someone else is never asked anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import stat
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher import private
from launcher.aio import cleanup
from launcher.errors import DtrainError
from launcher.output.rundir import RunDir, has_entry, open_run_dir

CONTROL = "control.sock"
CONTROL_VERSION = 1
_READ_TIMEOUT_S = 5.0
_MAX_REPLY = 64 * 1024 * 1024  # a stacks answer of many ranks; a bound all the same
STACKS_TIMEOUT_S = 30.0  # a dump waits for every node (hangwatch.REPLY_WAIT_S) first


@dataclass(frozen=True)
class StopRequest:
    """A `dtrain stop` that passed the uid check."""

    grace: float | None  # None: the run's own --grace
    kill: bool
    pid: int  # the requesting process (from SO_PEERCRED)
    uid: int


peer_uid_pid = private.peer_uid_pid  # the one helper (launcher/private.py)


@contextlib.contextmanager
def _socket_path(run_dir: Path) -> Iterator[str | None]:
    """A path to this user's ``run_dir/control.sock`` through an open descriptor of the run
    directory; None when the directory or the socket is not this user's."""
    dirfd = open_run_dir(run_dir)
    if dirfd is None:
        yield None
        return
    try:
        yield f"/proc/self/fd/{dirfd}/{CONTROL}" if has_entry(dirfd, CONTROL, stat.S_IFSOCK) \
            else None
    finally:
        os.close(dirfd)


class ControlServer:
    """Serves stop requests for one run, from its owner only."""

    def __init__(self, run_dir: RunDir, on_stop: Callable[[StopRequest], str],
                 *, owner_uid: int | None = None,
                 on_stacks: Callable[[int], Awaitable[dict[str, Any]]] | None = None) -> None:
        self.run_dir = run_dir  # held open by the archive for the launcher's life
        self.on_stop = on_stop  # returns the run's state after the request
        self.on_stacks = on_stacks  # `dtrain stacks`: every rank's stacks, folded
        self.owner_uid = os.getuid() if owner_uid is None else owner_uid
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        """Listen on ``control.sock`` (mode 0600) in the held run directory."""
        path = self.run_dir.socket_path(CONTROL)
        self._server = await asyncio.start_unix_server(self._handle, path=path)
        os.chmod(path, 0o600)

    async def aclose(self) -> None:
        """Stop listening and remove the socket file."""
        if self._server is not None:
            self._server.close()
            await cleanup(self._server.wait_closed(), 1.0)
            self._server = None
        with contextlib.suppress(OSError):
            self.run_dir.unlink(CONTROL)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            reply = await self._answer(reader, writer)
            writer.write((json.dumps(reply) + "\n").encode())
            await asyncio.wait_for(writer.drain(), _READ_TIMEOUT_S)
        except (OSError, TimeoutError, ValueError):
            pass  # a client that went away or sent garbage: nothing to do
        finally:
            writer.close()

    async def _answer(self, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> dict[str, Any]:
        uid, pid = peer_uid_pid(writer.get_extra_info("socket"))
        line = await asyncio.wait_for(reader.readline(), _READ_TIMEOUT_S)
        if uid != self.owner_uid:
            return {"ok": False, "error": f"refused: this run belongs to uid "
                                          f"{self.owner_uid}, the request came from uid {uid}"}
        msg = json.loads(line or b"{}")
        if isinstance(msg, dict) and msg.get("op") == "stacks" and self.on_stacks is not None:
            return {"ok": True, **await self.on_stacks(pid)}
        if not isinstance(msg, dict) or msg.get("op") != "stop":
            return {"ok": False, "error": f"unknown request {msg!r}"}
        grace = msg.get("grace")
        req = StopRequest(grace=float(grace) if isinstance(grace, int | float) else None,
                          kill=bool(msg.get("kill")), pid=pid, uid=uid)
        return {"ok": True, "state": self.on_stop(req)}


def request_stop(run_dir: Path, *, grace: float | None, kill: bool,
                 timeout: float = _READ_TIMEOUT_S) -> dict[str, Any]:
    """Ask a run's launcher to stop its job; the launcher's answer (``ok`` is True)."""
    msg = {"control_version": CONTROL_VERSION, "op": "stop", "grace": grace, "kill": kill}
    return _ask(run_dir, msg, timeout, "stop")


def request_stacks(run_dir: Path, timeout: float = STACKS_TIMEOUT_S) -> dict[str, Any]:
    """Ask a run's launcher for every rank's stacks (`dtrain stacks`): its folded answer."""
    return _ask(run_dir, {"control_version": CONTROL_VERSION, "op": "stacks"}, timeout,
                "read the stacks of")


def _ask(run_dir: Path, msg: dict[str, Any], timeout: float, what: str) -> dict[str, Any]:
    """One request on the control socket, one answer."""
    with _socket_path(run_dir) as path, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        if path is None:
            raise DtrainError(f"run {run_dir.name}: its launcher does not answer (no control "
                              f"socket of yours in {run_dir})",
                              hint="`dtrain ps` shows whether it is still alive; only the "
                                   f"user who started a run can {what} it")
        s.settimeout(timeout)
        try:
            s.connect(path)
        except PermissionError:
            raise DtrainError(f"refused: run {run_dir.name} belongs to another user",
                              hint=f"only the user who started a run can {what} it") from None
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise DtrainError(f"run {run_dir.name}: its launcher does not answer ({exc.strerror})",
                              hint="`dtrain ps` shows whether it is still alive") from None
        why = private.peer_is_me(s)  # the launcher is this user's, before a byte is sent
        if why is not None:
            raise DtrainError(f"run {run_dir.name}: refused to talk to its control socket: "
                              f"{why}", hint="someone else answers on it; `dtrain ps` shows "
                              "the run's launcher")
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            s.sendall((json.dumps(msg) + "\n").encode())  # the answer may come anyway
        data = b""
        with contextlib.suppress(ConnectionResetError):
            while not data.endswith(b"\n") and len(data) <= _MAX_REPLY:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
    try:
        reply = json.loads(data or b"{}")
    except ValueError:
        reply = {}
    if not isinstance(reply, dict) or not reply.get("ok"):
        error = reply.get("error") if isinstance(reply, dict) else None
        raise DtrainError(f"run {run_dir.name}: {error or 'no answer from its launcher'}",
                          hint=f"only the user who started a run can {what} it"
                          if error and error.startswith("refused") else None)
    return reply
