"""The run archive: every run's output and metadata under ``<archive_dir>/<run_id>/``.

    <run_id>/
      meta.json        versioned dict (archive_version: 1), rewritten atomically
      output.jsonl     one object per line, in arrival order:
                       {"t", "host", "node_rank", "rank", "stream", "line"}
      hosts/<host>.log plain text per host; rank lines start with "r<rank> "

Run ids sort by start time (``20261129-151300-ab12``: UTC time plus a random suffix);
a user-chosen ``--run-id`` must be a safe directory name. output.jsonl is buffered but
flushed at least once a second (``write_lines`` checks the clock, and ``OutputPipeline``
calls ``flush_if_due`` on a timer), so ``dtrain logs --follow`` sees a live run.
The archive never stores secrets: callers pass the job's environment through
``launcher.output.redact.redact_env`` before putting it into meta.json. It is private all
the same (training output can hold anything): run directories are 0700 and files 0600
whatever the umask; an archive directory dtrain creates is 0700 too.
"""

from __future__ import annotations

import contextlib
import json
import operator
import os
import re
import secrets
import tempfile
import time
from datetime import UTC, datetime
from json.encoder import encode_basestring  # the C-accelerated string quoter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self, TextIO

from launcher.errors import UsageError

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from types import TracebackType

    from launcher.models import OutputLine

ARCHIVE_VERSION = 1
META = "meta.json"
OUTPUT = "output.jsonl"
HOSTS_DIR = "hosts"
FLUSH_INTERVAL_S = 1.0
_HOST_BUFFER_CHARS = 4 * 1024 * 1024
_SOURCE_KEY = operator.attrgetter("host", "node_rank", "rank", "stream")
_Source = tuple[str, "int | None", "int | None", str]
_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def new_run_id(now: float | None = None) -> str:
    """A run id that sorts by start time: UTC YYYYMMDD-HHMMSS plus 4 random hex digits."""
    stamp = datetime.fromtimestamp(time.time() if now is None else now, UTC)
    return f"{stamp:%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def check_run_id(run_id: str) -> str:
    """Accept a user's --run-id only if it is one plain directory name."""
    if not _SAFE_ID.fullmatch(run_id):
        raise UsageError(
            f"invalid run id {run_id!r}",
            hint="use letters, digits, '.', '_' and '-', starting with a letter or digit",
        )
    return run_id


DIR_MODE = 0o700
FILE_MODE = 0o600


def _private_opener(path: str, flags: int) -> int:
    """``open(..., opener=)``: create files 0600 and fix the mode of existing ones (the umask
    can only take bits away, and a umask of 0o200 would take the owner's write)."""
    fd = os.open(path, flags, FILE_MODE)
    os.fchmod(fd, FILE_MODE)
    return fd


def _private_dir(path: Path) -> None:
    """mkdir (FileExistsError if it exists), then 0700 whatever the umask."""
    path.mkdir(mode=DIR_MODE)
    os.chmod(path, DIR_MODE)


