"""`dtrain cp`: copy files to every node (pdcp) or from every node (rpdcp), in parallel.

Push: the local sources are listed once, before anything connects (a missing source is
bad input, exit 2). Then each node, at most ``fanout`` at once: dtrain's node program in
``unpack`` mode on one channel (``NodeFiles``: shipped, nothing installed) lists the
node's tree, ``plan_sync`` decides, and one ``apply`` op carries the plan out with the
files' bytes as one stream (``push_node_stream``; docs/cp.md "The push stream"). Where
that program cannot start (no such python), the node falls back to the SFTP engine:
one SFTP session on the node's SSH connection, DEST laid out per node
(``decide.copyplan.layout``), the node's tree listed, ``plan_sync`` decides, and the
``Syncer`` carries it out: stale temps removed, extras deleted (``--delete``), directories
made, files written to a temp name and renamed over the final one, symlinks likewise.

Pull: the same machinery the other way round, each node's files under LOCALDIR/<host>/.

A temp name that is in flight is remembered until it is renamed; on any error or
cancellation (Ctrl-C) the node's remaining temps are removed before the node task ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import posixpath
import secrets
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from launcher.decide import broadcast as bc
from launcher.decide import copyplan as cpl
from launcher.decide.copyplan import DIR, LINK, Entry, SyncPlan
from launcher.errors import (
    ConnectError,
    DtrainError,
    RemoteCommandError,
    TransferError,
    UsageError,
)
from launcher.job.remote import read_json_line, run_program, start_program
from launcher.models import CopyResult, Host
from launcher.output import render
from launcher.output.cpview import CopyView
from launcher.transports import AutoTransport
from launcher.transports.base import Connection, FileStat, FileSystem, Process, Transport
from launcher.transports.local import LocalFileSystem
from launcher.transports.ssh import SSHSettings

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
    fanout: int = 64
    python: str = "python3"
    progress: bool | None = None  # None: live progress when stderr is a terminal
    broadcast: bool | None = None  # None: on for large files that >= 3 nodes receive
    broadcast_min: int = bc.DEFAULT_MIN
    stream: bool = True  # push through dtrain's node program (False: SFTP only)


@dataclass
class Source:
    """One local source of a push, listed before connecting."""

    path: str
    name: str
    tree: dict[str, Entry]

    @property
    def kind(self) -> str:
        return self.tree[""].kind


# ---------------------------------------------------------------- listing


def _entry(rel: str, st: FileStat, target: str = "") -> Entry:
    return Entry.from_stat(rel, st.st_mode, st.size, st.mtime, target)


async def walk(fs: FileSystem, root: str) -> dict[str, Entry]:
    """The tree at root (lstat: links are listed, never followed), {} when absent.

    Directories of one level are listed concurrently (one round trip per level over SFTP).
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


# ---------------------------------------------------------------- broadcast of large files

RELAY_START_S = 30.0  # starting a node's relay and reading its port
RELAY_IDLE_S = 60.0  # no progress on a link (node side) / on the first node's channel
RELAY_END_S = 120.0  # the last byte sent → every node's verdict
# tests only: called at "started" ({label: pid}) and after each chunk ({"chunks": n})
_hook: Callable[[str, Mapping[str, Any]], Awaitable[None]] | None = None


@dataclass
class Want:
    """One node's need for one large file, and where the verdict goes.

    ``done`` resolves to None when the file landed by broadcast, "" when it was not
    broadcast (send it directly, nothing to say), or the reason the node falls back.
    """

    label: str
    conn: Connection
    python: str
    src_path: str
    entry: Entry
    tmp: str
    final: str
    done: asyncio.Future[str | None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())


