"""asyncio habits every layer shares: a cleanup runs to its end (or its bound) whatever
cancels its task meanwhile, and a helper task is never left running behind its owner."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

CLOSE_S = 5.0  # a connection's close: transports bound theirs (SSH: 2 s), this bounds ours


async def cleanup(aw: Awaitable[object], timeout: float) -> None:
    """Run a cleanup to its end, or for at most ``timeout`` seconds, even when the task that
    runs it is cancelled meanwhile (trio's shielded, bounded cancel scope; its
    ``aclose_forcefully`` the model).

    A cleanup has nobody to report to: its errors (and its timeout) are dropped. A
    cancellation is never swallowed: one that arrived while the cleanup ran is raised again
    once it is over, so a second Ctrl-C or a TaskGroup's abort still ends the task.
    """
    async def bounded() -> None:
        try:
            async with asyncio.timeout(timeout):
                await aw
        except Exception:  # noqa: BLE001, S110 - see above: nobody to report to
            pass

    task = asyncio.ensure_future(bounded())
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = True  # keep waiting: the cleanup is bounded by timeout
    if cancelled:
        raise asyncio.CancelledError


def cleanup_now(close: Callable[[], object]) -> None:
    """``cleanup``'s synchronous twin: run a cleanup step (``proc.write_eof``), dropping its
    errors (a channel already gone has nothing to close; nobody to report to)."""
    try:
        close()
    except Exception:  # noqa: BLE001, S110 - see above: nobody to report to
        pass


async def cancel_and_wait(*tasks: asyncio.Future[Any]) -> None:
    """Cancel helper tasks and wait until every one has ended, even when the task that waits
    is cancelled meanwhile (raised again once they have: trio's nursery never leaves a child
    behind). Their results and errors stay theirs to read (``task.exception()``); none is
    logged as never retrieved."""
    for task in tasks:
        task.cancel()
    cancelled = False
    pending = [t for t in tasks if not t.done()]
    while pending:
        try:
            await asyncio.wait(pending)
        except asyncio.CancelledError:
            cancelled = True  # keep waiting: each was cancelled and ends soon
        pending = [t for t in pending if not t.done()]
    for task in tasks:
        if not task.cancelled():
            task.exception()  # retrieved: the caller reads it, asyncio does not log it
    if cancelled:
        raise asyncio.CancelledError
