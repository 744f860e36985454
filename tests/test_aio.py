"""launcher/aio.py: a cleanup runs to its end (or its bound) and never swallows a cancel."""

from __future__ import annotations

import asyncio

import pytest

from launcher.aio import cleanup


def test_a_cancel_during_cleanup_waits_for_it_then_goes_on() -> None:
    """Ctrl-C twice (or a TaskGroup's abort) while a node removes its temps: the temps are
    still removed, and the task still ends cancelled."""
    async def main() -> tuple[list[str], bool]:
        log: list[str] = []
        cleaning, release = asyncio.Event(), asyncio.Event()

        async def remove_temps() -> None:
            cleaning.set()
            await release.wait()
            log.append("temps removed")

        async def node() -> None:
            try:
                await asyncio.sleep(3600)
            finally:
                await cleanup(remove_temps(), 60)

        task = asyncio.create_task(node())
        await asyncio.sleep(0)
        task.cancel()
        await cleaning.wait()
        task.cancel()  # the second cancellation arrives mid-cleanup
        await asyncio.sleep(0)
        release.set()
        try:
            await task
        except asyncio.CancelledError:
            return log, True
        return log, False

    log, cancelled = asyncio.run(main())
    assert log == ["temps removed"]
    assert cancelled


def test_a_cancel_that_arrives_during_cleanup_is_not_swallowed() -> None:
    async def main() -> list[str]:
        log: list[str] = []
        cleaning, release = asyncio.Event(), asyncio.Event()

        async def close() -> None:
            cleaning.set()
            await release.wait()

        async def body() -> None:
            await cleanup(close(), 60)
            log.append("went on as if not cancelled")

        task = asyncio.create_task(body())
        await cleaning.wait()
        task.cancel()
        await asyncio.sleep(0)
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        return log

    assert asyncio.run(main()) == []


def test_cleanup_is_bounded_and_its_errors_are_dropped() -> None:
    async def hangs() -> None:
        await asyncio.Event().wait()

    async def fails() -> None:
        raise OSError("channel closed")

    async def main() -> None:
        await cleanup(hangs(), 0.01)
        await cleanup(fails(), 60)

    asyncio.run(main())
