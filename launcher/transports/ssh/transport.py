"""SSH transport on asyncssh: ``SSHTransport → SSHConnection → SSHProcess``.

One connection per node, ~/.ssh/config honoured (User, Port, HostName, IdentityFile,
ProxyJump with one shared jump connection), ~/.ssh/known_hosts enforced strictly (unknown or
changed keys refused; ``accept_new`` records unknown keys, never changed ones), keepalives on,
and every asyncssh/OSError failure translated once (``errormap``) into a ConnectError with a
message naming the host and what to try.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import asyncssh
from asyncssh.config import SSHClientConfig

from launcher.aio import cleanup
from launcher.errors import ConnectError
from launcher.models import Host
from launcher.text import hops
from launcher.transports.base import Connection, FileSystem, Process, Transport
from launcher.transports.ssh.config import (
    MAX_JUMP_DEPTH,
    ParsedConfigOptions,
    load_host_config,
    parse_proxy_jump,
)
from launcher.transports.ssh.errormap import TRANSIENT, dropped_at_handshake, map_ssh_errors
from launcher.transports.ssh.hostkeys import HostKeyPolicy, HostKeyVerdict
from launcher.transports.ssh.settings import (
    CIPHERS,
    DEFAULT_KEY_NAMES,
    DTRAIN_KEY_NAME,
    KEX_ALGS,
    SSHSettings,
)
from launcher.transports.ssh.sftp import SFTPFileSystem


class _Client(asyncssh.SSHClient):
    """One connection's client: its host key verdict is its own."""

    def __init__(self, policy: HostKeyPolicy) -> None:
        self._policy = policy
        self.verdict: HostKeyVerdict | None = None

    def validate_host_public_key(self, host: str, addr: str, port: int,
                                 key: asyncssh.SSHKey) -> bool:
        self.verdict = self._policy.validate(host, addr, port, key)
        return self.verdict.kind == "added"




class SSHProcess(Process):
    """An asyncssh channel with the Process interface."""

    def __init__(self, proc: asyncssh.SSHClientProcess[bytes]) -> None:
        self._proc = proc

    async def write(self, data: bytes) -> None:
        try:
            self._proc.stdin.write(data)
            await self._proc.stdin.drain()
        except (asyncssh.Error, OSError, BrokenPipeError) as exc:
            raise ConnectionError(str(exc)) from exc

    def write_eof(self) -> None:
        with contextlib.suppress(asyncssh.Error, OSError):
            self._proc.stdin.write_eof()

    async def read_stdout(self, n: int) -> bytes:
        return await self._read(self._proc.stdout, n)

    async def read_stderr(self, n: int) -> bytes:
        return await self._read(self._proc.stderr, n)

    @staticmethod
    async def _read(stream: asyncssh.SSHReader[bytes], n: int) -> bytes:
        try:
            data = await stream.read(n)
        except (asyncssh.Error, OSError):
            return b""
        if data:
            hops.mark("first byte")
        return data

    async def wait(self) -> int | None:
        try:
            result = await self._proc.wait()
        except (asyncssh.Error, OSError):
            return None
        hops.mark("exit status", last=True)
        return result.exit_status

    def abort(self) -> None:
        self._proc.close()


class SSHConnection(Connection):
    """One asyncssh connection to a node."""

    def __init__(self, host: Host, conn: asyncssh.SSHClientConnection,
                 settings: SSHSettings) -> None:
        self.host = host
        self._conn = conn
        self._settings = settings
        peer = conn.get_extra_info("peername")
        self.peer_addr = peer[0] if peer else None

    async def start(self, command: str) -> Process:
        with map_ssh_errors(self.host.label, self._settings):
            async with asyncio.timeout(self._settings.connect_timeout):
                proc = await self._conn.create_process(command, encoding=None)
        return SSHProcess(proc)

    async def files(self) -> FileSystem:
        with map_ssh_errors(self.host.label, self._settings):
            async with asyncio.timeout(self._settings.connect_timeout):
                # names are bytes on the node: surrogateescape round-trips any of them
                sftp = await self._conn.start_sftp_client(path_errors="surrogateescape")
        return SFTPFileSystem(self.host.label, sftp)

    def is_closed(self) -> bool:
        """The connection is gone (closed here, by the node, or by missed keepalives)."""
        return bool(self._conn.is_closed())

    async def aclose(self) -> None:
        self._conn.close()
        await cleanup(self._conn.wait_closed(), 2)