class Broadcaster:
    """Collects, per source, every node's large files, then sends each file once.

    Every node reports once per source (``want``, possibly nothing) or leaves (``leave``:
    failed or unreachable); when all have, the files wanted by enough nodes are sent down
    a chain (``_chain``), the others are handed back for a direct send.
    """

    def __init__(self, labels: Sequence[str], n_sources: int, req: CopyRequest,
                 view: CopyView) -> None:
        self._req = req
        self._view = view
        self._pending = [set(labels) for _ in range(n_sources)]
        self._order = {label: i for i, label in enumerate(labels)}
        self._wants: list[list[Want]] = [[] for _ in range(n_sources)]
        self._tasks: set[asyncio.Task[None]] = set()

    def big(self, e: Entry) -> bool:
        return self._req.broadcast is not False and e.size >= self._req.broadcast_min

    def want(self, index: int, label: str, wants: Sequence[Want]) -> None:
        self._wants[index].extend(wants)
        self._arrive(index, label)

    def leave(self, label: str) -> None:
        for index in range(len(self._pending)):
            self._arrive(index, label)

    def _arrive(self, index: int, label: str) -> None:
        pending = self._pending[index]
        if label not in pending:
            return
        pending.discard(label)
        if not pending:
            task = asyncio.create_task(self._run(self._wants[index]))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, wants: list[Want]) -> None:
        groups: dict[str, list[Want]] = {}
        for w in sorted(wants, key=lambda w: self._order[w.label]):  # host order
            groups.setdefault(w.src_path, []).append(w)
        try:
            for path, group in groups.items():
                e = group[0].entry
                if bc.use_broadcast(e.size, len(group), mode=self._req.broadcast,
                                    min_size=self._req.broadcast_min):
                    try:
                        await self._chain(path, group)
                    except Exception as exc:  # noqa: BLE001 - any surprise: send directly
                        _settle(group, _why(exc))
                _settle(group, "")
        finally:
            _settle(wants, "")

    async def _chain(self, path: str, group: list[Want]) -> None:
        by_label = {w.label: w for w in group}
        links, out = bc.plan_chain([(w.label, w.conn.peer_addr) for w in group])
        for label in out:
            _settle([by_label[label]], "")  # a localhost entry: sent directly
        if len(links) < bc.FORCED_MIN_NODES:
            return
        tokens = {ln.label: secrets.token_bytes(32) for ln in links}
        procs: dict[str, Process] = {}
        try:
            started = await asyncio.gather(
                *(self._start(by_label[ln.label], ln.addr, tokens[ln.label], procs)
                  for ln in links), return_exceptions=True)
            ports: dict[str, int] = {}
            pids: dict[str, int] = {}
            for ln, got in zip(links, started, strict=True):
                if isinstance(got, BaseException):
                    _settle([by_label[ln.label]], f"relay did not start: {_why(got)}")
                else:
                    ports[ln.label], pids[ln.label] = got
            links, _ = bc.plan_chain([(ln.label, ln.addr) for ln in links
                                      if ln.label in ports])
            if len(links) < bc.FORCED_MIN_NODES:
                return  # _run's _settle sends the rest directly
            if _hook:
                await _hook("started", pids)
            for ln in links:
                nxt = None
                if ln.downstream is not None:
                    d = next(x for x in links if x.label == ln.downstream)
                    nxt = {"addr": d.addr, "port": ports[d.label], "token": tokens[d.label].hex()}
                await _line(procs[ln.label], {"stdin": ln.upstream is None, "next": nxt})
            linked = await self._linked([ln.label for ln in links], procs)
            chain, cut = bc.cut_chain([ln.label for ln in links], linked)
            for label, why in cut.items():
                procs[label].abort()
                _settle([by_label[label]], why)
            if not chain:
                return
            digest = await self._stream(path, group[0].entry.size, procs[chain[0]])
            outcomes = await self._verdicts(chain, procs, digest)
            reasons = bc.fallbacks(chain, outcomes)
            for label in chain:
                _settle([by_label[label]], reasons.get(label))
        finally:
            for p in procs.values():
                p.abort()

    async def _start(self, w: Want, addr: str, token: bytes,
                     procs: dict[str, Process]) -> tuple[int, int]:
        spec = {"mode": "relay", "tmp": w.tmp, "final": w.final, "size": w.entry.size,
                "mode_bits": cpl.new_mode(w.entry, self._req.preserve),
                "chmod": w.entry.mode & 0o7777 if self._req.preserve else None,
                "mtime": w.entry.mtime,
                "bind": addr, "token": token.hex(), "timeout": RELAY_IDLE_S}
        async with asyncio.timeout(RELAY_START_S):
            proc = procs[w.label] = await start_program(w.conn, "cpnode", spec,
                                                        python=w.python)
            got = await read_json_line(proc, w.label, "cp relay")
        return int(got["port"]), int(got.get("pid", 0))

    async def _linked(self, chain: Sequence[str], procs: Mapping[str, Process]
                      ) -> dict[str, str | None]:
        """Each relay's report on connecting to its successor ("" ok, the error, None)."""
        async def one(label: str) -> str | None:
            try:
                async with asyncio.timeout(RELAY_START_S):
                    got = await read_json_line(procs[label], label, "cp relay")
            except (DtrainError, TimeoutError):
                return None
            return "" if got.get("linked") else str(got.get("error") or "not linked")

        results = await asyncio.gather(*(one(label) for label in chain))
        return dict(zip(chain, results, strict=True))

    async def _stream(self, path: str, size: int, head: Process) -> str | None:
        """Send the file once, to the chain's first node; its sha256 (None: link lost)."""
        h = hashlib.sha256()
        sent = chunks = 0
        with open(path, "rb") as f:
            while sent < size:
                chunk = await asyncio.to_thread(_read_hash, f, min(CHUNK, size - sent), h)
                if not chunk:
                    return None  # the source shrank: every node fails its size check
                try:
                    async with asyncio.timeout(RELAY_IDLE_S):
                        await head.write(chunk)
                except (ConnectionError, TimeoutError):
                    return None
                sent += len(chunk)
                chunks += 1
                self._view.add_bytes(len(chunk))
                if _hook:
                    await _hook("chunk", {"chunks": chunks})
        return h.hexdigest()

    async def _verdicts(self, chain: Sequence[str], procs: Mapping[str, Process],
                        digest: str | None) -> dict[str, bc.Outcome | None]:
        async def one(label: str) -> bc.Outcome | None:
            proc = procs[label]
            with contextlib.suppress(ConnectionError):
                await _line(proc, {"sha256": digest or ""})
            proc.write_eof()
            try:
                async with asyncio.timeout(RELAY_END_S):
                    got = await read_json_line(proc, label, "cp relay")
            except (DtrainError, TimeoutError):
                return None
            for addr in got.get("refused", []):
                render.note(f"{label}: cp relay refused a connection from {addr} "
                            "(wrong token)")
            return bc.Outcome(bool(got.get("ok")), str(got.get("error", "")),
                              str(got.get("forward_error", "")))

        results = await asyncio.gather(*(one(label) for label in chain))
        return dict(zip(chain, results, strict=True))

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.gather(*self._tasks, return_exceptions=True)


