"""launcher/job/stoppable.py: the stop signals and the control socket that `Job.run`,
`supervise` and the restart loop's back-off share, without the cluster (real signals to
this process, a real control socket in a temporary run directory)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from launcher.job.control import CONTROL, request_stop
from launcher.job.stoppable import ControlSocket, Signals, Stoppable, stop_signals
from launcher.output.rundir import RunDir


def test_sighup_is_a_stop_signal_unless_a_detached_launcher_ignores_it() -> None:
    assert stop_signals() == (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    assert stop_signals(hangup=False) == (signal.SIGINT, signal.SIGTERM)


async def test_signals_reach_the_handler_while_installed_and_are_given_back() -> None:
    before = signal.getsignal(signal.SIGTERM)
    got: list[int] = []
    with Signals(got.append, hangup=False) as signals:
        assert signals.installed == [signal.SIGINT, signal.SIGTERM]
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.sleep(0.05)
    assert got == [signal.SIGTERM]
    assert signals.installed == []
    assert signal.getsignal(signal.SIGTERM) == before  # the next phase can take it


async def test_between_attempts_a_signal_stops_at_once_with_its_code(tmp_path: Path) -> None:
    async with Stoppable(RunDir.open(tmp_path), hangup=False) as between:
        assert (tmp_path / CONTROL).exists()
        os.kill(os.getpid(), signal.SIGTERM)
        assert await between.wait(10) is True
        os.kill(os.getpid(), signal.SIGINT)  # a second one does not change who stopped it
        await asyncio.sleep(0.05)
    assert (between.who, between.code) == ("SIGTERM", 143)
    assert not (tmp_path / CONTROL).exists()


async def test_between_attempts_dtrain_stop_stops_at_once(tmp_path: Path) -> None:
    async with Stoppable(RunDir.open(tmp_path)) as between:
        reply = await asyncio.to_thread(request_stop, tmp_path, grace=None, kill=False)
        assert reply == {"ok": True, "state": "stopping"}
        assert await between.wait(10) is True
    assert (between.who, between.code) == (f"`dtrain stop` (pid {os.getpid()})", 130)


async def test_a_back_off_that_nobody_stops_runs_out(tmp_path: Path) -> None:
    between = Stoppable(RunDir.open(tmp_path))
    async with between:
        assert await between.wait(0.05) is False
    assert between.who is None
    await between.aclose()  # again: nothing


async def test_a_control_socket_that_cannot_be_served_says_why(tmp_path: Path) -> None:
    run_dir = RunDir.open(tmp_path)
    (tmp_path / CONTROL).mkdir()  # in the socket's way
    control = ControlSocket(run_dir, lambda req: "stopping")
    refused = await control.open()
    assert isinstance(refused, OSError)
    await control.aclose()
