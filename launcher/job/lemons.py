"""The lemon list's file: ``<state dir>/lemons.json`` (0600 in a 0700 directory).

The per-user state directory is ``$DTRAIN_STATE_DIR``, else ``$XDG_STATE_HOME/dtrain``, else
``~/.local/state/dtrain`` (the XDG base directory rule the run archive's default follows).
Every change is read-modify-write under an exclusive ``flock`` on ``lemons.lock``, written
whole through a temp name and a rename (``RunDir.replace``): two runs fencing at once both
land, a reader never sees half a file. A missing, torn or foreign file reads as empty.
The records and rules are ``decide/lemons.py``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from launcher.decide.lemons import Lemon, document, parse
from launcher.output.rundir import DIR_MODE, RunDir, read_capped

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
        if create and not self.directory.is_dir():
            self.directory.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):
                self.directory.mkdir(mode=DIR_MODE)
        try:
            return RunDir.open(self.directory)
        except OSError:
            if create:
                raise
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
            raw = read_capped(held.fd, LEMONS, MAX_BYTES)
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
            raw = read_capped(held.fd, LEMONS, MAX_BYTES)
            try:
                records = parse(json.loads(raw)) if raw else []
            except ValueError:
                records = []
            new, result = edit(records)
            held.replace(LEMONS, (json.dumps(document(new), indent=1) + "\n").encode())
            return result

    def remember(self, lemons: Sequence[Lemon]) -> None:
        """Add records (replacing earlier ones of the same hosts)."""
        from launcher.decide.lemons import add

        if lemons:
            self.change(lambda old: (add(old, lemons), None))
