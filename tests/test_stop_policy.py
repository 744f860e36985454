"""The launcher's stop policy, without nodes (issue 24 items 1 and 3; the cluster half is
tests/test_graceful_stop.py): which interrupts escalate, and how a rank asked to stop is
reported."""

from __future__ import annotations

import signal
from collections.abc import Coroutine
from typing import Any

from launcher.decide.outcome.outcomes import RankEnd
from launcher.job.orchestrate import Job, Policy
from tests.test_failures import _node, _outcome


class _Router:
    def __init__(self) -> None:
        self.said: list[str] = []

    def chunk(self, *a: object) -> None:
        pass

    def flush(self, host: str) -> None:
        pass

    def say(self, host: str, text: str) -> None:
        self.said.append(text)


class _Task:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class _TaskGroup:
    """Records what the policy starts (stop_all / kill / the victim's hold) without running
    it."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.tasks: list[_Task] = []

    def create_task(self, coro: Coroutine[Any, Any, Any], name: str = "") -> _Task:
        self.started.append(name)
        coro.close()
        self.tasks.append(_Task())
        return self.tasks[-1]


def _job() -> tuple[Job, _Router, _TaskGroup]:
    router = _Router()
    return Job([], {}, Policy(grace=10.0), router), router, _TaskGroup()


def test_repeated_hangup_and_term_are_one_graceful_stop() -> None:
    """A closing terminal: SIGHUP, SIGHUP, SIGTERM. One stop, no KILL, said once."""
    job, router, tg = _job()
    for sig in (signal.SIGHUP, signal.SIGHUP, signal.SIGTERM, signal.SIGHUP):
        job._interrupt(sig, tg)  # type: ignore[arg-type]
    assert tg.started == ["stop-all"]
    assert not job.outcome.killed and job.outcome.interrupted == signal.SIGHUP
    assert router.said[0].startswith("SIGHUP (the terminal closed): stopping every node")
    assert sum("already stopping" in s for s in router.said) == 1, router.said


def test_only_a_second_ctrl_c_kills() -> None:
    job, router, tg = _job()
    job._interrupt(signal.SIGTERM, tg)  # type: ignore[arg-type]
    job._interrupt(signal.SIGTERM, tg)  # type: ignore[arg-type]
    assert tg.started == ["stop-all"] and not job.outcome.killed
    job._interrupt(signal.SIGINT, tg)  # type: ignore[arg-type]
    assert tg.started == ["stop-all", "kill-all"] and job.outcome.killed
    assert "Ctrl-C again: killing every node now" in router.said
    job._interrupt(signal.SIGINT, tg)  # type: ignore[arg-type]
    assert tg.started == ["stop-all", "kill-all"]  # killing already


def test_first_ctrl_c_is_graceful() -> None:
    job, router, tg = _job()
    job._interrupt(signal.SIGINT, tg)  # type: ignore[arg-type]
    assert tg.started == ["stop-all"] and not job.outcome.killed
    assert router.said == ["Ctrl-C: stopping every node (Ctrl-C again to kill now)"]


def test_a_rank_asked_to_stop_is_not_a_failure() -> None:
    """Its shim forwarded a stop (dtrain's or torchrun's): whatever it exits with, it is
    a follower, never a root-cause candidate."""
    from launcher.job.events import RankExit
    from launcher.models import Host

    job, _, tg = _job()
    job._event(Host("a"), RankExit(1.0, RankEnd(1, code=143, stop_signal=15, t=1.0)), tg)  # type: ignore[arg-type]
    assert job.outcome.failures == [] and tg.started == []
    job._event(Host("a"), RankExit(1.0, RankEnd(0, code=7, t=1.0)), tg)  # type: ignore[arg-type]
    assert [(f.host, f.rank) for f in job.outcome.failures] == [("a", 0)]


def test_a_rank_that_exits_143_after_the_stop_is_stopped_by_dtrain() -> None:
    ranks = {"0": {"code": 143, "signal": None, "stop_signal": 15, "t": 5.0, "duration": 4.0},
             "1": {"code": 0, "signal": None, "stop_signal": 15, "t": 5.0, "duration": 4.0},
             "2": {"code": 139, "signal": 11, "stop_signal": 15, "t": 5.0, "duration": 4.0}}
    out = _outcome(nodes={"a": _node("a", 137, ranks, stopped="stop requested")},
                   interrupted=2, interrupted_t=1.0, stopped_by="`dtrain stop` (pid 9)",
                   stop_reason="stop requested", stop_t=1.0)
    from launcher.decide.outcome.verdict import TailKeeper, node_results, summary_lines, verdict

    v = verdict(out, _plan3(), TailKeeper())
    lines = summary_lines(out, _plan3(), v)
    assert v.code == 130
    assert "r0 exit 143 after 4.0s (stopped by dtrain)" in lines[1], lines
    assert "r2 SIGSEGV (139) after 4.0s (failed too)" in lines[1], lines  # a crash is not ours
    roles = {r: e["role"] for r, e in node_results(out, _plan3(), v)[0]["ranks"].items()}
    assert roles == {"0": "stopped", "1": "ok", "2": "failed"}


def _plan3():  # type: ignore[no-untyped-def]
    from tests.test_failures import _plan

    return _plan("a", ranks=3)


def test_the_summary_of_many_nodes_is_folded_and_the_odd_node_comes_first() -> None:
    """Issue 24.8: at 16+ nodes, one line for the nodes that ended alike (a range of
    durations), the node that differs on its own line before it."""
    from tests.test_failures import _node, _outcome, _plan

    names = [f"gpu{k:02d}" for k in range(1, 21)]
    nodes = {}
    for i, name in enumerate(names):
        ranks = {str(2 * i + j): {"code": 0, "signal": None, "t": 5.0,
                                  "duration": 8.0 + i / 100} for j in range(2)}
        nodes[name] = _node(name, 0, ranks)
    nodes["gpu05"] = _node("gpu05", 0, {"8": {"code": 0, "signal": None, "t": 5.0,
                                              "duration": 3.0}})  # rank 9 never reported
    from launcher.decide.outcome.verdict import TailKeeper, summary_lines, verdict

    plan = _plan(*names, ranks=2)
    out = _outcome(nodes=nodes)
    v = verdict(out, plan, TailKeeper())
    lines = summary_lines(out, plan, v)
    assert lines[0] == "ok: succeeded (exit 0)", lines
    assert lines[1].startswith("  gpu05 (node 4): r8 exit 0 after 3.0s, r9 no exit report")
    assert lines[2] == ("  gpu[01-04,06-20] (19 nodes): 38 ranks exit 0 after 8.0-8.2s; "
                        "torchrun exit 0 after 10.0s"), lines
    assert len(lines) == 3 + len(v.lines), lines


def _held_job(hold: float = 2.0) -> tuple[Job, _Router, _TaskGroup]:
    """A job with two running nodes whose victims are the aborted ranks, or those whose tail
    says a peer went away (as commands/launch.py wires ErrorKeeper.victim)."""
    from launcher.decide.outcome.failures import looks_like_victim

    router = _Router()
    tails = {("b", 2): ["[rank2]: RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection "
                        "closed by peer [198.18.0.11]:43210"]}
    job = Job([], {}, Policy(grace=10.0, peer_hold=hold), router,
              victim=lambda f: looks_like_victim(f.signal, tails.get((f.host, f.rank), ())))
    job.sessions = {"a": object(), "b": object()}  # type: ignore[dict-item]
    return job, router, _TaskGroup()


def _exit(job: Job, tg: _TaskGroup, host: str, rank: int, code: int,
          sig: int | None = None) -> None:
    from launcher.job.events import RankExit
    from launcher.models import Host

    job._event(Host(host), RankExit(1.0, RankEnd(rank, code=code, signal=sig, t=1.0)), tg)  # type: ignore[arg-type]


def test_a_victims_abort_holds_the_stop_and_the_raiser_behind_it_is_the_root_cause() -> None:
    """The race of docs/failure-semantics.md: rank 0 aborts on "Connection closed by peer" a
    few milliseconds before rank 1's own exception exit arrives. Rank 1 is the root cause."""
    job, _, tg = _held_job()
    _exit(job, tg, "a", 0, 134, signal.SIGABRT)
    assert tg.started == ["hold"]  # not stopping yet
    _exit(job, tg, "b", 2, 1)  # says a peer went away: a victim too, still held
    assert tg.started == ["hold"]
    _exit(job, tg, "b", 1, 1)  # failed of its own
    assert tg.started == ["hold", "stop-all"] and tg.tasks[0].cancelled
    assert [(f.host, f.rank, f.code) for f in job.outcome.failures] == [
        ("b", 1, 1), ("a", 0, 134), ("b", 2, 1)]
    assert job.outcome.root is not None and job.outcome.root.rank == 1
    assert job.outcome.first_failure == "b"
    _exit(job, tg, "a", 3, 1)  # after the stop: a follower
    assert len(job.outcome.failures) == 3 and tg.started == ["hold", "stop-all"]


