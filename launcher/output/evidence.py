"""Evidence files of a run archive: stack dumps and flight recorder dumps (docs/hangs.md).

    <run_id>/stacks/<dump_id>/r<rank>.txt          faulthandler's all-threads dump of a rank
    <run_id>/stacks/<dump_id>/r<rank>.py-spy.txt   py-spy dump --native, where the node has it
    <run_id>/stacks/<dump_id>/folded.txt           the folded verdict, as the console showed it
    <run_id>/flight/<dump_id>/rank_<rank>          PyTorch flight recorder dump (its pickle)

Directories 0700 and files 0600, as the rest of the archive, made and written relative to
the run directory the launcher holds open (output/rundir.py: no path is followed). A dump id
names one collection (``h1`` the first hang, ``s1`` the first `dtrain stacks`, ``end`` what
the nodes left at the end); file names come from rank numbers and fixed words only.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from launcher.output.rundir import RunDir, open_run_dir, read_capped

STACKS_DIR = "stacks"
FLIGHT_DIR = "flight"
_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def _folder(run_dir: RunDir, kind: str, dump_id: str) -> RunDir:
    """``<kind>/<dump_id>/`` in the held run directory (made 0700 when missing), held open."""
    if not _SAFE.fullmatch(dump_id):
        raise ValueError(f"bad dump id {dump_id!r}")
    parent = _sub(run_dir, kind)
    try:
        return _sub(parent, dump_id)
    finally:
        parent.close()


def _sub(run_dir: RunDir, name: str) -> RunDir:
    try:
        return run_dir.subdir(name)
    except FileNotFoundError:
        try:
            return run_dir.mkdir(name)
        except FileExistsError:  # made meanwhile
            return run_dir.subdir(name)


def _write(folder: RunDir, name: str, data: bytes) -> Path:
    folder.unlink(name)  # a dump written again replaces its file
    fd = folder.create(name)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
        folder.close()
    return folder.path / name


def write_stack(run_dir: RunDir, dump_id: str, name: str, text: str) -> Path:
    """One file of a stack dump (``r4.txt``, ``r4.py-spy.txt``, ``folded.txt``)."""
    if not _SAFE.fullmatch(name):
        raise ValueError(f"bad file name {name!r}")
    return _write(_folder(run_dir, STACKS_DIR, dump_id), name,
                  text.encode("utf-8", "backslashreplace"))


def stack_dir(run_dir: RunDir, dump_id: str) -> Path:
    """Where a stack dump is (for messages and meta.json)."""
    return run_dir.path / STACKS_DIR / dump_id


def write_flight(run_dir: RunDir, dump_id: str, rank: int, data: bytes) -> Path:
    """One rank's flight recorder dump, named as torch's analyzer expects (rank_<N>)."""
    return _write(_folder(run_dir, FLIGHT_DIR, dump_id), f"rank_{int(rank)}", data)


MAX_STACK_BYTES = 16 * 1024 * 1024


def read_stack(run_dir: Path, dump_id: str, name: str) -> str | None:
    """A file of an archived stack dump, with the archive readers' checks (this user's run
    directory and regular files, nothing followed, under a cap); None when there is none."""
    if not (_SAFE.fullmatch(dump_id) and _SAFE.fullmatch(name)):
        return None
    fd = open_run_dir(run_dir)
    for part in (STACKS_DIR, dump_id):
        if fd is None:
            return None
        parent, fd = fd, _open_subdir(fd, part)
        os.close(parent)
    if fd is None:
        return None
    try:
        data = read_capped(fd, name, MAX_STACK_BYTES)
    finally:
        os.close(fd)
    return None if data is None else data.decode("utf-8", "replace")


def _open_subdir(dirfd: int, name: str) -> int | None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                     dir_fd=dirfd)
    except OSError:
        return None
    if os.fstat(fd).st_uid != os.fstat(dirfd).st_uid:
        os.close(fd)
        return None
    return fd
