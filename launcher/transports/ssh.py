"""SSH transport on asyncssh: the only module that imports asyncssh.

One connection per node, ~/.ssh/config honoured (User, Port, HostName, IdentityFile,
ProxyJump with one shared jump connection), ~/.ssh/known_hosts enforced strictly (unknown or
changed keys refused; ``accept_new`` records unknown keys, never changed ones), keepalives on,
and every asyncssh/OSError failure translated once, here, into a ConnectError with a message
naming the host and what to try.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import getpass
import os
import socket
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import asyncssh
from asyncssh.config import SSHClientConfig

from launcher.errors import AuthError, ConnectError, HostKeyError, TransferError
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

DTRAIN_KEY_NAME = "id_ed25519_dtrain"
DEFAULT_KEY_NAMES = ("id_ed25519", "id_ecdsa", "id_rsa")
# group-exchange costs ~0.5 s per connection for nothing: prefer fixed groups and curves
KEX_ALGS = ("curve25519-sha256", "curve25519-sha256@libssh.org", "ecdh-sha2-nistp256",
            "ecdh-sha2-nistp384", "ecdh-sha2-nistp521", "diffie-hellman-group14-sha256",
            "diffie-hellman-group16-sha512")
# AES-GCM is about twice as fast as chacha20 on AES-NI hardware
CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "chacha20-poly1305@openssh.com",
           "aes128-ctr", "aes256-ctr")


@dataclass(frozen=True)
class SSHSettings:
    """How dtrain connects; built once from CLI options."""

    connect_timeout: float = 10.0
    accept_new: bool = False
    identities: tuple[str, ...] = ()  # extra identity files (--identity)
    keepalive_interval: float = 5.0
    keepalive_count_max: int = 3
    retries: int = 4  # for the transient drops sshd's MaxStartups produces
    home: Path = field(default_factory=Path.home)
    password: str | None = field(default=None, repr=False)  # only for keys setup; never shown

    @property
    def ssh_dir(self) -> Path:
        return self.home / ".ssh"

    @property
    def known_hosts(self) -> Path:
        return self.ssh_dir / "known_hosts"

    @property
    def config_path(self) -> Path:
        return self.ssh_dir / "config"


def fingerprint(key: asyncssh.SSHKey) -> str:
    """OpenSSH-style SHA256 fingerprint, as `ssh-keygen -l` prints it."""
    return str(key.get_fingerprint("sha256"))


def _known_host_names(host: str, addr: str | None, port: int | None) -> list[str]:
    names = [host] + ([addr] if addr and addr != host else [])
    return names if not port or port == 22 else [f"[{n}]:{port}" for n in names]


class HostKeyPolicy:
    """Strict known_hosts checking with OpenSSH's accept-new semantics.

    asyncssh calls ``validate`` only for keys not already trusted by known_hosts; we then
    decide between "changed" (the file knows another key for this host: always refuse),
    "unknown" (refuse, or record it under accept_new).
    """

    def __init__(self, path: Path, accept_new: bool) -> None:
        self.path = path
        self.accept_new = accept_new
        self.verdicts: dict[str, tuple[str, str]] = {}  # host -> (unknown|changed, fingerprint)

    def known_keys(self, host: str, addr: str | None, port: int | None) -> list[asyncssh.SSHKey]:
        if not self.path.exists():
            return []
        trusted = asyncssh.match_known_hosts(str(self.path), host, addr or "", port)[0]
        return list(trusted)

    def validate(self, host: str, addr: str | None, port: int | None,
                 key: asyncssh.SSHKey) -> bool:
        fp = fingerprint(key)
        if self.known_keys(host, addr, port):
            self.verdicts[host] = ("changed", fp)
            return False
        if not self.accept_new:
            self.verdicts[host] = ("unknown", fp)
            return False
        self.record(host, addr, port, key)
        self.verdicts[host] = ("added", fp)
        return True

    def record(self, host: str, addr: str | None, port: int | None, key: asyncssh.SSHKey) -> None:
        """Append the key to known_hosts (created 0600, ~/.ssh 0700)."""
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        line = ",".join(_known_host_names(host, addr, port)) + " "
        line += key.export_public_key("openssh").decode().strip() + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a") as f:
            f.write(line)

    def trusted_arg(self) -> object:
        """The known_hosts argument for asyncssh: the file, or an empty trust set."""
        return str(self.path) if self.path.exists() else ([], [], [])


class _Client(asyncssh.SSHClient):
    def __init__(self, policy: HostKeyPolicy) -> None:
        self._policy = policy

    def validate_host_public_key(self, host: str, addr: str, port: int,
                                 key: asyncssh.SSHKey) -> bool:
        return self._policy.validate(host, addr, port, key)


@contextlib.contextmanager
def map_ssh_errors(label: str, settings: SSHSettings,
                   policy: HostKeyPolicy | None = None) -> Iterator[None]:
    """Translate asyncssh/OSError failures into ConnectError with an actionable message."""
    try:
        yield
    except asyncssh.HostKeyNotVerifiable as exc:
        verdict, fp = (policy.verdicts.get(label) if policy else None) or ("", "")
        if not verdict and policy:
            verdict, fp = next(iter(policy.verdicts.values()), ("", ""))
        if verdict == "changed":
            raise HostKeyError(
                f"HOST KEY CHANGED: the node now presents {fp}, which differs from the key "
                f"recorded in {settings.known_hosts}", host=label,
                hint="this may be an attack or a reinstalled node; verify it, then remove the "
                     "old line with `ssh-keygen -R HOST` and retry") from exc
        raise HostKeyError(
            f"unknown host key {fp}".rstrip(), host=label,
            hint="check the fingerprint, then retry with --accept-new (or run "
                 "`dtrain keys setup`)") from exc
    except asyncssh.PermissionDenied as exc:
        raise AuthError("permission denied (publickey/password)", host=label,
                        hint="run `dtrain keys setup` to install a key, or check the user "
                             "name and ~/.ssh/config") from exc
    except asyncssh.DisconnectError as exc:
        if "authentication" in str(exc).lower():
            raise AuthError(f"server disconnected: {exc.reason}", host=label,
                            hint="too many keys offered? set IdentitiesOnly/IdentityFile "
                                 "in ~/.ssh/config") from exc
        raise ConnectError(f"SSH session failed: {exc.reason}", host=label) from exc
    except TimeoutError as exc:
        raise ConnectError(f"timed out connecting after {settings.connect_timeout:g} s",
                           host=label, hint="is the node up and reachable? raise "
                                            "--connect-timeout for slow links") from exc
    except socket.gaierror as exc:
        raise ConnectError(f"cannot resolve host name ({exc.strerror})", host=label,
                           hint="check the name, /etc/hosts or ~/.ssh/config HostName") from exc
    except ConnectionRefusedError as exc:
        raise ConnectError("connection refused", host=label,
                           hint="is sshd running and listening on that port?") from exc
    except OSError as exc:
        # EINVAL: a blackhole route (e.g. the test bridge is down)
        if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EINVAL):
            raise ConnectError("host unreachable", host=label,
                               hint="check the address and the network path") from exc
        raise ConnectError(f"connection failed: {exc.strerror or exc}", host=label) from exc
    except asyncssh.Error as exc:
        raise ConnectError(f"SSH error: {exc.reason}", host=label) from exc


_TRANSIENT = (asyncssh.ConnectionLost, ConnectionResetError, BrokenPipeError)


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
            return await stream.read(n)
        except (asyncssh.Error, OSError):
            return b""

    async def wait(self) -> int | None:
        try:
            result = await self._proc.wait()
        except (asyncssh.Error, OSError):
            return None
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

    async def aclose(self) -> None:
        self._conn.close()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2):
                await self._conn.wait_closed()


@contextlib.contextmanager
def map_sftp_errors(label: str, path: str) -> Iterator[None]:
    """SFTP failures: a lost link → ConnectError, anything else → TransferError(path)."""
    try:
        yield
    except (asyncssh.SFTPConnectionLost, asyncssh.SFTPNoConnection, asyncssh.ConnectionLost,
            asyncssh.DisconnectError, BrokenPipeError, ConnectionResetError) as exc:
        raise ConnectError(f"connection lost during the copy ({exc})", host=label) from exc
    except asyncssh.SFTPError as exc:
        raise TransferError(str(exc.reason).lower() or "failed", path=path,
                            host=label) from exc
    except (asyncssh.Error, OSError) as exc:
        raise ConnectError(f"connection failed during the copy ({exc})", host=label) from exc


def _sftp_stat(attrs: asyncssh.SFTPAttrs) -> FileStat:
    return FileStat(attrs.permissions or 0, attrs.size or 0, int(attrs.mtime or 0))


class _SFTPReader(Reader):
    def __init__(self, f: asyncssh.SFTPClientFile, label: str, path: str) -> None:
        self._f, self._label, self._path = f, label, path

    async def read(self, n: int) -> bytes:
        with map_sftp_errors(self._label, self._path):
            return cast(bytes, await self._f.read(n))


class _SFTPWriter(Writer):
    def __init__(self, f: asyncssh.SFTPClientFile, label: str, path: str) -> None:
        self._f, self._label, self._path = f, label, path

    async def write(self, data: bytes) -> None:
        with map_sftp_errors(self._label, self._path):
            await self._f.write(data)


class SFTPFileSystem(FileSystem):
    """A node's files over SFTP on the existing connection (OpenSSH's sftp-server: nothing
    of dtrain's is installed). Renames use posix-rename@openssh.com (atomic replace)."""

    def __init__(self, label: str, sftp: asyncssh.SFTPClient) -> None:
        self._label = label
        self._sftp = sftp

    async def home(self) -> str:
        with map_sftp_errors(self._label, "~"):
            return await self._sftp.realpath(".")

    async def lstat(self, path: str) -> FileStat | None:
        with map_sftp_errors(self._label, path):
            try:
                return _sftp_stat(await self._sftp.lstat(path))
            except asyncssh.SFTPNoSuchFile:
                return None

    async def stat(self, path: str) -> FileStat | None:
        with map_sftp_errors(self._label, path):
            try:
                return _sftp_stat(await self._sftp.stat(path))
            except asyncssh.SFTPNoSuchFile:
                return None

    async def listdir(self, path: str) -> list[tuple[str, FileStat]]:
        with map_sftp_errors(self._label, path):
            names = await self._sftp.readdir(path)
        return [(cast(str, n.filename), _sftp_stat(n.attrs)) for n in names
                if n.filename not in (".", "..")]

    async def readlink(self, path: str) -> str:
        with map_sftp_errors(self._label, path):
            return await self._sftp.readlink(path)

    async def glob(self, pattern: str) -> list[str]:
        with map_sftp_errors(self._label, pattern):
            try:
                return sorted(cast(Sequence[str], await self._sftp.glob(pattern)))
            except asyncssh.SFTPNoSuchFile:
                return []

    async def mkdir(self, path: str, *, parents: bool = False) -> None:
        with map_sftp_errors(self._label, path):
            if parents:
                await self._sftp.makedirs(path, exist_ok=True)
            else:
                await self._sftp.mkdir(path)

    async def remove(self, path: str) -> None:
        with map_sftp_errors(self._label, path):
            await self._sftp.remove(path)

    async def rmdir(self, path: str) -> None:
        with map_sftp_errors(self._label, path):
            await self._sftp.rmdir(path)

    async def symlink(self, target: str, path: str) -> None:
        with map_sftp_errors(self._label, path):
            await self._sftp.symlink(target, path)

    async def rename(self, src: str, dst: str) -> None:
        with map_sftp_errors(self._label, dst):
            await self._sftp.posix_rename(src, dst)

    async def set_attrs(self, path: str, *, mode: int | None = None,
                        mtime: int | None = None) -> None:
        attrs = asyncssh.SFTPAttrs(permissions=mode)
        if mtime is not None:
            attrs.atime = attrs.mtime = mtime
        with map_sftp_errors(self._label, path):
            await self._sftp.setstat(path, attrs)

    @contextlib.asynccontextmanager
    async def open_read(self, path: str) -> AsyncIterator[Reader]:
        with map_sftp_errors(self._label, path):
            f = await self._sftp.open(path, "rb", encoding=None)
        try:
            yield _SFTPReader(f, self._label, path)
        finally:
            with contextlib.suppress(asyncssh.Error, OSError):
                await f.close()

    @contextlib.asynccontextmanager
    async def open_write(self, path: str, mode: int) -> AsyncIterator[Writer]:
        attrs = asyncssh.SFTPAttrs(permissions=mode)
        with map_sftp_errors(self._label, path):
            f = await self._sftp.open(path, "wb", attrs, encoding=None)
        try:
            yield _SFTPWriter(f, self._label, path)
        finally:
            with map_sftp_errors(self._label, path):
                await f.close()

    async def aclose(self) -> None:
        self._sftp.exit()


