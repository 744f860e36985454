"""decide/outcome/verdict.py: what issue 51's mutation round (docs/testing.md, "Mutation score")
found no unit test for: what the verdict says for each kind of failure (its exit code,
its words, the host and rank it blames, its kind), the summary a user reads, meta.json's
``root_cause`` and ``nodes`` key by key, and the failure reason of the root-cause rank.

Pure: the job's outcome is built by hand, as job/ would fill it in."""

from __future__ import annotations

import signal
from types import SimpleNamespace
from typing import Any

import pytest

from launcher.decide.outcome.outcomes import Failure, JobOutcome, NodeOutcome, RankEnd
from launcher.decide.outcome.verdict import (
    TailKeeper,
    failure_lines,
    failure_reason,
    node_results,
    rank_ends,
    restarts_text,
    root_cause_json,
    summary_lines,
    verdict,
)
from launcher.models import Host, OutputLine


def plan(*hosts: str, ranks: int = 1) -> Any:
    return SimpleNamespace(nodes=[SimpleNamespace(host=Host(h), node_rank=i,
                                                  ranks=range(i * ranks, (i + 1) * ranks))
                                  for i, h in enumerate(hosts)])


def node(host: str, code: int | None, ranks: tuple[RankEnd, ...] = (), **kw: Any) -> NodeOutcome:
    kw.setdefault("started", 100.0)
    kw.setdefault("ended", 110.0)
    return NodeOutcome(Host(host), code, ranks={e.rank: e for e in ranks}, **kw)


def tails(*lines: tuple[str, int | None, str, str]) -> TailKeeper:
    keeper = TailKeeper()
    keeper.add([OutputLine(host, stream, text, rank) for host, rank, stream, text in lines])
    return keeper


def judge(out: JobOutcome, hosts: tuple[str, ...], keeper: TailKeeper | None = None,
          ranks: int = 1, **kw: Any) -> dict[str, Any]:
    """The verdict as a user and meta.json see it."""
    keeper = keeper or TailKeeper()
    p = plan(*hosts, ranks=ranks)
    v = verdict(out, p, keeper)
    return {"code": v.code, "outcome": v.outcome, "host": v.root_host, "rank": v.root_rank,
            "kind": v.root_kind, "lines": v.lines, "why": v.why,
            "summary": summary_lines(out, p, v, **kw),
            "root_cause": root_cause_json(out, v, keeper)}


def short(out: JobOutcome, *hosts: str, keeper: TailKeeper | None = None) -> tuple[Any, ...]:
    v = verdict(out, plan(*hosts), keeper or TailKeeper())
    return v.code, v.outcome, v.root_host, v.root_rank, v.root_kind, v.lines


def _stopped_node(host: str = "a", code: int = 130, sig: int = 2) -> NodeOutcome:
    return node(host, code, (RankEnd(0, code, sig, sig, 1.0, 5.0),), stopped="interrupted")


@pytest.mark.parametrize(("kw", "code", "words"), [
    ({"interrupted": signal.SIGINT}, 130, "interrupted by Ctrl-C"),
    ({"interrupted": signal.SIGTERM, "killed": True}, 143, "interrupted by SIGTERM, then killed"),
    ({"interrupted": signal.SIGHUP}, 129, "interrupted by SIGHUP"),
    ({"interrupted": signal.SIGINT, "stopped_by": "dtrain stop (pid 7)"}, 130,
     "stopped by dtrain stop (pid 7)"),
    ({"interrupted": signal.SIGINT, "stopped_by": "dtrain stop", "killed": True}, 130,
     "stopped by dtrain stop, then killed"),
])
def test_an_interrupt_is_its_signals_code_and_blames_no_one(kw: dict[str, Any], code: int,
                                                             words: str) -> None:
    out = JobOutcome(nodes={"a": _stopped_node()}, interrupted_t=3.0, **kw)
    assert judge(out, ("a",)) == {
        "code": code, "outcome": words, "host": None, "rank": None, "kind": "interrupted",
        "lines": [], "why": [],
        # no FAILED: an interrupt is the user's doing
        "summary": [f"{words} (exit {code})",
                    "  a (node 0): r0 SIGINT (130) after 1.0s; torchrun exit 130 after 10.0s"
                    " (stopped by dtrain)"],
        "root_cause": {"kind": "interrupted", "host": None, "rank": None, "exit_code": code,
                       "summary": words}}


def test_a_failure_seen_before_the_interrupt_is_the_root_cause_one_after_is_not() -> None:
    def seen_at(seen: float, interrupted_t: float | None) -> tuple[Any, ...]:
        out = JobOutcome(nodes={"a": node("a", 1, (RankEnd(0, 3, t=5.0, duration=1.0),))},
                         failures=[Failure("rank", "a", 0, 3, seen=seen)],
                         interrupted=signal.SIGINT, interrupted_t=interrupted_t)
        return short(out, "a")[:5]

    rank = (3, "rank 0 on a exited 3", "a", 0, "rank")
    ctrl_c = (130, "interrupted by Ctrl-C", None, None, "interrupted")
    assert seen_at(2.9, 3.0) == rank
    assert seen_at(3.0, 3.0) == rank  # the same instant: the failure came first
    assert seen_at(3.5, 3.0) == ctrl_c
    assert seen_at(1.0, None) == ctrl_c  # the interrupt's time unknown: the interrupt
    # meta.json's root cause is the interrupt's alone: no failure's signal, error or stderr
    out = JobOutcome(nodes={"a": _stopped_node()},
                     failures=[Failure("rank", "a", 0, 3, signal=2, error="x", seen=3.5)],
                     interrupted=signal.SIGINT, interrupted_t=3.0)
    assert judge(out, ("a",), tails(("a", 0, "err", "e")))["root_cause"] == {
        "kind": "interrupted", "host": None, "rank": None, "exit_code": 130,
        "summary": "interrupted by Ctrl-C"}


