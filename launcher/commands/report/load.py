"""Reading a run archive for the report: the only I/O of `dtrain report`'s input side.

An archive may sit in a shared directory, so every file is opened the guarded way: without
following a symlink (O_NOFOLLOW), without blocking on a FIFO (O_NONBLOCK), only when it is a
regular file owned by this user, and read up to a cap (meta.json, stack files) or streamed
(output.jsonl, samples.jsonl: one record at a time, each record capped). A file that does
not pass is skipped with a warning; a missing optional file is simply absent.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from launcher.errors import UsageError
from launcher.output.archive import META, OUTPUT
from launcher.output.runreport.curves import Pattern
from launcher.output.runreport.digest import Digest
from launcher.output.runreport.summary import RunSummary, summarize
from launcher.output.runreport.usage import UsageBuilder

SAMPLES = "samples.jsonl"
STACKS = "stacks"
META_CAP = 16 * 1024 * 1024
RECORD_CAP = 4 * 1024 * 1024  # one output.jsonl record (a longer one is skipped, counted)
STACK_CAP = 256 * 1024  # one stack file (the rest is cut, said in the text)
MAX_DUMPS = 100
MAX_STACK_FILES = 1100  # per dump: 1024 ranks and their py-spy twins


class Refused(Exception):
    """A file the report will not read (a symlink, not regular, another user's)."""


@dataclass
class Loaded:
    summary: RunSummary
    warnings: list[str] = field(default_factory=list)


def open_guarded(path: Path) -> IO[bytes]:
    """Open a regular file of this user's, not following a symlink, never blocking."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Refused(f"{path}: a symbolic link, not read") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"{path}: not a regular file, not read")
        if st.st_uid != os.getuid():
            raise Refused(f"{path}: owned by uid {st.st_uid}, not you; not read")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def read_capped(path: Path, cap: int) -> tuple[bytes, bool]:
    """Up to ``cap`` bytes of a file, and whether there was more."""
    with open_guarded(path) as fh:
        data = fh.read(cap + 1)
    return data[:cap], len(data) > cap


def records(path: Path, warnings: list[str]) -> Iterator[object]:
    """JSON records of a .jsonl file, one per line; a torn or oversized line is yielded as
    None (the caller counts it)."""
    try:
        fh = open_guarded(path)
    except FileNotFoundError:
        return
    except (Refused, OSError) as exc:
        warnings.append(str(exc))
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


def read_meta(run_dir: Path) -> dict[str, Any]:
    try:
        data, more = read_capped(run_dir / META, META_CAP)
    except FileNotFoundError:
        raise UsageError(f"{run_dir}: no meta.json: not a run archive") from None
    except (Refused, OSError) as exc:
        raise UsageError(f"cannot read the run's meta.json: {exc}") from None
    if more:
        raise UsageError(f"{run_dir / META}: larger than {META_CAP >> 20} MiB, not read")
    try:
        meta = json.loads(data)
    except ValueError as exc:
        raise UsageError(f"{run_dir / META}: not JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise UsageError(f"{run_dir / META}: not a JSON object")
    return meta


def read_stacks(run_dir: Path, warnings: list[str]) -> dict[str, list[tuple[str, str]]]:
    """stacks/<dump_id>/<file>: dump id -> [(file name, text)]."""
    root = run_dir / STACKS
    try:
        if not stat.S_ISDIR(os.lstat(root).st_mode):
            return {}
        dumps = sorted(os.listdir(root))
    except OSError:
        return {}
    out: dict[str, list[tuple[str, str]]] = {}
    for dump in dumps[:MAX_DUMPS]:
        d = root / dump
        try:
            if not stat.S_ISDIR(os.lstat(d).st_mode):
                continue
            names = sorted(os.listdir(d))
        except OSError:
            continue
        files = []
        for name in names[:MAX_STACK_FILES]:
            try:
                data, more = read_capped(d / name, STACK_CAP)
            except (Refused, OSError) as exc:
                warnings.append(str(exc))
                continue
            body = data.decode("utf-8", "replace")
            if more:
                body += f"\n[dtrain report: cut at {STACK_CAP >> 10} KiB]"
            files.append((name, body))
        out[dump] = files
    if len(dumps) > MAX_DUMPS:
        warnings.append(f"{root}: {len(dumps)} dumps, the first {MAX_DUMPS} shown")
    return out


def load(run_dir: Path, pats: list[Pattern], *, lanes: str = "auto") -> Loaded:
    """Read one run's archive and summarise it."""
    warnings: list[str] = []
    meta = read_meta(run_dir)
    digest = Digest(pats)
    for rec in records(run_dir / OUTPUT, warnings):
        digest.add(rec)
    usage = UsageBuilder()
    for rec in records(run_dir / SAMPLES, warnings):
        if isinstance(rec, Mapping):
            usage.add(rec)
    stacks = read_stacks(run_dir, warnings)
    if digest.bad:
        warnings.append(f"{run_dir / OUTPUT}: {digest.bad} unreadable records skipped")
    summary = summarize(meta, digest, usage, stacks, run_id=run_dir.name, lanes=lanes)
    return Loaded(summary, warnings)
