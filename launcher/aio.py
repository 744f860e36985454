"""asyncio habits every layer shares."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable


async def cleanup(aw: Awaitable[object], timeout: float) -> None:
    """Run a cleanup to its end, or for at most ``timeout`` seconds, even when the task that
    runs it is cancelled meanwhile (trio's shielded, bounded cancel scope).

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
