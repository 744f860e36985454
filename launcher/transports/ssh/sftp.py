"""A node's files over SFTP on its SSH connection (``Connection.files()``, used by `cp`)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import cast

import asyncssh

from launcher.transports.base import FileStat, FileSystem, Reader, Writer
from launcher.transports.ssh.errormap import map_sftp_errors


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
        return await self._stat(self._sftp.lstat, path)

    async def stat(self, path: str) -> FileStat | None:
        return await self._stat(self._sftp.stat, path)

    async def _stat(self, call: Callable[[str], Awaitable[asyncssh.SFTPAttrs]], path: str
                    ) -> FileStat | None:
        """``call(path)`` (the SFTP stat or lstat); None when nothing is there."""
        with map_sftp_errors(self._label, path):
            try:
                return _sftp_stat(await call(path))
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

