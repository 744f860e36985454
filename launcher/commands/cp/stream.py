"""The push as one stream: dtrain's node program in ``unpack`` mode on one channel per node.

``NodeFiles`` speaks its ops (a JSON line out, maybe data, a JSON line back; docs/cp.md "The
push stream"): the node's tree is listed (``walk``), ``plan_sync`` decides, and one ``apply``
op carries the plan out with the files' bytes as one stream. Large files go to the
broadcast first (directories are made before, so the relays can write into them).

The node program's answers are a node's word: a line over ``MAX_LINE``, a line that is not
a JSON object, a walk row that is not ``[rel, kind, size, mtime, mode, target]`` with a rel
of single components under a listed directory, counts that are not integers: each is that
node's error (``RemoteCommandError``), never an exception that stops the other nodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import posixpath
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from launcher.aio import cancel_and_wait, cleanup
from launcher.commands.cp.relay import RELAY_IDLE_S, RELAY_START_S
from launcher.commands.cp.request import CLEANUP_S, Source
from launcher.commands.cp.shared import Copy, Target, hand_off
from launcher.decide.copies import copyplan as cpl
from launcher.decide.copies.copyplan import Entry, SyncPlan
from launcher.errors import ConnectError, RemoteCommandError
from launcher.job.remote import MAX_LINE, read_json_line, start_program
from launcher.transports.base import Connection, Process

UNPACK_REPLY_S = 120.0  # an op's reply, once its data is sent (walk, hash, apply)
UNPACK_IDLE_S = 60.0  # node side: silence inside an op's data
UNPACK_WAIT_S = 3600.0  # node side: silence between ops (a broadcast may run meanwhile)
_KINDS = (cpl.FILE, cpl.DIR, cpl.LINK, cpl.OTHER)


def _bad(label: str, what: str) -> RemoteCommandError:
    return RemoteCommandError(f"cp node program: {what}: refused", host=label)


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _row(r: Any, label: str) -> Entry:
    """One ``[rel, kind, size, mtime, mode, target]`` row a node sent, checked."""
    if not (isinstance(r, list) and len(r) == 6 and isinstance(r[0], str)
            and r[1] in _KINDS and all(_int(v) for v in r[2:5]) and isinstance(r[5], str)):
        raise _bad(label, f"a walk row that is not [rel, kind, size, mtime, mode, target]: "
                          f"{str(r)[:200]!r}")
    why = cpl.bad_rel(r[0])
    if why:
        raise _bad(label, f"the walk lists {r[0]!r}: {why}")
    return Entry(r[0], r[1], r[2], r[3], r[4] & 0o7777, r[5])


def _check_tree(tree: Mapping[str, Entry], label: str) -> None:
    """Every entry but the root is below a directory of the tree."""
    for rel in tree:
        parent = posixpath.dirname(rel)
        if rel and (tree.get(parent) is None or tree[parent].kind != cpl.DIR):
            raise _bad(label, f"the walk lists {rel!r}: not below a directory of the listing")


def walk_tree(rows: Any, label: str) -> dict[str, Entry]:
    """A walk answer's rows as the destination tree, every row checked (see the module
    docstring)."""
    if not isinstance(rows, list):
        raise _bad(label, "a walk answer that is not a list")
    tree: dict[str, Entry] = {}
    for r in rows:
        e = _row(r, label)
        if e.rel in tree:
            raise _bad(label, f"the walk lists {e.rel!r}: listed twice")
        tree[e.rel] = e
    _check_tree(tree, label)
    return tree


def checked_diff(reply: Mapping[str, Any], label: str) -> dict[str, Any]:
    """A diff answer with every row and path checked: ``differ`` and ``extra`` rows,
    ``missing`` relative paths (see the module docstring)."""
    missing = reply.get("missing")
    rows = [reply.get("differ"), reply.get("extra")]
    if not isinstance(missing, list) or not all(isinstance(r, list) for r in rows):
        raise _bad(label, "a diff answer without its differ, missing and extra lists")
    for rel in missing:
        if not isinstance(rel, str) or cpl.bad_rel(rel):
            raise _bad(label, f"a diff answer that misses {str(rel)[:200]!r}")
    checked = [[_row(r, label) for r in part] for part in rows if isinstance(part, list)]
    as_rows = [[[e.rel, e.kind, e.size, e.mtime, e.mode, e.target] for e in part]
               for part in checked]
    return {"differ": as_rows[0], "missing": missing, "extra": as_rows[1]}


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
                    try:
                        got = json.loads(line)
                    except ValueError:
                        got = None
                    if not isinstance(got, dict):
                        raise _bad(self._label, "an answer that is not a JSON object")
                    return got
                continue
            if len(self._buf) > MAX_LINE:
                raise _bad(self._label, f"an answer line longer than {MAX_LINE >> 20} MiB")
            chunk = await self._proc.read_stdout(1 << 20)
            if not chunk:
                err = b""
                with contextlib.suppress(Exception):  # not a cleanup: a read, 1 s of it
                    async with asyncio.timeout(1):
                        while part := await self._proc.read_stderr(65536):
                            err += part
                text = err.decode(errors="replace").strip().splitlines()
                raise RemoteCommandError(
                    "cp node program ended: " + (text[-1] if text else "no output"),
                    host=self._label)
            self._buf += chunk

    async def call(self, op: Mapping[str, Any], data: AsyncIterator[bytes] | None = None, *,
                   encoded: Mapping[str, bytes] | None = None) -> dict[str, Any]:
        """One op; its reply. ``encoded``: more fields of the op, already JSON (the same
        large value for every node, encoded once). A lost channel → ConnectError; the
        node's error or silence → RemoteCommandError."""
        line = json.dumps(op).encode()
        for key, value in (encoded or {}).items():
            line = line[:-1] + b"," + json.dumps(key).encode() + b":" + value + b"}"
        async with self._lock:
            self._in_step = False
            try:
                await self._proc.write(line + b"\n")
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
        async def end() -> None:
            if drop and self._in_step and not self._lock.locked():
                await self.call({"op": "drop", "paths": list(drop)})
            self._proc.write_eof()
            await self._proc.wait()

        try:
            await cleanup(end(), CLEANUP_S)
        finally:
            self._proc.abort()


