"""What one node says may clear another node's ranks, never accuse them (issue 50, item 2).

A node's ``stacks`` answer (faulthandler's text and the flight recorder's pickle of each of
its ranks) is a claim about its own ranks only. The hang culprit (decide/outcome/stacks.py) is a
rank
whose OWN report agrees: its own stack stands outside every collective and its own flight
recorder does not show it inside one. A higher sequence number, an op or a stack reported by
another node is no evidence against it; it may only clear it.

Every input goes the way a real answer goes: the supervisor's JSON message (built by
tests/hostile.py, the lying node of every such test), job/events.py's
``decode`` (the host's own ranks only, job/nodemsg.py), then what job/hangwatch.py's
``_collect`` does with each entry (``rank_stack``, ``load_dump``, ``rank_flight``) and
``fold``; the hang's record is the one HangWatch._hang writes, read by
commands/restarts.attempt_end into decide/outcome/restarts.decide, attempt after attempt.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

from launcher.commands.restarts import attempt_end
from launcher.decide.outcome import flight, stacks
from launcher.decide.outcome.hang import HangPolicy, ProgressWatch, compile_progress
from launcher.decide.outcome.outcomes import Failure
from launcher.decide.outcome.restarts import Decision, Fault, NodeCount, RestartPolicy, decide
from launcher.decide.outcome.verdict import Verdict
from launcher.exitcodes import EXIT_HANG
from launcher.job import events, nodemsg
from launcher.job.hangwatch import HangWatch, StackDump
from tests.hostile import ALL_REDUCE, BARRIER, LOAD_BATCH, Cluster, fr, rank_entry

# the lying node of tests/hostile.py: nodeA (ranks 0-1) and nodeB (ranks 2-3)
CLUSTER = Cluster()
PLAN = CLUSTER.plan
_fr, _rank = fr, rank_entry


def _answer(ranks: Mapping[int, dict[str, Any]]) -> bytes:
    """A supervisor's ``stacks`` message (what goes over the node's channel)."""
    return CLUSTER.liar.stacks(dict(ranks))


def _fold(answers: Mapping[str, bytes]) -> stacks.Folded:
    """The answers as the launcher reads them: decoded against the plan, then folded."""
    owners = nodemsg.rank_owners(PLAN, planned=True)
    ranks: list[stacks.RankStack] = []
    positions: dict[int, flight.RankFlight] = {}
    for host, data in answers.items():
        ev = events.decode(data, owners[host])
        assert isinstance(ev, events.Stacks)
        for rank, entry in ev.ranks.items():
            ranks.append(stacks.rank_stack(rank, host, entry))
            if entry.fr_data is not None:
                loaded = flight.load_dump(base64.b64decode(entry.fr_data))
                position = flight.rank_flight(rank, loaded) if loaded is not None else None
                if position is not None:
                    positions[rank] = position
    return stacks.fold(ranks, [r for rs in PLAN.values() for r in rs], positions)


def _framed() -> dict[str, bytes]:
    """Every rank waits in the same all_reduce, collective #7 by its own flight recorder;
    nodeB overstates its own ranks' last enqueued collective (#1000)."""
    return {"nodeA": _answer({0: _rank(ALL_REDUCE, _fr(7, 6)), 1: _rank(ALL_REDUCE, _fr(7, 6))}),
            "nodeB": _answer({2: _rank(ALL_REDUCE, _fr(1000, 6)),
                              3: _rank(ALL_REDUCE, _fr(1000, 6))})}


def test_a_node_that_overstates_its_own_position_frames_nobody() -> None:
    folded = _fold(_framed())
    assert folded.culprit is None, folded.culprit
    assert folded.lines() == ["ranks 0-3 (4 ranks on 2 nodes): all_reduce <- step() train.py:47"]
    # the same with nodeB's ranks claiming another op at that number (a "desync" vote) or
    # standing elsewhere inside a collective: nodeA's ranks wait, by their own word
    other_op = dict(_framed(), nodeB=_answer({2: _rank(ALL_REDUCE, _fr(7, 6, "gloo:x")),
                                              3: _rank(ALL_REDUCE, _fr(7, 6, "gloo:x"))}))
    assert _fold(other_op).culprit is None
    elsewhere = {"nodeA": _answer({0: _rank(ALL_REDUCE), 1: _rank(ALL_REDUCE)}),
                 "nodeB": _answer({2: _rank(BARRIER), 3: _rank(BARRIER)})}
    assert _fold(elsewhere).culprit is None
    # nodeB cannot speak for nodeA's ranks either (job/nodemsg.py): its claims on ranks 0-1
    # are dropped, nodeA's own answers stand
    spoof = dict(_framed(), nodeB=_answer({0: _rank(LOAD_BATCH, _fr(1, 1)),
                                           2: _rank(ALL_REDUCE, _fr(1000, 6)),
                                           3: _rank(ALL_REDUCE, _fr(1000, 6))}))
    assert _fold(spoof).culprit is None


