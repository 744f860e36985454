"""#28's pure policy: classification, fencing, spares and shrinking, back-off, the lemon
list (decide/outcome/restarts.py, decide/outcome/lemons.py, output/lemons.py); no cluster."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from launcher.decide.outcome import lemons as lm
from launcher.decide.outcome.failures import explain
from launcher.decide.outcome.restarts import (
    FINAL,
    NODE,
    PROCESS,
    USER,
    AttemptEnd,
    Fault,
    NodeCount,
    RestartPolicy,
    backoff,
    choose_gang,
    classify,
    decide,
    fenced_line,
    next_gang,
    parse_nnodes,
    signature,
)
from launcher.errors import UsageError
from launcher.job.lemons import LemonStore, state_dir

TRACE = ["Traceback (most recent call last):",
         '  File "/w/train.py", line 40, in <module>',
         "    main()",
         '  File "/w/train.py", line 31, in main',
         "    raise ValueError('bad batch 7')",
         "ValueError: bad batch 7"]


def _rank_end(stderr: list[str], *, progressed: bool = True, code: int = 1,
              sig: int | None = None, evidence: dict[str, object] | None = None,
              host: str = "node2", rank: int = 3) -> AttemptEnd:
    reason = explain(rank=rank, host=host, code=code, sig=sig, pid=77, evidence=evidence,
                     stderr=stderr)
    return AttemptEnd(code, "rank", host, rank, reason, progressed, stderr=tuple(stderr))


# -- --nnodes ---------------------------------------------------------------------------------

def test_nnodes_takes_k_and_min_max() -> None:
    assert parse_nnodes("3") == NodeCount(3, 3)
    assert parse_nnodes("2:4") == NodeCount(2, 4)
    assert str(NodeCount(2, 4)) == "2:4" and str(NodeCount(3, 3)) == "3"
    assert parse_nnodes(None) is None
    for bad in ("0", "4:2", "a", "1:2:3", "", ":3", "-1"):
        with pytest.raises(UsageError):
            parse_nnodes(bad)


def test_policy_splits_hosts_into_the_gang_and_spares() -> None:
    hosts = ["n1", "n2", "n3", "n4"]
    assert RestartPolicy(count=NodeCount(3, 3)).split(hosts) == (NodeCount(3, 3),
                                                                 ["n1", "n2", "n3"], ["n4"])
    assert RestartPolicy().split(hosts) == (NodeCount(4, 4), hosts, [])


def test_every_run_s_first_gang_leaves_lemons_out_while_enough_hosts_remain() -> None:
    """decide.outcome.restarts.choose_gang (every run, not only --restarts): a host on the lemon
    list
    is left out while --nnodes MIN still fits, used with a warning when it does not; MAX
    hosts run, the rest are spares, said in one line."""
    now = 1000.0
    bad = {"n2": lm.Lemon("n2", "lost", "r1", now - 60, now + 3600)}
    hosts = ["n1", "n2", "n3", "n4"]
    gang = choose_gang(hosts, RestartPolicy(restarts=2, count=NodeCount(2, 2)), bad, now)
    assert (gang.active, gang.count, gang.spares) == (("n1", "n3"), NodeCount(2, 2), ("n4",))
    assert len(gang.lemon_lines) == 1 and gang.lemon_lines[0].startswith("n2 skipped: ")
    assert gang.spares_line == "n4: spare for a fenced node (--nnodes 2)"
    # every host needed: n2 is used, with a warning
    gang = choose_gang(hosts, RestartPolicy(), bad, now)
    assert (gang.active, gang.count, gang.spares) == (tuple(hosts), NodeCount(4, 4), ())
    assert gang.lemon_lines[0].startswith("warning: n2 was fenced by run r1")
    assert gang.spares_line is None
    # without --restarts the hosts beyond MAX are not used
    gang = choose_gang(hosts, RestartPolicy(count=NodeCount(1, 2)), {}, now)
    assert (gang.active, gang.spares, gang.lemon_lines) == (("n1", "n2"), ("n3", "n4"), ())
    assert gang.spares_line == "n[3-4] not used (--nnodes 1:2)"
    with pytest.raises(UsageError, match=r"--nnodes 5: only 4 host\(s\) given \(n\[1-4\]\)"):
        choose_gang(hosts, RestartPolicy(count=NodeCount(5, 5)), {}, now)


# -- classification ---------------------------------------------------------------------------

@pytest.mark.parametrize("line", ["SyntaxError: invalid syntax",
                                  "ModuleNotFoundError: No module named 'nope'",
                                  "ImportError: cannot import name 'x' from 'y'",
                                  "NameError: name 'foo' is not defined"])
def test_deterministic_exceptions_are_user_errors_even_after_progress(line: str) -> None:
    stderr = [*TRACE[:-1], line]
    fault = classify(_rank_end(stderr, progressed=True))
    assert fault.kind == USER
    assert "fails the same way" in fault.why


def test_a_syntax_error_before_the_traceback_frames_is_a_user_error() -> None:
    # what python prints for a SyntaxError in the script itself: no "in <module>" frame
    stderr = ['  File "/w/bad.py", line 3', "    def (:", "        ^",
              "SyntaxError: invalid syntax"]
    stderr = ["Traceback (most recent call last):", *stderr]
    assert classify(_rank_end(stderr, progressed=False)).kind == USER


def test_an_argparse_error_is_a_user_error() -> None:
    stderr = ["usage: train.py [-h] [--lr LR]", "train.py: error: unrecognized arguments: --lx"]
    fault = classify(_rank_end(stderr, code=2, progressed=True))
    assert fault.kind == USER and "refused its arguments" in fault.why


def test_a_failure_before_any_progress_is_a_user_error_after_it_a_process_fault() -> None:
    assert classify(_rank_end(TRACE, progressed=False)).kind == USER
    assert classify(_rank_end(TRACE, progressed=True)).kind == PROCESS


def test_the_same_exception_at_the_same_place_twice_is_a_user_error() -> None:
    first = classify(_rank_end(TRACE))
    assert first.kind == PROCESS and first.signature is not None
    again = classify(_rank_end(TRACE, host="node4", rank=0), [first])  # another rank
    assert again.kind == USER and "same place" in again.why
    other = [*TRACE[:-1], "ValueError: bad batch 8"]
    assert classify(_rank_end(other), [first]).kind == PROCESS  # another message
    assert classify(_rank_end(TRACE), [Fault(PROCESS, "x"), first][:1]).kind == PROCESS


def test_a_lost_node_is_fenced() -> None:
    end = AttemptEnd(255, "lost", "node2", error="no heartbeat for 10 s", lost=("node2",))
    fault = classify(end)
    assert fault.kind == NODE
    assert fault.fence == (("node2", "lost (no heartbeat for 10 s)"),)
    assert fault.why == "node2 lost (no heartbeat for 10 s)"


def test_every_lost_node_is_fenced_whatever_the_root_cause() -> None:
    end = AttemptEnd(1, "rank", "node1", 0, lost=("node2", "node3"), error="gone")
    assert [h for h, _ in classify(end).fence] == ["node2", "node3"]


def test_a_node_that_did_not_start_is_fenced() -> None:
    end = AttemptEnd(124, "start", "node3", error="did not start within 120 s")
    assert classify(end).fence == (("node3", "did not start within 120 s"),)


def test_a_hang_in_the_script_s_own_code_never_fences_however_often() -> None:
    """A rank that slept in load_batch fenced localhost for 24 h: the script's, not the
    node's. The first time the same nodes again, the same place again: stop."""
    place = "time.sleep <- load_batch() data.py:41"
    end = AttemptEnd(125, "hang", "node3", 4, error="no progress for 300 s", where="script",
                     place=place)
    first = classify(end)
    assert (first.kind, first.fence, first.suspect) == (PROCESS, (), ())
    assert first.why == ("node3: hang culprit blocked in the script's own code, not a node "
                         "fault (no progress for 300 s)")
    again = classify(end, (first,))
    assert (again.kind, again.fence) == (USER, ())
    assert "same place as the attempt before, not a node fault" in again.why
    d = decide(end, [], 1, RestartPolicy(restarts=2, backoff=0), ["node3"], [],
               NodeCount(1, 1))
    assert d.relaunch and d.fenced == () and d.suspect == ()
    assert d.line.endswith("attempt 2 on the same nodes from the last checkpoint")
    d = decide(end, [first], 2, RestartPolicy(restarts=2, backoff=0), ["node3"], [],
               NodeCount(1, 1))
    assert not d.relaunch and d.fenced == () and d.line.endswith(": not restarted")
    # elsewhere in the script each time: restarted on the same nodes, never fenced
    other = AttemptEnd(125, "hang", "node3", 4, where="script", place="f() t.py:3")
    assert classify(other, (first, first)).kind == PROCESS
    assert classify(AttemptEnd(125, "hang", None, None, error="hang")).kind == PROCESS