def _settle(wants: Iterable[Want], outcome: str | None) -> None:
    for w in wants:
        if not w.done.done():
            w.done.set_result(outcome)


def _why(exc: BaseException) -> str:
    if isinstance(exc, DtrainError):
        return exc.message
    if isinstance(exc, TimeoutError):
        return f"no answer within {RELAY_START_S:g} s"
    return str(exc) or type(exc).__name__


async def _line(proc: Process, obj: Mapping[str, Any]) -> None:
    await proc.write(json.dumps(obj).encode() + b"\n")


def _read_hash(f: Any, n: int, h: Any) -> bytes:
    chunk: bytes = f.read(n)
    h.update(chunk)
    return chunk


# ---------------------------------------------------------------- the tree as one stream

SMALL_MAX = 1 << 20  # files up to this size are read once per push and kept for every node
CACHE_MAX = 256 << 20  # ... up to this many bytes in all (the rest: read once per node)
BATCH = 1 << 20  # stream writes are coalesced up to about this size
UNPACK_REPLY_S = 120.0  # an op's reply, once its data is sent (walk, hash, apply)
UNPACK_IDLE_S = 60.0  # node side: silence inside an op's data
UNPACK_WAIT_S = 3600.0  # node side: silence between ops (a broadcast may run meanwhile)


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


