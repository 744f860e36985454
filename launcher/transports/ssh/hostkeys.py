"""Host keys: strict known_hosts checking over every file OpenSSH reads, accept-new, and
the fingerprints dtrain shows."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

import asyncssh

from launcher.errors import HostKeyError

SSHKey: TypeAlias = asyncssh.SSHKey  # a public or private key, for the layers above


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


@dataclass(frozen=True)
class UnknownHostKey:
    """A host key no known_hosts line vouches for, kept so the one shown is the one recorded."""

    host: str  # the node's label
    algorithm: str
    fingerprint: str
    where: tuple[str, str | None, int | None] = field(repr=False, compare=False)
    key: SSHKey = field(repr=False, compare=False)
    policy: HostKeyPolicy | None = field(default=None, repr=False, compare=False)

    def record(self) -> None:
        """Append exactly this key to the known_hosts file its host's policy records in."""
        assert self.policy is not None
        self.policy.record(*self.where, self.key)
