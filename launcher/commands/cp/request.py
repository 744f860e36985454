"""What `dtrain cp` copies: the request, the sources listed before anything connects, and
the launcher side's sums and bytes.

Push: the local sources are listed once (``prepare_push``; a missing source is bad input,
exit 2). ``walk`` lists any tree (local, or a node's over SFTP) without following a link.
``SourceData`` reads each small source file once for every node; ``Sums`` hashes files for
``--checksum`` (in-process locally, by dtrain's node program on a node).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from launcher import defaults
from launcher.commands.cp.view import CopyView
from launcher.decide.copies import broadcast as bc
from launcher.decide.copies import copyplan as cpl
from launcher.decide.copies.copyplan import DIR, LINK, Entry
from launcher.errors import TransferError, UsageError
from launcher.job.remote import run_program
from launcher.models import Host
from launcher.transports.base import Connection, FileStat, FileSystem
from launcher.transports.local import LocalFileSystem

CHUNK = 4 << 20  # per read/write call; SFTP splits it into parallel requests
FILES_IN_FLIGHT = 32  # per node: hides the round trips of small files
CLEANUP_S = 5.0  # bound on removing temps after an error or Ctrl-C


@dataclass(frozen=True)
class CopyRequest:
    """What the user asked `dtrain cp` for."""

    sources: tuple[str, ...]
    dest: str
    pull: bool = False
    recursive: bool = False
    preserve: bool = False
    checksum: bool = False
    delete: bool = False
    fanout: int = defaults.FANOUT
    python: str = "python3"
    progress: bool | None = None  # None: live progress when stderr is a terminal
    broadcast: bool | None = None  # None: on for large files that >= 3 nodes receive
    broadcast_min: int = bc.DEFAULT_MIN
    stream: bool = True  # push through dtrain's node program (False: SFTP only)
    keep_setuid: bool = False  # pull -p: keep setuid/setgid bits (off: masked, 0o6000)
    transport: str = "auto"  # --transport: ssh, srun or auto (srun has no SFTP: push only)

    def python_on(self, host: Host) -> str:
        """The interpreter of dtrain's node programs on this node."""
        return host.python or self.python


@dataclass
class Source:
    """One local source of a push, listed before connecting."""

    path: str
    name: str
    tree: dict[str, Entry]
    _manifests: dict[bool, bytes] = field(default_factory=dict, repr=False)

    @property
    def kind(self) -> str:
        return self.tree[""].kind

    def manifest(self, *, preserve: bool) -> bytes:
        """The rows a node compares its tree with (op "diff"), as JSON: encoded once for
        every node."""
        if preserve not in self._manifests:
            rows = cpl.manifest_rows(self.tree.values(), preserve=preserve)
            self._manifests[preserve] = json.dumps(rows, separators=(",", ":")).encode()
        return self._manifests[preserve]


# ---------------------------------------------------------------- listing


def _entry(rel: str, st: FileStat, target: str = "") -> Entry:
    return Entry.from_stat(rel, st.st_mode, st.size, st.mtime, target)


async def walk(fs: FileSystem, root: str) -> dict[str, Entry]:
    """The tree at root (lstat: links are listed, never followed), {} when absent.

    Directories of one level are listed concurrently (one round trip per level over SFTP).
    A name that is not one path component (``..``, ``x/y``, NUL, empty), or one listed
    twice, is a TransferError: the listing came from a node and is not acted on.
    """
    st = await fs.lstat(root)
    if st is None:
        return {}
    top = _entry("", st)
    if top.kind == LINK:
        top = _entry("", st, await fs.readlink(root))
    tree = {"": top}
    level = [""] if top.kind == DIR else []
    while level:
        listings = await asyncio.gather(*(fs.listdir(cpl.join(root, d)) for d in level))
        nxt: list[str] = []
        links: list[str] = []
        for d, names in zip(level, listings, strict=True):
            for name, est in names:
                rel = f"{d}/{name}" if d else name
                why = cpl.bad_name(name) or ("listed twice" if rel in tree else None)
                if why:
                    raise TransferError(f"the listing holds {name!r}: {why}; refused",
                                        path=cpl.join(root, d))
                tree[rel] = e = _entry(rel, est)
                if e.kind == DIR:
                    nxt.append(rel)
                elif e.kind == LINK:
                    links.append(rel)
        targets = await asyncio.gather(*(fs.readlink(cpl.join(root, r)) for r in links))
        for rel, target in zip(links, targets, strict=True):
            tree[rel] = Entry(rel, LINK, 0, tree[rel].mtime, tree[rel].mode, target)
        level = nxt
    return tree


async def prepare_push(req: CopyRequest) -> list[Source]:
    """List the local sources; bad input (missing, a directory without -r) → UsageError."""
    try:
        cpl.remote_path(req.dest, "/home")
    except ValueError as exc:
        raise UsageError(f"DEST {exc}") from None
    local = LocalFileSystem()
    sources = []
    for path in req.sources:
        try:
            name = cpl.source_name(os.path.abspath(path))
            tree = await walk(local, path) if req.recursive else {}
            if not req.recursive:
                st = await local.lstat(path)
                if st is not None:
                    tree = {"": _entry("", st, await local.readlink(path)
                                       if os.path.islink(path) else "")}
        except (ValueError, TransferError) as exc:
            raise UsageError(f"source {exc}") from None
        if not tree:
            raise UsageError(f"source {path}: no such file or directory")
        if tree[""].kind == DIR and not req.recursive:
            raise UsageError(f"source {path} is a directory",
                             hint="use -r to copy directories")
        sources.append(Source(path, name, tree))
    return sources


