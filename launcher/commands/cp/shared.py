"""What every node's part of one copy shares, and the one hand-off to the broadcast.

``Copy`` is one `dtrain cp` over every node (the request, what was listed, what all nodes
share); ``Target`` is one node's part of it (its channel, its result, the temps in flight
there). Both engines (``stream``, ``sftp``) hand their large files to the broadcast through
``hand_off`` and send directly what it hands back.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from launcher.commands.cp.relay import Broadcaster, Want
from launcher.commands.cp.request import CopyRequest, Source, SourceData
from launcher.commands.cp.view import CopyView
from launcher.decide.copies import copyplan as cpl
from launcher.decide.copies.copyplan import Entry, SyncPlan
from launcher.models import CopyResult
from launcher.output import render
from launcher.transports.base import Connection


@dataclass
class Copy:
    """One `dtrain cp` over every node."""

    req: CopyRequest
    view: CopyView
    sources: Sequence[Source] = ()  # push: listed before connecting
    data: SourceData | None = None  # push: each source file read once for every node
    bcast: Broadcaster | None = None  # push: large files go by broadcast
    unchanged: dict[int, SyncPlan] = field(default_factory=dict)  # per source: the plan of
    # every node whose tree matched the source's rows (one plan_sync for all of them)

    def big(self, e: Entry) -> bool:
        """Whether this file goes to the broadcast rather than directly."""
        return self.bcast is not None and self.bcast.big(e)


@dataclass
class Target:
    """One node's part of a copy."""

    conn: Connection | None  # the node (None: the launcher's own side)
    result: CopyResult
    python: str  # the interpreter of dtrain's node programs there
    temps: set[str] = field(default_factory=set)  # in flight: removed if interrupted
    _named: dict[str, str] = field(default_factory=dict)

    def temp(self, final: str) -> str:
        """The temp name of ``final``: random per file (another user who sees one temp of
        this copy cannot tell the next one's name), the same until ``renew``."""
        tmp = self._named.get(final)
        if tmp is None:
            tmp = self._named[final] = cpl.temp_name(final, secrets.token_hex(8))
        return tmp

    def renew(self, final: str) -> None:
        """The next ``temp(final)`` is a new name (the old temp may still exist)."""
        self._named.pop(final, None)


async def hand_off(bcast: Broadcaster, index: int, node: Target, entries: Sequence[Entry],
                   src_root: str, dst_root: str) -> AsyncIterator[Entry]:
    """Hand one source's large files to the broadcast; yield each one it hands back, to be
    sent directly (its temp stays in ``node.temps`` until the caller's send is done).

    Every node hands over once per source, large files or none: the broadcast waits for
    all of them.
    """
    assert node.conn is not None
    wants = []
    for e in entries:
        final = cpl.join(dst_root, e.rel)
        w = Want(node.result.label, node.conn, node.python, cpl.join(src_root, e.rel), e,
                 node.temp(final), final)
        node.temps.add(w.tmp)  # removed by the engine's cleanup if the copy is interrupted
        wants.append(w)
    bcast.want(index, node.result.label, wants)
    for w in wants:
        outcome = await w.done
        if outcome is None:
            node.temps.discard(w.tmp)
            node.result.sent += 1
            node.result.sent_bytes += w.entry.size
            continue
        if outcome:
            render.note(f"{node.result.label}: {w.final}: broadcast failed: {outcome}; "
                        "sending it directly")
        node.renew(w.final)  # the relay's temp may be left: created O_EXCL, a new name
        yield w.entry