def test_a_culprit_outside_the_script_is_a_suspect_once_and_fenced_when_named_again() -> None:
    end = AttemptEnd(125, "hang", "node3", None, error="no progress for 300 s",
                     where="collective", place="all_reduce <- step() t.py:9")
    first = classify(end)
    assert (first.kind, first.fence) == (PROCESS, ())
    assert first.suspect == (("node3", "hang culprit in a collective, once (no progress for "
                                       "300 s)"),)
    assert first.why.endswith(": a suspect, fenced if named again")
    again = classify(end, (first,))
    assert again.kind == NODE and again.fence == (
        ("node3", "hang culprit again after a restart, in a collective (no progress for "
                  "300 s)"),)
    # another node named the second time: a suspect of its own, nobody fenced
    other = classify(AttemptEnd(125, "hang", "node2", None, where="native"), (first,))
    assert (other.kind, other.fence, other.suspect[0][0]) == (PROCESS, (), "node2")
    assert "outside Python" in other.why
    policy = RestartPolicy(restarts=3, backoff=0)
    d = decide(end, [first], 2, policy, ["node1", "node3"], ["node4"], NodeCount(2, 2))
    assert d.relaunch and d.fenced == again.fence and d.gang is not None
    assert d.gang.active == ("node1", "node4")


def test_a_run_never_fences_its_last_usable_node() -> None:
    lost = AttemptEnd(1, "lost", host="n1", error="no heartbeat")
    d = decide(lost, [], 1, RestartPolicy(restarts=2, backoff=0), ["n1"], [], NodeCount(1, 1))
    assert d.fenced == () and d.relaunch and d.gang is not None and d.gang.active == ("n1",)
    assert d.line == ("n1 lost (no heartbeat): not fenced (n1: the run's last usable node); "
                      "attempt 2 on the same nodes from the last checkpoint")
    # with another node left it is fenced as before
    d = decide(lost, [], 1, RestartPolicy(restarts=2, backoff=0), ["n1", "n2"], [],
               NodeCount(1, 2))
    assert d.fenced == (("n1", "lost (no heartbeat)"),)
    assert "shrinking to 1 node;" in d.line


def test_lemon_tiers_isolate_and_a_suspect_whose_cooldown_doubles_with_each_repeat() -> None:
    assert [lm.cooldown(n) for n in (1, 2, 3, 4)] == [600.0, 1200.0, 2400.0, 4800.0]
    assert lm.cooldown(40) == lm.cooldown(10**6) == 24 * 3600.0  # capped, no overflow
    s1 = lm.Lemon("n2", "hang", "r1", 1000.0, 0.0, lm.SUSPECT)
    records = lm.add([], [s1])
    assert records == [lm.Lemon("n2", "hang", "r1", 1000.0, 1600.0, lm.SUSPECT, 1)]
    # named again (after the first was forgiven): the count goes on, the cooldown doubles
    records = lm.add(records, [lm.Lemon("n2", "hang", "r2", 5000.0, 0.0, lm.SUSPECT)])
    assert (records[0].count, records[0].until) == (2, 5000.0 + 1200.0)
    assert list(lm.current(records, 5100.0)) == ["n2"] and lm.current(records, 6200.0) == {}
    # an isolate in force is not shortened by a suspect record
    iso = lm.add([], [lm.Lemon("n3", "Xid 79", "r1", 0.0, 86400.0, lm.ISOLATE)])
    iso = lm.add(iso, [lm.Lemon("n3", "hang", "r2", 100.0, 0.0, lm.SUSPECT)])
    assert (iso[0].tier, iso[0].until, iso[0].count, iso[0].why) == (
        lm.ISOLATE, 86400.0, 2, "hang")
    # old records (no tier, no count) read as isolate, once; odd ones are tamed
    assert lm.Lemon.from_json({"host": "a", "t": 1}).tier == lm.ISOLATE
    odd = lm.Lemon.from_json({"host": "a", "t": 1, "tier": "x", "count": True})
    assert odd is not None and (odd.tier, odd.count) == (lm.ISOLATE, 1)
    big = lm.Lemon.from_json({"host": "a", "t": 1, "tier": "suspect", "count": 10**30})
    assert big is not None and (big.tier, big.count) == (lm.SUSPECT, lm.MAX_COUNT)
    assert lm.parse(json.loads(json.dumps(lm.document(records)))) == records
    line = lm.skip_line(records[0], 5100.0)
    assert line.startswith("n2 skipped: a suspect (named 2x, left out for 20 min) since run r2")
    assert "fenced" not in lm.kept_line(records[0], 5100.0)