class SSHTransport(Transport):
    """Connections over SSH, sharing one options object, key set and jump connections."""

    def __init__(self, settings: SSHSettings | None = None) -> None:
        self.settings = settings or SSHSettings()
        self._policies: dict[tuple[Path, ...], HostKeyPolicy] = {}
        self._keys: list[asyncssh.SSHKeyPair] | None = None
        self._key_paths: list[str] = []  # resolved files behind self._keys
        self._jumps: dict[tuple[str, ...], asyncssh.SSHClientConnection] = {}
        self._jump_locks: dict[tuple[str, ...], asyncio.Lock] = {}
        self._configs: dict[tuple[str, str | None, int | None], SSHClientConfig] = {}

    def _host_config(self, host: Host) -> SSHClientConfig:
        """~/.ssh/config as it applies to host, parsed once per host (ProxyJump, keys)."""
        key = (host.name, host.user, host.port)
        cfg = self._configs.get(key)
        if cfg is None:
            cfg = self._configs[key] = load_host_config(self.settings, host)
        return cfg

    def _client_keys(self, config_files: Sequence[str]) -> list[asyncssh.SSHKeyPair]:
        """Config IdentityFile(s), --identity, the dtrain key and the default keys."""
        if self._keys is None:
            ssh = self.settings.ssh_dir
            names = [*self.settings.identities, str(ssh / DTRAIN_KEY_NAME)]
            names += [str(ssh / n) for n in DEFAULT_KEY_NAMES]
            # the same file offered twice costs a failed attempt against MaxAuthTries
            self._key_paths = list(dict.fromkeys(_real_path(n) for n in names))
            self._keys = _load_keys(self._key_paths)
        extra = [f for f in config_files if _real_path(f) not in self._key_paths]
        return _load_keys(extra) + self._keys

    async def _route(self, host: Host, via: tuple[str, ...] = (),
                     resolving: tuple[str, ...] = ()
                     ) -> tuple[asyncssh.SSHClientConnection | None, tuple[str, ...]]:
        """The tunnel to reach host through its ProxyJump chain (None: direct) and its key.

        Every hop is one connection shared by all the targets behind it; a hop's own
        ProxyJump is followed too, as OpenSSH does, up to MAX_JUMP_DEPTH hops in all.
        """
        jump = self._host_config(host).get("ProxyJump")
        if not jump or str(jump).lower() == "none":
            return None, via
        hops = parse_proxy_jump(str(jump), host.label)
        resolving = (*resolving, host.label)
        tunnel: asyncssh.SSHClientConnection | None = None
        for i, hop in enumerate(hops):
            if hop.label in resolving or len(resolving) >= MAX_JUMP_DEPTH:
                raise ConnectError(f"ProxyJump loops or is deeper than {MAX_JUMP_DEPTH} hops: "
                                   f"{' -> '.join((*resolving, hop.label))}", host=host.label,
                                   hint="check ProxyJump in ~/.ssh/config")
            if i == 0:
                tunnel, via = await self._route(hop, via, resolving)
            if len(via) >= MAX_JUMP_DEPTH or hop.label in via:
                raise ConnectError(f"ProxyJump loops or is deeper than {MAX_JUMP_DEPTH} hops: "
                                   f"{' -> '.join((*via, hop.label))}", host=host.label,
                                   hint="check ProxyJump in ~/.ssh/config")
            via = (*via, hop.label)
            tunnel = await self._jump(via, hop, tunnel)
        return tunnel, via

    async def _jump(self, key: tuple[str, ...], hop: Host,
                    tunnel: asyncssh.SSHClientConnection | None) -> asyncssh.SSHClientConnection:
        """One connection per jump host and route, shared by every target behind it."""
        async with self._jump_locks.setdefault(key, asyncio.Lock()):
            if key not in self._jumps:
                self._jumps[key] = await self._open(hop, tunnel=tunnel)
            return self._jumps[key]

    def _policy(self, cfg: SSHClientConfig) -> HostKeyPolicy:
        """One policy per set of known_hosts files, shared (its parsed files are cached)."""
        policy = self.settings.host_key_policy(cfg)
        return self._policies.setdefault(policy.files, policy)

    async def _open(self, host: Host, tunnel: object) -> asyncssh.SSHClientConnection:
        cfg = self._host_config(host)
        policy = self._policy(cfg)
        identity_files = cast(Sequence[str], cfg.get("IdentityFile", ()) or ())
        files = [str(p) for p in identity_files]
        kwargs: dict[str, Any] = {
            "known_hosts": policy.trusted_arg(),
            "client_keys": self._client_keys(files),
            # the config parsed once for this host, not re-read by asyncssh
            "options": ParsedConfigOptions(cfg), "config": [],
            "connect_timeout": self.settings.connect_timeout,
            "keepalive_interval": self.settings.keepalive_interval,
            "keepalive_count_max": self.settings.keepalive_count_max,
            "kex_algs": KEX_ALGS, "encryption_algs": CIPHERS,
            "login_timeout": self.settings.connect_timeout,
        }
        if host.user:
            kwargs["username"] = host.user
        if host.port:
            kwargs["port"] = host.port
        kwargs["tunnel"] = tunnel  # None: direct (we resolved ProxyJump, asyncssh must not)
        if self.settings.password is not None:
            kwargs["password"] = self.settings.password
        delay = 0.1
        started = time.monotonic()
        for attempt in range(self.settings.retries + 1):
            conn = await self._attempt(host, _Client(policy), kwargs)
            if conn is not None:
                return conn
            if attempt < self.settings.retries:
                await asyncio.sleep(delay * (0.5 + random.random()))  # jitter: N nodes'
                delay = min(delay * 2, 2.0)  # retries must not arrive together again
        raise dropped_at_handshake(host.label, self.settings.retries + 1,
                                   time.monotonic() - started)

    async def _attempt(self, host: Host, client: _Client, kwargs: dict[str, Any]
                       ) -> asyncssh.SSHClientConnection | None:
        """One connection attempt, errors mapped; None after a transient drop (retry)."""
        with map_ssh_errors(host.label, self.settings, lambda: client.verdict):
            try:
                async with asyncio.timeout(self.settings.connect_timeout + 1):
                    conn, _ = await asyncssh.create_connection(lambda: client, host.name,
                                                               **kwargs)
                return conn
            except TRANSIENT:
                return None

    def watched_files(self, host: Host) -> list[str]:
        """The known_hosts and identity files this host's config names (the connection
        keeper closes a kept connection when one of them changes)."""
        cfg = self._host_config(host)
        files = [str(p) for p in self._policy(cfg).files]
        files += [str(p) for p in cast(Sequence[str], cfg.get("IdentityFile", ()) or ())]
        return files

    async def connect(self, host: Host) -> Connection:
        try:
            tunnel, via = await self._route(host)
        except ConnectError as exc:
            if exc.host == host.label:
                raise
            raise ConnectError(f"through jump host {exc.host}: {exc.message}", host=host.label,
                               hint=exc.hint) from exc
        conn = await self._open(host, tunnel=tunnel)
        hops.mark("connected")
        return SSHConnection(host, conn, self.settings)

    async def aclose(self) -> None:
        for conn in self._jumps.values():
            conn.close()
        self._jumps.clear()


def _real_path(name: str) -> str:
    return str(Path(name).expanduser().resolve())


def _load_keys(paths: Sequence[str]) -> list[asyncssh.SSHKeyPair]:
    keys: list[asyncssh.SSHKeyPair] = []
    for path in paths:
        p = Path(path).expanduser()
        if p.is_file():
            with contextlib.suppress(asyncssh.KeyImportError, OSError):
                keys.extend(asyncssh.load_keypairs([str(p)]))
    return keys
