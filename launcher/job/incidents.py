"""The incident store's file: ``<state dir>/incidents.json`` (0600 in a 0700 directory), kept
as the lemon list is (job/lemons.py): the per-user state directory (``$DTRAIN_STATE_DIR``,
else ``$XDG_STATE_HOME/dtrain``, else ``~/.local/state/dtrain``) held open and checked as
this user's, every change read-modify-write under an exclusive ``flock`` on
``incidents.lock``, written whole through a temp name and a rename, every open relative to
the held directory with ``O_NOFOLLOW``: the directory and the file are opened and checked by
``job/statefile.py``, the lemon list's opener too.

Unlike the lemon list, a file that cannot be trusted or read is never read as empty
(docs/incidents.md): another user's file, a link, a file others may write or one of another
``incidents_version`` is refused (``StoreRefused``) and left as it is; a corrupt one (not
JSON, not an incident store, over the size cap) is refused by the readers, and a writer
keeps it aside as ``incidents.json.corrupt-<time>`` before it begins a new store: nothing
is lost. A record is written when the attempt's failure is judged, and charged the seconds
it cost (``IncidentStore.charge``) once the run's goodput ledger is made, at its end. The
records and rules are ``decide/outcome/incidents.py``; the commit and versions beside each record
are read here (``commit_of``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from launcher.decide.outcome import incidents as inc
from launcher.decide.outcome.incidents import Incident
from launcher.errors import DtrainError
from launcher.job.lemons import state_dir
from launcher.job.statefile import Untrusted, open_state_dir, read_state_file
from launcher.output.rundir import RunDir

INCIDENTS = "incidents.json"
LOCK = "incidents.lock"
MAX_BYTES = 16 * 1024 * 1024  # 2,000 records are about 1 MB
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
        raw = read_state_file(held, INCIDENTS, MAX_BYTES)
    except Untrusted as exc:
        raise _refusal(exc, path) from None
    if raw is None:
        return []
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise Corrupt(f"{path} is not JSON ({exc})") from None
    if isinstance(doc, dict) and doc.get("incidents_version") not in (None, *inc.READS):
        raise StoreRefused(f"{path}: incidents_version {doc.get('incidents_version')!r}, "
                           f"this dtrain reads versions {_versions()}: refused, left as it "
                           "is", hint="a newer dtrain wrote it; use that one")
    try:
        return inc.parse(doc)
    except inc.BadStore as exc:
        raise Corrupt(f"{path}: {exc}") from None


def _versions() -> str:
    return " and ".join(str(v) for v in inc.READS)


def _refusal(exc: Untrusted, path: Path) -> StoreRefused:
    """The store's word for a file statefile.py would not trust."""
    if exc.why == "link":
        return StoreRefused(f"{path} is a symbolic link: refused, left as it is",
                            hint="remove it; dtrain keeps its incidents in a file of its own")
    if exc.why == "owner" and exc.uid is not None:
        return StoreRefused(f"{path} belongs to {_owner(exc.uid)}, not to you: refused, left "
                            "as it is", hint="another user put it there; remove it (your own "
                                             "records are not in it)")
    if exc.why == "mode" and exc.mode is not None:
        return StoreRefused(f"{path} is writable by others (mode {exc.mode:o}): refused, "
                            "left as it is", hint=f"chmod 600 {path} if its records are yours")
    if exc.why == "size":
        return Corrupt(f"{path} is larger than {MAX_BYTES} bytes: not an incident store")
    if exc.why == "not-regular":
        return StoreRefused(f"{path} is not a regular file: refused, left as it is")
    return StoreRefused(exc.text)


class IncidentStore:
    """This user's incidents."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory or state_dir()
        self.path = self.directory / INCIDENTS
        self.kept_aside: str | None = None  # the name a corrupt file was kept under

    def _open(self, create: bool) -> RunDir | None:
        try:
            return open_state_dir(self.directory, create=create)
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
        """Add records; every record after it (bounded: decide.outcome.incidents.bound)."""
        t = time.time() if now is None else now

        def edit(old: list[Incident]) -> tuple[list[Incident], list[Incident]]:
            kept = inc.add(old, new, t)
            return kept, kept

        return self.change(edit)

    def charge(self, run_id: str, by_attempt: Mapping[int, Mapping[str, float | None]]
               ) -> int:
        """Charge run ``run_id``'s records with the seconds of the attempts they ended
        (decide.outcome.incidents.charge: the goodput ledger's, made at the run's end); how many
        records were charged. Nothing is written when none is."""
        if not by_attempt:
            return 0
        with self._locked() as held:
            try:
                records = _read(held, self.path)
            except Corrupt:
                return 0  # the next record keeps it aside; a charge never does
            new = inc.charge(records, run_id, by_attempt)
            done = sum(1 for a, b in zip(records, new, strict=True) if a is not b)
            if done:
                held.replace(INCIDENTS,
                             (json.dumps(inc.document(new), indent=1) + "\n").encode())
            return done


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