def test_dtrain_nodes_shows_the_tier_the_count_and_the_until(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import time

    from launcher.commands.nodes import list_nodes

    store = LemonStore(tmp_path / "s")
    now = time.time()
    store.remember([lm.Lemon("n1", "Xid 79", "r", now - 10, now + 100, lm.ISOLATE)])
    store.remember([lm.Lemon("n2", "hang", "r", now - 10, 0.0, lm.SUSPECT)])
    store.remember([lm.Lemon("n2", "hang", "r", now - 5, 0.0, lm.SUSPECT)])
    capsys.readouterr()
    assert list_nodes(store=store) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:6] == ["HOST", "TIER", "COUNT", "STATE", "FENCED", "UNTIL"]
    assert out[1].split()[:4] == ["n1", "isolate", "1", "fenced"]
    assert out[2].split()[:5] == ["n2", "suspect", "2", "left", "out"]
    assert list_nodes(as_json=True, store=store) == 0
    nodes = json.loads(capsys.readouterr().out)["nodes"]
    assert [(n["host"], n["tier"], n["count"]) for n in nodes] == [
        ("n1", "isolate", 1), ("n2", "suspect", 2)]
    assert nodes[1]["until"] == pytest.approx(now - 5 + 1200.0)


def test_failures_and_restarts_say_one_thing_about_which_exceptions_fail_the_same_way() -> None:
    """The explanation said every exception "fails the same way on restart" while the policy
    restarts a RuntimeError after progress."""
    for kind, restarted in (("RuntimeError", True), ("ValueError", True),
                            ("NameError", False), ("ModuleNotFoundError", False)):
        end = _rank_end(["Traceback (most recent call last):",
                         '  File "/w/t.py", line 2, in <module>', f"{kind}: boom"])
        assert end.reason is not None and end.reason.kind == "exception"
        fault = classify(end)
        assert (fault.kind == PROCESS) is restarted, (kind, fault)
        says_same = "fails the same way on every run" in end.reason.advice
        assert says_same is not restarted, (kind, end.reason.advice)
        if restarted:
            assert "with --restarts it is run again" in end.reason.advice


def test_an_oom_kill_of_the_training_process_does_not_fence_a_node_xid_does() -> None:
    kernel = ["Out of memory: Killed process 77 (python) total-vm:1kB, anon-rss:2097152kB"]
    end = _rank_end([], sig=9, code=137, evidence={"kernel": kernel})
    oom = classify(end)
    assert oom.kind == PROCESS and oom.fence == () and "OOM" in oom.why
    again = classify(end, (oom,))
    assert again.kind == USER and again.fence == () and "same place" in again.why
    xid = ["NVRM: Xid (PCI:0000:3b:00): 79, pid=77, GPU has fallen off the bus"]
    fault = classify(_rank_end([], code=1, evidence={"kernel": xid}))
    assert fault.kind == NODE and "Xid 79" in fault.why


def test_a_kill_from_outside_or_a_segfault_after_progress_restarts_on_the_same_nodes() -> None:
    killed = classify(_rank_end([], sig=9, code=137, evidence={"kernel": []}))
    assert killed.kind == PROCESS and not killed.fence
    assert classify(_rank_end(["Connection closed by peer"], code=1)).kind == PROCESS


def test_success_interrupt_and_timeout_are_final() -> None:
    assert classify(AttemptEnd(0, None)).kind == FINAL
    assert classify(AttemptEnd(130, "interrupted")).kind == FINAL
    assert classify(AttemptEnd(124, "timeout")).kind == FINAL


def test_signature_leaves_out_rank_and_host() -> None:
    a = explain(rank=1, host="a", code=1, sig=None, stderr=TRACE)
    b = explain(rank=5, host="b", code=1, sig=None, stderr=TRACE)
    assert signature(a) == signature(b) is not None
    assert signature(None) is None


# -- spares and shrinking ---------------------------------------------------------------------

def test_a_fenced_node_is_replaced_by_a_spare_in_its_place() -> None:
    gang = next_gang(["n1", "n2", "n3"], ["n4", "n5"], ["n2"], NodeCount(3, 3))
    assert gang.active == ("n1", "n4", "n3") and gang.spares == ("n5",)
    assert gang.replaced == (("n2", "n4"),) and gang.stop is None


def test_without_a_spare_the_gang_shrinks_down_to_min_then_stops() -> None:
    gang = next_gang(["n1", "n2", "n3"], [], ["n2"], NodeCount(2, 3))
    assert gang.active == ("n1", "n3") and gang.dropped == ("n2",) and gang.stop is None
    gang = next_gang(["n1", "n3"], [], ["n3"], NodeCount(2, 3))
    assert gang.stop is not None and "at least 2" in gang.stop
    assert next_gang(["n1", "n2"], [], ["n1"], NodeCount(2, 2)).stop is not None


def test_a_fenced_spare_is_not_brought_in() -> None:
    gang = next_gang(["n1", "n2"], ["n3", "n4"], ["n2", "n3"], NodeCount(2, 2))
    assert gang.active == ("n1", "n4")


