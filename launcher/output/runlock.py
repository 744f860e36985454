"""The launcher's lock on its run directory: proof of life that a reused pid cannot fake.

    <run_dir>/launcher.lock   {"lock_version": 1, "pid", "uid", "host", "started", "detached"}

The launcher creates the file when it creates the archive and holds ``fcntl.flock(LOCK_EX)``
on it for as long as it lives; the kernel releases the lock when the process dies, however
it dies (kill -9, OOM, a crash). ``probe`` answers "is a launcher alive for this run?" by
trying a non-blocking shared lock: refused means a live holder. The pid in the file is only
information (shown by ``dtrain ps``); nothing trusts it without the lock being held.

The descriptor is opened close-on-exec, so a child process never inherits the lock (a local
job outliving its launcher must not make the run look alive). flock works on local
filesystems and on NFS (Linux emulates it with byte-range locks there). The file is created
0600 relative to the held run directory (output/rundir.py); readers open it with the
readers' checks (a regular file of the run's owner, no symlink, no FIFO).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from launcher.output.rundir import RunDir, open_in_run

LOCK = "launcher.lock"
LOCK_VERSION = 1


class LauncherLock:
    """Held by the launcher of one run for its whole life."""

    def __init__(self, run_dir: RunDir, fd: int, info: dict[str, Any]) -> None:
        self.run_dir = run_dir
        self.info = info
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, run_dir: RunDir, *, detached: bool = False) -> LauncherLock:
        """Create (0600) and lock ``launcher.lock`` (blocking: a concurrent probe holds it
        briefly)."""
        fd = run_dir.create(LOCK, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            info = {"lock_version": LOCK_VERSION, "pid": os.getpid(), "uid": os.getuid(),
                    "host": socket.gethostname(), "started": time.time(),
                    "detached": detached}
            data = (json.dumps(info) + "\n").encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
        except BaseException:
            os.close(fd)
            raise
        return cls(run_dir, fd, info)

    def update(self, **fields: Any) -> None:
        """Rewrite the lock file's information (e.g. detached=True once detached)."""
        if self._fd is None:
            return
        self.info.update(fields)
        data = (json.dumps(self.info) + "\n").encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)

    def release(self) -> None:
        """Unlock and close (process exit does the same)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def _open_lock(run_dir: Path, owner: int | None) -> int | None:
    return open_in_run(run_dir, LOCK, owner)


def probe(run_dir: Path, owner: int | None = None) -> dict[str, Any] | None:
    """The live launcher's lock information, or None when no launcher holds the lock.

    Also None when the file is missing (an archive from before the lock existed) or cannot
    be opened (another user's run, a symlink, not a regular file).
    """
    fd = _open_lock(run_dir, owner)
    if fd is None:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_info(fd)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _read_info(fd: int) -> dict[str, Any]:
    try:
        data = json.loads(os.pread(fd, 65536, 0) or b"{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}
