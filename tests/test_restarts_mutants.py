"""decide/outcome/restarts.py: what issue 51's mutation round (docs/testing.md, "Mutation score")
found no test for: a hang's signature on every path, the fields a fault keeps when its last
usable nodes are not fenced, the spares chosen by place inside ``decide``, the suspect of a
run that stops, and the plural of the console lines."""

from __future__ import annotations

from launcher.decide.outcome import lemons as lm
from launcher.decide.outcome.failures import FailureReason
from launcher.decide.outcome.incidents import Recall
from launcher.decide.outcome.restarts import (
    NODE,
    PROCESS,
    USER,
    AttemptEnd,
    Fault,
    NodeCount,
    RestartPolicy,
    choose_gang,
    classify,
    decide,
    remembered,
    signature,
)
from launcher.decide.runplan.placement import Place


def _hang(where: str | None, host: str = "node2") -> AttemptEnd:
    return AttemptEnd(1, "hang", host, 3, error="no progress for 60 s", where=where,
                      place="train.py:40 in step")


def test_an_oom_kill_has_one_signature_whatever_the_node() -> None:
    a = FailureReason("oom", "rank 3 on node2: killed by the OOM killer", "less memory",
                      host="node2", rank=3)
    b = FailureReason("oom", "rank 0 on node7: killed by the OOM killer", "less memory",
                      host="node7", rank=0)
    assert signature(a) == signature(b) == "oom: killed by the kernel's OOM killer"


def test_every_hang_fault_carries_the_place_as_its_signature() -> None:
    sig = "hang: train.py:40 in step"
    # no stacks read; blocked in the script (first time, then again); in a collective once,
    # then again on the same node
    assert classify(_hang(None)).signature == sig
    first = classify(_hang("script"))
    assert first.kind == PROCESS and first.signature == sig
    again = classify(_hang("script"), [first])
    assert again.kind == USER and again.signature == sig
    assert again.why == ("node2: hang culprit blocked in the script's own code at the same "
                         "place as the attempt before, not a node fault (it hangs the same "
                         "way on any node) (no progress for 60 s)")
    suspect = classify(_hang("collective"))
    assert suspect.kind == PROCESS and suspect.signature == sig
    assert suspect.suspect and suspect.suspect[0][0] == "node2"
    assert suspect.why == ("node2: hang culprit in a collective, once (no progress for 60 s): "
                           "a suspect, fenced if named again")
    fenced = classify(_hang("collective"), [suspect])
    assert fenced.kind == NODE and fenced.signature == sig
    assert fenced.why == ("node2: hang culprit again after a restart, in a collective "
                          "(no progress for 60 s)")
    native = classify(_hang("native"))
    assert native.why.startswith("node2: hang culprit outside Python, once")
    # the signature is what makes the second of two hangs at one place the script's
    assert classify(_hang("script"), [classify(_hang(None))]).kind == USER
    assert classify(_hang("script"), [fenced]).kind == USER
    assert classify(_hang("script"), [suspect]).kind == USER


def test_what_earlier_runs_say_keeps_the_faults_signature() -> None:
    fault = Fault(PROCESS, "rank 3 raised KeyError", signature="exception: KeyError at x")
    code = remembered(fault, Recall(code="the same failure on 3 nodes with this commit"))
    assert (code.kind, code.signature) == (USER, "exception: KeyError at x")
    node = remembered(fault, Recall(fence=("node2", lm.SUSPECT, "3 prints on node2")))
    assert node.kind == NODE and node.signature == "exception: KeyError at x"
    assert node.tier == lm.SUSPECT and node.fence == (("node2", "3 prints on node2"),)


def _lost(*hosts: str) -> AttemptEnd:
    return AttemptEnd(1, "lost", hosts[0], lost=hosts, error="no heartbeat for 10 s")