def test_the_fenced_line_says_each_spare_brought_in_and_the_smaller_run() -> None:
    both = next_gang(["n1", "n2", "n3"], ["n4"], ["n1", "n2"], NodeCount(2, 3))
    assert fenced_line("n1, n2 unreachable at attempt 1", both) == \
        "n1, n2 unreachable at attempt 1: fenced, spare n4 in, shrinking to 2 nodes"
    same = next_gang(["n1", "n2"], [], [], NodeCount(2, 2))
    assert fenced_line("n2 lost", same) == "n2 lost: fenced"
    stops = next_gang(["n1", "n2"], [], ["n2"], NodeCount(2, 2))
    assert fenced_line("n2 lost", stops) == "n2 lost: fenced"  # the stop is said apart


# -- back-off and the decision ----------------------------------------------------------------

def test_backoff_doubles_from_the_base_up_to_the_cap() -> None:
    assert [backoff(n, 1.0, 30.0) for n in (1, 2, 3, 4, 5, 6, 7)] == [0, 1, 2, 4, 8, 16, 30]
    assert backoff(9, 0.0) == 0.0
    assert backoff(2, 600.0) == 600.0 and backoff(4, 600.0) == 600.0  # a base above the cap


def test_decision_line_for_a_lost_node_with_a_spare() -> None:
    end = AttemptEnd(255, "lost", "node2", error="no heartbeat for 10 s", lost=("node2",))
    d = decide(end, [], 1, RestartPolicy(restarts=3), ["node1", "node2", "node3"], ["node4"],
               NodeCount(3, 3))
    assert d.relaunch and d.gang is not None and d.gang.active == ("node1", "node4", "node3")
    assert d.line == ("node2 lost (no heartbeat for 10 s): fenced, spare node4 in; "
                      "attempt 2 from the last checkpoint in 1 s")
    assert d.fenced == (("node2", "lost (no heartbeat for 10 s)"),)


def test_decision_for_a_process_fault_and_the_restart_budget() -> None:
    end = _rank_end(TRACE)
    policy = RestartPolicy(restarts=1, backoff=0.5)
    d = decide(end, [], 1, policy, ["a", "b"], [], NodeCount(2, 2))
    assert d.relaunch and d.wait == 0.5 and "attempt 2 on the same nodes" in d.line
    d = decide(end, [Fault(PROCESS, "other")], 2, policy, ["a", "b"], [], NodeCount(2, 2))
    assert not d.relaunch and "no restart left (--restarts 1)" in d.line


def test_decision_for_a_user_error_is_one_attempt() -> None:
    stderr = [*TRACE[:-1], "SyntaxError: invalid syntax"]
    d = decide(_rank_end(stderr), [], 1, RestartPolicy(restarts=9), ["a"], [], NodeCount(1, 1))
    assert not d.relaunch and d.fault.kind == USER and d.line.endswith("not restarted")


def test_decision_to_shrink_and_to_stop_without_nodes() -> None:
    end = AttemptEnd(255, "lost", "b", error="gone", lost=("b",))
    d = decide(end, [], 1, RestartPolicy(restarts=2), ["a", "b", "c"], [], NodeCount(2, 3))
    assert d.relaunch and d.gang is not None and d.gang.active == ("a", "c")
    assert "fenced, shrinking to 2 nodes" in d.line
    d = decide(end, [], 1, RestartPolicy(restarts=2), ["a", "b"], [], NodeCount(2, 2))
    assert not d.relaunch and "at least 2" in d.line


# -- the lemon list ---------------------------------------------------------------------------

def _lemon(host: str, t: float = 1000.0, ttl: float = 100.0) -> lm.Lemon:
    return lm.Lemon(host, "lost (no heartbeat)", "run-1", t, t + ttl)


def test_lemons_in_force_skip_and_kept() -> None:
    now = 1050.0
    records = [_lemon("n2"), _lemon("n5", t=800.0)]  # n5's time is over
    current = lm.current(records, now)
    assert list(current) == ["n2"]
    s = lm.skip(["n1", "n2", "n3", "n4"], current, need=3)
    assert s.hosts == ("n1", "n3", "n4") and [x.host for x in s.skipped] == ["n2"]
    s = lm.skip(["n1", "n2", "n3"], current, need=3)  # cannot spare it: used, with a warning
    assert s.hosts == ("n1", "n2", "n3") and [x.host for x in s.kept] == ["n2"]
    assert "dtrain nodes unfence n2" in lm.skip_line(current["n2"], now)
    assert "fenced by run run-1 50 s ago" in lm.skip_line(current["n2"], now)
    assert "used anyway" in lm.kept_line(current["n2"], now)


def test_lemons_add_remove_expire_and_tolerant_parse() -> None:
    records = lm.add([_lemon("a"), _lemon("b")], [_lemon("a", t=2000.0)])
    assert sorted((x.host, x.t) for x in records) == [("a", 2000.0), ("b", 1000.0)]
    kept, found = lm.remove(records, ["a", "zz"])
    assert [x.host for x in kept] == ["b"] and found == ["a"]
    kept, dropped = lm.expire(records, now=1500.0)
    assert [x.host for x in kept] == ["a"] and [x.host for x in dropped] == ["b"]
    kept, dropped = lm.expire(records, now=2001.0, older_than=0.5)
    assert kept == [] and len(dropped) == 2
    doc = lm.document(records)
    assert lm.parse(json.loads(json.dumps(doc))) == records
    assert lm.parse({"lemons": [{"host": 3}, {"t": 1}, "x", {"host": "h", "t": "no"}]}) == []
    assert lm.parse([1, 2]) == [] and lm.parse(None) == []


