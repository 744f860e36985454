"""Evidence files of a run archive: stack dumps and flight recorder dumps (docs/hangs.md).

    <run_id>/stacks/<dump_id>/r<rank>.txt          faulthandler's all-threads dump of a rank
    <run_id>/stacks/<dump_id>/r<rank>.py-spy.txt   py-spy dump --native, where the node has it
    <run_id>/stacks/<dump_id>/folded.txt           the folded verdict, as the console showed it
    <run_id>/flight/<dump_id>/rank_<rank>          PyTorch flight recorder dump (its pickle)

Directories 0700 and files 0600, as the rest of the archive. A dump id names one collection
(``h1`` the first hang, ``s1`` the first `dtrain stacks`, ``end`` what the nodes left at
the end); file names come from rank numbers and fixed words only.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from launcher.output.archive import DIR_MODE, FILE_MODE

STACKS_DIR = "stacks"
FLIGHT_DIR = "flight"
_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def _folder(run_dir: Path, kind: str, dump_id: str) -> Path:
    if not _SAFE.fullmatch(dump_id):
        raise ValueError(f"bad dump id {dump_id!r}")
    folder = run_dir / kind / dump_id
    for path in (run_dir / kind, folder):
        if not path.is_dir():
            path.mkdir(mode=DIR_MODE, exist_ok=True)
            os.chmod(path, DIR_MODE)
    return folder


def _write(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def write_stack(run_dir: Path, dump_id: str, name: str, text: str) -> Path:
    """One file of a stack dump (``r4.txt``, ``r4.py-spy.txt``, ``folded.txt``)."""
    if not _SAFE.fullmatch(name):
        raise ValueError(f"bad file name {name!r}")
    path = _folder(run_dir, STACKS_DIR, dump_id) / name
    _write(path, text.encode("utf-8", "backslashreplace"))
    return path


def stack_dir(run_dir: Path, dump_id: str) -> Path:
    return run_dir / STACKS_DIR / dump_id


def write_flight(run_dir: Path, dump_id: str, rank: int, data: bytes) -> Path:
    """One rank's flight recorder dump, named as torch's analyzer expects (rank_<N>)."""
    path = _folder(run_dir, FLIGHT_DIR, dump_id) / f"rank_{int(rank)}"
    _write(path, data)
    return path
