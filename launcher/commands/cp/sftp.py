"""The SFTP engine: pull, and the push where dtrain's node program cannot start.

One SFTP session on the node's SSH connection (``Connection.files()``): DEST laid out per
node (``decide.copies.copyplan.layout``), the tree at the destination listed (``walk``),
``plan_sync`` decides, and the ``Syncer`` carries it out: stale temps removed, extras
deleted (``--delete``), directories made, files written to a temp name and renamed over the
final one, symlinks likewise. Pull is the same machinery the other way round, each node's
files under LOCALDIR/<host>/, written only through ``ConfinedFileSystem`` (nothing outside
that directory, no symlink followed below it, setuid/setgid bits dropped unless
``--keep-setuid``). What the node lists and what its glob returns is checked first
(``request.walk``, ``copyplan.bad_match``): a hostile name is that node's error.

A temp name that is in flight is remembered until it is renamed; on any error or
cancellation (Ctrl-C) the node's remaining temps are removed before the node task ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass

from launcher.aio import cleanup
from launcher.commands.cp.request import CHUNK, CLEANUP_S, FILES_IN_FLIGHT, Sums, walk
from launcher.commands.cp.shared import Copy, Target, hand_off
from launcher.decide.copies import copyplan as cpl
from launcher.decide.copies.copyplan import DIR, LINK, Entry, SyncPlan
from launcher.errors import DtrainError, TransferError
from launcher.models import CopyResult
from launcher.transports.base import Connection, FileStat, FileSystem
from launcher.transports.confined import ConfinedFileSystem
from launcher.transports.local import LocalFileSystem


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
    copy: Copy
    node: Target  # the destination node on a push (its relay), the source on a pull

    @property
    def result(self) -> CopyResult:
        return self.node.result

    def _fail(self, exc: TransferError) -> None:
        self.result.errors.append(exc.message)

    async def run(self, plan: SyncPlan, src_root: str, dst_root: str,
                  dst_tree: dict[str, Entry], index: int = 0) -> None:
        if plan.compare:
            await self._compare(plan, src_root, dst_root, dst_tree)
        self.result.errors += [f"{cpl.join(src_root, rel)}: {msg}" for rel, msg in plan.errors]
        for rel in plan.stale:
            if await self.attempt(self.dst.fs.remove(cpl.join(dst_root, rel))):
                self.result.stale += 1
        for d in plan.delete:
            path = cpl.join(dst_root, d.rel)
            if not cpl.inside(path, dst_root):  # walk refuses such names; never trust it blindly
                self._fail(TransferError(f"outside {dst_root}: not deleted", path=path))
                continue
            rm = self.dst.fs.rmdir(path) if d.kind == DIR else self.dst.fs.remove(path)
            if await self.attempt(rm):
                self.result.deleted += 1
        for rel in plan.unlink_first:
            await self.attempt(self.dst.fs.remove(cpl.join(dst_root, rel)))
        for d in plan.mkdirs:
            await self.attempt(self.dst.fs.mkdir(cpl.join(dst_root, d.rel), parents=not d.rel))
        sem = asyncio.Semaphore(FILES_IN_FLIGHT)

        async def bounded(e: Entry) -> None:
            async with sem:
                await (self._link(e, dst_root) if e.kind == LINK
                       else self._send(e, src_root, dst_root))

        big = [e for e in plan.send if self.copy.big(e)]
        direct = [e for e in plan.send if not self.copy.big(e)]
        async with asyncio.TaskGroup() as tg:
            if self.copy.bcast is not None:  # every node reports, big files or none
                tg.create_task(self._broadcast(index, big, src_root, dst_root))
            for e in [*direct, *plan.links]:
                tg.create_task(bounded(e))
        self.result.skipped += len(plan.skip)
        preserve = self.copy.req.preserve
        for e in plan.fix_attrs:
            await self.attempt(self.dst.fs.set_attrs(
                cpl.join(dst_root, e.rel), mode=e.mode if preserve else None,
                mtime=e.mtime))
        for e in plan.dir_attrs:
            await self.attempt(self.dst.fs.set_attrs(cpl.join(dst_root, e.rel), mode=e.mode,
                                                     mtime=e.mtime))

    async def attempt(self, op: Awaitable[None]) -> bool:
        """Run one file operation; its TransferError becomes the node's error (False)."""
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
                            preserve=self.copy.req.preserve)

    async def _send(self, e: Entry, src_root: str, dst_root: str) -> None:
        preserve = self.copy.req.preserve
        final = cpl.join(dst_root, e.rel)
        tmp = self.node.temp(final)
        self.node.temps.add(tmp)
        try:
            sent = 0
            async with self.src.fs.open_read(cpl.join(src_root, e.rel)) as r, \
                    self.dst.fs.open_write(tmp, cpl.new_mode(e, preserve)) as w:
                # the size listed is what is copied: asking SFTP for more than is left
                # costs parallel read requests past the end (and a round trip for EOF)
                while sent < e.size and (chunk := await r.read(min(CHUNK, e.size - sent))):
                    await w.write(chunk)
                    sent += len(chunk)
                    self.copy.view.add_bytes(len(chunk))
            await self.dst.fs.set_attrs(tmp, mode=e.mode if preserve else None,
                                        mtime=e.mtime)
            await self.dst.fs.rename(tmp, final)
            self.node.temps.discard(tmp)
            self.result.sent += 1
            self.result.sent_bytes += sent
        except TransferError as exc:
            self._fail(exc)
            await self.drop_temp(tmp)

    async def _broadcast(self, index: int, entries: Sequence[Entry], src_root: str,
                         dst_root: str) -> None:
        """Hand the large files to the broadcaster; send directly what it hands back."""
        assert self.copy.bcast is not None
        async for e in hand_off(self.copy.bcast, index, self.node, entries, src_root,
                                dst_root):
            await self._send(e, src_root, dst_root)

    async def _link(self, e: Entry, dst_root: str) -> None:
        final = cpl.join(dst_root, e.rel)
        tmp = self.node.temp(final)
        self.node.temps.add(tmp)
        try:
            await self.dst.fs.symlink(e.target, tmp)
            await self.dst.fs.rename(tmp, final)
            self.node.temps.discard(tmp)
            self.result.sent += 1
        except TransferError as exc:
            self._fail(exc)
            await self.drop_temp(tmp)

    async def drop_temp(self, tmp: str) -> None:
        """Remove a temp (it may not exist yet); never raises."""
        self.node.temps.discard(tmp)
        with contextlib.suppress(DtrainError):
            if await self.dst.fs.lstat(tmp) is not None:
                await self.dst.fs.remove(tmp)

    async def cleanup(self) -> None:
        """Remove every temp still in flight (after an error or a cancellation), bounded."""
        async def drop_all() -> None:
            for tmp in list(self.node.temps):
                await self.drop_temp(tmp)

        await cleanup(drop_all(), CLEANUP_S)


