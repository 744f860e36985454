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
import fcntl
import functools
import getpass
import os
import shlex
import socket
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import asyncssh
import asyncssh.config
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
    # OpenSSH's defaults when ssh config names none (overridable for tests):
    # UserKnownHostsFile (None: ~/.ssh/known_hosts ~/.ssh/known_hosts2), GlobalKnownHostsFile
    user_known_hosts: tuple[Path, ...] | None = None
    global_known_hosts: tuple[Path, ...] = (Path("/etc/ssh/ssh_known_hosts"),
                                            Path("/etc/ssh/ssh_known_hosts2"))

    @property
    def ssh_dir(self) -> Path:
        return self.home / ".ssh"

    @property
    def known_hosts_files(self) -> tuple[Path, ...]:
        """The user known_hosts files when ssh config does not name them."""
        if self.user_known_hosts is not None:
            return self.user_known_hosts
        return (self.ssh_dir / "known_hosts", self.ssh_dir / "known_hosts2")

    @property
    def known_hosts(self) -> Path:
        """Where new host keys are recorded by default (the first user file)."""
        files = self.known_hosts_files
        return files[0] if files else self.ssh_dir / "known_hosts"

    def host_key_policy(self, config: Any = None, accept_new: bool | None = None
                        ) -> HostKeyPolicy:
        """The policy for one host: UserKnownHostsFile/GlobalKnownHostsFile from its config."""
        users: Sequence[Path] = self.known_hosts_files
        globs: Sequence[Path] = self.global_known_hosts
        if config is not None:
            user_cfg = config.get("UserKnownHostsFile", None)
            if user_cfg is not None:  # [] means `none`
                users = [self._path(p) for p in user_cfg]
            global_cfg = config.get("GlobalKnownHostsFile", None)
            if global_cfg is not None:
                globs = [self._path(p) for p in global_cfg]
        accept = self.accept_new if accept_new is None else accept_new
        return HostKeyPolicy(users, accept, globs)

    def _path(self, text: str) -> Path:
        if text == "~" or text.startswith("~/"):
            return self.home / text[2:]
        return Path(text).expanduser()

    @property
    def config_path(self) -> Path:
        return self.ssh_dir / "config"


def fingerprint(key: asyncssh.SSHKey) -> str:
    """OpenSSH-style SHA256 fingerprint, as `ssh-keygen -l` prints it."""
    return str(key.get_fingerprint("sha256"))


def _known_host_names(host: str, addr: str | None, port: int | None) -> list[str]:
    host = host.lower()
    names = [host] + ([addr] if addr and addr != host else [])
    return names if not port or port == 22 else [f"[{n}]:{port}" for n in names]


def _normalise_line(line: str) -> str:
    """Lower-case a known_hosts line's plain host patterns: OpenSSH compares names that way.

    Hashed entries (``|1|salt|hash``) hash the lower-cased name already; markers
    (``@cert-authority``, ``@revoked``) and the key are left alone.
    """
    text = line.strip()
    if not text or text.startswith("#"):
        return text
    words = text.split(None, 2 if text.startswith("@") else 1)
    at = 1 if text.startswith("@") else 0
    if len(words) > at and not words[at].startswith("|"):
        words[at] = words[at].lower()
    return " ".join(words)


@dataclass(frozen=True)
class HostKeyVerdict:
    """What one connection's host key check found (each connection keeps its own)."""

    kind: str  # unknown | changed | added
    host: str
    fingerprint: str
    files: tuple[str, ...] = ()  # where the differing key is recorded (changed)


