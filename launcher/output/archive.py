"""The run archive: every run's output and metadata under ``<archive_dir>/<run_id>/``.

    <run_id>/
      meta.json        versioned dict (archive_version: 1), rewritten atomically
      output.jsonl     one object per line, in arrival order:
                       {"t", "host", "node_rank", "rank", "stream", ["attempt",] "line"}
                       ("attempt": with --restarts, 1, 2, ...; absent = 1)
      hosts/<host>.log plain text per host; rank lines start with "r<rank> "

Run ids sort by start time (``20261129-151300-ab12``: UTC time plus a random suffix);
a user-chosen ``--run-id`` must be a safe directory name. output.jsonl is buffered but
flushed at least once a second (``write_lines`` checks the clock, and ``OutputPipeline``
calls ``flush_if_due`` on a timer), so ``dtrain logs --follow`` sees a live run.
The archive never stores secrets: callers pass the job's environment through
``launcher.text.redact.redact_env`` before putting it into meta.json. It is private all
the same (training output can hold anything): run directories are 0700 and files 0600
whatever the umask; an archive directory dtrain creates is 0700 too.

The run directory is held open (``output/rundir.py``): every file is created and opened
relative to its descriptor with O_NOFOLLOW, so a shared archive directory (sticky, or
refused) cannot redirect a write. Readers (``list_runs``, ``read_meta``, ``resolve_run``)
take only this user's runs, regular files under a size cap, and skip what they cannot read.
"""

from __future__ import annotations

import contextlib
import json
import operator
import os
import re
import secrets
import time
from datetime import UTC, datetime
from json.encoder import encode_basestring  # the C-accelerated string quoter
from pathlib import Path
from typing import TYPE_CHECKING, Self, TextIO, Unpack, cast

from launcher.errors import UsageError
from launcher.output import render
from launcher.output.rundir import (
    RunDir,
    has_entry,
    open_archive_dir,
    open_in_run,
    open_run_dir,
    owner_of,
    read_capped,
)
from launcher.runrecord import ARCHIVE_VERSION, RunMeta

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from types import TracebackType

    from launcher.models import OutputLine

META = "meta.json"
OUTPUT = "output.jsonl"
HOSTS_DIR = "hosts"
FLUSH_INTERVAL_S = 1.0
_HOST_BUFFER_CHARS = 4 * 1024 * 1024
_SOURCE_KEY = operator.attrgetter("host", "node_rank", "rank", "stream")
_Source = tuple[str, "int | None", "int | None", str]
_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
MAX_META_BYTES = 16 * 1024 * 1024  # a readers' cap: meta.json of a 1000-node run is ~2 MB


def new_run_id(now: float | None = None) -> str:
    """A run id that sorts by start time: UTC YYYYMMDD-HHMMSS plus 4 random hex digits."""
    stamp = datetime.fromtimestamp(time.time() if now is None else now, UTC)
    return f"{stamp:%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def is_run_id(name: str) -> bool:
    """Whether ``name`` has the form of a run id (one plain directory name)."""
    return _SAFE_ID.fullmatch(name) is not None


def check_run_id(run_id: str) -> str:
    """Accept a user's --run-id only if it is one plain directory name."""
    if not _SAFE_ID.fullmatch(run_id):
        raise UsageError(
            f"invalid run id {run_id!r}",
            hint="use letters, digits, '.', '_' and '-', starting with a letter or digit",
        )
    return run_id


def meta_bytes(data: RunMeta) -> bytes:
    """meta.json's text."""
    return (json.dumps(data, indent=2, sort_keys=False, default=str) + "\n").encode()


def parse_meta(raw: bytes | None) -> RunMeta:
    """meta.json's record; {} for missing, torn or non-object data. Its values are not
    checked here: a reader checks each one it uses (the file is outside input)."""
    if raw is None:
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    return cast(RunMeta, data) if isinstance(data, dict) else {}


def read_meta(run_dir: Path, owner: int | None = None) -> RunMeta:
    """meta.json (launcher/runrecord.py: RunMeta), the one reader of report, ps, top, logs and
    run; {} when it is missing, being replaced mid-read, not a regular
    file of the run's owner (``owner``: this user by default), or over the size cap."""
    dirfd = open_run_dir(run_dir, owner)
    if dirfd is None:
        return {}
    try:
        return parse_meta(read_capped(dirfd, META, MAX_META_BYTES))
    finally:
        os.close(dirfd)


def open_output(run_dir: Path, owner: int | None = None) -> int | None:
    """output.jsonl opened for reading (the readers' checks), or None."""
    return open_in_run(run_dir, OUTPUT, owner)