class NodeFiles:
    """dtrain's node program in ``unpack`` mode on one node: one channel, one op at a time
    (a JSON line out, maybe data, a JSON line back)."""

    def __init__(self, proc: Process, label: str) -> None:
        self._proc = proc
        self._label = label
        self._lock = asyncio.Lock()
        self._buf = b""
        self._in_step = True  # False once an op was cut short: the node is mid-op

    @staticmethod
    async def start(conn: Connection, python: str) -> tuple[NodeFiles, str]:
        """Start it; (it, the node's home)."""
        spec = {"mode": "unpack", "idle": UNPACK_IDLE_S, "timeout": UNPACK_WAIT_S}
        async with asyncio.timeout(RELAY_START_S):
            proc = await start_program(conn, "cpnode", spec, python=python)
            try:
                hello = await read_json_line(proc, conn.host.label, "cp node program")
            except BaseException:
                proc.abort()
                raise
        if not isinstance(hello.get("home"), str):
            proc.abort()
            raise RemoteCommandError("cp node program: unexpected answer", host=conn.host.label)
        return NodeFiles(proc, conn.host.label), hello["home"]

    async def _line(self) -> dict[str, Any]:
        while True:
            line, nl, rest = self._buf.partition(b"\n")
            if nl:
                self._buf = rest
                if line.lstrip().startswith(b"{"):
                    got: dict[str, Any] = json.loads(line)
                    return got
                continue
            chunk = await self._proc.read_stdout(1 << 20)
            if not chunk:
                err = b""
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(1):
                        while part := await self._proc.read_stderr(65536):
                            err += part
                text = err.decode(errors="replace").strip().splitlines()
                raise RemoteCommandError(
                    "cp node program ended: " + (text[-1] if text else "no output"),
                    host=self._label)
            self._buf += chunk

    async def call(self, op: Mapping[str, Any],
                   data: AsyncIterator[bytes] | None = None) -> dict[str, Any]:
        """One op; its reply. A lost channel → ConnectError; the node's error or silence →
        RemoteCommandError."""
        async with self._lock:
            self._in_step = False
            try:
                await self._proc.write(json.dumps(op).encode() + b"\n")
                if data is not None:
                    async for chunk in data:
                        async with asyncio.timeout(RELAY_IDLE_S):
                            await self._proc.write(chunk)
                async with asyncio.timeout(UNPACK_REPLY_S):
                    reply = await self._line()
                self._in_step = True
            except (ConnectionError, OSError) as exc:
                raise ConnectError(f"connection lost during the copy ({exc})",
                                   host=self._label) from exc
            except TimeoutError:
                raise RemoteCommandError(f"cp node program: no progress on {op.get('op')} "
                                         f"within {UNPACK_REPLY_S:g} s",
                                         host=self._label) from None
        for key in ("fatal", "error"):
            if reply.get(key):
                raise RemoteCommandError(f"cp node program: {reply[key]}", host=self._label)
        return reply

    async def close(self, drop: Sequence[str] = ()) -> None:
        """Remove the given temps (broadcast temps after an interruption; only when no op
        was cut short, else the node would read the op as file data: the relays remove
        their own), end the program (it removes its own temps on EOF) and wait for it,
        bounded by CLEANUP_S."""
        with contextlib.suppress(Exception, asyncio.CancelledError):
            async with asyncio.timeout(CLEANUP_S):
                if drop and self._in_step and not self._lock.locked():
                    await self.call({"op": "drop", "paths": list(drop)})
                self._proc.write_eof()
                await self._proc.wait()
        self._proc.abort()


async def push_node_stream(nf: NodeFiles, home: str, conn: Connection, req: CopyRequest,
                           sources: Sequence[Source], token: str, result: CopyResult,
                           view: CopyView, data: SourceData,
                           bcast: Broadcaster | None = None) -> None:
    """Push every source to one node through its ``unpack`` program."""
    temps: set[str] = set()  # broadcast temps in flight
    try:
        dest = cpl.remote_path(req.dest, home)
        kind = (await nf.call({"op": "stat", "path": dest})).get("kind")
        try:
            roots, make = cpl.layout([s.name for s in sources], [s.kind for s in sources],
                                     dest, kind, dest_slash=req.dest.endswith("/"))
        except cpl.LayoutError as exc:
            result.errors.append(str(exc))
            return
        if make:
            try:
                await nf.call({"op": "mkdir", "path": dest})
            except RemoteCommandError as exc:
                result.errors.append(f"{dest}: {exc.message}")
                return
        for index, (src, root) in enumerate(zip(sources, roots, strict=True)):
            rows = (await nf.call({"op": "walk", "root": root}))["tree"]
            dst_tree = {r[0]: Entry(r[0], r[1], r[2], r[3], r[4], r[5]) for r in rows}
            plan = cpl.plan_sync(src.tree.values(), dst_tree, checksum=req.checksum,
                                 delete=req.delete, preserve=req.preserve)
            src_root = os.path.abspath(src.path)
            if plan.compare:
                rels = [e.rel for e in plan.compare]
                mine = await data.sums.of([cpl.join(src_root, r) for r in rels])
                theirs = (await nf.call({"op": "hash", "paths": [cpl.join(root, r)
                                                                 for r in rels]}))["sha256"]
                cpl.resolve_compare(plan, dst_tree,
                                    {r: mine[cpl.join(src_root, r)] or "" for r in rels},
                                    {r: theirs.get(cpl.join(root, r)) for r in rels},
                                    preserve=req.preserve)
            result.errors += [f"{cpl.join(src_root, rel)}: {msg}" for rel, msg in plan.errors]
            await _apply_stream(nf, plan, src_root, root, token, req, result, view, data,
                                bcast, index, conn, temps)
    finally:
        if bcast is not None:
            bcast.leave(result.label)
        await nf.close(sorted(temps))