def test_a_rank_whose_own_report_shows_it_short_is_still_the_culprit() -> None:
    # rank 1's own flight recorder: #6 enqueued and completed, nothing in flight; its own
    # stack: outside every collective; the others wait in #7
    answers = {"nodeA": _answer({0: _rank(ALL_REDUCE, _fr(7, 6)), 1: _rank(LOAD_BATCH, _fr(6, 6))}),
               "nodeB": _answer({2: _rank(ALL_REDUCE, _fr(7, 6)), 3: _rank(ALL_REDUCE, _fr(7, 6))})}
    c = _fold(answers).culprit
    assert c is not None and (c.ranks, c.host, c.rule, c.where) == ((1,), "nodeA", "flight",
                                                                    "script")
    assert c.why == ("it has not entered collective #7 (gloo:all_reduce), which the other 3 "
                     "ranks wait in (flight recorder: at #6)")
    # no flight recorder at all: its own stack outside every collective says it
    bare = {"nodeA": _answer({0: _rank(ALL_REDUCE), 1: _rank(LOAD_BATCH)}),
            "nodeB": _answer({2: _rank(ALL_REDUCE), 3: _rank(ALL_REDUCE)})}
    c = _fold(bare).culprit
    assert c is not None and (c.ranks, c.rule, c.where) == ((1,), "wavefront", "script")
    # a rank that did not answer the dump (its own node says so): native, the culprit
    gone = {"nodeA": _answer({0: _rank(ALL_REDUCE, _fr(7, 6)), 1: _rank(None)}),
            "nodeB": _answer({2: _rank(ALL_REDUCE, _fr(7, 6)), 3: _rank(ALL_REDUCE, _fr(7, 6))})}
    c = _fold(gone).culprit
    assert c is not None and (c.ranks, c.host, c.where) == ((1,), "nodeA", "native")


def test_another_node_s_word_can_clear_a_rank_and_its_own_record_can_too() -> None:
    # rank 1's stack is outside a collective, but its own flight recorder shows #7 entered and
    # not completed (an NCCL rank blocked after enqueueing): it waits, not the culprit
    own = {"nodeA": _answer({0: _rank(ALL_REDUCE, _fr(7, 6)), 1: _rank(LOAD_BATCH, _fr(7, 6))}),
           "nodeB": _answer({2: _rank(ALL_REDUCE, _fr(7, 6)), 3: _rank(ALL_REDUCE, _fr(7, 6))})}
    assert _fold(own).culprit is None
    # rank 1 completed #7, which the others (by their word) wait in: cleared by their numbers
    cleared = {"nodeA": _answer({0: _rank(ALL_REDUCE, _fr(7, 6)),
                                 1: _rank(LOAD_BATCH, _fr(7, 7))}),
               "nodeB": _answer({2: _rank(ALL_REDUCE, _fr(7, 6)),
                                 3: _rank(ALL_REDUCE, _fr(7, 6))})}
    assert _fold(cleared).culprit is None


# -- the restart policy: a framed node is neither a suspect nor fenced ---------------------------

def _attempt(folded: stacks.Folded, attempt: int) -> Any:
    """One attempt that ends in the hang with ``--on-hang stop``: HangWatch._hang's own record
    and Failure, then the verdict's root cause and commands/restarts.attempt_end."""
    failures: list[Failure] = []
    job = SimpleNamespace(declare_failure=failures.append)
    watch = HangWatch(job, HangPolicy(timeout=300.0, on_hang="stop"),  # type: ignore[arg-type]
                      ProgressWatch(compile_progress(None), range(4), 0.0), PLAN,
                      None, lambda _line: None, alive=lambda: True)  # type: ignore[arg-type]
    watch.attempt = attempt

    async def dump(kind: str, reason: str) -> StackDump:
        return StackDump("h1", reason, 0.0, folded=folded)

    watch.dump = dump  # type: ignore[method-assign]
    asyncio.run(watch._hang(1000.0))
    (root,) = failures
    verdict = Verdict(root.code or EXIT_HANG, root.error or "hang", root.host or None, root.rank,
                      root_kind="hang")
    result = SimpleNamespace(verdict=verdict, code=verdict.code, hangs=watch.hangs, failure=None,
                             outcome=SimpleNamespace(root=root, nodes={}), progressed=True,
                             tails=SimpleNamespace(tails={}))
    return attempt_end(result)  # type: ignore[arg-type]


def _restarts(folded: stacks.Folded) -> list[Decision]:
    before: list[Fault] = []
    out = []
    for attempt in (1, 2, 3):
        d = decide(_attempt(folded, attempt), before, attempt, RestartPolicy(restarts=5),
                   ["nodeA", "nodeB"], ["nodeC"], NodeCount(2, 2))
        before.append(d.fault)
        out.append(d)
    return out


def test_a_framed_node_is_never_a_suspect_nor_fenced_attempt_after_attempt() -> None:
    decisions = _restarts(_fold(_framed()))
    assert [(d.suspect, d.fenced) for d in decisions] == [((), ())] * 3, \
        [d.line for d in decisions]
    for d in decisions:
        assert d.relaunch and "nodeA" not in d.line, d.line
        assert d.gang is not None and d.gang.active == ("nodeA", "nodeB")


def test_a_node_whose_own_rank_shows_it_stuck_outside_python_is_still_fenced() -> None:
    # the rule still fences on the node's own evidence: its rank did not answer the dump
    gone = {"nodeA": _answer({0: _rank(ALL_REDUCE, _fr(7, 6)), 1: _rank(None)}),
            "nodeB": _answer({2: _rank(ALL_REDUCE, _fr(7, 6)), 3: _rank(ALL_REDUCE, _fr(7, 6))})}
    first, second, _ = _restarts(_fold(gone))
    assert [h for h, _ in first.suspect] == ["nodeA"] and first.fenced == ()
    assert [h for h, _ in second.fenced] == ["nodeA"]
    assert second.gang is not None and second.gang.active == ("nodeC", "nodeB")
