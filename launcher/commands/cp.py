"""`dtrain cp`: copy files to every node (pdcp) or from every node (rpdcp), in parallel.

Push: the local sources are listed once, before anything connects (a missing source is
bad input, exit 2). Then each node, at most ``fanout`` at once: one SFTP session on the
node's SSH connection (nothing installed on the node), DEST laid out per node
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
import os
import secrets
import signal
from collections.abc import Awaitable, Iterable, Sequence
from dataclasses import dataclass, field

from launcher.decide import copyplan as cpl
from launcher.decide.copyplan import DIR, LINK, Entry, SyncPlan
from launcher.errors import ConnectError, DtrainError, TransferError, UsageError
from launcher.job.remote import run_program
from launcher.models import CopyResult, Host
from launcher.output import render
from launcher.output.cpview import CopyView
from launcher.transports import AutoTransport
from launcher.transports.base import Connection, FileStat, FileSystem, Transport
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

    def _fail(self, exc: TransferError) -> None:
        self.result.errors.append(exc.message)

    async def run(self, plan: SyncPlan, src_root: str, dst_root: str,
                  dst_tree: dict[str, Entry]) -> None:
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

        async with asyncio.TaskGroup() as tg:
            for e in [*plan.send, *plan.links]:
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
                    token: str, result: CopyResult, view: CopyView) -> None:
    """Push every source to one node."""
    fs = await conn.files()
    local = Side(LocalFileSystem(), Sums(None, req.python))
    remote = Side(fs, Sums(conn, conn.host.python or req.python))
    syncer = Syncer(local, remote, token, req.preserve, result, view)
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
        for src, root in zip(sources, roots, strict=True):
            dst_tree = await walk(fs, root)
            plan = cpl.plan_sync(src.tree.values(), dst_tree, checksum=req.checksum,
                                 delete=req.delete, preserve=req.preserve)
            await syncer.run(plan, os.path.abspath(src.path), root, dst_tree)
    finally:
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

    async def one(host: Host, transport: Transport) -> None:
        result = results[host.label]
        async with sem:
            try:
                async with await transport.connect(host) as conn:
                    if req.pull:
                        await pull_node(conn, req, token, result, view)
                    else:
                        await push_node(conn, req, sources, token, result, view)
            except ConnectError as exc:
                result.unreachable = exc.message
            except DtrainError as exc:
                result.errors.append(exc.message)
        view.node_done(result)

    try:
        async with AutoTransport(settings) as transport, asyncio.TaskGroup() as tg:
            for h in hosts:
                tg.create_task(one(h, transport), name=h.label)
    finally:
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