async def _apply_stream(nf: NodeFiles, plan: SyncPlan, src_root: str, root: str, token: str,
                        req: CopyRequest, result: CopyResult, view: CopyView,
                        data: SourceData, bcast: Broadcaster | None, index: int,
                        conn: Connection, temps: set[str]) -> None:
    preserve = req.preserve

    def tmp(rel: str) -> str:
        return posixpath.basename(cpl.temp_name(cpl.join(root, rel), token))

    def files(entries: Sequence[Entry]) -> list[list[Any]]:
        return [[e.rel, e.size, cpl.new_mode(e, preserve),
                 e.mode & 0o7777 if preserve else None, e.mtime, tmp(e.rel)] for e in entries]

    async def apply(fields: Mapping[str, list[Any]], entries: Sequence[Entry]) -> None:
        if not any(fields.values()):
            return
        bad: list[str] = []
        stream = (data.stream([(cpl.join(src_root, e.rel), e) for e in entries], view, bad)
                  if entries else None)
        reply = await nf.call({"op": "apply", "root": root, **fields}, stream)
        result.sent += int(reply["sent"])
        result.sent_bytes += int(reply["sent_bytes"])
        result.deleted += int(reply["deleted"])
        result.stale += int(reply["stale"])
        result.errors += [f"{p}: {m}" if p else str(m) for p, m in reply["errors"]]
        result.errors += bad

    prep: dict[str, list[Any]] = {
        "stale": plan.stale, "delete": [[d.rel, d.kind] for d in plan.delete],
        "unlink_first": plan.unlink_first, "mkdirs": [d.rel for d in plan.mkdirs]}
    big = [e for e in plan.send if bcast is not None and bcast.big(e)]
    direct = [e for e in plan.send if not (bcast is not None and bcast.big(e))]
    rest: dict[str, list[Any]] = {
        "files": files(direct), "links": [[e.rel, e.target, tmp(e.rel)] for e in plan.links],
        "fix_attrs": [[e.rel, e.mode if preserve else None, e.mtime] for e in plan.fix_attrs]}
    last: dict[str, list[Any]] = {"dir_attrs": [[e.rel, e.mode, e.mtime]
                                                for e in plan.dir_attrs]}
    result.skipped += len(plan.skip)
    if bcast is None:
        await apply({**prep, **rest, **last}, direct)
        return
    await apply(prep, [])  # directories first: the relays write into them

    async def broadcast() -> None:
        assert bcast is not None
        wants = []
        for e in big:
            final = cpl.join(root, e.rel)
            w = Want(result.label, conn, nf_python(conn, req), cpl.join(src_root, e.rel), e,
                     cpl.temp_name(final, token), final)
            temps.add(w.tmp)
            wants.append(w)
        bcast.want(index, result.label, wants)
        again = []
        for w in wants:
            outcome = await w.done
            if outcome is None:
                temps.discard(w.tmp)
                result.sent += 1
                result.sent_bytes += w.entry.size
                continue
            if outcome:
                render.note(f"{result.label}: {w.final}: broadcast failed: {outcome}; "
                            "sending it directly")
            again.append(w.entry)
        await apply({"files": files(again)}, again)
        for w in wants:
            temps.discard(w.tmp)

    # gather, not a TaskGroup: the first error (a DtrainError) is what the node reports,
    # not an ExceptionGroup
    tasks = [asyncio.ensure_future(broadcast()), asyncio.ensure_future(apply(rest, direct))]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    await apply(last, [])


def nf_python(conn: Connection, req: CopyRequest) -> str:
    """The interpreter of dtrain's node programs on this node."""
    return conn.host.python or req.python


# ---------------------------------------------------------------- carrying out a plan


@dataclass
class Side:
    """One end of a copy: its files, and how to hash them."""

    fs: FileSystem
    sums: Sums