def test_a_timeout_with_no_failure_before_it() -> None:
    out = JobOutcome(nodes={"a": node("a", 143, stopped="--timeout")}, timed_out=True,
                     stop_reason="--timeout 60 s")
    words = "timed out (--timeout): every node stopped"
    assert judge(out, ("a",)) == {
        "code": 124, "outcome": words, "host": None, "rank": None, "kind": "timeout",
        "lines": [], "why": [],
        "summary": [f"FAILED: {words} (exit 124)",
                    "  a (node 0): r0 no exit report (killed by dtrain); torchrun exit 143 after"
                    " 10.0s (stopped by dtrain)"],
        "root_cause": {"kind": "timeout", "host": None, "rank": None, "exit_code": 124,
                       "summary": words, "stop_reason": "--timeout 60 s"}}
    # a rank that failed before the timeout is the root cause
    out = JobOutcome(nodes={"a": node("a", 1, (RankEnd(0, 3, t=5.0, duration=1.0),))},
                     failures=[Failure("rank", "a", 0, 3, seen=3.5)], timed_out=True)
    assert short(out, "a")[:5] == (3, "rank 0 on a exited 3", "a", 0, "rank")


def test_a_start_timeout_names_every_late_node() -> None:
    out = JobOutcome(nodes={"a": node("a", 143),
                            "b": node("b", None, abandoned=True, started=None, ended=0.0),
                            "c": node("c", None, started=None, ended=0.0)},
                     start_timed_out=("b", "c"),
                     failures=[Failure("start", "b", error="did not start within 0.8 s",
                                       t=2.0, seen=2.0)],
                     stop_reason="b did not start")
    words = "b,c did not start within 0.8 s"
    assert judge(out, ("a", "b", "c")) == {
        "code": 124, "outcome": words, "host": "b", "rank": None, "kind": "start",
        "lines": [], "why": [],
        "summary": [f"FAILED: {words} (exit 124)",
                    "  b (node 1): r1 no exit report (killed by dtrain); no exit status",
                    "  a (node 0): r0 no exit report (killed by dtrain); torchrun exit 143 after"
                    " 10.0s",
                    "  c (node 2): r2 no exit report (killed by dtrain); no exit status"],
        "root_cause": {"kind": "start", "host": "b", "rank": None, "exit_code": 124,
                       "summary": words, "signal": None, "error": "did not start within 0.8 s",
                       "t": 2.0, "stderr_tail": [], "stop_reason": "b did not start"}}
    out.start_timed_out = ()  # the late nodes not listed: the root cause's host
    assert short(out, "a", "b", "c")[:2] == (124, "b did not start within 0.8 s")


def test_a_rank_killed_by_a_signal_is_the_root_cause_with_its_stderr() -> None:
    out = JobOutcome(
        nodes={"a": node("a", 143, (RankEnd(0, 143, 15, 15, 5.0, 1005.2),),
                         stopped="b rank 1 was killed by SIGSEGV"),
               "b": node("b", 139, (RankEnd(1, 139, 11, None, 4.9, 1005.0),))},
        failures=[Failure("rank", "b", rank=1, code=139, signal=11, t=1005.0, seen=5.01,
                          error="x")],
        stop_reason="b rank 1 was killed by SIGSEGV")
    keeper = tails(("b", 1, "err", "Fatal Python error: Segmentation fault"),
                   ("b", 1, "out", "step 3"),  # stdout is no part of the tail
                   ("b", None, "err", "agent line"), ("a", 0, "err", "other"))
    words = "rank 1 on b was killed by SIGSEGV"
    tail = ["last stderr lines of rank 1 on b:", "  Fatal Python error: Segmentation fault"]
    assert judge(out, ("a", "b"), keeper) == {
        "code": 139, "outcome": words, "host": "b", "rank": 1, "kind": "rank",
        "lines": tail, "why": [],
        "summary": [f"FAILED: {words} (exit 139)",
                    "  b (node 1): r1 SIGSEGV (139) after 4.9s (ROOT CAUSE); torchrun exit 139"
                    " after 10.0s",
                    "  a (node 0): r0 SIGTERM (143) after 5.0s (stopped by dtrain); torchrun"
                    " exit 143 after 10.0s (stopped by dtrain)", *tail],
        "root_cause": {"kind": "rank", "host": "b", "rank": 1, "exit_code": 139,
                       "summary": words, "signal": 11, "error": "x", "t": 1005.0,
                       "stderr_tail": ["Fatal Python error: Segmentation fault"],
                       "stop_reason": "b rank 1 was killed by SIGSEGV"}}
    # no code known: exit 1
    out = JobOutcome(nodes={"a": node("a", 1, (RankEnd(0),))}, failures=[Failure("rank", "a", 0)])
    assert short(out, "a")[0] == 1