def test_the_store_lives_in_the_state_dir_private_and_survives_garbage(tmp_path: Path) -> None:
    assert state_dir({"XDG_STATE_HOME": "/x/state"}) == Path("/x/state/dtrain")
    assert state_dir({"HOME": "/h"}) == Path("/h/.local/state/dtrain")
    assert state_dir({"DTRAIN_STATE_DIR": "/s", "XDG_STATE_HOME": "/x"}) == Path("/s")
    assert state_dir({"XDG_STATE_HOME": "rel", "HOME": "/h"}) == Path("/h/.local/state/dtrain")
    store = LemonStore(tmp_path / "state" / "dtrain")
    assert store.load() == []  # no directory yet: nothing, nothing created
    assert not (tmp_path / "state").exists()
    store.remember([_lemon("n2")])
    store.remember([_lemon("n3")])
    assert [x.host for x in store.load()] == ["n2", "n3"]
    mode = stat.S_IMODE(os.stat(store.path).st_mode)
    assert mode == 0o600 and stat.S_IMODE(os.stat(store.directory).st_mode) == 0o700
    store.path.write_text("{torn")
    assert store.load() == []
    store.remember([_lemon("n4")])  # a torn file is replaced, not fatal
    assert [x.host for x in store.load()] == ["n4"]


# -- the archive, ps, JUnit, doctor -----------------------------------------------------------

def test_an_archived_line_says_its_attempt_and_logs_filters_on_it(tmp_path: Path) -> None:
    from launcher.models import OutputLine
    from launcher.output.archive import RunArchive
    from launcher.output.logview import attempt_of, replay

    archive = RunArchive.create(tmp_path / "runs", "r1")
    archive.write_lines([OutputLine("n1", "out", "plain", 0, 0, 1.0)])
    archive.begin_attempt(2)
    archive.write_lines([OutputLine("n1", "out", "second", 0, 0, 2.0)])
    archive.close()
    archive.begin_attempt(3)  # a closed archive reopens for the next attempt
    archive.write_lines([OutputLine("n2", "out", "third", 1, 1, 3.0)])
    archive.close()
    raws = (tmp_path / "runs" / "r1" / "output.jsonl").read_text().splitlines()
    records = [json.loads(r) for r in raws]
    assert [r.get("attempt") for r in records] == [None, 2, 3]
    assert [attempt_of(r) for r in raws] == [1, 2, 3]
    import io

    out = io.StringIO()
    replay(tmp_path / "runs" / "r1", attempt=2, out=out, color=False)
    assert out.getvalue() == "n1 r0: second\n"


def test_ps_shows_the_attempt_and_restarting_is_live(tmp_path: Path) -> None:
    from launcher.output.runstate import status_of

    meta = {"run_id": "r", "state": "restarting", "next_attempt": {"n": 3, "at": 0}}
    st = status_of(tmp_path, meta, {"pid": 1})
    assert st.state == "restarting" and st.attempt == 3 and st.label == "restarting (attempt 3)"
    st = status_of(tmp_path, {"run_id": "r", "exit_code": 0, "attempt": 2}, None)
    assert st.label == "finished (0, attempt 2)"
    assert status_of(tmp_path, {"run_id": "r", "exit_code": 1}, None).label == "finished (1)"


def test_junit_has_one_case_per_attempt() -> None:
    from launcher.output.junit import to_junit
    from launcher.output.report import CommandReport

    attempts = [{"n": 1, "start": 10.0, "end": 25.5, "exit_code": 255, "cause": "node",
                 "why": "node2 lost (no heartbeat for 5 s)", "hosts": ["node1", "node2"],
                 "fenced": [{"host": "node2", "why": "lost"}], "decision": "...: fenced"},
                {"n": 2, "start": 27.0, "end": 40.0, "exit_code": 0, "cause": "ok",
                 "hosts": ["node1", "node3"], "fenced": []}]
    xml = to_junit(CommandReport("run", 0, "succeeded", 0.0, 40.0,
                                 extra={"attempts": attempts}))
    assert '<testcase name="attempt 1"' in xml and '<testcase name="attempt 2"' in xml
    assert 'message="node: node2 lost (no heartbeat for 5 s) (exit 255) after 15.5 s"' in xml
    assert "fenced: node2" in xml and 'failures="1"' in xml


def _attempts() -> list[dict]:
    return [{"n": 1, "start": 10.0, "end": 25.5, "exit_code": 255, "cause": "node",
             "why": "node2 lost (no heartbeat for 5 s)", "hosts": ["node1", "node2"],
             "fenced": [{"host": "node2", "why": "lost"}], "decision": "...: fenced",
             "detected": 24.0, "stopping": 24.0, "relaunched": 26.5, "world_size": 2,
             "outcome": "node2 lost", "relaunch": True},
            {"n": 2, "start": 26.5, "end": 40.0, "exit_code": 0, "cause": "ok",
             "hosts": ["node1", "node3"], "fenced": [], "detected": None, "stopping": None,
             "relaunched": None, "world_size": 2, "relaunch": False}]


def test_each_attempt_says_when_its_failure_was_detected_and_the_relaunch_started() -> None:
    """dtrain.run/1's attempts[] carry detected and relaunched (Unix times, null when none),
    and the JUnit case of an attempt says its timings and takes its duration."""
    import copy

    import jsonschema

    from launcher.output.junit import to_junit
    from launcher.output.report import CommandReport, to_json
    from tests.reports import validate_json, validate_junit

    report = CommandReport("run", 0, "succeeded", 10.0, 40.0,
                           extra={"run_id": "r", "world_size": 2, "master": "node1:29500",
                                  "stop_reason": None, "hangs": [], "attempts": _attempts()})
    doc = to_json(report)
    validate_json(doc, "run")
    for key in ("detected", "relaunched"):
        bad = copy.deepcopy(doc)
        del bad["run"]["attempts"][0][key]
        with pytest.raises(jsonschema.ValidationError, match=key):
            validate_json(bad, "run")
    bad = copy.deepcopy(doc)
    bad["run"]["attempts"][0]["detected"] = "soon"
    with pytest.raises(jsonschema.ValidationError):
        validate_json(bad, "run")
    suite = validate_junit(to_junit(report)).find("testsuite")
    case = next(c for c in suite.iter("testcase") if c.get("name") == "attempt 1")
    assert case.get("time") == "15.500"
    text = "".join(case.itertext())
    assert "timings: detected +14.0 s, stopping +14.0 s, ended +15.5 s, relaunched +16.5 s" \
        in text, text