@dataclass
class Syncer:
    """Makes the tree at dst_root match the tree at src_root, as a SyncPlan says."""

    src: Side
    dst: Side
    token: str
    preserve: bool
    result: CopyResult
    view: CopyView
    temps: set[str] = field(default_factory=set)
    bcast: Broadcaster | None = None  # push only: large files go by broadcast
    conn: Connection | None = None  # the destination node (for its relay)
    python: str = "python3"

    def _fail(self, exc: TransferError) -> None:
        self.result.errors.append(exc.message)

    async def run(self, plan: SyncPlan, src_root: str, dst_root: str,
                  dst_tree: dict[str, Entry], index: int = 0) -> None:
        if plan.compare:
            await self._compare(plan, src_root, dst_root, dst_tree)
        self.result.errors += [f"{cpl.join(src_root, rel)}: {msg}" for rel, msg in plan.errors]
        for rel in plan.stale:
            if await self._try(self.dst.fs.remove(cpl.join(dst_root, rel))):
                self.result.stale += 1
        for d in plan.delete:
            path = cpl.join(dst_root, d.rel)
            if not cpl.inside(path, dst_root):  # by construction; never trust it blindly
                raise AssertionError(f"refusing to delete {path} outside {dst_root}")
            rm = self.dst.fs.rmdir(path) if d.kind == DIR else self.dst.fs.remove(path)
            if await self._try(rm):
                self.result.deleted += 1
        for rel in plan.unlink_first:
            await self._try(self.dst.fs.remove(cpl.join(dst_root, rel)))
        for d in plan.mkdirs:
            await self._try(self.dst.fs.mkdir(cpl.join(dst_root, d.rel), parents=not d.rel))
        sem = asyncio.Semaphore(FILES_IN_FLIGHT)

        async def bounded(e: Entry) -> None:
            async with sem:
                await (self._link(e, dst_root) if e.kind == LINK
                       else self._send(e, src_root, dst_root))

        big = [e for e in plan.send if self.bcast is not None and self.bcast.big(e)]
        direct = [e for e in plan.send if not (self.bcast is not None and self.bcast.big(e))]
        async with asyncio.TaskGroup() as tg:
            if self.bcast is not None:  # every node reports, big files or none
                tg.create_task(self._broadcast(index, big, src_root, dst_root))
            for e in [*direct, *plan.links]:
                tg.create_task(bounded(e))
        self.result.skipped += len(plan.skip)
        for e in plan.fix_attrs:
            await self._try(self.dst.fs.set_attrs(
                cpl.join(dst_root, e.rel), mode=e.mode if self.preserve else None,
                mtime=e.mtime))
        for e in plan.dir_attrs:
            await self._try(self.dst.fs.set_attrs(cpl.join(dst_root, e.rel), mode=e.mode,
                                                  mtime=e.mtime))

    async def _try(self, op: Awaitable[None]) -> bool:
        try:
            await op
        except TransferError as exc:
            self._fail(exc)
            return False
        return True

    async def _compare(self, plan: SyncPlan, src_root: str, dst_root: str,
                       dst_tree: dict[str, Entry]) -> None:
        rels = [e.rel for e in plan.compare]
        src = await self.src.sums.of([cpl.join(src_root, r) for r in rels])
        dst = await self.dst.sums.of([cpl.join(dst_root, r) for r in rels])
        cpl.resolve_compare(plan, dst_tree,
                            {r: src[cpl.join(src_root, r)] or "" for r in rels},
                            {r: dst[cpl.join(dst_root, r)] for r in rels},
                            preserve=self.preserve)

    async def _send(self, e: Entry, src_root: str, dst_root: str) -> None:
        final = cpl.join(dst_root, e.rel)
        tmp = cpl.temp_name(final, self.token)
        self.temps.add(tmp)
        try:
            sent = 0
            async with self.src.fs.open_read(cpl.join(src_root, e.rel)) as r, \
                    self.dst.fs.open_write(tmp, cpl.new_mode(e, self.preserve)) as w:
                # the size listed is what is copied: asking SFTP for more than is left
                # costs parallel read requests past the end (and a round trip for EOF)
                while sent < e.size and (chunk := await r.read(min(CHUNK, e.size - sent))):
                    await w.write(chunk)
                    sent += len(chunk)
                    self.view.add_bytes(len(chunk))
            await self.dst.fs.set_attrs(tmp, mode=e.mode if self.preserve else None,
                                        mtime=e.mtime)
            await self.dst.fs.rename(tmp, final)
            self.temps.discard(tmp)
            self.result.sent += 1
            self.result.sent_bytes += sent
        except TransferError as exc:
            self._fail(exc)
            await self.drop_temp(tmp)

    async def _broadcast(self, index: int, entries: Sequence[Entry], src_root: str,
                         dst_root: str) -> None:
        """Hand the large files to the broadcaster; send directly what it hands back."""
        assert self.bcast is not None and self.conn is not None
        wants = []
        for e in entries:
            final = cpl.join(dst_root, e.rel)
            tmp = cpl.temp_name(final, self.token)
            self.temps.add(tmp)  # removed by cleanup() if the run is interrupted
            wants.append(Want(self.result.label, self.conn, self.python,
                              cpl.join(src_root, e.rel), e, tmp, final))
        self.bcast.want(index, self.result.label, wants)
        for w in wants:
            outcome = await w.done
            if outcome is None:
                self.temps.discard(w.tmp)
                self.result.sent += 1
                self.result.sent_bytes += w.entry.size
                continue
            if outcome:
                render.note(f"{self.result.label}: {w.final}: broadcast failed: {outcome}; "
                            "sending it directly")
            await self._send(w.entry, src_root, dst_root)

    async def _link(self, e: Entry, dst_root: str) -> None:
        final = cpl.join(dst_root, e.rel)
        tmp = cpl.temp_name(final, self.token)
        self.temps.add(tmp)
        try:
            await self.dst.fs.symlink(e.target, tmp)
            await self.dst.fs.rename(tmp, final)
            self.temps.discard(tmp)
            self.result.sent += 1
        except TransferError as exc:
            self._fail(exc)
            await self.drop_temp(tmp)

    async def drop_temp(self, tmp: str) -> None:
        """Remove a temp (it may not exist yet); never raises."""
        self.temps.discard(tmp)
        with contextlib.suppress(DtrainError):
            if await self.dst.fs.lstat(tmp) is not None:
                await self.dst.fs.remove(tmp)

    async def cleanup(self) -> None:
        """Remove every temp still in flight (after an error or a cancellation), bounded."""
        with contextlib.suppress(Exception, asyncio.CancelledError):
            async with asyncio.timeout(CLEANUP_S):
                for tmp in list(self.temps):
                    await self.drop_temp(tmp)


