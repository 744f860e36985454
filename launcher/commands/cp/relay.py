"""The broadcast of large files: each is read once and sent down a chain of node relays.

Every node's engine hands its large files over (``Broadcaster.want``, through
``shared.hand_off``) or leaves; once every node has answered for a source, the files that
enough nodes want go down a chain (``decide.copies.broadcast`` plans it; ``nodeside/cpnode.py``'s
``relay`` mode receives, forwards and writes), the rest are handed back for a direct send.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import secrets
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from launcher.aio import cleanup
from launcher.commands.cp.request import CHUNK, CLEANUP_S, CopyRequest
from launcher.commands.cp.view import CopyView
from launcher.decide.copies import broadcast as bc
from launcher.decide.copies import copyplan as cpl
from launcher.decide.copies.copyplan import Entry
from launcher.errors import DtrainError
from launcher.job.remote import read_json_line, start_program
from launcher.output import render
from launcher.transports.base import Connection, Process

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
            refused = got.get("refused")  # the node caps it; this side shows 5 at most
            for addr in (refused if isinstance(refused, list) else [])[:5]:
                render.note(f"{label}: cp relay refused a connection from {str(addr)[:64]} "
                            "(wrong token)")
            if isinstance(refused, list) and len(refused) > 5:
                render.note(f"{label}: cp relay refused {len(refused) - 5} more")
            return bc.Outcome(bool(got.get("ok")), str(got.get("error", "")),
                              str(got.get("forward_error", "")))

        results = await asyncio.gather(*(one(label) for label in chain))
        return dict(zip(chain, results, strict=True))

    async def aclose(self) -> None:
        """Cancel the chains still running and wait for them, bounded by CLEANUP_S."""
        for task in list(self._tasks):
            task.cancel()
        await cleanup(asyncio.gather(*self._tasks, return_exceptions=True), CLEANUP_S)


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


