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


def test_a_helper_task_is_cancelled_and_awaited_when_its_owner_fails() -> None:
    """The hang watch, the stop bound, cp's broadcast: a helper started beside the body is
    cancelled and has ended (its own cleanup done) before the body's error goes up, and a
    cancel of the owner meanwhile is raised again once it has."""
    from launcher.aio import cancel_and_wait

    async def main(cancel: bool) -> tuple[list[str], BaseException]:
        log: list[str] = []
        release = asyncio.Event()

        async def helper() -> None:
            try:
                await asyncio.sleep(3600)
            finally:
                await release.wait()  # a slow cleanup of its own
                log.append("helper ended")

        async def owner() -> None:
            watching = asyncio.get_running_loop().create_task(helper())
            try:
                await asyncio.sleep(0.01)
                raise RuntimeError("the job failed")
            finally:
                await cancel_and_wait(watching)
                log.append("owner went on")

        task = asyncio.create_task(owner())
        await asyncio.sleep(0.05)
        if cancel:
            task.cancel()  # the owner is cancelled while it waits for the helper
            await asyncio.sleep(0.01)
        assert not task.done()  # still waiting for the helper
        release.set()
        try:
            await task
        except BaseException as exc:  # noqa: BLE001 - what the owner raised is the answer
            return log, exc
        raise AssertionError("the owner's error was lost")

    log, exc = asyncio.run(main(cancel=False))
    assert log == ["helper ended", "owner went on"] and isinstance(exc, RuntimeError)
    log, exc = asyncio.run(main(cancel=True))
    assert log == ["helper ended"] and isinstance(exc, asyncio.CancelledError)


def test_a_helper_task_s_own_error_stays_for_its_owner_to_read() -> None:
    from launcher.aio import cancel_and_wait

    async def main() -> BaseException | None:
        async def broken() -> None:
            raise ValueError("the watch's bug")

        task = asyncio.get_running_loop().create_task(broken())
        await asyncio.sleep(0)
        await cancel_and_wait(task)
        return task.exception()

    assert isinstance(asyncio.run(main()), ValueError)


def test_a_synchronous_cleanup_drops_its_error() -> None:
    from launcher.aio import cleanup_now

    def gone() -> None:
        raise BrokenPipeError("the channel is gone")

    cleanup_now(gone)  # nothing raised: nobody to report to