def test_a_rank_its_own_torchrun_stopped_blames_that_torchrun() -> None:
    # torchrun on a passed a SIGTERM to its rank before dtrain stopped anything, and no rank
    # there failed on its own: torchrun's end is the root cause, with its stderr (here the
    # supervisor's copy: no line of torchrun's own came)
    out = JobOutcome(
        nodes={"a": node("a", 143, (RankEnd(0, 143, 15, 15, 5.0, 1005.0),),
                         stderr_tail=("sup tail 1", "sup tail 2")),
               "b": node("b", 143, stopped="a failed")},
        failures=[Failure("rank", "a", 0, 143, 15, seen=5.0)],
        stop_reason="a rank 0 was killed by SIGTERM")
    tail = ["last stderr lines of a:", "  sup tail 1", "  sup tail 2"]
    assert judge(out, ("a", "b")) == {
        "code": 143, "outcome": "torchrun on a exited 143", "host": "a", "rank": None,
        "kind": "node", "lines": tail, "why": [],
        "summary": ["FAILED: torchrun on a exited 143 (exit 143)",
                    "  a (node 0): r0 SIGTERM (143) after 5.0s (failed too); torchrun exit 143"
                    " after 10.0s",
                    "  b (node 1): r1 no exit report (killed by dtrain); torchrun exit 143"
                    " after 10.0s (stopped by dtrain)", *tail],
        "root_cause": {"kind": "node", "host": "a", "rank": None, "exit_code": 143,
                       "summary": "torchrun on a exited 143", "signal": 15, "error": None,
                       "t": 0.0, "stderr_tail": [],
                       "stop_reason": "a rank 0 was killed by SIGTERM"}}
    # torchrun says it got the signal (and exits 1): its code is the signal's, named
    agent = ("torch.distributed.elastic.multiprocessing.api.SignalException: Process 42 got"
             " signal: 15")
    out = JobOutcome(nodes={"a": node("a", 1, (RankEnd(0, 143, 15, 15, 5.0, 1005.0),),
                                      stderr_tail=("not this one",))},
                     failures=[Failure("rank", "a", 0, 143, 15, seen=5.0)])
    words = ("torchrun on a got SIGTERM and ended (a signal not from dtrain: a scheduler, a"
             " user, a watchdog)")
    assert short(out, "a", keeper=tails(("a", None, "err", agent))) == (
        143, words, "a", None, "node", ["last stderr lines of a:", f"  {agent}"])
    # killed by a signal itself: that signal, whatever its stderr says
    out = JobOutcome(nodes={"a": node("a", 137, (RankEnd(0, 137, 9, 15, 5.0, 1005.0),),
                                      signal=9)},
                     failures=[Failure("rank", "a", 0, 137, 9, seen=5.0)])
    assert short(out, "a", keeper=tails(("a", None, "err", agent))) == (
        137, "torchrun on a was killed by SIGKILL", "a", None, "node",
        ["last stderr lines of a:", f"  {agent}"])
    # torchrun ended 0 (or not at all): the rank is the root cause after all
    for code in (0, None):
        out = JobOutcome(nodes={"a": node("a", code, (RankEnd(0, 143, 15, 15, 5.0),))},
                         failures=[Failure("rank", "a", 0, 143, 15, seen=5.0)])
        assert short(out, "a")[:5] == (143, "rank 0 on a was killed by SIGTERM", "a", 0, "rank")
    # another rank on that node failed on its own: it is the story, not torchrun
    out = JobOutcome(nodes={"a": node("a", 1, (RankEnd(0, 143, 15, 15, 5.0, 9.0),
                                               RankEnd(1, 3, None, None, 4.0, 8.0)))},
                     failures=[Failure("rank", "a", 0, 143, 15, seen=5.0)])
    assert short(out, "a")[:5] == (143, "rank 0 on a was killed by SIGTERM", "a", 0, "rank")
    # the root rank not in the exit message: no stop known, the rank
    out = JobOutcome(nodes={"a": node("a", 1, (RankEnd(1, 3),))},
                     failures=[Failure("rank", "a", 0, 143, 15, seen=5.0)])
    assert short(out, "a")[:5] == (143, "rank 0 on a was killed by SIGTERM", "a", 0, "rank")


def _two_stopped(reason: str) -> dict[str, NodeOutcome]:
    return {h: node(h, 143, (RankEnd(r, 143, 15, 15, 5.0, 9.0),), stopped=reason)
            for r, h in enumerate("ab")}


def test_a_hang_is_125_and_names_the_rank_that_made_no_progress() -> None:
    out = JobOutcome(nodes=_two_stopped("hang"),
                     failures=[Failure("hang", "b", 1, error="rank 1 on b made no progress for"
                                                              " 60 s", t=7.0, seen=7.0)],
                     stop_reason="hang")
    words = "rank 1 on b made no progress for 60 s"
    assert judge(out, ("a", "b"), tails(("b", 1, "err", "stuck"))) == {
        "code": 125, "outcome": words, "host": "b", "rank": 1, "kind": "hang", "lines": [],
        "why": [],
        "summary": [f"FAILED: {words} (exit 125)",
                    "  b (node 1): r1 SIGTERM (143) after 5.0s (ROOT CAUSE); torchrun exit 143"
                    " after 10.0s (stopped by dtrain)",
                    "  a (node 0): r0 SIGTERM (143) after 5.0s (stopped by dtrain); torchrun"
                    " exit 143 after 10.0s (stopped by dtrain)"],
        "root_cause": {"kind": "hang", "host": "b", "rank": 1, "exit_code": 125,
                       "summary": words, "signal": None, "error": words, "t": 7.0,
                       "stderr_tail": ["stuck"], "stop_reason": "hang"}}
    out.failures = [Failure("hang", "", None)]  # nothing known of it
    assert short(out, "a", "b") == (125, "hang", None, None, "hang", [])
    out.failures = [Failure("hang", "b", 1, code=3, error="x")]  # --on-hang's own code
    assert short(out, "a", "b") == (3, "x", "b", 1, "hang", [])


def test_a_refused_fabric_is_123_and_names_the_node() -> None:
    out = JobOutcome(nodes=_two_stopped("fabric"),
                     failures=[Failure("fabric", "b", error="b: NCCL used Socket, not IB",
                                       t=3.0)], stop_reason="fabric refused")
    words = "b: NCCL used Socket, not IB"
    assert judge(out, ("a", "b")) == {
        "code": 123, "outcome": words, "host": "b", "rank": None, "kind": "fabric",
        "lines": [], "why": [],
        "summary": [f"FAILED: {words} (exit 123)",
                    "  b (node 1): r1 SIGTERM (143) after 5.0s (stopped by dtrain); torchrun"
                    " exit 143 after 10.0s (stopped by dtrain)",
                    "  a (node 0): r0 SIGTERM (143) after 5.0s (stopped by dtrain); torchrun"
                    " exit 143 after 10.0s (stopped by dtrain)"],
        "root_cause": {"kind": "fabric", "host": "b", "rank": None, "exit_code": 123,
                       "summary": words, "signal": None, "error": words, "t": 3.0,
                       "stderr_tail": [], "stop_reason": "fabric refused"}}
    out.failures = [Failure("fabric", "", None)]
    assert short(out, "a", "b") == (123, "fabric refused", None, None, "fabric", [])
    out.failures = [Failure("fabric", "b", code=5, error="y")]
    assert short(out, "a", "b") == (5, "y", "b", None, "fabric", [])