def test_the_last_usable_nodes_are_not_fenced_and_the_fault_keeps_its_fields() -> None:
    policy = RestartPolicy(restarts=2)
    d = decide(_lost("a", "b"), [], 1, policy, ["a", "b"], [], NodeCount(1, 2))
    assert d.relaunch and d.fenced == () and d.gang is not None
    assert d.line == ("a, b lost (no heartbeat for 10 s): not fenced (a, b: the run's last "
                      "usable nodes); attempt 2 on the same nodes from the last checkpoint "
                      "in 1 s")
    one = decide(_lost("a"), [], 1, policy, ["a"], [], NodeCount(1, 1))
    assert "not fenced (a: the run's last usable node);" in one.line
    # a fault the incidents fence (a signature, a tier): only its fence is dropped
    reason = FailureReason("exception", "rank 0 on a raised KeyError at train.py:3", "",
                           host="a", rank=0, evidence=("KeyError: 'x'",))
    end = AttemptEnd(1, "rank", "a", 0, reason, progressed=True)
    d = decide(end, [], 1, policy, ["a"], [], NodeCount(1, 1),
               history=Recall(fence=("a", lm.SUSPECT, "a: 3 prints")))
    assert d.fault == Fault(NODE, "rank 0 on a raised KeyError at train.py:3; a: 3 prints",
                            (), "exception: KeyError at train.py:3", (), lm.SUSPECT)
    assert d.fenced == () and d.suspect == ()


def test_decide_takes_the_spare_from_the_fenced_nodes_switch() -> None:
    places = {"a": Place("s1"), "c": Place("s0"), "d": Place("s1")}
    d = decide(_lost("a"), [], 1, RestartPolicy(restarts=1), ["a", "b"], ["c", "d"],
               NodeCount(2, 2), places)
    assert d.gang is not None and d.gang.replaced == (("a", "d"),)
    assert d.gang.active == ("d", "b")


def test_a_suspect_is_kept_when_the_run_stops() -> None:
    # no restart left, then a gang too small: the suspect goes on the lemon list either way
    d = decide(_hang("collective"), [], 1, RestartPolicy(restarts=0), ["node2"], [],
               NodeCount(1, 1))
    assert not d.relaunch and d.suspect and d.suspect[0][0] == "node2"
    assert d.line.endswith("no restart left (--restarts 0)")
    end = AttemptEnd(1, "lost", "node1", lost=("node1",), error="gone")
    stopped = decide(end, [], 1, RestartPolicy(restarts=3), ["node1", "node2"], [],
                     NodeCount(2, 2))
    assert not stopped.relaunch and stopped.gang is not None and stopped.gang.stop
    assert stopped.fenced == (("node1", "lost (gone)"),) and stopped.suspect == ()
    # fewer nodes than the minimum (no fence): stopped, and the suspect still kept
    short = decide(_hang("collective"), [], 1, RestartPolicy(restarts=3), ["node2"], [],
                   NodeCount(2, 2))
    assert not short.relaunch and short.gang is not None and short.gang.stop
    assert short.suspect == d.suspect
    hang = decide(_hang("collective"), [], 1, RestartPolicy(restarts=3), ["node2"], [],
                  NodeCount(1, 1))
    assert hang.relaunch and hang.suspect == d.suspect


def test_as_many_hosts_as_the_minimum_is_enough_and_spares_are_plural() -> None:
    first = choose_gang(["a", "b"], RestartPolicy(count=NodeCount(2, 2)), {}, 0.0)
    assert first.active == ("a", "b") and first.spares == ()
    many = choose_gang(["a", "b", "c", "d"], RestartPolicy(restarts=1, count=NodeCount(2, 2)),
                       {}, 0.0)
    assert many.spares_line == "c,d: spares for a fenced node (--nnodes 2)"
    one = choose_gang(["a", "b", "c"], RestartPolicy(restarts=1, count=NodeCount(2, 2)), {},
                      0.0)
    assert one.spares_line == "c: spare for a fenced node (--nnodes 2)"