def _kind(st: FileStat | None) -> str | None:
    return None if st is None else Entry.from_stat("", st.st_mode, 0, 0).kind


# ---------------------------------------------------------------- one node


async def push_node(conn: Connection, req: CopyRequest, sources: Sequence[Source],
                    token: str, result: CopyResult, view: CopyView,
                    bcast: Broadcaster | None = None, data: SourceData | None = None) -> None:
    """Push every source to one node: as one stream through dtrain's node program, or over
    SFTP when that program cannot start there (no such python: a note says so)."""
    if req.stream:
        try:
            nf, home = await NodeFiles.start(conn, nf_python(conn, req))
        except (RemoteCommandError, TimeoutError) as exc:
            why = exc.message if isinstance(exc, DtrainError) else "no answer in time"
            render.note(f"{result.label}: {why}; copying over SFTP instead")
        else:
            await push_node_stream(nf, home, conn, req, sources, token, result, view,
                                   data or SourceData(req.python), bcast)
            return
    fs = await conn.files()
    local = Side(LocalFileSystem(), Sums(None, req.python))
    remote = Side(fs, Sums(conn, conn.host.python or req.python))
    syncer = Syncer(local, remote, token, req.preserve, result, view, bcast=bcast,
                    conn=conn, python=conn.host.python or req.python)
    try:
        dest = cpl.remote_path(req.dest, await fs.home())
        try:
            roots, make = cpl.layout([s.name for s in sources], [s.kind for s in sources],
                                     dest, _kind(await fs.stat(dest)),
                                     dest_slash=req.dest.endswith("/"))
        except cpl.LayoutError as exc:
            result.errors.append(str(exc))
            return
        if make and not await syncer._try(fs.mkdir(dest, parents=True)):
            return
        for index, (src, root) in enumerate(zip(sources, roots, strict=True)):
            dst_tree = await walk(fs, root)
            plan = cpl.plan_sync(src.tree.values(), dst_tree, checksum=req.checksum,
                                 delete=req.delete, preserve=req.preserve)
            await syncer.run(plan, os.path.abspath(src.path), root, dst_tree, index)
    finally:
        if bcast is not None:
            bcast.leave(result.label)  # the sources it never reached: nothing to wait for
        await syncer.cleanup()
        with contextlib.suppress(Exception):
            await fs.aclose()


