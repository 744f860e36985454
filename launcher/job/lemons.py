"""The lemon list's file: ``<state dir>/lemons.json`` (0600 in a 0700 directory).

The per-user state directory is ``$DTRAIN_STATE_DIR``, else ``$XDG_STATE_HOME/dtrain``, else
``~/.local/state/dtrain`` (the XDG base directory rule the run archive's default follows).
Every change is read-modify-write under an exclusive ``flock`` on ``lemons.lock``, written
whole through a temp name and a rename (``RunDir.replace``): two runs fencing at once both
land, a reader never sees half a file. The directory and the file are opened and checked by
``job/statefile.py``, as the incident store's are; a missing, torn or untrusted file (a link,
another user's, writable by others) reads as empty. The records and rules are
``decide/outcome/lemons.py``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from launcher.decide.outcome.lemons import Lemon, document, parse
from launcher.job.statefile import Untrusted, open_state_dir, read_state_file
from launcher.output.rundir import RunDir

LEMONS = "lemons.json"
LOCK = "lemons.lock"
MAX_BYTES = 4 * 1024 * 1024
T = TypeVar("T")


def state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """dtrain's per-user state directory (see the module doc; hosts/userconfig.py)."""
    from launcher.hosts.userconfig import state_dir as per_user

    return per_user(environ)


class LemonStore:
    """The lemon list of this user."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory or state_dir()
        self.path = self.directory / LEMONS

    def _open(self, create: bool) -> RunDir | None:
        try:
            return open_state_dir(self.directory, create=create)
        except OSError:
            if create:
                raise
            return None

    def _read(self, held: RunDir) -> bytes | None:
        try:
            return read_state_file(held, LEMONS, MAX_BYTES)
        except Untrusted:  # a link, another user's, writable by others: no list of ours
            return None

    def load(self) -> list[Lemon]:
        """Every record ([] when there is no list or it cannot be read)."""
        try:
            held = self._open(create=False)
        except Exception:  # another user's directory: no list of ours
            return []
        if held is None:
            return []
        try:
            raw = self._read(held)
        finally:
            held.close()
        if raw is None:
            return []
        try:
            return parse(json.loads(raw))
        except ValueError:
            return []

    @contextlib.contextmanager
    def _locked(self) -> Iterator[RunDir]:
        held = self._open(create=True)
        assert held is not None
        lock = held.append(LOCK)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield held
        finally:
            os.close(lock)
            held.close()

    def change(self, edit: Callable[[list[Lemon]], tuple[list[Lemon], T]]) -> T:
        """Apply ``edit`` (records -> (new records, a result)) under the lock."""
        with self._locked() as held:
            raw = self._read(held)
            try:
                records = parse(json.loads(raw)) if raw else []
            except ValueError:
                records = []
            new, result = edit(records)
            held.replace(LEMONS, (json.dumps(document(new), indent=1) + "\n").encode())
            return result

    def remember(self, lemons: Sequence[Lemon]) -> None:
        """Add records (replacing earlier ones of the same hosts)."""
        from launcher.decide.outcome.lemons import add

        if lemons:
            self.change(lambda old: (add(old, lemons), None))