def test_a_lost_node_is_255() -> None:
    out = JobOutcome(nodes={"a": node("a", None, lost=True, error="no heartbeat for 5 s",
                                      ended=0.0),
                            "b": node("b", 143, stopped="a lost")},
                     failures=[Failure("lost", "a", code=255, error="no heartbeat for 5 s",
                                       t=4.0)])
    words = "node a lost: no heartbeat for 5 s"
    assert judge(out, ("a", "b")) == {
        "code": 255, "outcome": words, "host": "a", "rank": None, "kind": "lost",
        "lines": [], "why": [],
        "summary": [f"FAILED: {words} (exit 255)",
                    "  a (node 0): r0 no exit report (node lost); LOST: no heartbeat for 5 s",
                    "  b (node 1): r1 no exit report; torchrun exit 143 after 10.0s (stopped by"
                    " dtrain)"],
        "root_cause": {"kind": "lost", "host": "a", "rank": None, "exit_code": 255,
                       "summary": words, "signal": None, "error": "no heartbeat for 5 s",
                       "t": 4.0, "stderr_tail": []}}
    out.failures = [Failure("lost", "a")]
    assert short(out, "a", "b") == (255, "node a lost: connection lost", "a", None, "lost", [])


def test_a_failed_node_whose_ranks_failed_names_its_first_failed_rank() -> None:
    # torchrun gave up (exit 1): of its ranks that failed on their own, the first to end
    # (its node's clock) is the story; a rank torchrun stopped tells nothing
    out = JobOutcome(nodes={"a": node("a", 1, (RankEnd(0, 143, 15, 15, 5.0, 9.0),
                                               RankEnd(1, 6, None, None, 4.0, 8.5),
                                               RankEnd(2, 134, 6, None, 4.0, 8.0))),
                            "b": node("b", 143, stopped="a failed")},
                     failures=[Failure("node", "a", code=1, t=9.5, seen=9.6)],
                     stop_reason="a failed (exit 1)")
    keeper = tails(("a", 2, "err", "abort here"), ("a", None, "err", "torchrun says"))
    got = judge(out, ("a", "b"), keeper, ranks=3)
    words = "rank 2 on a was killed by SIGABRT"
    tail = ["last stderr lines of rank 2 on a:", "  abort here"]
    assert {k: got[k] for k in ("code", "outcome", "host", "rank", "kind", "lines")} == {
        "code": 134, "outcome": words, "host": "a", "rank": 2, "kind": "rank", "lines": tail}
    assert got["summary"] == [
        f"FAILED: {words} (exit 134)",
        "  a (node 0): r2 SIGABRT (134) after 4.0s (ROOT CAUSE), r0 SIGTERM (143) after 5.0s"
        " (stopped by dtrain), r1 exit 6 after 4.0s (failed too); torchrun exit 1 after 10.0s",
        "  b (node 1): r3 no exit report (killed by dtrain), r4 no exit report (killed by"
        " dtrain), r5 no exit report (killed by dtrain); torchrun exit 143 after 10.0s"
        " (stopped by dtrain)", *tail]
    # meta.json: that rank's signal, end and stderr, not its node's
    assert got["root_cause"] == {
        "kind": "rank", "host": "a", "rank": 2, "exit_code": 134, "summary": words,
        "signal": 6, "error": None, "t": 8.0, "stderr_tail": ["abort here"],
        "stop_reason": "a failed (exit 1)"}
    out.nodes["a"] = node("a", 1, (RankEnd(2, 134, 6),))  # its end's instant unknown
    assert judge(out, ("a", "b"), keeper, ranks=3)["root_cause"]["t"] == 9.5
    assert judge(out, ("a", "b"), ranks=3)["root_cause"]["stderr_tail"] == []  # it said nothing
    # an exit report without a code is no failure of the rank's: torchrun's end
    out.nodes["a"] = node("a", 1, (RankEnd(2, None, 6),))
    assert short(out, "a", "b")[:2] == (1, "torchrun on a exited 1")


@pytest.mark.parametrize(("stop", "code", "words", "kind"), [
    ("supervisor got signal 15", 143,
     "dtrain's supervisor on a got SIGTERM (not from dtrain) and stopped its job", "node"),
    ("torchrun stopped (state T) for 30 s after its ranks ended", 125,
     "torchrun on a was stopped (SIGSTOP or SIGTSTP, not from dtrain) after every rank there"
     " ended, and stayed so 30 s: it could never end, so its supervisor ended the job", "hang"),
    ("no heartbeat from the launcher for 7.5 s", 255,
     "node a heard nothing from dtrain for 7.5 s and stopped its job (its link to this machine"
     " cut or dropping packets, or dtrain stalled)", "lost"),
    ("its own reason", 143, "node a stopped its job by itself: its own reason", "node"),
])
def test_a_node_that_stopped_its_job_by_itself_says_why(stop: str, code: int, words: str,
                                                        kind: str) -> None:
    out = JobOutcome(nodes={"a": node("a", 143, stopped=stop, stderr_tail=("s1",)),
                            "b": node("b", 143, stopped="a")},
                     failures=[Failure("node", "a", code=143, own_stop=stop, t=2.0)])
    assert short(out, "a", "b") == (code, words, "a", None, kind,
                                    ["last stderr lines of a:", "  s1"])
    # torchrun's own stderr lines come before the supervisor's copy
    got = short(out, "a", "b", keeper=tails(("a", None, "err", "own"), ("a", 0, "err", "r0")))
    assert got[5] == ["last stderr lines of a:", "  own"]