class StreamPush:
    """Every source pushed to one node through its ``unpack`` program."""

    def __init__(self, nf: NodeFiles, copy: Copy, node: Target) -> None:
        self.nf = nf
        self.copy = copy
        self.node = node

    async def run(self, home: str) -> None:
        req, result = self.copy.req, self.node.result
        try:
            dest = cpl.remote_path(req.dest, home)
            kind = (await self.nf.call({"op": "stat", "path": dest})).get("kind")
            if kind is not None and kind not in _KINDS:
                raise _bad(result.label, f"a stat answer with kind {str(kind)[:50]!r}")
            sources = self.copy.sources
            try:
                roots, make = cpl.layout([s.name for s in sources], [s.kind for s in sources],
                                         dest, kind, dest_slash=req.dest.endswith("/"))
            except cpl.LayoutError as exc:
                result.errors.append(str(exc))
                return
            if make:
                try:
                    await self.nf.call({"op": "mkdir", "path": dest})
                except RemoteCommandError as exc:
                    result.errors.append(f"{dest}: {exc.message}")
                    return
            for index, (src, root) in enumerate(zip(sources, roots, strict=True)):
                await self._source(index, src, root)
        finally:
            if self.copy.bcast is not None:
                self.copy.bcast.leave(result.label)
            await self.nf.close(sorted(self.node.temps))

    async def _plan(self, index: int, src: Source, root: str) -> tuple[SyncPlan,
                                                                        dict[str, Entry]]:
        """This node's plan for one source, and its tree as plan_sync saw it.

        The node compares its tree with the source's rows and answers only where it
        differs (decide/copies/copyplan.py "the node-side diff"): a re-push of an unchanged tree
        moves a few bytes back, not a row per file, and every node that matched shares
        one plan. ``--checksum`` lists the tree (its compare reads every mtime).
        """
        req, label = self.copy.req, self.node.result.label
        same = False  # the node's tree matched the source's rows everywhere
        if req.checksum:
            dst_tree = walk_tree((await self.nf.call({"op": "walk", "root": root})).get("tree"),
                                 label)
        else:
            reply = checked_diff(await self.nf.call(
                {"op": "diff", "root": root, "all_extras": req.delete},
                encoded={"rows": src.manifest(preserve=req.preserve)}), label)
            same = not (reply["differ"] or reply["missing"] or reply["extra"])
            if same and index in self.copy.unchanged:
                return self.copy.unchanged[index], {}
            dst_tree = cpl.tree_from_diff(src.tree.values(), reply)
            _check_tree(dst_tree, label)
        plan = cpl.plan_sync(src.tree.values(), dst_tree, checksum=req.checksum,
                             delete=req.delete, preserve=req.preserve)
        if same:
            self.copy.unchanged[index] = plan
        return plan, dst_tree

    async def _source(self, index: int, src: Source, root: str) -> None:
        req, result = self.copy.req, self.node.result
        plan, dst_tree = await self._plan(index, src, root)
        src_root = os.path.abspath(src.path)
        if plan.compare:
            assert self.copy.data is not None
            rels = [e.rel for e in plan.compare]
            mine = await self.copy.data.sums.of([cpl.join(src_root, r) for r in rels])
            theirs = (await self.nf.call({"op": "hash", "paths": [cpl.join(root, r)
                                                                  for r in rels]})).get("sha256")
            if not isinstance(theirs, dict) or not all(
                    isinstance(v, str | None) for v in theirs.values()):
                raise _bad(result.label, "a hash answer that is not {path: sha256}")
            cpl.resolve_compare(plan, dst_tree,
                                {r: mine[cpl.join(src_root, r)] or "" for r in rels},
                                {r: theirs.get(cpl.join(root, r)) for r in rels},
                                preserve=req.preserve)
        result.errors += [f"{cpl.join(src_root, rel)}: {msg}" for rel, msg in plan.errors]
        await self._apply_plan(index, plan, src_root, root)

    def _files(self, entries: Sequence[Entry], root: str) -> list[list[Any]]:
        preserve = self.copy.req.preserve
        return [[e.rel, e.size, cpl.new_mode(e, preserve),
                 e.mode & 0o7777 if preserve else None, e.mtime,
                 posixpath.basename(self.node.temp(cpl.join(root, e.rel)))] for e in entries]

    async def _apply(self, fields: Mapping[str, list[Any]], entries: Sequence[Entry],
                     src_root: str, root: str) -> None:
        """One ``apply`` op, the bytes of ``entries`` as its data; its counts to the result."""
        if not any(fields.values()):
            return
        assert self.copy.data is not None
        result = self.node.result
        bad: list[str] = []
        stream = (self.copy.data.stream([(cpl.join(src_root, e.rel), e) for e in entries],
                                        self.copy.view, bad)
                  if entries else None)
        reply = await self.nf.call({"op": "apply", "root": root, **fields}, stream)
        counts = [reply.get(k) for k in ("sent", "sent_bytes", "deleted", "stale")]
        errors = reply.get("errors")
        if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counts) \
                or not isinstance(errors, list) \
                or not all(isinstance(e, list) and len(e) == 2 for e in errors):
            raise _bad(result.label, "an apply answer without its counts and errors")
        result.sent += reply["sent"]
        result.sent_bytes += reply["sent_bytes"]
        result.deleted += reply["deleted"]
        result.stale += reply["stale"]
        result.errors += [f"{p}: {m}" if p else str(m) for p, m in errors]
        result.errors += bad

    async def _apply_plan(self, index: int, plan: SyncPlan, src_root: str,
                          root: str) -> None:
        preserve = self.copy.req.preserve
        prep: dict[str, list[Any]] = {
            "stale": plan.stale, "delete": [[d.rel, d.kind] for d in plan.delete],
            "unlink_first": plan.unlink_first, "mkdirs": [d.rel for d in plan.mkdirs]}
        big = [e for e in plan.send if self.copy.big(e)]
        direct = [e for e in plan.send if not self.copy.big(e)]
        rest: dict[str, list[Any]] = {
            "files": self._files(direct, root),
            "links": [[e.rel, e.target, posixpath.basename(self.node.temp(cpl.join(root, e.rel)))]
                      for e in plan.links],
            "fix_attrs": [[e.rel, e.mode if preserve else None, e.mtime]
                          for e in plan.fix_attrs]}
        last: dict[str, list[Any]] = {"dir_attrs": [[e.rel, e.mode, e.mtime]
                                                    for e in plan.dir_attrs]}
        self.node.result.skipped += len(plan.skip)
        bcast = self.copy.bcast
        if bcast is None:
            await self._apply({**prep, **rest, **last}, direct, src_root, root)
            return
        await self._apply(prep, [], src_root, root)  # directories first: relays write there

        async def broadcast() -> None:
            again = [e async for e in hand_off(bcast, index, self.node, big, src_root, root)]
            await self._apply({"files": self._files(again, root)}, again, src_root, root)
            for e in again:
                self.node.temps.discard(self.node.temp(cpl.join(root, e.rel)))

        # gather, not a TaskGroup: the first error (a DtrainError) is what the node reports,
        # not an ExceptionGroup
        tasks = [asyncio.ensure_future(broadcast()),
                 asyncio.ensure_future(self._apply(rest, direct, src_root, root))]
        try:
            await asyncio.gather(*tasks)
        finally:  # the other one, after the first error: cancelled and awaited, always
            await cancel_and_wait(*tasks)
        await self._apply(last, [], src_root, root)