def test_a_recovered_run_is_no_failure_in_json_or_junit() -> None:
    """Issue 55 item 2: attempt 1, relaunched, was a JUnit failure in a run that succeeded;
    the run section counts the restarts (a new field of dtrain.run/1)."""
    import copy

    import jsonschema

    from launcher.output.junit import to_junit
    from launcher.output.report import CommandReport, to_json
    from tests.reports import validate_json, validate_junit

    report = CommandReport("run", 0, "succeeded after 1 restart", 10.0, 40.0,
                           extra={"run_id": "r", "world_size": 2, "master": "node1:29500",
                                  "stop_reason": None, "hangs": [], "attempts": _attempts(),
                                  "restarts": 1})
    doc = to_json(report)
    validate_json(doc, "run")
    assert doc["run"]["restarts"] == 1 and doc["summary"] == "succeeded after 1 restart"
    bad = copy.deepcopy(doc)
    bad["run"]["restarts"] = -1
    with pytest.raises(jsonschema.ValidationError):
        validate_json(bad, "run")
    xml = to_junit(report)
    suite = validate_junit(xml).find("testsuite")
    assert suite.get("failures") == "0" and suite.get("skipped") == "1"
    case = next(c for c in suite.iter("testcase") if c.get("name") == "attempt 1")
    (skipped,) = case.findall("skipped")
    assert skipped.get("message") == ("attempt 1 failed: node: node2 lost (no heartbeat for "
                                      "5 s) (exit 255) after 15.5 s; relaunched")
    assert '<property name="restarts" value="1" />' in xml


def test_the_summary_of_a_retried_attempt_and_of_the_last() -> None:
    from launcher.decide.outcome.verdict import restarts_text

    assert restarts_text(0) == "" and restarts_text(1) == " after 1 restart"
    assert restarts_text(3) == " after 3 restarts"


def test_doctor_names_the_hosts_on_the_lemon_list(tmp_path: Path) -> None:
    import time

    from launcher.commands.nodes import fenced_notes

    store = LemonStore(tmp_path / "s")
    now = time.time()
    store.remember([lm.Lemon("n2", "lost", "run-9", now - 60, now + 60)])
    assert fenced_notes(["n1", "n2"], store) == [
        "n2 is on the lemon list: fenced by run run-9 60 s ago (lost); runs with a spare "
        "host leave it out (`dtrain nodes unfence n2`)"]