def test_a_failed_node_without_a_stop_of_its_own() -> None:
    out = JobOutcome(nodes={"a": node("a", None, error="python3 not found")},
                     failures=[Failure("node", "a", error="python3 not found")])
    words = "node a failed: python3 not found"
    assert judge(out, ("a",)) == {
        "code": 255, "outcome": words, "host": "a", "rank": None, "kind": "node",
        "lines": [], "why": [],
        "summary": [f"FAILED: {words} (exit 255)",
                    "  a (node 0): r0 no exit report; python3 not found"],
        "root_cause": {"kind": "node", "host": "a", "rank": None, "exit_code": 255,
                       "summary": words, "signal": None, "error": "python3 not found",
                       "t": 0.0, "stderr_tail": []}}
    out = JobOutcome(nodes={"a": node("a", 137, signal=9)},
                     failures=[Failure("node", "a", code=137, signal=9)])
    assert short(out, "a", keeper=tails(("a", None, "err", "t1"))) == (
        137, "torchrun on a was killed by SIGKILL", "a", None, "node",
        ["last stderr lines of a:", "  t1"])
    assert judge(out, ("a",))["summary"] == [
        "FAILED: torchrun on a was killed by SIGKILL (exit 137)",
        "  a (node 0): r0 no exit report; torchrun SIGKILL (137) after 10.0s"]
    out = JobOutcome(nodes={"a": node("a", 2)}, failures=[Failure("node", "a", code=2)])
    assert short(out, "a") == (2, "torchrun on a exited 2", "a", None, "node", [])
    # a stop of its own but exit 0 (or no code): still a failure, exit 1
    out = JobOutcome(nodes={"a": node("a", 0)},
                     failures=[Failure("node", "a", code=0, own_stop="x")])
    assert short(out, "a") == (1, "node a stopped its job by itself: x", "a", None, "node", [])


def _ok(hosts: str = "abc") -> dict[str, NodeOutcome]:
    return {h: node(h, 0, (RankEnd(r, 0, None, None, 8.0 + r / 10, 9.0),))
            for r, h in enumerate(hosts)}


def test_a_run_that_succeeded_and_how_its_head_reads() -> None:
    rows = ["  a (node 0): r0 exit 0 after 8.0s; torchrun exit 0 after 10.0s",
            "  b (node 1): r1 exit 0 after 8.1s; torchrun exit 0 after 10.0s",
            "  c (node 2): r2 exit 0 after 8.2s; torchrun exit 0 after 10.0s"]
    assert judge(JobOutcome(nodes=_ok()), ("a", "b", "c")) == {
        "code": 0, "outcome": "succeeded", "host": None, "rank": None, "kind": None,
        "lines": [], "why": [], "summary": ["ok: succeeded (exit 0)", *rows],
        "root_cause": {"kind": None, "host": None, "rank": None, "exit_code": 0,
                       "summary": "succeeded"}}
    # smoke's job: its own verdict comes next
    assert judge(JobOutcome(nodes=_ok()), ("a", "b", "c"), judged=True)["summary"] == [
        "job: ended (exit 0)", *rows]
    # --restarts: the last attempt counts the relaunches
    for attempt, said in ((2, " after 1 restart"), (3, " after 2 restarts")):
        assert judge(JobOutcome(nodes=_ok()), ("a",), attempt=attempt)["summary"][0] == (
            f"ok: succeeded{said} (exit 0)")
    assert (restarts_text(0), restarts_text(-1)) == ("", "")
    failed = JobOutcome(nodes={"a": node("a", 1, (RankEnd(0, 3, None, None, 1.0, 2.0),))},
                        failures=[Failure("rank", "a", 0, 3)])
    assert judge(failed, ("a",), attempt=2, retried=True)["summary"][0] == (
        "attempt 2 failed: rank 0 on a exited 3 (exit 3)")
    assert judge(failed, ("a",), judged=True)["summary"][0] == (
        "FAILED: rank 0 on a exited 3 (exit 3)")
    assert judge(failed, ("a",), attempt=2)["summary"][0] == (
        "FAILED: rank 0 on a exited 3 after 1 restart (exit 3)")


def test_with_no_failure_seen_nodes_that_never_ended_or_ended_badly() -> None:
    hosts = ("a", "b", "c", "d", "e")
    assert short(JobOutcome(nodes=_ok()), *hosts) == (
        255, "d,e never reported an end", "d", None, "lost", [])
    assert short(JobOutcome(nodes={**_ok(), "b": node("b", None)}), "a", "b", "c") == (
        255, "b never reported an end", "b", None, "lost", [])
    bad = {**_ok(), "b": node("b", 3), "c": node("c", 4)}
    assert short(JobOutcome(nodes=bad), "a", "b", "c") == (
        3, "torchrun on b exited 3", "b", None, "node", [])


def _many(n: int = 20) -> tuple[JobOutcome, Any]:
    """n01's rank 0 failed; n02-n19 stopped by dtrain (n02-n10 a little later each); n20 never
    started."""
    hosts = tuple(f"n{i:02d}" for i in range(1, n + 1))
    nodes = {"n01": node("n01", 1, (RankEnd(0, 7, None, None, 3.0, 5.0),
                                    RankEnd(1, 143, 15, 15, 3.5, 5.5)))}
    for i, h in enumerate(hosts[1:n - 1], 1):
        late = i / 10 if i < 10 else 0.0
        nodes[h] = node(h, 143, (RankEnd(2 * i, 143, 15, 15, 4.0 + late, 6.0),
                                 RankEnd(2 * i + 1, 143, 15, 15, 4.0, 6.0)),
                        stopped="n01 failed", ended=110.0 + late / 10)
    out = JobOutcome(nodes=nodes, failures=[Failure("rank", "n01", 0, 7, t=5.0)],
                     stop_reason="n01 rank 0 exited 7")
    return out, plan(*hosts, ranks=2)