class RunArchive:
    """One run's directory, written while the job runs."""

    def __init__(
        self, path: Path, run_id: str, *, clock: Callable[[], float] = time.monotonic,
        rundir: RunDir | None = None,
    ) -> None:
        self.dir = rundir or RunDir.open(path)  # reopening: an existing run of this user
        self.path = path
        self.run_id = run_id
        self._clock = clock  # tests pass a fake one to check the flush interval
        # continue an existing run's meta
        self._meta: RunMeta = parse_meta(read_capped(self.dir.fd, META, MAX_META_BYTES))
        self._out: TextIO | None = open(  # closed by close()
            self.dir.append(OUTPUT),
            "a",
            encoding="utf-8",
            errors="backslashreplace",
            buffering=1024 * 1024,
        )
        self._hosts_dir: RunDir | None = None
        self._host_buf: dict[str, list[str]] = {}
        self._host_chars = 0
        self._host_files: dict[str, str] = {}
        self._sources: dict[_Source, tuple[str, str, list[str] | None]] = {}
        self._dirty = False
        self._last_flush = clock()
        # why the archive could not be written any more (a full disk): then it is off, the
        # run goes on and the console still shows every line (docs/reliability.md)
        self.failed: str | None = None
        self.attempt: int | None = None  # --restarts: every output.jsonl line says its attempt

    def begin_attempt(self, attempt: int) -> None:
        """The lines from now on belong to ``attempt`` (``"attempt": n`` in output.jsonl;
        the host logs get a ``dtrain: attempt n`` line); reopens the output files a
        finished attempt's pipeline closed."""
        self.attempt = attempt
        self._sources.clear()
        if self._out is None:
            self._out = open(  # closed by close()
                self.dir.append(OUTPUT), "a", encoding="utf-8", errors="backslashreplace",
                buffering=1024 * 1024)

    @classmethod
    def create(
        cls,
        archive_dir: Path,
        run_id: str | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> RunArchive:
        """Make a new run directory (never reusing one) and write its first meta.json.

        Exit 2 when the archive directory can be written by other users and is not sticky.
        """
        parent = open_archive_dir(archive_dir)
        try:
            rundir, run_id = _make_run_dir(parent, archive_dir, run_id)
        finally:
            os.close(parent)
        try:
            rundir.mkdir(HOSTS_DIR).close()
            archive = cls(rundir.path, run_id, clock=clock, rundir=rundir)
        except BaseException:
            rundir.close()
            raise
        archive.write_meta({"created": datetime.now(UTC).isoformat(), "created_ts": time.time()})
        return archive

    @property
    def meta(self) -> RunMeta:
        """A copy of the metadata last written."""
        return self._meta.copy()

    def write_meta(self, meta: RunMeta) -> None:
        """Replace meta.json's fields (archive_version and run_id are always kept): the one
        writer of the run record (launcher/runrecord.py)."""
        self._meta = {"archive_version": ARCHIVE_VERSION, "run_id": self.run_id, **meta}
        self._meta["archive_version"] = ARCHIVE_VERSION
        self.dir.replace(META, meta_bytes(self._meta))

    def update_meta(self, **fields: Unpack[RunMeta]) -> None:
        """Merge fields into meta.json (e.g. outcome=..., end=... when the job is over); a
        failed write (a full disk) is one warning, not the run's end."""
        try:
            self.write_meta({**self._meta, **fields})
        except OSError as exc:
            self._failed(exc)

    def _failed(self, exc: OSError) -> None:
        """The archive cannot be written (ENOSPC, a read-only filesystem): it stops here with
        one warning; what was written stays, the run goes on."""
        if self.failed is None:
            self.failed = exc.strerror or str(exc)
            render.note(f"warning: cannot write the archive {self.path} ({self.failed}): the "
                        "rest of this run is not archived (the console still shows it)")
        self._dirty = False
        for fh in self._host_buf.values():
            fh.clear()

    def write_lines(self, lines: Sequence[OutputLine]) -> None:
        """Append lines to output.jsonl and the host logs; flush if a second has passed."""
        if self._out is None:
            raise RuntimeError("RunArchive.write_lines() called after close()")
        if not lines or self.failed is not None:
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
        try:
            self._out.write(block)
        except OSError as exc:
            self._failed(exc)
            return
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
        if not self._dirty or self._out is None or self.failed is not None:
            return
        try:
            self._out.flush()
            for host, texts in self._host_buf.items():
                if texts:
                    hosts = self._hosts_dir = self._hosts_dir or self.dir.subdir(HOSTS_DIR)
                    with open(hosts.append(self._host_file(host)), "a", encoding="utf-8",
                              errors="backslashreplace") as fh:
                        fh.write("\n".join(texts) + "\n")
                    texts.clear()  # in place: the per-source cache holds these lists
        except OSError as exc:
            self._failed(exc)
            return
        self._host_chars = 0
        self._dirty = False

    def close(self) -> None:
        """Flush and close the output files; meta.json can still be updated afterwards
        (the run directory stays held until the process ends)."""
        if self._out is not None:
            self.flush()
            with contextlib.suppress(OSError):  # a full disk: what it could not write is lost
                self._out.close()
            self._out = None
        if self._hosts_dir is not None:
            self._hosts_dir.close()
            self._hosts_dir = None

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
        if node_rank is not None and node_rank < 0:  # a console-only mark (fold.SUMMARY)
            node_rank = None
        middle = (
            f',"host":{json.dumps(host)},"node_rank":{json.dumps(node_rank)},'
            f'"rank":{json.dumps(rank)},"stream":{json.dumps(stream)},'
            + (f'"attempt":{self.attempt},' if self.attempt is not None else "") + '"line":'
        )
        prefix = "dtrain: " if stream == "dtrain" else (f"r{rank} " if rank is not None else "")
        log = self._host_buf.setdefault(host, []) if host else None
        entry = self._sources[key] = (middle, prefix, log)
        return entry

    def _host_file(self, host: str) -> str:
        name = self._host_files.get(host)
        if name is None:
            # Host labels are user input: keep them from naming another directory.
            safe = re.sub(r"[^A-Za-z0-9._:@\[\]-]", "_", host).lstrip(".") or "_"
            name = self._host_files[host] = f"{safe}.log"
        return name


def _make_run_dir(parent: int, archive_dir: Path, run_id: str | None) -> tuple[RunDir, str]:
    if run_id is not None:
        try:
            return RunDir.make(parent, archive_dir, check_run_id(run_id)), run_id
        except FileExistsError:
            raise UsageError(
                f"run {run_id!r} already exists in {archive_dir}",
                hint="choose another --run-id",
            ) from None
    for _ in range(100):
        run_id = new_run_id()
        with contextlib.suppress(FileExistsError):
            return RunDir.make(parent, archive_dir, run_id), run_id
    raise RuntimeError(f"could not create a fresh run directory in {archive_dir}")


def _run_dirs(archive_dir: Path, owner: int | None = None) -> list[tuple[Path, float]]:
    """(run directory, start time) of each run of ``owner`` (this user by default); what
    is not a readable run directory of that user is skipped."""
    try:
        entries = list(os.scandir(archive_dir))
    except OSError:
        return []
    runs = []
    for entry in entries:
        path = Path(entry.path)
        dirfd = open_run_dir(path, owner)
        if dirfd is None:
            continue
        try:
            meta = _run_meta(dirfd)
            if not meta:
                continue
            created = meta.get("created_ts")
            when = float(created) if isinstance(created, int | float) and \
                not isinstance(created, bool) else os.fstat(dirfd).st_mtime
            runs.append((path, when))
        except OSError:
            continue
        finally:
            os.close(dirfd)
    return runs


def list_runs(archive_dir: Path, owner: int | None = None) -> list[Path]:
    """This user's run directories (``owner``'s if given), oldest first (by their recorded
    start time, then name)."""
    return [p for p, _ in sorted(_run_dirs(archive_dir, owner), key=lambda r: (r[1], r[0].name))]


def latest_run(archive_dir: Path) -> Path | None:
    """This user's most recently started run, or None when there is none."""
    runs = list_runs(archive_dir)
    return runs[-1] if runs else None


def _has_meta(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a run of this user; another user's run is refused by name."""
    dirfd = open_run_dir(run_dir)
    if dirfd is None:
        owner = owner_of(run_dir)
        if owner is not None and owner != os.getuid() and os.path.isdir(run_dir):
            raise UsageError(f"{run_dir}: permission denied: the run belongs to another user, "
                             "refused",
                             hint="only the user who started a run can read, attach to or "
                                  "stop it (run directories are 0700)") from None
        return False
    try:
        return bool(_run_meta(dirfd))
    finally:
        os.close(dirfd)


def _run_meta(dirfd: int) -> RunMeta:
    """A run's meta.json ({} when it is not a readable run: no meta.json, not a regular file
    of the directory's owner, over the cap, not a JSON object)."""
    if not has_entry(dirfd, META):
        return {}
    return parse_meta(read_capped(dirfd, META, MAX_META_BYTES))


def resolve_run(archive_dir: Path, run: str | None) -> Path:
    """Find a run from a path (an argument with a ``/`` or a leading ``.``), a run id, a
    unique run-id prefix, or None for the latest; only this user's runs."""
    if run is None:
        latest = latest_run(archive_dir)
        if latest is None:
            raise UsageError(f"no runs in {archive_dir}", hint="start one with `dtrain run`")
        return latest
    if os.sep in run or run.startswith("."):
        as_path = Path(os.path.realpath(Path(run).expanduser()))  # the user named this path
        if _has_meta(as_path):
            return as_path
    elif _SAFE_ID.fullmatch(run):
        if _has_meta(archive_dir / run):
            return archive_dir / run
        matches = [p for p in list_runs(archive_dir) if p.name.startswith(run)]
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            names = ", ".join(sorted(p.name for p in matches)[:5])
            raise UsageError(f"run {run!r} is ambiguous in {archive_dir}", hint=f"matches {names}")
    recent = ", ".join(p.name for p in list_runs(archive_dir)[-3:]) or "none"
    raise UsageError(f"no run {run!r} in {archive_dir}", hint=f"recent runs: {recent}"
                     + ("; a run directory elsewhere is named by its path (./NAME)"
                        if not _SAFE_ID.fullmatch(run) or os.path.isdir(run) else ""))
