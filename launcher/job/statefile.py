"""The per-user state directory's files (the lemon list, the incident store): one opener for
both, so that the trust checks are written once (docs/threat-model.md, docs/incidents.md).

* ``open_state_dir``: the directory (``$DTRAIN_STATE_DIR``, else ``$XDG_STATE_HOME/dtrain``,
  else ``~/.local/state/dtrain``), made 0700 when asked, then held open without following a
  link in its last component and checked as this user's (``RunDir.open``: owner, mode 0700);
* ``read_state_file``: a file relative to that held descriptor, opened with ``O_NOFOLLOW``
  and checked on the descriptor that was opened (no check-then-open race): a regular file,
  owned by this user, not writable by group or others, at most ``limit`` bytes.

What a refusal means is the caller's: the lemon list reads a file it cannot trust as empty
(a fence is a hint), the incident store refuses it with the reason (``Untrusted.why``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from launcher.output.rundir import DIR_MODE, RunDir

_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class Untrusted(Exception):
    """A state file this user cannot trust: ``why`` is one of ``link``, ``not-regular``,
    ``owner``, ``mode``, ``size`` and ``io``; ``uid`` and ``mode`` are the file's (when it
    was opened)."""

    def __init__(self, why: str, text: str, uid: int | None = None, mode: int | None = None
                 ) -> None:
        super().__init__(text)
        self.why, self.text, self.uid, self.mode = why, text, uid, mode


def open_state_dir(directory: Path, *, create: bool) -> RunDir | None:
    """The state directory, held open and checked as this user's; None when it does not
    exist and ``create`` is false. ``UsageError`` (from ``RunDir``) for another user's."""
    if create and not directory.is_dir():
        directory.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            directory.mkdir(mode=DIR_MODE)
    try:
        return RunDir.open(directory)
    except FileNotFoundError:
        if create:
            raise
        return None


def read_state_file(held: RunDir, name: str, limit: int) -> bytes | None:
    """``name``'s bytes in the held state directory; None when there is no such file;
    ``Untrusted`` when it is a link, not a regular file, another user's, writable by others,
    larger than ``limit``, or cannot be read."""
    path = held.path / name
    try:
        fd = os.open(name, _READ, dir_fd=held.fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Untrusted("link", f"{path} is a symbolic link") from None
        raise Untrusted("io", f"{path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Untrusted("not-regular", f"{path} is not a regular file", st.st_uid)
        if st.st_uid != os.getuid():
            raise Untrusted("owner", f"{path} belongs to uid {st.st_uid}, not to you",
                            st.st_uid)
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o022:
            raise Untrusted("mode", f"{path} is writable by others (mode {mode:o})", st.st_uid,
                            mode)
        if st.st_size > limit:
            raise Untrusted("size", f"{path} is larger than {limit} bytes", st.st_uid, mode)
        os.set_blocking(fd, True)
        raw = b""
        while len(raw) <= limit:
            chunk = os.read(fd, limit + 1 - len(raw))
            if not chunk:
                break
            raw += chunk
        if len(raw) > limit:
            raise Untrusted("size", f"{path} is larger than {limit} bytes", st.st_uid, mode)
        return raw
    except OSError as exc:
        raise Untrusted("io", f"{path}: {exc.strerror}") from None
    finally:
        os.close(fd)