def test_from_16_nodes_on_the_nodes_that_ended_alike_are_one_line() -> None:
    out, p = _many()
    v = verdict(out, p, TailKeeper())
    assert summary_lines(out, p, v) == [
        "FAILED: rank 0 on n01 exited 7 (exit 7)",
        "  n01 (node 0): r0 exit 7 after 3.0s (ROOT CAUSE), r1 SIGTERM (143) after 3.5s"
        " (stopped by dtrain); torchrun exit 1 after 10.0s",
        "  n20 (node 19): not started",
        # torchrun stopped by dtrain, as on an unfolded row
        "  n[02-19] (18 nodes): 36 ranks SIGTERM after 4.0-4.9s (143) (stopped by dtrain);"
        " torchrun exit 143 after 10.0-10.1s (stopped by dtrain)"]


def _never(rank: int) -> dict[str, Any]:
    return {"exit_code": None, "signal": None, "duration": None, "stop_signal": None,
            "role": "unknown"}


def test_meta_json_nodes_key_by_key() -> None:
    out = JobOutcome(
        nodes={"a": node("a", 143, (RankEnd(0, 143, 15, 15, 5.0, 1005.12345, 11),
                                    RankEnd(1)),  # a report without a code or a time
                         stopped="b rank 2 exited 7", supervisor_pid=50, pid=51,
                         started=100.2504, ended=110.2506),
               "b": node("b", 1, (RankEnd(2, 7, None, None, 4.9, 1005.0, 12),)),
               "c": node("c", None, lost=True, error="no heartbeat", abandoned=True,
                         started=None, ended=0.0)},
        failures=[Failure("rank", "b", rank=2, code=7, t=1005.0, seen=5.01)],
        stop_reason="b rank 2 exited 7")
    p = plan("a", "b", "c", "d", ranks=2)
    got = node_results(out, p, verdict(out, p, TailKeeper()))
    assert got[0].pop("duration") == pytest.approx(10.0002)
    assert got == [
        {"host": "a", "node_rank": 0, "exit_code": 143, "signal": None, "error": None,
         "lost": False, "abandoned": False, "stopped": "b rank 2 exited 7",
         "start": 100.25, "end": 110.251, "supervisor_pid": 50, "pid": 51,
         "ranks": {"0": {"exit_code": 143, "signal": 15, "duration": 5.0, "stop_signal": 15,
                         "end": 1005.123, "start": 1000.123, "role": "stopped"},
                   "1": {"exit_code": 0, "signal": None, "duration": None,
                         "stop_signal": None, "role": "ok"}}},
        {"host": "b", "node_rank": 1, "exit_code": 1, "signal": None, "error": None,
         "lost": False, "abandoned": False, "stopped": None, "duration": 10.0,
         "start": 100.0, "end": 110.0, "supervisor_pid": None, "pid": None,
         "ranks": {"2": {"exit_code": 7, "signal": None, "duration": 4.9, "stop_signal": None,
                         "end": 1005.0, "start": 1000.1, "role": "root cause"},
                   "3": _never(3)}},
        {"host": "c", "node_rank": 2, "exit_code": None, "signal": None,
         "error": "no heartbeat", "lost": True, "abandoned": True, "stopped": None,
         "duration": None, "start": None, "end": None, "supervisor_pid": None, "pid": None,
         "ranks": {"4": _never(4), "5": _never(5)}},
        {"host": "d", "node_rank": 3, "exit_code": None, "signal": None,
         "error": "not started", "lost": False, "abandoned": False, "stopped": None,
         "duration": None, "start": None, "end": None, "supervisor_pid": None, "pid": None,
         "ranks": {"6": _never(6), "7": _never(7)}}]
    # without a verdict: no roles
    assert node_results(out, p)[0]["ranks"]["0"] == {
        "exit_code": 143, "signal": 15, "duration": 5.0, "stop_signal": 15, "end": 1005.123,
        "start": 1000.123}
    # a signal of torchrun's own, and a node ended at its start
    out.nodes["b"] = node("b", 137, signal=9, started=0.0, ended=3.5)
    assert {k: node_results(out, p)[1][k] for k in ("signal", "start", "end", "duration")} == {
        "signal": 9, "start": 0.0, "end": 3.5, "duration": 3.5}


def test_each_ranks_role() -> None:
    ends = (RankEnd(0, 7, t=1.0),  # the root cause
            RankEnd(1, 3, t=2.0),  # a failure seen before the stop: failed
            RankEnd(2, 143, 15, 15, t=3.0),  # stopped
            RankEnd(3, 137, 9, t=3.0),  # SIGKILL: stopped, whoever asked
            RankEnd(4, 1, None, 15, t=3.0),  # asked to stop, exited 1 by itself: stopped
            RankEnd(5, 139, 11, 15, t=3.0),  # asked to stop, crashed: failed
            RankEnd(6, 2, t=3.0),  # exited 2 on its own, after the stop: failed
            RankEnd(7, 0, t=3.0))
    out = JobOutcome(nodes={"a": node("a", 1, ends)},
                     failures=[Failure("rank", "a", 0, 7), Failure("rank", "a", 1, 3),
                               Failure("node", "a", 4)],  # no rank's failure
                     stop_reason="a rank 0 exited 7")
    p = plan("a", "b", ranks=8)
    roles = {r: e["role"] for r, e in
             node_results(out, p, verdict(out, p, TailKeeper()))[0]["ranks"].items()}
    assert roles == {"0": "root cause", "1": "failed", "2": "stopped", "3": "stopped",
                     "4": "stopped", "5": "failed", "6": "failed", "7": "ok"}
    assert summary_lines(out, p, verdict(out, p, TailKeeper()))[1] == (
        "  a (node 0): r0 exit 7 (ROOT CAUSE), r1 exit 3 (failed too), r2 SIGTERM (143)"
        " (stopped by dtrain), r3 SIGKILL (137) (stopped by dtrain), r4 exit 1 (stopped by"
        " dtrain), r5 SIGSEGV (139) (failed too), r6 exit 2 (failed too), r7 exit 0;"
        " torchrun exit 1 after 10.0s")
    # a hang's rank is its root cause too; a lost node's ranks are not
    out.failures = [Failure("hang", "a", 6)]
    assert node_results(out, p, verdict(out, p, TailKeeper()))[0]["ranks"]["6"]["role"] == (
        "root cause")
    out.failures = [Failure("lost", "a", 6)]
    assert node_results(out, p, verdict(out, p, TailKeeper()))[0]["ranks"]["6"]["role"] == (
        "failed")
    # the same rank number on another node is not the root cause
    out = JobOutcome(nodes={"a": node("a", 1, (RankEnd(0, 7),)),
                            "b": node("b", 1, (RankEnd(0, 7),))},
                     failures=[Failure("rank", "a", 0, 7)])
    p = plan("a", "b", ranks=1)
    p.nodes[1].ranks = range(1)
    roles = [n["ranks"]["0"]["role"] for n in node_results(out, p, verdict(out, p, TailKeeper()))]
    assert roles == ["root cause", "failed"]