async def pull_node(conn: Connection, req: CopyRequest, token: str, result: CopyResult,
                    view: CopyView) -> None:
    """Pull every REMOTE of one node into LOCALDIR/<host>/."""
    fs = await conn.files()
    remote = Side(fs, Sums(conn, conn.host.python or req.python))
    local = Side(LocalFileSystem(), Sums(None, req.python))
    syncer = Syncer(remote, local, token, req.preserve, result, view)
    seen: set[str] = set()
    try:
        home = await fs.home()
        for pattern in req.sources:
            path = cpl.remote_path(pattern, home)
            matches = await fs.glob(path) if cpl.has_glob(path) else [path]
            if not matches:
                result.errors.append(f"{pattern}: no match")
            for m in matches:
                await _pull_one(syncer, fs, req, m, seen)
    finally:
        await syncer.cleanup()
        with contextlib.suppress(Exception):
            await fs.aclose()


async def _pull_one(syncer: Syncer, fs: FileSystem, req: CopyRequest, path: str,
                    seen: set[str]) -> None:
    result = syncer.result
    src_tree = await walk(fs, path)
    if not src_tree:
        result.errors.append(f"{path}: no such file or directory")
        return
    if src_tree[""].kind == DIR and not req.recursive:
        result.errors.append(f"{path}: is a directory (use -r)")
        return
    root = cpl.pull_root(os.path.abspath(req.dest), result.label, path)
    if root in seen:
        result.errors.append(f"{path}: another match already landed at {root}")
        return
    seen.add(root)
    local = syncer.dst.fs
    if not await syncer._try(local.mkdir(os.path.dirname(root), parents=True)):
        return
    dst_tree = await walk(local, root)
    plan = cpl.plan_sync(src_tree.values(), dst_tree, checksum=req.checksum,
                         delete=req.delete, preserve=req.preserve)
    await syncer.run(plan, path, root, dst_tree)


# ---------------------------------------------------------------- all nodes


async def cp_async(hosts: Sequence[Host], req: CopyRequest, settings: SSHSettings) -> int:
    """Copy to (or from) every host; the exit code as exec's."""
    sources = [] if req.pull else await prepare_push(req)
    if req.pull:
        prepare_pull(req)
    token = secrets.token_hex(4)
    view = CopyView(len(hosts), live=req.progress, verb="received" if req.pull else "sent")
    results = {h.label: CopyResult(h.label) for h in hosts}
    sem = asyncio.Semaphore(req.fanout)
    data = SourceData(req.python)  # each source file read once per push, not once per node
    bcast = None
    if not req.pull and req.broadcast is not False:
        if len(hosts) <= req.fanout:  # a chain needs every node connected at once
            bcast = Broadcaster([h.label for h in hosts], len(sources), req, view)
        elif req.broadcast:
            render.note(f"--broadcast needs --fanout >= the number of nodes ({len(hosts)}); "
                        "sending directly")

    async def one(host: Host, transport: Transport) -> None:
        result = results[host.label]
        async with sem:
            try:
                async with await transport.connect(host) as conn:
                    if req.pull:
                        await pull_node(conn, req, token, result, view)
                    else:
                        await push_node(conn, req, sources, token, result, view, bcast,
                                        data)
            except ConnectError as exc:
                result.unreachable = exc.message
            except DtrainError as exc:
                result.errors.append(exc.message)
            finally:
                if bcast is not None:
                    bcast.leave(host.label)
        view.node_done(result)

    try:
        async with AutoTransport(settings) as transport, asyncio.TaskGroup() as tg:
            for h in hosts:
                tg.create_task(one(h, transport), name=h.label)
    finally:
        if bcast is not None:
            await bcast.aclose()
        view.close()
    _report(results.values())
    return cpl.exit_code(results.values())


def _report(results: Iterable[CopyResult]) -> None:
    failed = [r for r in results if r.exit_code]
    if failed:
        render.note(f"{render.count(len(failed), 'node')} failed: "
                    + ", ".join(r.label for r in failed))


def run_cp(hosts: Sequence[Host], req: CopyRequest, settings: SSHSettings) -> int:
    """Synchronous entry for the CLI."""
    try:
        return asyncio.run(cp_async(hosts, req, settings))
    except KeyboardInterrupt:
        return 128 + signal.SIGINT
