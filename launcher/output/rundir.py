"""A run directory reached only through descriptors: the launcher's writes and every reader's
reads stay inside the run's own directory, whoever else can write the archive directory.

Writing (the launcher). The archive directory may be shared (``/scratch/team/runs``, mode
1777) or pre-created by someone else. ``open_archive_dir`` refuses one that another user may
write unless it is sticky (exit 2): in a non-sticky one, anyone could rename a run directory
and put a symlink in its place between two of the launcher's writes. The run directory is
made with ``mkdirat`` and opened at once with ``O_DIRECTORY|O_NOFOLLOW`` (it must be a
directory owned by this user, or the run stops); from then on ``RunDir`` creates and opens
every file relative to that descriptor with ``O_NOFOLLOW`` (``O_EXCL`` on create), replaces
files with ``renameat`` of a random ``O_EXCL`` temp name, and binds the control socket through
``/proc/self/fd/<dirfd>/``. Swapping the path afterwards changes nothing for the launcher.

Reading (ps, attach, logs, stop, completion). What another user planted in a shared archive
is not trusted: ``open_run_dir`` opens a run directory with ``O_NOFOLLOW`` and accepts it only
when it belongs to the expected owner (this user, unless a caller asks for another's run);
``read_capped`` and ``open_regular`` open files relative to it with
``O_NOFOLLOW|O_NONBLOCK`` and accept only regular files of that owner (a symlink to
/dev/zero, a FIFO, another user's file: skipped), ``read_capped`` under a size cap. Anything
unreadable is skipped, never an exception.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import secrets
import stat
from pathlib import Path

from launcher.errors import UsageError

DIR_MODE = 0o700
FILE_MODE = 0o600
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _own_private_group(gid: int, uid: int) -> bool:
    """A user-private group (named after the user, nobody else listed): group write on it
    lets no other user in (umask 002 distributions make such directories 0775)."""
    try:
        name = pwd.getpwuid(uid).pw_name
        group = grp.getgrgid(gid)
    except KeyError:
        return False
    return group.gr_name == name and set(group.gr_mem) <= {name}


def others_may_write(st: os.stat_result, uid: int | None = None) -> bool:
    """Whether a user other than ``uid`` (and root) may create or rename entries in a
    directory: world-writable, group-writable for a shared group, or owned by another user."""
    uid = os.getuid() if uid is None else uid
    if st.st_uid not in (uid, 0):
        return True
    if st.st_mode & stat.S_IWOTH:
        return True
    return bool(st.st_mode & stat.S_IWGRP) and not _own_private_group(st.st_gid, uid)


def open_archive_dir(path: Path) -> int:
    """The archive directory, opened (created 0700 when missing); refused (exit 2) when
    another user may write it and it is not sticky."""
    if not path.is_dir():
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):  # another run made it meanwhile
            path.mkdir(mode=DIR_MODE)
            os.chmod(path, DIR_MODE)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise UsageError(f"archive directory {path}: {exc.strerror}",
                         hint="choose another with --archive-dir") from None
    try:
        _refuse_shared(os.fstat(fd), path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_archive_dir(path: Path) -> None:
    """Exit 2 before anything connects when an existing archive directory would be refused
    (``open_archive_dir`` checks again when the run directory is made)."""
    try:
        st = os.stat(path)
    except OSError:
        return  # missing: dtrain will create it 0700
    if stat.S_ISDIR(st.st_mode):
        _refuse_shared(st, path)


def _refuse_shared(st: os.stat_result, path: Path) -> None:
    if others_may_write(st) and not st.st_mode & stat.S_ISVTX:
        raise UsageError(
            f"archive directory {path} (owner {_user(st.st_uid)}, mode "
            f"{stat.S_IMODE(st.st_mode):04o}) can be written by other users and is not "
            "sticky: refused (they could swap a run directory for a symlink while the run "
            "writes to it)",
            hint=f"use a directory of your own (--archive-dir), or make a shared one sticky: "
                 f"chmod +t {path}")


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


class RunDir:
    """One run directory, held open; every file in it is reached through the descriptor."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self.fd = fd

    @classmethod
    def make(cls, parent_fd: int, parent: Path, name: str) -> RunDir:
        """mkdir ``name`` (FileExistsError if it exists) 0700 and hold it open."""
        os.mkdir(name, DIR_MODE, dir_fd=parent_fd)
        return cls._held(parent / name, os.open(name, _DIR_FLAGS, dir_fd=parent_fd))

    @classmethod
    def open(cls, path: Path) -> RunDir:
        """An existing run directory of this user (the last component is not followed)."""
        return cls._held(path, os.open(path, _DIR_FLAGS))

    @classmethod
    def _held(cls, path: Path, fd: int) -> RunDir:
        st = os.fstat(fd)
        if st.st_uid != os.getuid():
            os.close(fd)
            raise UsageError(f"{path}: owned by {_user(st.st_uid)}, not by you: refused",
                             hint="another user replaced the run directory; start the run "
                                  "again in a directory of your own (--archive-dir)")
        os.fchmod(fd, DIR_MODE)
        return cls(path, fd)

    def mkdir(self, name: str) -> RunDir:
        """A new private subdirectory, held open too."""
        return RunDir.make(self.fd, self.path, name)

    def subdir(self, name: str) -> RunDir:
        """An existing subdirectory, held open."""
        return RunDir._held(self.path / name, os.open(name, _DIR_FLAGS, dir_fd=self.fd))

    def create(self, name: str, flags: int = os.O_WRONLY) -> int:
        """A new file, 0600 whatever the umask (FileExistsError if the name is taken)."""
        fd = os.open(name, flags | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     FILE_MODE, dir_fd=self.fd)
        os.fchmod(fd, FILE_MODE)
        return fd

    def append(self, name: str) -> int:
        """A file to append to: the existing regular file, else a new one (0600)."""
        try:
            fd = os.open(name, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC,
                         dir_fd=self.fd)
        except FileNotFoundError:
            return self.create(name, os.O_WRONLY | os.O_APPEND)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(f"{self.path / name}: not a regular file")
        os.fchmod(fd, FILE_MODE)
        return fd

    def replace(self, name: str, data: bytes) -> None:
        """Write ``name`` whole through a random temp name and rename: readers see the old
        file or the new one, never half."""
        tmp = f".{name}.{secrets.token_hex(8)}.tmp"
        fd = self.create(tmp)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=self.fd)
            raise

    def unlink(self, name: str) -> None:
        """Remove a file of the run directory (missing is fine)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=self.fd)

    def socket_path(self, name: str) -> str:
        """A path for bind()/connect() that resolves through the held descriptor (and fits
        in sockaddr_un whatever the run directory's length)."""
        return f"/proc/self/fd/{self.fd}/{name}"

    def close(self) -> None:
        """Let go of the directory."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


# -- readers ----------------------------------------------------------------------------------

def open_run_dir(path: Path, owner: int | None = None) -> int | None:
    """A run directory's descriptor if it is a directory (not a symlink) of ``owner`` (this
    user by default); None otherwise or when it cannot be opened."""
    try:
        fd = os.open(path, _DIR_FLAGS | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
    except OSError:
        st = None
    if st is None or st.st_uid != (os.getuid() if owner is None else owner):
        os.close(fd)
        return None
    return fd


def owner_of(path: Path) -> int | None:
    """The uid owning ``path`` itself (not followed), None when it cannot be stat'ed."""
    try:
        return os.lstat(path).st_uid
    except OSError:
        return None