def test_the_failure_reason_of_the_root_cause_rank() -> None:
    from launcher.decide.outcome.failures import ErrorKeeper

    oom = "Out of memory: Killed process 4242 (python) anon-rss:8388608kB"
    keeper = ErrorKeeper()
    keeper.evidence[("a", 0)] = {"kernel": [oom]}
    keeper.evidence[("a", 1)] = {"kernel": ["Out of memory: Killed process 4243 (python)"]}
    out = JobOutcome(nodes={"a": node("a", 1, (RankEnd(0, 137, 9, None, 4.9, 1005.0, 4242),))},
                     failures=[Failure("rank", "a", 0, 137, 9)])
    v = verdict(out, plan("a"), TailKeeper())
    reason = failure_reason(out, v, keeper)
    assert reason is not None
    assert (reason.kind, reason.summary, reason.rank, reason.host, reason.evidence) == (
        "oom", "rank 0 on a was killed by the kernel's OOM killer (8.0 GiB)", 0, "a", (oom,))
    assert failure_lines(reason) == [
        "why: rank 0 on a was killed by the kernel's OOM killer (8.0 GiB)", f"  {oom}",
        "next: the rank needs more memory than the node (or its cgroup) gives: lower the batch"
        " size, the data loader's workers or prefetch, or use nodes with more memory"]
    # the rank's stderr: its exception
    keeper = ErrorKeeper()
    keeper.observe([OutputLine("a", "err", "Traceback (most recent call last):", 0),
                    OutputLine("a", "err", '  File "t.py", line 3, in main', 0),
                    OutputLine("a", "err", "ValueError: bad", 0),
                    OutputLine("a", "err", "ValueError: not this rank's", 1)])
    out = JobOutcome(nodes={"a": node("a", 1, (RankEnd(0, 3, t=1.0),))},
                     failures=[Failure("rank", "a", 0, 9)])
    v = verdict(out, plan("a"), TailKeeper())
    reason = failure_reason(out, v, keeper)
    assert reason is not None
    assert reason.summary == "rank 0 on a raised ValueError: bad in main() t.py:3"
    # the code its node reported, else the verdict's
    reason = failure_reason(out, v, ErrorKeeper())
    assert reason is not None and reason.summary == "rank 0 on a exited 3"
    out.nodes["a"] = node("a", 1, (RankEnd(0, None, t=1.0),))
    reason = failure_reason(out, v, ErrorKeeper())
    assert reason is not None and reason.summary == "rank 0 on a exited 9"
    out.nodes["a"] = node("a", 1, (RankEnd(0, 139, 11, t=1.0),))
    reason = failure_reason(out, v, ErrorKeeper())
    assert reason is not None and reason.kind == "segfault"
    out.nodes["a"] = node("a", 1)  # no exit report: the verdict's code
    reason = failure_reason(out, v, ErrorKeeper())
    assert reason is not None and reason.summary == "rank 0 on a exited 9"
    del out.nodes["a"]
    reason = failure_reason(out, v, ErrorKeeper())
    assert reason is not None and reason.summary == "rank 0 on a exited 9"
    # no rank to explain
    for v_ in (verdict(JobOutcome(nodes=_ok()), plan("a", "b", "c"), TailKeeper()),
               verdict(JobOutcome(nodes=_ok(), failures=[Failure("hang", "a", 0)]),
                       plan("a"), TailKeeper())):
        assert failure_reason(out, v_, ErrorKeeper()) is None
    v.root_host = None
    assert failure_reason(out, v, ErrorKeeper()) is None
    v.root_host, v.root_rank = "a", None
    assert failure_reason(out, v, ErrorKeeper()) is None


def test_failure_lines_keep_8_lines_of_evidence() -> None:
    from launcher.decide.outcome.failures import FailureReason

    reason = FailureReason("exit", "s", "do this", evidence=tuple(f"e{i}" for i in range(10)))
    assert failure_lines(reason) == ["why: s", *(f"  e{i}" for i in range(8)), "next: do this"]


def test_a_nodes_ranks_in_the_order_they_ended_and_the_tails_kept() -> None:
    out = JobOutcome(nodes={"a": node("a", 1, (RankEnd(0, 1, t=5.0), RankEnd(1, 1),
                                               RankEnd(2, 1, t=0.5)))})
    assert [e.rank for e in rank_ends(out, "a")] == [1, 2, 0]  # no time: first
    assert rank_ends(out, "b") == []
    keeper = tails(*((("a", 0, "err", f"l{i}")) for i in range(12)))
    assert list(keeper.tails[("a", 0)]) == [f"l{i}" for i in range(4, 12)]  # the last 8
    small = TailKeeper(2)
    small.add([OutputLine("a", "err", f"l{i}", 0) for i in range(3)])
    assert list(small.tails[("a", 0)]) == ["l1", "l2"]