def test_dtrain_nodes_unfence_expire_and_durations(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    import time

    from launcher.commands.nodes import expire, list_nodes, parse_duration, unfence

    assert parse_duration("90s") == 90 and parse_duration("2h") == 7200
    assert parse_duration("7d") == 7 * 86400 and parse_duration("5") == 5
    with pytest.raises(UsageError):
        parse_duration("soon")
    store = LemonStore(tmp_path / "s")
    now = time.time()
    store.remember([lm.Lemon(h, "lost", "r", now - 10, now + 100) for h in ("n1", "n2", "n3")])
    assert unfence(["n[1-2]", "n9"], store) == 0
    assert [x.host for x in store.load()] == ["n3"]
    assert unfence(["n9"], store) == 1
    assert expire("0", store) == 0 and store.load() == []
    capsys.readouterr()
    assert list_nodes(as_json=True, store=store) == 0
    assert json.loads(capsys.readouterr().out)["nodes"] == []


def test_unfence_takes_a_host_as_the_hostfile_spells_it(tmp_path: Path) -> None:
    """Issue 55 item 5: `nodes unfence dtuser@login1:2222` read the @ as a node group."""
    import time

    from launcher.commands.nodes import unfence
    from tests.util import assert_exit, dtrain

    store = LemonStore(tmp_path / "s")
    now = time.time()
    store.remember([lm.Lemon(h, "lost", "r", now - 10, now + 100)
                    for h in ("login1:2222", "login1:2223", "n1", "127.0.0.1:2202")])
    assert unfence(["dtuser@login1:2222"], store) == 0
    assert [x.host for x in store.load()] == ["login1:2223", "n1", "127.0.0.1:2202"]
    assert unfence(["login1:2222"], store) == 1  # gone already
    assert unfence(["alice@n1", "127.0.0.1:2202"], store) == 0
    assert [x.host for x in store.load()] == ["login1:2223"]
    assert unfence(["login1"], store) == 0  # a name without a port: any port
    assert store.load() == []
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    res = dtrain(["nodes", "unfence", "dtuser@node9:2222"], env=env)
    assert_exit(res, 1)
    assert "not on the list: node9:2222" in res.stdout, res.stdout + res.stderr


# -- the words and keys the policy reads, whole -----------------------------------------------

def test_nnodes_error_names_the_option_and_what_spares_are() -> None:
    for bad, option in (("0", "--nnodes"), ("4:2", "--min-nodes")):
        with pytest.raises(UsageError) as err:
            parse_nnodes(bad, option) if option != "--nnodes" else parse_nnodes(bad)
        assert (err.value.message, err.value.hint) == (
            f"{option} {bad!r}: give a number of nodes (3) or MIN:MAX (2:4)",
            "the hosts beyond MAX are spares: they replace a fenced node")
    assert parse_nnodes("1:1") == NodeCount(1, 1) and parse_nnodes("10") == NodeCount(10, 10)


def test_signature_words_whole() -> None:
    from launcher.decide.outcome.failures import FailureReason
    a = explain(rank=1, host="a", code=1, sig=None, stderr=TRACE)
    assert signature(a) == "exception: ValueError: bad batch 7 in main() train.py:31"
    crash = FailureReason("segfault", "s", "a", details={
        "frames": ["f1() a.py:1", "f2() a.py:2", "f3", "f4", "f5"]})
    assert signature(crash) == "segfault: f1() a.py:1 <- f2() a.py:2 <- f3 <- f4"
    assert signature(FailureReason("abort", "s", "a", details={"frames": ["g() b.py:9"]})) == \
        "abort: g() b.py:9"
    for none in (FailureReason("abort", "s", "a"), FailureReason("exception", "no word", "a"),
                 FailureReason("exit", "x raised y", "a"),
                 FailureReason("segfault", "s", "a", details={"frames": []})):
        assert signature(none) is None


def test_the_exception_type_is_the_last_dotted_name_of_the_first_evidence_line() -> None:
    from launcher.decide.outcome import restarts
    from launcher.decide.outcome.failures import FailureReason
    assert restarts._exception_type(FailureReason(
        "exception", "s", "a", evidence=("torch.cuda.OutOfMemoryError: CUDA out: of memory",
                                         "ValueError: x"))) == "OutOfMemoryError"
    assert restarts._exception_type(FailureReason("exception", "s", "a")) == ""


def test_argparse_errors_need_usage_and_the_error_line_last() -> None:
    from launcher.decide.outcome import restarts
    ok = AttemptEnd(2, "rank", stderr=("usage: train.py [-h]", "  ", "       [--lr LR]",
                                       "train.py: error: unrecognized arguments: --x  "))
    assert restarts._argparse_error(ok) == "train.py: error: unrecognized arguments: --x"
    for stderr, code in [(ok.stderr, 1), (ok.stderr[1:], 2), (ok.stderr[:3], 2),
                         ((*ok.stderr, "more"), 2), (("usage: x", "x: error:"), 2), ((), 2)]:
        assert restarts._argparse_error(AttemptEnd(code, "rank", stderr=stderr)) is None, stderr


def test_lemon_ages_and_lines_whole() -> None:
    assert [lm.ago(s) for s in (-5, 0, 40.4, 119, 120, 7199, 7200, 10800)] == [
        "0 s", "0 s", "40 s", "119 s", "2 min", "120 min", "2 h", "3 h"]
    lemon = lm.Lemon("node2", "lost (no heartbeat)", "r1", t=100.0, until=200.0)
    assert lm.kept_line(lemon, 160.0) == (
        "warning: node2 was fenced by run r1 60 s ago (lost (no heartbeat)); used anyway: this "
        "run needs every host it was given (--nnodes with a spare host leaves it out; "
        "`dtrain nodes unfence node2`)")
    older = lm.Lemon("node2", "old", "r0", t=50.0, until=300.0)
    expired = lm.Lemon("node3", "x", "r0", t=10.0, until=150.0)
    assert lm.current([lemon, older, expired], 160.0) == {"node2": lemon}
    assert lm.current([lemon, expired], 150.0) == {"node2": lemon}


def _fault(end: AttemptEnd, before: tuple[Fault, ...] = ()) -> tuple[object, ...]:
    f = classify(end, before)
    return (f.kind, f.why, f.fence, f.signature)


def test_classify_every_branch_whole() -> None:
    from launcher.decide.outcome.failures import FailureReason
    assert _fault(AttemptEnd(0, None)) == (FINAL, "succeeded", (), None)
    assert _fault(AttemptEnd(130, "interrupted")) == (FINAL, "interrupted", (), None)
    assert _fault(AttemptEnd(124, "timeout")) == (FINAL, "--timeout reached", (), None)
    why = "lost (no heartbeat for 10 s, last 12:00)"
    assert _fault(AttemptEnd(1, "lost", host="node2",
                             error="no heartbeat for 10 s (last 12:00)")) == (
        NODE, f"node2 {why}", (("node2", why),), None)
    assert _fault(AttemptEnd(1, "lost", host="node2")) == (
        NODE, "node2 lost (connection lost)", (("node2", "lost (connection lost)"),), None)
    # no host and no lost list: the line names no one, but it still reads as a sentence
    # (it said " lost (connection lost)"; mutant 35 makes it "None lost")
    assert _fault(AttemptEnd(1, "lost")) == (
        NODE, "a node (not named) lost (connection lost)", (), None)
    assert _fault(AttemptEnd(1, "rank", host="node1", lost=("node3", "node4"),
                             error="connection reset")) == (
        NODE, "node3, node4 lost (connection reset)",
        (("node3", "lost (connection reset)"), ("node4", "lost (connection reset)")), None)
    assert _fault(AttemptEnd(1, "start", host="node2", error="ssh: connect refused")) == (
        NODE, "node2 ssh: connect refused", (("node2", "ssh: connect refused"),), None)
    assert _fault(AttemptEnd(1, "start", host="node2"))[1] == "node2 did not start"
    assert _fault(AttemptEnd(1, "hang", host="node2", error="rank 3 in all_reduce")) == (
        PROCESS, "node2: hang culprit (rank 3 in all_reduce); where its stack stood is not "
        "known: no evidence of the machine", (), None)
    assert "(no progress)" in _fault(AttemptEnd(1, "hang", host="node2"))[1]
    assert _fault(AttemptEnd(1, "hang")) == (PROCESS, "hang", (), None)
    assert _fault(AttemptEnd(1, "hang", error="no culprit")) == (PROCESS, "no culprit", (), None)
    # an Xid fences its node when the driver's catalogue says so, or the explanation does
    for xid, scope, kind in [(13, "process", PROCESS), (13, "node", NODE), (79, "process", NODE),
                             (None, "process", NODE)]:
        reason = FailureReason("xid", f"Xid {xid}", "a", scope=scope, host="n2",
                               details={"xid": xid} if xid is not None else {})
        fence = (("n2", f"Xid {xid}"),) if kind == NODE else ()
        assert _fault(AttemptEnd(1, "rank", "n2", 1, reason, True)) == (
            kind, f"Xid {xid}", fence, None), (xid, scope)
    assert _fault(AttemptEnd(1, "rank", "n2", 1, None, False)) == (
        USER, "exit 1 before any progress line (a restart would fail the same way; --progress "
        "REGEX names the script's progress lines)", (), None)
    assert _fault(AttemptEnd(1, "rank", "n2", 1, None, True)) == (PROCESS, "exit 1", (), None)
    assert _fault(AttemptEnd(1, "node", "n2", 1, None, True, error="boom")) == (
        PROCESS, "boom", (), None)
    exc = _rank_end(TRACE)
    sig = "exception: ValueError: bad batch 7 in main() train.py:31"
    first = classify(exc)
    assert (first.kind, first.signature) == (PROCESS, sig)
    assert _fault(exc, (first,)) == (
        USER, "rank 3 on node2 raised ValueError: bad batch 7 in main() train.py:31 (the same "
        "failure at the same place as the attempt before)", (), sig)


def test_decide_lines_whole() -> None:
    policy = RestartPolicy(restarts=2, backoff=5.0)
    lost = AttemptEnd(1, "lost", host="n2", error="no heartbeat")
    fenced = (("n2", "lost (no heartbeat)"),)
    cases = [
        ((lost, [], 1, policy, ["n1", "n2"], ["n3"], NodeCount(2, 2)),
         (True, "n2 lost (no heartbeat): fenced, spare n3 in; attempt 2 from the last "
          "checkpoint in 5 s", 5.0, fenced)),
        ((lost, [], 1, policy, ["n1", "n2"], [], NodeCount(1, 2)),
         (True, "n2 lost (no heartbeat): fenced, shrinking to 1 node; attempt 2 from the last "
          "checkpoint in 5 s", 5.0, fenced)),
        ((lost, [], 1, policy, ["n1", "n2"], [], NodeCount(2, 2)),
         (False, "n2 lost (no heartbeat): fenced; 1 usable node(s) left, the run needs at least "
          "2 (--nnodes 2); no spare left", 0.0, fenced)),
        ((lost, [], 3, policy, ["n1", "n2"], ["n3"], NodeCount(2, 2)),
         (False, "n2 lost (no heartbeat): fenced, spare n3 in; no restart left (--restarts 2)",
          0.0, fenced)),
        ((AttemptEnd(1, "rank", "n2", 1, None, True), [], 1, policy, ["n1", "n2"], [],
          NodeCount(2, 2)),
         (True, "exit 1; attempt 2 on the same nodes from the last checkpoint in 5 s", 5.0, ())),
        ((AttemptEnd(1, "rank", "n2", 1, None, True), [], 1, RestartPolicy(restarts=1, backoff=0),
          ["n1", "n2"], [], NodeCount(2, 2)),
         (True, "exit 1; attempt 2 on the same nodes from the last checkpoint", 0.0, ())),
        ((AttemptEnd(1, "rank", "n2", 1, None, False), [], 1, policy, ["n1", "n2"], [],
          NodeCount(2, 2)),
         (False, "exit 1 before any progress line (a restart would fail the same way; "
          "--progress REGEX names the script's progress lines): not restarted", 0.0, ())),
        ((AttemptEnd(0, None), [], 1, policy, ["n1", "n2"], [], NodeCount(2, 2)),
         (False, "", 0.0, ())),
    ]
    for args, expected in cases:
        d = decide(*args)  # type: ignore[arg-type]
        assert (d.relaunch, d.line, d.wait, d.fenced) == expected, args
    assert [backoff(a, 5.0) for a in (1, 2, 3, 4, 10)] == [0.0, 5.0, 10.0, 20.0, 30.0]
    assert backoff(3, 0) == 0.0 and backoff(5, 100.0, 60.0) == 100.0


def test_lemon_records_defaults_bad_ones_and_expiry() -> None:
    assert lm.Lemon.from_json({"host": "n1", "t": 5}) == lm.Lemon("n1", "", "", 5.0,
                                                                 5.0 + 24 * 3600.0)
    for bad in ({"t": 5}, {"host": "", "t": 5}, {"host": 3, "t": 5}, {"host": "n1"},
                {"host": "n1", "t": "x"}, {"host": "n1", "t": 5, "until": None}):
        assert lm.Lemon.from_json(bad) is None, bad
    assert lm.parse({"lemons": [{"host": "n1", "t": 1}, "junk", {"t": 2}]}) == [
        lm.Lemon("n1", "", "", 1.0, 1.0 + 24 * 3600.0)]
    assert lm.document([]) == {"lemons_version": 1, "lemons": []}
    a = lm.Lemon("a", "w", "r", t=0.0, until=100.0)
    b = lm.Lemon("b", "w", "r", t=50.0, until=1000.0)
    assert lm.expire([a, b], 100.0) == ([b], [a])  # over exactly at `until`
    assert lm.expire([a, b], 99.0, older_than=49.0) == ([], [a, b])  # fenced 49 s ago: old
    assert lm.expire([a, b], 99.0, older_than=50.0) == ([b], [a])
    assert lm.ago(12600) == "4 h"


def test_classify_and_decide_carry_the_fault_the_gang_and_the_signature() -> None:
    sig = "exception: ValueError: bad batch 7 in main() train.py:31"
    early = classify(_rank_end(TRACE, progressed=False))
    assert (early.kind, early.signature) == (USER, sig)
    assert classify(_rank_end(["boom"], progressed=False)).why == (
        "rank 3 on node2 exited 1: boom before any progress line (a restart would fail the "
        "same way; --progress REGEX names the script's progress lines)")
    typed = classify(_rank_end(["Traceback (most recent call last):",
                                '  File "/w/t.py", line 2, in <module>', "NameError: bad"]))
    assert (typed.kind, typed.why, typed.signature) == (
        USER, "rank 3 on node2 raised NameError: bad in <module>() t.py:2 (a NameError fails "
        "the same way on every attempt)", "exception: NameError: bad in <module>() t.py:2")
    policy = RestartPolicy(restarts=3, backoff=0)
    again = decide(_rank_end(TRACE), [classify(_rank_end(TRACE))], 2, policy, ["n1", "n2"], [],
                   NodeCount(2, 2))
    assert not again.relaunch and again.fault.kind == USER and again.line.endswith(
        "(the same failure at the same place as the attempt before): not restarted")
    done = decide(AttemptEnd(0, None), [], 1, policy, ["n1"], [], NodeCount(1, 1))
    assert done.fault.kind == FINAL
    two = decide(AttemptEnd(1, "rank", "n1", 0, None, True, lost=("n1", "n2")), [], 1, policy,
                 ["n1", "n2"], ["n3", "n4"], NodeCount(2, 2))
    assert two.line == ("n1, n2 lost (connection lost): fenced, spare n3 in, spare n4 in; "
                        "attempt 2 from the last checkpoint")
    assert two.fault.kind == NODE and two.gang is not None and two.gang.active == ("n3", "n4")
    stop = decide(AttemptEnd(1, "lost", host="n2"), [], 1, policy, ["n1", "n2"], [],
                  NodeCount(2, 2))
    assert stop.fault.kind == NODE and stop.gang is not None and stop.gang.stop
    last = decide(AttemptEnd(1, "lost", host="n2"), [], 4, policy, ["n1", "n2"], ["n3"],
                  NodeCount(2, 2))
    assert not last.relaunch and last.fault.kind == NODE and last.gang is not None
