"""How a run is stopped from outside: the stop signals and the control socket, held for as
long as a phase of the run lasts and given back on every way out of it.

Three phases share it:

* ``job/orchestrate.Job.run`` routes Ctrl-C, SIGTERM and SIGHUP (``Signals``) to its stop
  policy while the nodes run;
* ``commands/launch.supervise`` serves `dtrain stop` and `dtrain stacks` on the run
  directory's control socket (``ControlSocket``) meanwhile;
* between two attempts of ``--restarts`` (the back-off, the next prepare) both stop the run
  at once: ``Stoppable`` holds both and remembers who stopped it first.

A signal handler that the platform (or a thread other than the main one) refuses is left as
it was; a filesystem without unix sockets leaves the run without a control socket (the
caller says so where it matters). Nothing here decides anything: the callers' handlers do.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

from launcher.exitcodes import EXIT_INTERRUPTED, exit_for_signal
from launcher.job.control import ControlServer, StopRequest
from launcher.output.rundir import RunDir


def stop_signals(hangup: bool = True) -> tuple[int, ...]:
    """Ctrl-C and SIGTERM, and SIGHUP (the terminal closed) unless a detached launcher
    ignores it."""
    return (signal.SIGINT, signal.SIGTERM) + ((signal.SIGHUP,) if hangup else ())


def signal_name(signum: int) -> str:
    """``Ctrl-C`` for SIGINT, else the signal's name (``SIGTERM``)."""
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


class Signals:
    """The stop signals routed to ``handler(signum)`` on the running loop, from ``install``
    to ``remove`` (also a context manager)."""

    def __init__(self, handler: Callable[[int], None], *, hangup: bool = True) -> None:
        self.handler = handler
        self.signums = stop_signals(hangup)
        self.installed: list[int] = []

    def install(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in self.signums:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(signum, self.handler, signum)
                self.installed.append(signum)

    def remove(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in self.installed:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(signum)
        self.installed = []

    def __enter__(self) -> Signals:
        self.install()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.remove()


class ControlSocket:
    """`dtrain stop` (and `dtrain stacks`) served on ``run_dir/control.sock`` from ``open``
    to ``aclose`` (job/control.py: the protocol, the owner's uid only)."""

    def __init__(self, run_dir: RunDir, on_stop: Callable[[StopRequest], str], *,
                 on_stacks: Callable[[int], Awaitable[dict[str, Any]]] | None = None) -> None:
        self._server: ControlServer | None = ControlServer(run_dir, on_stop,
                                                           on_stacks=on_stacks)

    async def open(self) -> OSError | None:
        """Listen; the error when the socket cannot be served (the run goes on without)."""
        assert self._server is not None
        try:
            await self._server.start()
        except OSError as exc:
            self._server = None
            return exc
        return None

    async def aclose(self) -> None:
        """Stop listening, remove the socket (again: nothing)."""
        if self._server is not None:
            server, self._server = self._server, None
            await server.aclose()


class Stoppable:
    """Signals and the control socket for a phase that either ends at once (the restart
    loop's back-off and next prepare): ``stop`` is set by the first request; ``who`` and
    ``code`` say by whom and with which exit code (130 for `dtrain stop`, 128+N for signal N).
    """

    def __init__(self, run_dir: RunDir, *, hangup: bool = True) -> None:
        self.who: str | None = None
        self.code = EXIT_INTERRUPTED
        self.stop = asyncio.Event()
        self._control = ControlSocket(run_dir, self._requested)
        self._signals = Signals(self._signal, hangup=hangup)

    async def __aenter__(self) -> Stoppable:
        await self._control.open()  # none: Ctrl-C and SIGTERM still stop it
        self._signals.install()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()

    def _requested(self, req: StopRequest) -> str:
        self._stopped(f"`dtrain stop` (pid {req.pid})", EXIT_INTERRUPTED)
        return "stopping"

    def _signal(self, signum: int) -> None:
        self._stopped(signal_name(signum), exit_for_signal(signum))

    def _stopped(self, who: str, code: int) -> None:
        if self.who is None:
            self.who, self.code = who, code
        self.stop.set()

    async def wait(self, seconds: float) -> bool:
        """Wait ``seconds`` (a back-off); True when the run was stopped meanwhile."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self.stop.wait()
        return self.stop.is_set()

    async def aclose(self) -> None:
        """Give the signals back, close the socket (again: nothing), so that the next phase
        can take them."""
        self._signals.remove()
        await self._control.aclose()