def test_exactly_16_nodes_fold_and_each_kind_of_end_is_a_line_of_its_own() -> None:
    out, p = _many(16)
    out.nodes["n15"] = node("n15", 137, (RankEnd(28, 137, 9, 9), RankEnd(29, 137, 9, 9)),
                            signal=9, stopped="x", ended=0.0)  # no durations known
    out.nodes["n16"] = node("n16", 0, (RankEnd(30, 0, None, None, 2.0),
                                       RankEnd(31, 0, None, None, 2.04)), ended=112.0)
    assert summary_lines(out, p, verdict(out, p, TailKeeper())) == [
        "FAILED: rank 0 on n01 exited 7 (exit 7)",
        "  n01 (node 0): r0 exit 7 after 3.0s (ROOT CAUSE), r1 SIGTERM (143) after 3.5s"
        " (stopped by dtrain); torchrun exit 1 after 10.0s",
        "  n[02-14] (13 nodes): 26 ranks SIGTERM after 4.0-4.9s (143) (stopped by dtrain);"
        " torchrun exit 143 after 10.0-10.1s (stopped by dtrain)",
        "  n15 (1 node): 2 ranks SIGKILL (137) (stopped by dtrain); torchrun SIGKILL (137)"
        " (stopped by dtrain)",
        "  n16 (1 node): 2 ranks exit 0 after 2.0s; torchrun exit 0 after 12.0s"]
    out, p = _many(15)  # under 16: a line per node
    lines = summary_lines(out, p, verdict(out, p, TailKeeper()))
    assert len(lines) == 16 and lines[2] == (
        "  n02 (node 1): r2 SIGTERM (143) after 4.1s (stopped by dtrain), r3 SIGTERM (143)"
        " after 4.0s (stopped by dtrain); torchrun exit 143 after 10.0s (stopped by dtrain)")


def test_the_nodes_that_ended_otherwise_are_not_folded() -> None:
    out, p = _many(20)
    out.nodes["n12"] = node("n12", 143, (RankEnd(22, 143, 15, 15, 4.0),), stopped="x")
    p.nodes[12].ranks = range(0)  # n13: a node with no rank
    out.nodes["n14"] = node("n14", 143, (RankEnd(26, 1, None, None, 4.0),
                                         RankEnd(27, 143, 15, 15, 4.0)), stopped="x")
    out.nodes["n15"] = node("n15", None, (RankEnd(28, 143, 15, 15, 4.0),
                                          RankEnd(29, 143, 15, 15, 4.0)))
    out.nodes["n16"] = node("n16", None, lost=True, error="gone")
    out.nodes["n17"] = node("n17", 143, (RankEnd(32, 1, None, None, 4.0),
                                         RankEnd(33, 1, None, None, 4.0)), stopped="x")
    out.nodes["n18"] = node("n18", 143, (), stopped="x")
    stopped = "torchrun exit 143 after 10.0s (stopped by dtrain)"
    assert summary_lines(out, p, verdict(out, p, TailKeeper()))[2:] == [
        "  n12 (node 11): r22 SIGTERM (143) after 4.0s (stopped by dtrain), r23 no exit report"
        f" (killed by dtrain); {stopped}",
        f"  n13 (node 12): no ranks; {stopped}",
        "  n14 (node 13): r26 exit 1 after 4.0s (failed too), r27 SIGTERM (143) after 4.0s"
        f" (stopped by dtrain); {stopped}",
        "  n15 (node 14): r28 SIGTERM (143) after 4.0s (stopped by dtrain), r29 SIGTERM (143)"
        " after 4.0s (stopped by dtrain); no exit status",
        "  n16 (node 15): r30 no exit report (node lost), r31 no exit report (node lost);"
        " LOST: gone",
        "  n17 (node 16): r32 exit 1 after 4.0s (failed too), r33 exit 1 after 4.0s (failed"
        f" too); {stopped}",  # all alike, but failed: each node on its own
        "  n18 (node 17): r34 no exit report (killed by dtrain), r35 no exit report (killed by"
        f" dtrain); {stopped}",
        "  n20 (node 19): not started",
        "  n[02-11,19] (11 nodes): 22 ranks SIGTERM after 4.0-4.9s (143) (stopped by dtrain);"
        " torchrun exit 143 after 10.0-10.1s (stopped by dtrain)"]


def test_a_node_that_never_connected_and_a_failure_is_never_exit_0() -> None:
    # a node's failure with no outcome of its own (it never connected)
    out = JobOutcome(failures=[Failure("node", "a", error="ssh: connection refused")])
    assert short(out, "a") == (255, "node a failed: ssh: connection refused", "a", None,
                               "node", [])
    # a node's failure recorded with exit 0 is still a failure: exit 1
    out = JobOutcome(nodes={"a": node("a", 0)}, failures=[Failure("node", "a", code=0)])
    assert short(out, "a") == (1, "torchrun on a exited 0", "a", None, "node", [])


def test_root_cause_is_the_rank_dtrain_saw_fail_first_even_if_another_ended_earlier() -> None:
    # rank 0 ended first by its node's clock, but dtrain heard of rank 1's failure first:
    # rank 1 is the root cause, and meta.json says rank 1's signal, time and stderr
    out = JobOutcome(nodes={"a": node("a", 1, (RankEnd(0, 3, None, None, 1.0, 4.0),
                                               RankEnd(1, 139, 11, None, 1.0, 5.0)))},
                     failures=[Failure("rank", "a", 1, 139, 11, t=5.0, seen=5.1),
                               Failure("rank", "a", 0, 3, t=4.0, seen=5.2)])
    keeper = tails(("a", 0, "err", "zero"), ("a", 1, "err", "one"))
    assert judge(out, ("a",), keeper, ranks=2)["root_cause"] == {
        "kind": "rank", "host": "a", "rank": 1, "exit_code": 139,
        "summary": "rank 1 on a was killed by SIGSEGV", "signal": 11, "error": None,
        "t": 5.0, "stderr_tail": ["one"]}