class SSHTransport(Transport):
    """Connections over SSH, sharing one options object, key set and jump connections."""

    def __init__(self, settings: SSHSettings | None = None) -> None:
        self.settings = settings or SSHSettings()
        self.policy = HostKeyPolicy(self.settings.known_hosts, self.settings.accept_new)
        self._keys: list[asyncssh.SSHKeyPair] | None = None
        self._jumps: dict[str, asyncssh.SSHClientConnection] = {}
        self._jump_lock = asyncio.Lock()
        self._configs: dict[tuple[str, str | None, int | None], SSHClientConfig] = {}

    def _config_paths(self) -> list[str]:
        path = self.settings.config_path
        return [str(path)] if path.is_file() else []

    def _host_config(self, host: Host) -> SSHClientConfig:
        """~/.ssh/config as it applies to host, parsed once per host (ProxyJump, keys)."""
        key = (host.name, host.user, host.port)
        cfg = self._configs.get(key)
        if cfg is None:
            cfg = self._configs[key] = cast(SSHClientConfig, SSHClientConfig.load(
                None, self._config_paths(), False, False, False, getpass.getuser(),
                host.user or (), host.name, host.port or ()))
        return cfg

    def _client_keys(self, config_files: Sequence[str]) -> list[asyncssh.SSHKeyPair]:
        """Config IdentityFile(s), --identity, the dtrain key and the default keys."""
        if self._keys is None:
            ssh = self.settings.ssh_dir
            names = [*self.settings.identities, str(ssh / DTRAIN_KEY_NAME)]
            names += [str(ssh / n) for n in DEFAULT_KEY_NAMES]
            # the same file offered twice costs a failed attempt against MaxAuthTries
            unique = list(dict.fromkeys(str(Path(n).expanduser().resolve()) for n in names))
            self._keys = _load_keys(unique)
        extra = [f for f in config_files
                 if str(Path(f).expanduser().resolve()) not in self._key_paths()]
        return _load_keys(extra) + self._keys

    def _key_paths(self) -> set[str]:
        ssh = self.settings.ssh_dir
        names = [*self.settings.identities, str(ssh / DTRAIN_KEY_NAME)]
        names += [str(ssh / n) for n in DEFAULT_KEY_NAMES]
        return {str(Path(n).expanduser().resolve()) for n in names}

    async def _jump(self, spec: str) -> asyncssh.SSHClientConnection:
        """One connection per jump host, shared by every target behind it."""
        async with self._jump_lock:
            if spec not in self._jumps:
                user, _, rest = spec.rpartition("@")
                name, _, port = rest.partition(":")
                jump = Host(name=name, user=user or None, port=int(port) if port else None)
                self._jumps[spec] = await self._open(jump, tunnel=None)
            return self._jumps[spec]

    async def _open(self, host: Host, tunnel: object) -> asyncssh.SSHClientConnection:
        cfg = self._host_config(host)
        identity_files = cast(Sequence[str], cfg.get("IdentityFile", ()) or ())
        files = [str(p) for p in identity_files]
        kwargs: dict[str, Any] = {
            "known_hosts": self.policy.trusted_arg(),
            "client_keys": self._client_keys(files),
            "config": self._config_paths(),
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
        if tunnel is not None:
            kwargs["tunnel"] = tunnel
        if self.settings.password is not None:
            kwargs["password"] = self.settings.password
        delay = 0.1
        for attempt in range(self.settings.retries + 1):
            try:
                with map_ssh_errors(host.label, self.settings, self.policy):
                    try:
                        async with asyncio.timeout(self.settings.connect_timeout + 1):
                            conn, _ = await asyncssh.create_connection(
                                lambda: _Client(self.policy), host.name, **kwargs)
                        return conn
                    except _TRANSIENT:
                        if attempt == self.settings.retries:
                            raise
            except ConnectError:
                raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
        raise AssertionError("unreachable")

    async def connect(self, host: Host) -> Connection:
        cfg = self._host_config(host)
        jump = cfg.get("ProxyJump")
        tunnel = None
        if jump and jump != "none":
            tunnel = await self._jump(str(jump).split(",")[0])
        conn = await self._open(host, tunnel=tunnel)
        return SSHConnection(host, conn, self.settings)

    async def aclose(self) -> None:
        for conn in self._jumps.values():
            conn.close()
        self._jumps.clear()


def _load_keys(paths: Sequence[str]) -> list[asyncssh.SSHKeyPair]:
    keys: list[asyncssh.SSHKeyPair] = []
    for path in paths:
        p = Path(path).expanduser()
        if p.is_file():
            with contextlib.suppress(asyncssh.KeyImportError, OSError):
                keys.extend(asyncssh.load_keypairs([str(p)]))
    return keys