def atomic_write_json(path: Path, data: dict[str, Any]) -> None:
    """Write JSON through a temp file and os.replace: readers see old or new, never half."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, FILE_MODE)  # mkstemp's 0600, kept whatever the umask
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2, sort_keys=False, default=str)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_meta(run_dir: Path) -> dict[str, Any]:
    """meta.json as a dict; {} when it is missing or being replaced mid-read."""
    try:
        data = json.loads((run_dir / META).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


class RunArchive:
    """One run's directory, written while the job runs."""

    def __init__(
        self, path: Path, run_id: str, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.path = path
        self.run_id = run_id
        self._clock = clock  # tests pass a fake one to check the flush interval
        self._meta: dict[str, Any] = read_meta(path)  # continue an existing run's meta
        self._out: TextIO | None = open(  # closed by close()
            path / OUTPUT,
            "a",
            encoding="utf-8",
            errors="backslashreplace",
            buffering=1024 * 1024,
            opener=_private_opener,
        )
        self._hosts_dir = path / HOSTS_DIR
        self._host_buf: dict[str, list[str]] = {}
        self._host_chars = 0
        self._host_files: dict[str, Path] = {}
        self._sources: dict[_Source, tuple[str, str, list[str] | None]] = {}
        self._dirty = False
        self._last_flush = clock()

    @classmethod
    def create(
        cls,
        archive_dir: Path,
        run_id: str | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> RunArchive:
        """Make a new run directory (never reusing one) and write its first meta.json."""
        if not archive_dir.is_dir():
            archive_dir.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):  # another run made it meanwhile
                _private_dir(archive_dir)
        path, run_id = _make_run_dir(archive_dir, run_id)
        _private_dir(path / HOSTS_DIR)
        archive = cls(path, run_id, clock=clock)
        archive.write_meta({"created": datetime.now(UTC).isoformat(), "created_ts": time.time()})
        return archive

    @property
    def meta(self) -> dict[str, Any]:
        """A copy of the metadata last written."""
        return dict(self._meta)

    def write_meta(self, meta: dict[str, Any]) -> None:
        """Replace meta.json's fields (archive_version and run_id are always kept)."""
        self._meta = {"archive_version": ARCHIVE_VERSION, "run_id": self.run_id, **meta}
        self._meta["archive_version"] = ARCHIVE_VERSION
        atomic_write_json(self.path / META, self._meta)

    def update_meta(self, **fields: Any) -> None:
        """Merge fields into meta.json (e.g. outcome=..., end=... when the job is over)."""
        self.write_meta({**self._meta, **fields})

    def write_lines(self, lines: Sequence[OutputLine]) -> None:
        """Append lines to output.jsonl and the host logs; flush if a second has passed."""
        if self._out is None:
            raise RuntimeError("RunArchive.write_lines() called after close()")
        if not lines:
            return
        now = time.time()
        sources, source_of, source_key = self._sources, self._source, _SOURCE_KEY
        records: list[str] = []
        last_t, t_text = None, ""
        for line in lines:
            key = source_key(line)
            middle, log_prefix, log = sources.get(key) or source_of(key)
            t = line.t or now
            if t != last_t:  # lines of one chunk share a time: format it once
                last_t, t_text = t, f'{{"t":{t:.3f}'
            text = line.text
            records.append(f"{t_text}{middle}{encode_basestring(text)}}}\n")
            if log is not None:
                log.append(log_prefix + text)
        block = "".join(records)
        self._out.write(block)
        self._host_chars += len(block)  # a cheap upper bound of what the host logs hold
        self._dirty = True
        if self._host_chars > _HOST_BUFFER_CHARS:
            self.flush()
        else:
            self.flush_if_due()

    def flush_if_due(self, interval: float = FLUSH_INTERVAL_S) -> None:
        """Flush when there is unwritten output older than ``interval`` seconds."""
        if self._dirty and self._clock() - self._last_flush >= interval:
            self.flush()

    def flush(self) -> None:
        """Push buffered output to disk (output.jsonl first, then the host logs)."""
        self._last_flush = self._clock()
        if not self._dirty or self._out is None:
            return
        self._out.flush()
        for host, texts in self._host_buf.items():
            if texts:
                with open(
                    self._host_path(host), "a", encoding="utf-8", errors="backslashreplace",
                    opener=_private_opener,
                ) as fh:
                    fh.write("\n".join(texts) + "\n")
                texts.clear()  # in place: the per-source cache holds these lists
        self._host_chars = 0
        self._dirty = False

    def close(self) -> None:
        """Flush and close the output files; meta.json can still be updated afterwards."""
        if self._out is not None:
            self.flush()
            self._out.close()
            self._out = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _source(self, key: _Source) -> tuple[str, str, list[str] | None]:
        """Per-source constants: the JSON middle, the host-log prefix, the host's log buffer."""
        host, node_rank, rank, stream = key
        middle = (
            f',"host":{json.dumps(host)},"node_rank":{json.dumps(node_rank)},'
            f'"rank":{json.dumps(rank)},"stream":{json.dumps(stream)},"line":'
        )
        prefix = "dtrain: " if stream == "dtrain" else (f"r{rank} " if rank is not None else "")
        log = self._host_buf.setdefault(host, []) if host else None
        entry = self._sources[key] = (middle, prefix, log)
        return entry

    def _host_path(self, host: str) -> Path:
        path = self._host_files.get(host)
        if path is None:
            # Host labels are user input: keep them from naming another directory.
            name = re.sub(r"[^A-Za-z0-9._:@\[\]-]", "_", host).lstrip(".") or "_"
            path = self._host_files[host] = self._hosts_dir / f"{name}.log"
        return path


def _make_run_dir(archive_dir: Path, run_id: str | None) -> tuple[Path, str]:
    if run_id is not None:
        path = archive_dir / check_run_id(run_id)
        try:
            _private_dir(path)
        except FileExistsError:
            raise UsageError(
                f"run {run_id!r} already exists in {archive_dir}",
                hint="choose another --run-id",
            ) from None
        return path, run_id
    for _ in range(100):
        run_id = new_run_id()
        path = archive_dir / run_id
        with contextlib.suppress(FileExistsError):
            _private_dir(path)
            return path, run_id
    raise RuntimeError(f"could not create a fresh run directory in {archive_dir}")


def _run_dirs(archive_dir: Path) -> list[Path]:
    if not archive_dir.is_dir():
        return []
    return [p for p in archive_dir.iterdir() if p.is_dir() and (p / META).exists()]


def _started(run_dir: Path) -> tuple[float, str]:
    created = read_meta(run_dir).get("created_ts")
    when = float(created) if isinstance(created, int | float) else run_dir.stat().st_mtime
    return when, run_dir.name


def list_runs(archive_dir: Path) -> list[Path]:
    """Run directories, oldest first (by their recorded start time, then name)."""
    return sorted(_run_dirs(archive_dir), key=_started)


def latest_run(archive_dir: Path) -> Path | None:
    """The most recently started run, or None when there is none."""
    runs = list_runs(archive_dir)
    return runs[-1] if runs else None


def _has_meta(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a run; another user's private run is refused by name."""
    try:
        return (run_dir / META).exists()
    except PermissionError:
        raise UsageError(f"{run_dir}: permission denied: the run belongs to another user, "
                         "refused", hint="only the user who started a run can read, attach "
                         "to or stop it (run directories are 0700)") from None


def resolve_run(archive_dir: Path, run: str | None) -> Path:
    """Find a run from a path, a run id, a unique run-id prefix, or None for the latest."""
    if run is None:
        latest = latest_run(archive_dir)
        if latest is None:
            raise UsageError(f"no runs in {archive_dir}", hint="start one with `dtrain run`")
        return latest
    as_path = Path(run).expanduser()
    if _has_meta(as_path) and (os.sep in run or run.startswith(".")):
        return as_path
    if _SAFE_ID.fullmatch(run):
        if _has_meta(archive_dir / run):
            return archive_dir / run
        matches = [p for p in _run_dirs(archive_dir) if p.name.startswith(run)]
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            names = ", ".join(sorted(p.name for p in matches)[:5])
            raise UsageError(f"run {run!r} is ambiguous in {archive_dir}", hint=f"matches {names}")
    if _has_meta(as_path):
        return as_path
    recent = ", ".join(p.name for p in list_runs(archive_dir)[-3:]) or "none"
    raise UsageError(f"no run {run!r} in {archive_dir}", hint=f"recent runs: {recent}")