def test_a_failure_of_its_own_stops_at_once() -> None:
    job, _, tg = _held_job()
    _exit(job, tg, "a", 1, 1)
    assert tg.started == ["stop-all"]
    job, _, tg = _held_job(hold=0)  # no hold asked: even a victim stops at once
    _exit(job, tg, "a", 0, 134, signal.SIGABRT)
    assert tg.started == ["stop-all"]


def test_a_lost_node_ends_the_hold_at_once() -> None:
    from launcher.decide.outcome.outcomes import Failure

    job, _, tg = _held_job()
    _exit(job, tg, "a", 0, 134, signal.SIGABRT)
    job._failed(Failure("lost", "b", code=255), tg)  # type: ignore[arg-type]
    assert tg.started == ["hold", "stop-all"] and tg.tasks[0].cancelled
    assert job.outcome.root is not None and job.outcome.root.rank == 0


def _recorded_stops(job: Job) -> list[str]:
    """The job's stop_all replaced by one that records its reason (no node to stop)."""
    stops: list[str] = []

    async def stop_all(reason: str, **kw: object) -> None:
        stops.append(reason)

    job.stop_all = stop_all  # type: ignore[method-assign]
    return stops


def test_the_hold_ends_in_a_stop_with_the_victim_as_root_cause() -> None:
    import asyncio

    async def main() -> list[str]:
        job, _, _ = _held_job(hold=0.05)
        stops = _recorded_stops(job)
        async with asyncio.TaskGroup() as tg:
            _exit(job, tg, "a", 0, 134, signal.SIGABRT)  # type: ignore[arg-type]
            await asyncio.sleep(0.01)
            assert stops == []
        assert job.outcome.root is not None and job.outcome.root.rank == 0
        return stops

    assert asyncio.run(main()) == ["a rank 0 exited 134"]