def open_regular(dirfd: int, name: str) -> int | None:
    """A regular file in ``dirfd`` owned by the directory's owner, opened for reading (no
    symlink followed, a FIFO or device never opened for real); None otherwise."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dirfd)
    except OSError:
        return None
    try:
        st, parent = os.fstat(fd), os.fstat(dirfd)
    except OSError:
        os.close(fd)
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_uid != parent.st_uid:
        os.close(fd)
        return None
    os.set_blocking(fd, True)
    return fd


def open_in_run(run_dir: Path, name: str, owner: int | None = None) -> int | None:
    """``name`` in a run directory opened for reading, with both checks (``open_run_dir``,
    ``open_regular``); None when refused or missing."""
    dirfd = open_run_dir(run_dir, owner)
    if dirfd is None:
        return None
    try:
        return open_regular(dirfd, name)
    finally:
        os.close(dirfd)


def read_capped(dirfd: int, name: str, cap: int) -> bytes | None:
    """A small file's bytes (``open_regular``'s checks); None when refused, missing or
    larger than ``cap``."""
    fd = open_regular(dirfd, name)
    if fd is None:
        return None
    try:
        if os.fstat(fd).st_size > cap:
            return None
        chunks, size = [], 0
        while size <= cap:
            chunk = os.read(fd, cap + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return None if size > cap else b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def has_entry(dirfd: int, name: str, kind: int = stat.S_IFREG) -> bool:
    """Whether ``name`` in ``dirfd`` is of ``kind`` (not followed) and the directory owner's."""
    try:
        st, parent = os.stat(name, dir_fd=dirfd, follow_symlinks=False), os.fstat(dirfd)
    except OSError:
        return False
    return stat.S_IFMT(st.st_mode) == kind and st.st_uid == parent.st_uid