def prepare_pull(req: CopyRequest) -> None:
    """Check LOCALDIR and the remote paths before connecting."""
    if os.path.exists(req.dest) and not os.path.isdir(req.dest):
        raise UsageError(f"LOCALDIR {req.dest} exists and is not a directory")
    for path in req.sources:
        try:
            cpl.source_name(cpl.remote_path(path, "/home"))
        except ValueError as exc:
            raise UsageError(f"REMOTE {exc}") from None


# ---------------------------------------------------------------- sums


class Sums:
    """sha256 of files on one side: in-process locally, by dtrain's node program remotely."""

    def __init__(self, conn: Connection | None, python: str) -> None:
        self._conn = conn
        self._python = python
        self._cache: dict[str, str | None] = {}

    async def of(self, paths: Sequence[str]) -> dict[str, str | None]:
        todo = [p for p in paths if p not in self._cache]
        if todo and self._conn is None:
            for p in todo:
                self._cache[p] = await asyncio.to_thread(_sha256, p)
        elif todo and self._conn is not None:
            got = await run_program(self._conn, "cpnode", {"mode": "hash", "paths": todo},
                                    python=self._python, timeout=120.0)
            self._cache.update(got.get("sha256", {}))
        return {p: self._cache.get(p) for p in paths}


def _sha256(path: str) -> str | None:
    try:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        return h.hexdigest()
    except OSError:
        return None


# ---------------------------------------------------------------- the sources' bytes

SMALL_MAX = 1 << 20  # files up to this size are read once per push and kept for every node
CACHE_MAX = 256 << 20  # ... up to this many bytes in all (the rest: read once per node)
BATCH = 1 << 20  # stream writes are coalesced up to about this size

def _read_files(items: Sequence[tuple[str, int]]) -> list[bytes | str]:
    """Each file's first ``size`` bytes, or why not (a string)."""
    out: list[bytes | str] = []
    for path, size in items:
        try:
            with open(path, "rb") as f:
                data = f.read(size)
        except OSError as exc:
            out.append(f"{path}: {(exc.strerror or str(exc)).lower()}")
            continue
        out.append(data if len(data) == size else
                   f"{path}: changed during the copy ({len(data)} of {size} bytes read)")
    return out


class SourceData:
    """The push's source bytes: small files are read once (in batches, in a thread) and
    kept for every node, up to CACHE_MAX; larger ones are read per node, in chunks."""

    def __init__(self, python: str) -> None:
        self._reads: dict[str, tuple[asyncio.Future[list[bytes | str]], int]] = {}
        self._used = 0
        self.sums = Sums(None, python)  # --checksum: each source file hashed once

    async def small(self, items: Sequence[tuple[str, int]]) -> list[bytes | str]:
        todo = [(p, n) for p, n in items if p not in self._reads]
        mine: dict[str, bytes | str] = {}
        if todo:
            # a task of its own: a node cancelled meanwhile does not cancel the others' read
            task: asyncio.Future[list[bytes | str]] = asyncio.ensure_future(
                asyncio.to_thread(_read_files, todo))
            for i, (p, n) in enumerate(todo):
                if self._used + n <= CACHE_MAX:
                    self._used += n
                    self._reads[p] = (task, i)
            got = await asyncio.shield(task)
            mine = {p: d for (p, _), d in zip(todo, got, strict=True)}
        out = []
        for p, _ in items:
            if p in mine:
                out.append(mine[p])
            else:
                fut, i = self._reads[p]
                out.append((await asyncio.shield(fut))[i])
        return out

    async def stream(self, files: Sequence[tuple[str, Entry]], view: CopyView,
                     bad: list[str]) -> AsyncIterator[bytes]:
        """The bytes of an apply op: each file's ``size`` bytes and a status byte (1: as
        listed; 0: unreadable or changed, zeros instead: the node drops it)."""
        buf = bytearray()
        i = 0
        while i < len(files):
            j, total = i, 0
            while j < len(files) and files[j][1].size <= SMALL_MAX and total < 4 * BATCH:
                total += files[j][1].size
                j += 1
            if j > i:
                got = await self.small([(p, e.size) for p, e in files[i:j]])
                for (_, e), d in zip(files[i:j], got, strict=True):
                    if isinstance(d, bytes):
                        buf += d
                        buf += b"\x01"
                    else:
                        bad.append(d)
                        buf += bytes(e.size) + b"\x00"
                    view.add_bytes(e.size)
                    if len(buf) >= BATCH:
                        yield bytes(buf)
                        buf.clear()
                i = j
                continue
            if buf:
                yield bytes(buf)
                buf.clear()
            path, e = files[i]
            i += 1
            async for chunk in _big_file(path, e.size, bad, view):
                yield chunk
        if buf:
            yield bytes(buf)


async def _big_file(path: str, size: int, bad: list[str],
                    view: CopyView) -> AsyncIterator[bytes]:
    """A large file in chunks, then its status byte; zeros after a read error."""
    sent = 0
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed in finally, across yields
    except OSError as exc:
        f = None
        bad.append(f"{path}: {(exc.strerror or str(exc)).lower()}")
    try:
        while f is not None and sent < size:
            try:
                chunk = await asyncio.to_thread(f.read, min(CHUNK, size - sent))
            except OSError as exc:
                bad.append(f"{path}: {(exc.strerror or str(exc)).lower()}")
                break
            if not chunk:
                bad.append(f"{path}: changed during the copy ({sent} of {size} bytes read)")
                break
            sent += len(chunk)
            view.add_bytes(len(chunk))
            yield chunk
    finally:
        if f is not None:
            f.close()
    if sent < size:
        while sent < size:
            n = min(CHUNK, size - sent)
            sent += n
            yield bytes(n)
        yield b"\x00"
    else:
        yield b"\x01"