def test_a_rank_that_said_it_raised_holds_a_victims_stop_until_its_exit() -> None:
    """The CI race of docs/failure-semantics.md on a loaded machine: rank 1 raised (its shim
    said so before its connections closed), rank 0 aborted on the closed connection, and
    rank 1's interpreter took longer than ``peer_hold`` to end. Its exit, when it comes, is
    the root cause; without the raised note the victim would have been."""
    import asyncio

    from launcher.job.events import RankRaised
    from launcher.models import Host

    async def main(raised: bool) -> tuple[list[str], int | None]:
        job, _, _ = _held_job(hold=0.05)
        stops = _recorded_stops(job)
        async with asyncio.TaskGroup() as tg:
            if raised:
                job._event(Host("b"), RankRaised(1.0, rank=1, exc="RuntimeError"), tg)  # type: ignore[arg-type]
            _exit(job, tg, "a", 0, 134, signal.SIGABRT)  # type: ignore[arg-type]
            await asyncio.sleep(0.3)  # six holds long: the raiser is still on its way out
            _exit(job, tg, "b", 1, 1)  # type: ignore[arg-type]
        assert job.outcome.root is not None
        return stops, job.outcome.root.rank

    assert asyncio.run(main(True)) == (["b rank 1 exited 1"], 1)
    assert asyncio.run(main(False)) == (["a rank 0 exited 134"], 0)


def test_a_raised_note_bounds_its_hold_and_a_rank_that_ended_is_not_waited_for() -> None:
    import asyncio

    from launcher.job.events import RankRaised
    from launcher.job.orchestrate import Policy
    from launcher.models import Host

    async def main(exited_first: bool) -> float:
        job, _, _ = _held_job(hold=0.05)
        job.policy = Policy(grace=10.0, peer_hold=0.05, raise_hold=0.3)
        stops: list[float] = []
        loop = asyncio.get_running_loop()

        async def stop_all(reason: str, **kw: object) -> None:
            stops.append(loop.time())

        job.stop_all = stop_all  # type: ignore[method-assign]
        t0 = loop.time()
        async with asyncio.TaskGroup() as tg:
            if exited_first:  # its exit (a victim's, say) came before a late note: no wait
                _exit(job, tg, "b", 2, 1)  # type: ignore[arg-type]
            job._event(Host("b"), RankRaised(1.0, rank=2, exc="RuntimeError"), tg)  # type: ignore[arg-type]
            _exit(job, tg, "a", 0, 134, signal.SIGABRT)  # type: ignore[arg-type]
        return stops[0] - t0

    assert 0.3 <= asyncio.run(main(False)) < 2.0  # the raiser never ended: bounded
    assert asyncio.run(main(True)) < 0.25


def test_a_raiser_whose_interpreter_then_aborts_is_still_the_root_cause() -> None:
    """Rank 1 raised (its note came), then gloo aborted its interpreter's end: SIGABRT, 134.
    Its abort is not a victim's; a peer whose own words say the peer went away still is.
    (The final CI of 2026-12-04: attempt 1 named a SIGABRT victim, 134.)"""
    from launcher.job.events import RankRaised
    from launcher.models import Host

    job, _, tg = _held_job()
    job._event(Host("a"), RankRaised(1.0, rank=1, exc="RuntimeError"), tg)  # type: ignore[arg-type]
    job._event(Host("b"), RankRaised(1.0, rank=2, exc="RuntimeError"), tg)  # type: ignore[arg-type]
    _exit(job, tg, "b", 2, 1)  # raised too, but its tail says a peer went away: a victim
    assert tg.started == ["hold"]
    _exit(job, tg, "a", 1, 134, signal.SIGABRT)  # the raiser, aborted at its end
    assert tg.started == ["hold", "stop-all"] and tg.tasks[0].cancelled
    assert job.outcome.root is not None and (job.outcome.root.host, job.outcome.root.rank) \
        == ("a", 1)