class _KnownHostsFile:
    """One known_hosts file parsed by asyncssh, reloaded when it changes on disk."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self._db = asyncssh.SSHKnownHosts()

    def db(self) -> asyncssh.SSHKnownHosts:
        try:
            st = self.path.stat()
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError:
            stamp = None
        if stamp != self._stamp:
            self._stamp = stamp
            self._db = self._load() if stamp else asyncssh.SSHKnownHosts()
        return self._db

    def _load(self) -> asyncssh.SSHKnownHosts:
        try:
            text = self.path.read_text(errors="replace")
        except OSError:
            return asyncssh.SSHKnownHosts()
        db = asyncssh.SSHKnownHosts()
        for line in text.splitlines():
            norm = _normalise_line(line)
            if norm and not norm.startswith("#"):
                with contextlib.suppress(ValueError):  # a line OpenSSH would skip too
                    db.load(norm)
        return db


_KeyLists = tuple[list[asyncssh.SSHKey], list[asyncssh.SSHKey], list[asyncssh.SSHKey]]


class HostKeyPolicy:
    """Strict known_hosts checking over every file OpenSSH reads, with accept-new semantics.

    ``user_files`` are UserKnownHostsFile (default ``~/.ssh/known_hosts``,
    ``~/.ssh/known_hosts2``; new keys are recorded in the first), ``global_files``
    GlobalKnownHostsFile (default ``/etc/ssh/ssh_known_hosts``, ``ssh_known_hosts2``).
    asyncssh parses the files (hashed names, ``@cert-authority``, ``@revoked``) and calls
    ``validate`` only for a key none of them vouches for. Then: any key recorded for this
    host in ANY file means "changed" (always refused, with --accept-new too); none means
    "unknown" (refused, or recorded under accept_new). A revoked key is refused by asyncssh
    before ``validate``. Names compare case-insensitively (GPU01 is gpu01), as in OpenSSH.
    """

    def __init__(self, user_files: Path | Sequence[Path], accept_new: bool = False,
                 global_files: Sequence[Path] = ()) -> None:
        users = [user_files] if isinstance(user_files, Path) else list(user_files)
        self.user_files = tuple(users)
        self.global_files = tuple(global_files)
        self.accept_new = accept_new
        self._files = [_KnownHostsFile(p) for p in (*self.user_files, *self.global_files)]

    @property
    def path(self) -> Path | None:
        """The file new keys are recorded in (the first UserKnownHostsFile), if any."""
        return self.user_files[0] if self.user_files else None

    @property
    def files(self) -> tuple[Path, ...]:
        return (*self.user_files, *self.global_files)

    def _lookup(self, host: str, addr: str | None, port: int | None
                ) -> list[tuple[Path, tuple[Any, ...]]]:
        """Per file: asyncssh's (host keys, CA keys, revoked keys, ...) for this host."""
        names = {host.lower()} | ({addr.lower()} if addr else set())
        if port and port != 22:  # OpenSSH looks up [name]:port only, never the bare name
            names = {f"[{n}]:{port}" for n in names}
            port = None
        found = []
        for kh in self._files:
            db = kh.db()
            merged: tuple[list[Any], ...] = tuple([] for _ in range(7))
            for name in sorted(names):
                for i, part in enumerate(db.match(name, "", port)):
                    merged[i].extend(part)
            found.append((kh.path, merged))
        return found

    def match(self, host: str, addr: str, port: int | None) -> _KeyLists:
        """The known_hosts callable for asyncssh: trusted keys, trusted CAs, revoked keys."""
        keys: _KeyLists = ([], [], [])
        for _, parts in self._lookup(host, addr, port):
            for i in range(3):
                keys[i].extend(parts[i])
        return keys

    def known_keys(self, host: str, addr: str | None, port: int | None) -> list[asyncssh.SSHKey]:
        return self.match(host, addr or "", port)[0]

    def validate(self, host: str, addr: str | None, port: int | None,
                 key: asyncssh.SSHKey) -> HostKeyVerdict:
        """The verdict on a key no known_hosts line vouches for (see the class doc)."""
        fp = fingerprint(key)
        where = tuple(str(path) for path, parts in self._lookup(host, addr, port)
                      if parts[0] and key not in parts[0])
        if where:
            return HostKeyVerdict("changed", host, fp, where)
        if not self.accept_new or self.path is None:
            return HostKeyVerdict("unknown", host, fp)
        self.record(host, addr, port, key)
        return HostKeyVerdict("added", host, fp)

    def record(self, host: str, addr: str | None, port: int | None, key: asyncssh.SSHKey) -> None:
        """Append the key to the first user known_hosts file (created 0600, its dir 0700).

        Under an exclusive lock, so concurrent dtrain processes never interleave lines; a
        file without a final newline gets one first, so its last line stays intact.
        """
        path = self.path
        if path is None:
            raise HostKeyError("no UserKnownHostsFile to record the key in", host=host)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        line = ",".join(_known_host_names(host, addr, port)) + " "
        line += key.export_public_key("openssh").decode().strip() + "\n"
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            size = os.fstat(fd).st_size
            text = line.encode()
            if size and os.pread(fd, 1, size - 1) != b"\n":
                text = b"\n" + text
            os.write(fd, text)
        finally:
            os.close(fd)  # releases the lock

    def trusted_arg(self) -> object:
        """The known_hosts argument for asyncssh: this policy's matcher over every file."""
        return self.match


