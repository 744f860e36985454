"""This machine's files below one directory and never outside it: where `dtrain cp --pull`
writes what a node sends.

The names in a pull come from the node: a hostile one can list ``..``, ``x/y``, a symlink
and then a file "inside" it, a setuid file. ``ConfinedFileSystem`` takes every path as
``root/<component>/...``, refuses any component that is empty, ``.`` or ``..``, and
reaches each one with ``openat(O_DIRECTORY|O_NOFOLLOW)`` from the root's descriptor, so no
symlink is ever followed below the root, whoever made it (this very pull included). The
final component is acted on relative to its parent's descriptor: files are created
``O_CREAT|O_EXCL|O_NOFOLLOW``, mode and mtime are set on a descriptor of the file itself
(a symlink is refused, never followed), renames and removals are ``renameat``/``unlinkat``.
Permission bits lose setuid and setgid (``0o6000``) unless ``keep_setid``.

The root's own parents (LOCALDIR, which the user named) are followed as usual.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import AsyncIterator, Iterator

from launcher.errors import TransferError
from launcher.transports.base import FileStat, FileSystem, Reader, Writer
from launcher.transports.local import _errors, _fstat, _LocalReader, _LocalWriter

SETID = stat.S_ISUID | stat.S_ISGID
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class ConfinedFileSystem(FileSystem):
    """The local side of a pull: everything at or below ``root`` (an absolute path)."""

    def __init__(self, root: str, *, host: str | None = None, keep_setid: bool = False) -> None:
        self.root = os.path.normpath(root)
        self._host = host
        self._keep_setid = keep_setid

    # -- resolving --------------------------------------------------------------------------

    def _parts(self, path: str) -> list[str]:
        """The components of ``path`` below the root ([] for the root itself)."""
        norm = path.rstrip("/") or "/"
        if norm == self.root:
            return []
        if not norm.startswith(self.root.rstrip("/") + "/"):
            raise TransferError(f"outside {self.root}: refused", path=path, host=self._host)
        parts = norm[len(self.root.rstrip("/")) + 1:].split("/")
        for part in parts:
            if part in ("", ".", "..") or "\0" in part:
                raise TransferError(f"not a plain path below {self.root}: refused", path=path,
                                    host=self._host)
        return parts

    def _open_root(self) -> int:
        return os.open(self.root, _DIR)

    @contextlib.contextmanager
    def _parent(self, path: str) -> Iterator[tuple[int, str]]:
        """(a descriptor of the directory holding ``path``, its last component); the root
        itself is reached through its own parent."""
        parts = self._parts(path)
        with _errors(path, self._host):
            if not parts:
                head, name = os.path.split(self.root)
                fd = os.open(head or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            else:
                fd = self._open_root()
                try:
                    for part in parts[:-1]:
                        nxt = os.open(part, _DIR, dir_fd=fd)
                        os.close(fd)
                        fd = nxt
                except BaseException:
                    os.close(fd)
                    raise
                name = parts[-1]
        try:
            yield fd, name
        finally:
            os.close(fd)

    def _mode(self, mode: int) -> int:
        return mode if self._keep_setid else mode & ~SETID

    # -- the interface ----------------------------------------------------------------------

    async def home(self) -> str:
        return os.path.expanduser("~")

    async def lstat(self, path: str) -> FileStat | None:
        with self._parent(path) as (fd, name), _errors(path, self._host):
            try:
                return _fstat(os.stat(name, dir_fd=fd, follow_symlinks=False))
            except FileNotFoundError:
                return None

    async def stat(self, path: str) -> FileStat | None:
        return await self.lstat(path)  # nothing below the root is followed

    async def listdir(self, path: str) -> list[tuple[str, FileStat]]:
        with self._parent(path) as (parent, name), _errors(path, self._host):
            fd = os.open(name, _DIR, dir_fd=parent)
            try:
                with os.scandir(fd) as it:
                    return [(d.name, _fstat(d.stat(follow_symlinks=False))) for d in it]
            finally:
                os.close(fd)

    async def readlink(self, path: str) -> str:
        with self._parent(path) as (fd, name), _errors(path, self._host):
            return os.readlink(name, dir_fd=fd)

    async def glob(self, pattern: str) -> list[str]:
        raise TransferError("no patterns on the receiving side", path=pattern, host=self._host)

    async def mkdir(self, path: str, *, parents: bool = False) -> None:
        parts = self._parts(path)
        with _errors(path, self._host):
            if parents or not parts:
                if parents:
                    os.makedirs(os.path.dirname(self.root), exist_ok=True)
                try:
                    os.mkdir(self.root)
                except FileExistsError:
                    if not parts and not parents:
                        raise
            fd = self._open_root()  # a directory, not a symlink
            try:
                for i, part in enumerate(parts):
                    last = i == len(parts) - 1
                    if parents or last:
                        try:
                            os.mkdir(part, dir_fd=fd)
                        except FileExistsError:
                            if last and not parents:
                                raise
                    nxt = os.open(part, _DIR, dir_fd=fd)  # it too: a directory, no symlink
                    os.close(fd)
                    fd = nxt
            finally:
                os.close(fd)

    async def remove(self, path: str) -> None:
        with self._parent(path) as (fd, name), _errors(path, self._host):
            os.unlink(name, dir_fd=fd)

    async def rmdir(self, path: str) -> None:
        with self._parent(path) as (fd, name), _errors(path, self._host):
            os.rmdir(name, dir_fd=fd)

    async def symlink(self, target: str, path: str) -> None:
        with self._parent(path) as (fd, name), _errors(path, self._host):
            os.symlink(target, name, dir_fd=fd)

    async def rename(self, src: str, dst: str) -> None:
        with self._parent(src) as (sfd, sname), self._parent(dst) as (dfd, dname), \
                _errors(dst, self._host):
            os.rename(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd)

    async def set_attrs(self, path: str, *, mode: int | None = None,
                        mtime: int | None = None) -> None:
        with self._parent(path) as (parent, name), _errors(path, self._host):
            fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
            try:
                if stat.S_ISLNK(os.fstat(fd).st_mode):
                    raise TransferError("a symlink: its attributes are not set (not followed)",
                                        path=path, host=self._host)
                # through the descriptor of the file itself (O_PATH: even a mode-000 file)
                here = f"/proc/self/fd/{fd}"
                if mode is not None:
                    os.chmod(here, self._mode(mode))
                if mtime is not None:
                    os.utime(here, (mtime, mtime))
            finally:
                os.close(fd)

    @contextlib.asynccontextmanager
    async def open_read(self, path: str) -> AsyncIterator[Reader]:
        with self._parent(path) as (parent, name), _errors(path, self._host):
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=parent)
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise TransferError("not a regular file", path=path, host=self._host)
            os.set_blocking(fd, True)
        with os.fdopen(fd, "rb") as f:
            yield _LocalReader(f)

    @contextlib.asynccontextmanager
    async def open_write(self, path: str, mode: int) -> AsyncIterator[Writer]:
        with self._parent(path) as (parent, name), _errors(path, self._host):
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, self._mode(mode), dir_fd=parent)
        with os.fdopen(fd, "wb") as f, _errors(path, self._host):
            yield _LocalWriter(f)