def _kind(st: FileStat | None) -> str | None:
    return None if st is None else Entry.from_stat("", st.st_mode, 0, 0).kind


async def push_sftp(conn: Connection, copy: Copy, result: CopyResult) -> None:
    """Push every source to one node over SFTP."""
    req, sources = copy.req, copy.sources
    fs = await conn.files()
    python = req.python_on(conn.host)
    local = Side(LocalFileSystem(), Sums(None, req.python))
    remote = Side(fs, Sums(conn, python))
    syncer = Syncer(local, remote, copy, Target(conn, result, python))
    try:
        dest = cpl.remote_path(req.dest, await fs.home())
        try:
            roots, make = cpl.layout([s.name for s in sources], [s.kind for s in sources],
                                     dest, _kind(await fs.stat(dest)),
                                     dest_slash=req.dest.endswith("/"))
        except cpl.LayoutError as exc:
            result.errors.append(str(exc))
            return
        if make and not await syncer.attempt(fs.mkdir(dest, parents=True)):
            return
        for index, (src, root) in enumerate(zip(sources, roots, strict=True)):
            dst_tree = await walk(fs, root)
            plan = cpl.plan_sync(src.tree.values(), dst_tree, checksum=req.checksum,
                                 delete=req.delete, preserve=req.preserve)
            await syncer.run(plan, os.path.abspath(src.path), root, dst_tree, index)
    finally:
        if copy.bcast is not None:
            copy.bcast.leave(result.label)  # the sources it never reached: nothing to wait for
        await syncer.cleanup()
        await cleanup(fs.aclose(), CLEANUP_S)


async def pull_node(conn: Connection, copy: Copy, result: CopyResult) -> None:
    """Pull every REMOTE of one node into LOCALDIR/<host>/."""
    req = copy.req
    fs = await conn.files()
    python = req.python_on(conn.host)
    remote = Side(fs, Sums(conn, python))
    mine = ConfinedFileSystem(os.path.join(os.path.abspath(req.dest), cpl.pull_dir(result.label)),
                              host=result.label, keep_setid=req.keep_setuid)
    local = Side(mine, Sums(None, req.python))
    syncer = Syncer(remote, local, copy, Target(conn, result, python))
    seen: set[str] = set()
    try:
        home = await fs.home()
        for pattern in req.sources:
            path = cpl.remote_path(pattern, home)
            matches = await fs.glob(path) if cpl.has_glob(path) else [path]
            if not matches:
                result.errors.append(f"{pattern}: no match")
            bad = [(m, why) for m in matches if (why := cpl.bad_match(path, m))]
            if bad:  # the node answered the pattern with a path that is not a match
                result.errors += [f"{pattern}: the node's glob returned {m!r}: {why}; "
                                  "refused" for m, why in bad]
                continue
            for m in matches:
                await _pull_one(syncer, fs, m, seen)
    finally:
        await syncer.cleanup()
        await cleanup(fs.aclose(), CLEANUP_S)


async def _pull_one(syncer: Syncer, fs: FileSystem, path: str, seen: set[str]) -> None:
    req, result = syncer.copy.req, syncer.result
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
    if not await syncer.attempt(local.mkdir(os.path.dirname(root), parents=True)):
        return
    dst_tree = await walk(local, root)
    plan = cpl.plan_sync(src_tree.values(), dst_tree, checksum=req.checksum,
                         delete=req.delete, preserve=req.preserve)
    await syncer.run(plan, path, root, dst_tree)