class _Client(asyncssh.SSHClient):
    """One connection's client: its host key verdict is its own."""

    def __init__(self, policy: HostKeyPolicy) -> None:
        self._policy = policy
        self.verdict: HostKeyVerdict | None = None

    def validate_host_public_key(self, host: str, addr: str, port: int,
                                 key: asyncssh.SSHKey) -> bool:
        self.verdict = self._policy.validate(host, addr, port, key)
        return self.verdict.kind == "added"


@contextlib.contextmanager
def map_ssh_errors(label: str, settings: SSHSettings,
                   verdict: Callable[[], HostKeyVerdict | None] | None = None) -> Iterator[None]:
    """Translate asyncssh/OSError failures into ConnectError with an actionable message.

    ``verdict`` gives this connection's own host key verdict (never another node's).
    """
    try:
        yield
    except asyncssh.HostKeyNotVerifiable as exc:
        raise host_key_error(label, verdict() if verdict else None, exc) from exc
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


def host_key_error(label: str, verdict: HostKeyVerdict | None,
                   exc: asyncssh.HostKeyNotVerifiable) -> HostKeyError:
    """The message for a refused host key: changed, revoked or unknown, with its fingerprint."""
    if verdict is not None and verdict.kind == "changed":
        files = ", ".join(verdict.files)
        return HostKeyError(
            f"HOST KEY CHANGED: the node now presents {verdict.fingerprint}, which differs from "
            f"the key recorded for {verdict.host} in {files}", host=label,
            hint=f"this may be an attack or a reinstalled node; verify it, then remove the old "
                 f"line with `ssh-keygen -R {verdict.host} -f FILE` and retry")
    reason = str(exc.reason or "")
    if "revoked" in reason.lower():
        return HostKeyError(f"host key REVOKED ({reason}): a known_hosts file marks the key "
                            "the node presents (or its CA) @revoked", host=label,
                            hint="the node's key must be replaced; ask its administrator")
    if verdict is None:
        return HostKeyError(f"host key not trusted: {reason}", host=label,
                            hint="check the node's host certificate and your known_hosts "
                                 "@cert-authority lines")
    return HostKeyError(
        f"unknown host key {verdict.fingerprint}", host=label,
        hint="check the fingerprint, then retry with --accept-new (or run "
             "`dtrain keys setup`)")


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


MAX_JUMP_DEPTH = 8


