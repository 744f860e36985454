"""Reading a run archive for the report: the only I/O of `dtrain report`'s input side.

An archive may sit in a shared directory, so it is read the way every archive reader reads
(launcher/output/rundir.py): the run directory is opened once with O_NOFOLLOW and must be
this user's; every file in it is opened relative to that descriptor, without following a
symlink, without blocking on a FIFO, only when it is a regular file of the directory's owner;
meta.json and stack files are read up to a cap, output.jsonl and samples.jsonl streamed (one
record at a time, each record capped). What does not pass is skipped with a warning (meta.json:
an error, exit 2); a missing optional file is simply absent.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, cast

from launcher.decide.outcome.goodput import Ledger
from launcher.errors import UsageError
from launcher.output.archive import META, OUTPUT
from launcher.output.rundir import has_entry, open_regular, open_run_dir
from launcher.output.runreport.curves import Pattern
from launcher.output.runreport.digest import Digest
from launcher.output.runreport.summary import RunSummary, summarize
from launcher.output.runreport.usage import UsageBuilder
from launcher.runrecord import RunMeta

SAMPLES = "samples.jsonl"
STACKS = "stacks"
META_CAP = 16 * 1024 * 1024
RECORD_CAP = 4 * 1024 * 1024  # one output.jsonl record (a longer one is skipped, counted)
STACK_CAP = 256 * 1024  # one stack file (the rest is cut, said in the text)
MAX_DUMPS = 100
MAX_STACK_FILES = 1100  # per dump: 1024 ranks and their py-spy twins
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
REFUSED = "not a regular file of the run's owner (a symlink, a FIFO, another user's): not read"


@dataclass
class Loaded:
    summary: RunSummary
    warnings: list[str] = field(default_factory=list)


def open_file(dirfd: int, name: str) -> IO[bytes] | None:
    """A regular file of the directory's owner (rundir.open_regular), as a binary file."""
    fd = open_regular(dirfd, name)
    return os.fdopen(fd, "rb") if fd is not None else None


def read_head(dirfd: int, name: str, cap: int) -> tuple[bytes, bool] | None:
    """Up to ``cap`` bytes and whether there was more; None when refused or missing."""
    fh = open_file(dirfd, name)
    if fh is None:
        return None
    with fh:
        data = fh.read(cap + 1)
    return data[:cap], len(data) > cap


def records(dirfd: int, name: str, where: Path, warnings: list[str]) -> Iterator[object]:
    """JSON records of a .jsonl file, one per line; a torn or oversized line is yielded as
    None (the caller counts it)."""
    fh = open_file(dirfd, name)
    if fh is None:
        if _exists(dirfd, name):
            warnings.append(f"{where / name}: {REFUSED}")
        return
    with fh:
        while True:
            raw = fh.readline(RECORD_CAP)
            if not raw:
                break
            if not raw.endswith(b"\n") and len(raw) >= RECORD_CAP:
                while raw and not raw.endswith(b"\n"):  # skip the rest of a huge line
                    raw = fh.readline(RECORD_CAP)
                yield None
                continue
            try:
                yield json.loads(raw)
            except ValueError:
                if raw.strip():
                    yield None


def _exists(dirfd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    except OSError:
        return False
    return True


def read_meta(dirfd: int, run_dir: Path) -> RunMeta:
    """meta.json as report reads it (launcher/runrecord.py's RunMeta): what
    output.archive.read_meta would return as {} is a UsageError naming the file here."""
    got = read_head(dirfd, META, META_CAP)
    if got is None:
        if _exists(dirfd, META):
            raise UsageError(f"{run_dir / META}: {REFUSED}")
        raise UsageError(f"{run_dir}: no meta.json: not a run archive")
    data, more = got
    if more:
        raise UsageError(f"{run_dir / META}: larger than {META_CAP >> 20} MiB, not read")
    try:
        meta = json.loads(data)
    except ValueError as exc:
        raise UsageError(f"{run_dir / META}: not JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise UsageError(f"{run_dir / META}: not a JSON object")
    return cast(RunMeta, meta)


def _subdir(dirfd: int, name: str) -> int | None:
    """A subdirectory of the same owner, opened without following a symlink."""
    if not has_entry(dirfd, name, stat.S_IFDIR):
        return None
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dirfd)
    except OSError:
        return None


def read_stacks(dirfd: int, run_dir: Path,
                warnings: list[str]) -> dict[str, list[tuple[str, str]]]:
    """stacks/<dump_id>/<file>: dump id -> [(file name, text)]."""
    root = _subdir(dirfd, STACKS)
    if root is None:
        return {}
    out: dict[str, list[tuple[str, str]]] = {}
    try:
        dumps = sorted(os.listdir(root))
        for dump in dumps[:MAX_DUMPS]:
            d = _subdir(root, dump)
            if d is None:
                continue
            try:
                files = []
                for name in sorted(os.listdir(d))[:MAX_STACK_FILES]:
                    got = read_head(d, name, STACK_CAP)
                    if got is None:
                        warnings.append(f"{run_dir / STACKS / dump / name}: {REFUSED}")
                        continue
                    body = got[0].decode("utf-8", "replace")
                    if got[1]:
                        body += f"\n[dtrain report: cut at {STACK_CAP >> 10} KiB]"
                    files.append((name, body))
                out[dump] = files
            finally:
                os.close(d)
        if len(dumps) > MAX_DUMPS:
            warnings.append(f"{run_dir / STACKS}: {len(dumps)} dumps, the first {MAX_DUMPS} "
                            "shown")
    finally:
        os.close(root)
    return out


def goodput_ledger(meta: Mapping[str, Any]) -> Ledger:
    """The ledger (decide/outcome/goodput.py) with the run's own progress and checkpoint
    patterns."""
    policy = meta.get("hang_policy")
    progress = policy.get("progress") if isinstance(policy, Mapping) else None
    ckpt = meta.get("checkpoint_pattern")
    return Ledger(progress if isinstance(progress, str) else None,
                  ckpt if isinstance(ckpt, str) else None)


def load(run_dir: Path, pats: list[Pattern], *, lanes: str = "auto") -> Loaded:
    """Read one run's archive and summarise it."""
    dirfd = open_run_dir(run_dir)
    if dirfd is None:
        raise UsageError(f"{run_dir}: not a run directory of yours (a symlink, another user's, "
                         "or unreadable): not read")
    try:
        warnings: list[str] = []
        meta = read_meta(dirfd, run_dir)
        digest = Digest(pats)
        # a ledger recorded at the end is drawn as it is; a live or older run's is made here
        led = None if isinstance(meta.get("goodput"), Mapping) else goodput_ledger(meta)
        for rec in records(dirfd, OUTPUT, run_dir, warnings):
            digest.add(rec)
            if led is not None and isinstance(rec, Mapping):
                led.feed(rec)
        if led is not None:
            meta["goodput"] = led.result(meta, now=time.time()).json()
        usage = UsageBuilder()
        for rec in records(dirfd, SAMPLES, run_dir, warnings):
            if isinstance(rec, Mapping):
                usage.add(rec)
        stacks = read_stacks(dirfd, run_dir, warnings)
    finally:
        os.close(dirfd)
    if digest.bad:
        warnings.append(f"{run_dir / OUTPUT}: {digest.bad} unreadable records skipped")
    summary = summarize(meta, digest, usage, stacks, run_id=run_dir.name, lanes=lanes)
    return Loaded(summary, warnings)
