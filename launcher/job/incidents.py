"""The incident store's file: ``<state dir>/incidents.json`` (0600 in a 0700 directory), kept
as the lemon list is (job/lemons.py): the per-user state directory (``$DTRAIN_STATE_DIR``,
else ``$XDG_STATE_HOME/dtrain``, else ``~/.local/state/dtrain``) held open and checked as
this user's, every change read-modify-write under an exclusive ``flock`` on
``incidents.lock``, written whole through a temp name and a rename, every open relative to
the held directory with ``O_NOFOLLOW``.

Unlike the lemon list, a file that cannot be trusted or read is never read as empty
(docs/incidents.md): another user's file, a link, a file others may write or one of another
``incidents_version`` is refused (``StoreRefused``) and left as it is; a corrupt one (not
JSON, not an incident store, over the size cap) is refused by the readers, and a writer
keeps it aside as ``incidents.json.corrupt-<time>`` before it begins a new store: nothing
is lost. The records and rules are ``decide/incidents.py``; the commit and versions beside
each record are read here (``commit_of``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import stat
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

from launcher.decide import incidents as inc
from launcher.decide.incidents import Incident
from launcher.errors import DtrainError
from launcher.job.lemons import state_dir
from launcher.output.rundir import DIR_MODE, RunDir

INCIDENTS = "incidents.json"
LOCK = "incidents.lock"
MAX_BYTES = 16 * 1024 * 1024  # 2,000 records are about 1 MB
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
T = TypeVar("T")


class StoreRefused(DtrainError):
    """The incident store cannot be used as it is; the message says why and what to do."""


class Corrupt(StoreRefused):
    """The file is this user's but not a readable incident store."""


def _owner(uid: int) -> str:
    import pwd

    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _read(held: RunDir, path: Path) -> list[Incident]:
    """The records of the held directory's file ([] when there is none)."""
    try:
        fd = os.open(INCIDENTS, _READ, dir_fd=held.fd)
    except FileNotFoundError:
        return []
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StoreRefused(f"{path} is a symbolic link: refused, left as it is",
                               hint="remove it; dtrain keeps its incidents in a file of "
                                    "its own") from None
        raise StoreRefused(f"{path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StoreRefused(f"{path} is not a regular file: refused, left as it is")
        if st.st_uid != os.getuid():
            raise StoreRefused(f"{path} belongs to {_owner(st.st_uid)}, not to you: refused, "
                               "left as it is", hint="another user put it there; remove it "
                                                     "(your own records are not in it)")
        if st.st_mode & 0o022:
            raise StoreRefused(f"{path} is writable by others (mode "
                               f"{stat.S_IMODE(st.st_mode):o}): refused, left as it is",
                               hint=f"chmod 600 {path} if its records are yours")
        if st.st_size > MAX_BYTES:
            raise Corrupt(f"{path} is larger than {MAX_BYTES} bytes: not an incident store")
        os.set_blocking(fd, True)
        raw = b""
        while len(raw) <= MAX_BYTES:
            chunk = os.read(fd, MAX_BYTES + 1 - len(raw))
            if not chunk:
                break
            raw += chunk
    finally:
        os.close(fd)
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise Corrupt(f"{path} is not JSON ({exc})") from None
    if isinstance(doc, dict) and doc.get("incidents_version") not in (None, inc.VERSION):
        raise StoreRefused(f"{path}: incidents_version {doc.get('incidents_version')!r}, "
                           f"this dtrain reads version {inc.VERSION}: refused, left as it is",
                           hint="a newer dtrain wrote it; use that one")
    try:
        return inc.parse(doc)
    except inc.BadStore as exc:
        raise Corrupt(f"{path}: {exc}") from None


class IncidentStore:
    """This user's incidents."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory or state_dir()
        self.path = self.directory / INCIDENTS
        self.kept_aside: str | None = None  # the name a corrupt file was kept under

    def _open(self, create: bool) -> RunDir | None:
        if create and not self.directory.is_dir():
            self.directory.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):
                self.directory.mkdir(mode=DIR_MODE)
        try:
            return RunDir.open(self.directory)
        except FileNotFoundError:
            if create:
                raise
            return None
        except DtrainError as exc:  # another user's directory
            raise StoreRefused(exc.message, hint=exc.hint) from None

    def load(self) -> list[Incident]:
        """Every record ([] when there is no store); StoreRefused when it cannot be used,
        Corrupt when it is not readable (left as it is)."""
        held = self._open(create=False)
        if held is None:
            return []
        try:
            return _read(held, self.path)
        except Corrupt as exc:
            raise Corrupt(exc.message, hint="it is left as it is; the next failed run keeps "
                                            f"it aside as {INCIDENTS}.corrupt-<time> and "
                                            "begins a new store") from None
        finally:
            held.close()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[RunDir]:
        held = self._open(create=True)
        assert held is not None
        try:
            lock = held.append(LOCK)
        except OSError:
            held.close()
            raise
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield held
        finally:
            os.close(lock)
            held.close()

    def change(self, edit: Callable[[list[Incident]], tuple[list[Incident], T]]) -> T:
        """Apply ``edit`` (records -> (new records, a result)) under the lock. A corrupt file
        is kept aside first (``kept_aside``); one that is refused stops the change."""
        with self._locked() as held:
            try:
                records = _read(held, self.path)
            except Corrupt:
                aside = f"{INCIDENTS}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
                os.rename(INCIDENTS, aside, src_dir_fd=held.fd, dst_dir_fd=held.fd)
                self.kept_aside = str(self.directory / aside)
                records = []
            new, result = edit(records)
            held.replace(INCIDENTS, (json.dumps(inc.document(new), indent=1) + "\n").encode())
            return result

    def record(self, new: Sequence[Incident], now: float | None = None) -> list[Incident]:
        """Add records; every record after it (bounded: decide.incidents.bound)."""
        t = time.time() if now is None else now

        def edit(old: list[Incident]) -> tuple[list[Incident], list[Incident]]:
            kept = inc.add(old, new, t)
            return kept, kept

        return self.change(edit)


def commit_of(workdir: str | None, script: str) -> str | None:
    """The script's commit: ``git rev-parse HEAD`` in the working directory when it is a
    repository (on the login node: the shared filesystem), else ``sha256:`` + 12 hex of the
    script's bytes; None when neither can be read."""
    where = workdir or os.getcwd()
    try:
        out = subprocess.run(["git", "-C", where, "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5, check=False, stdin=subprocess.DEVNULL)
        head = out.stdout.strip()
        if out.returncode == 0 and len(head) in (40, 64) and all(
                c in "0123456789abcdef" for c in head):
            return head
    except (OSError, subprocess.SubprocessError):
        pass
    path = Path(script).expanduser()
    if not path.is_absolute():
        path = Path(where) / path
    try:
        with open(path, "rb") as fh:
            return "sha256:" + hashlib.sha256(fh.read(64 * 1024 * 1024)).hexdigest()[:12]
    except OSError:
        return None