def parse_proxy_jump(spec: str, where: str) -> list[Host]:
    """ProxyJump's hops, in order: ``[ssh://][user@]host[:port]``, comma-separated.

    ``host`` may be a bracketed IPv6 address (``[fd00::1]:2222``); a bare IPv6 address is
    taken whole (no port). Anything else is a ConnectError naming the host it was set for.
    """
    hops = []
    for raw in spec.split(","):
        text = raw.strip()
        if text.startswith("ssh://"):
            text = text[len("ssh://"):].rstrip("/")
        user, at, rest = text.rpartition("@")
        port = ""
        if rest.startswith("["):
            name, close, tail = rest[1:].partition("]")
            if not close or (tail and not tail.startswith(":")):
                name = ""
            port = tail[1:]
        elif rest.count(":") > 1:
            name = rest  # a bare IPv6 address
        else:
            name, _, port = rest.partition(":")
        if not name or any(c in name for c in " \t/@[]") or (port and not (
                port.isdigit() and 0 < int(port) < 65536)) or (at and not user):
            raise ConnectError(f"cannot read ProxyJump hop {raw.strip()!r} in {spec!r}",
                               host=where, hint="use [ssh://][user@]host[:port] hops separated "
                               "by commas; IPv6 addresses in brackets: [fd00::1]:22")
        hops.append(Host(name=name, user=user or None, port=int(port) if port else None))
    return hops


class _CachedShlex:
    """``shlex`` as asyncssh's config parser sees it, with ``split`` memoised.

    asyncssh evaluates ~/.ssh/config separately for every host (Host/Match blocks apply
    while it reads), re-splitting every line each time: with a generated config of a few
    hundred node blocks that was most of the launcher's CPU per host (docs/scaling.md).
    The split of a line does not depend on the host, so it is cached; everything else
    (matching, handlers, %-expansion) is still asyncssh's own code, run per host.
    """

    split = staticmethod(functools.lru_cache(maxsize=16384)(
        lambda line: tuple(shlex.split(line))))

    def __getattr__(self, name: str) -> Any:
        return getattr(shlex, name)


asyncssh.config.shlex = _CachedShlex()  # type: ignore[attr-defined,assignment]


class _ParsedConfigOptions(asyncssh.SSHClientConnectionOptions):
    """Hands a host's already-parsed ~/.ssh/config to ``create_connection``.

    asyncssh builds a connection's options on top of ``options.config`` (its "last
    config"); passing this carrier with ``config=[]`` makes it reuse the config dtrain
    parsed for the host (ProxyJump, IdentityFile...) instead of parsing the file again.
    """

    def __init__(self, config: SSHClientConfig) -> None:  # no prepare(): nothing to build
        self.kwargs = {}
        self.config = config


def load_host_config(settings: SSHSettings, host: Host) -> SSHClientConfig:
    """~/.ssh/config as it applies to one host (HostName, ProxyJump, known_hosts files...)."""
    path = settings.config_path
    paths = [str(path)] if path.is_file() else []
    return cast(SSHClientConfig, SSHClientConfig.load(
        None, paths, False, False, False, getpass.getuser(), host.user or (), host.name,
        host.port or ()))


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
            # "x": a new file (SSH_FXF_EXCL), never one that is there: cp writes random temps
            f = await self._sftp.open(path, "xb", attrs, encoding=None)
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
            "options": _ParsedConfigOptions(cfg), "config": [],
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
        for attempt in range(self.settings.retries + 1):
            conn = await self._attempt(host, _Client(policy), kwargs,
                                       last=attempt == self.settings.retries)
            if conn is not None:
                return conn
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
        raise AssertionError("unreachable")

    async def _attempt(self, host: Host, client: _Client, kwargs: dict[str, Any], *,
                       last: bool) -> asyncssh.SSHClientConnection | None:
        """One connection attempt, errors mapped; None after a transient drop (retry)."""
        with map_ssh_errors(host.label, self.settings, lambda: client.verdict):
            try:
                async with asyncio.timeout(self.settings.connect_timeout + 1):
                    conn, _ = await asyncssh.create_connection(lambda: client, host.name,
                                                               **kwargs)
                return conn
            except _TRANSIENT:
                if last:
                    raise
                return None

    async def connect(self, host: Host) -> Connection:
        try:
            tunnel, via = await self._route(host)
        except ConnectError as exc:
            if exc.host == host.label:
                raise
            raise ConnectError(f"through jump host {exc.host}: {exc.message}", host=host.label,
                               hint=exc.hint) from exc
        conn = await self._open(host, tunnel=tunnel)
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
