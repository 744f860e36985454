"""Hangs, without the cluster: progress rules, faulthandler parsing, folding, the culprit,
the flight recorder's summary and the rank wrapper's fidelity to ``python SCRIPT``.

The recorded dumps in tests/data/hangs/ are real faulthandler output of the rank wrapper
(tests/workloads/hang.py on 2 ranks: rank 0 in all_reduce, rank 1 in time.sleep).
"""

from __future__ import annotations

import io
import json
import os
import pickle
import runpy
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest

from launcher.decide.outcome import flight, hang, stacks
from launcher.job.events import stack_answer as said
from launcher.models import OutputLine
from launcher.nodeside import rankshim
from tests.util import node_program

DATA = Path(__file__).parent / "data" / "hangs"
SHIM = node_program()  # the bundle torchrun starts as each worker


def _stack(rank: int, host: str, name: str, **sources: str) -> stacks.RankStack:
    return stacks.rank_stack(rank, host, said({"text": (DATA / name).read_text(),
                                                       "sources": sources}))


SLEEP_SRC = {"/work/wt-hangs/tests/workloads/hang.py:42": "time.sleep(3600)"}


# -- faulthandler dumps -------------------------------------------------------------------

def test_main_thread_is_the_users_without_the_wrapper_and_its_helper() -> None:
    s = stacks.rank_stack(1, "node3", said({"text": (DATA / "sleep.txt").read_text(),
                                       "sources": SLEEP_SRC}))
    assert [t.frames[0].func for t in s.threads] == ["load_batch"]  # helper thread left out
    assert [f.func for f in s.main] == ["load_batch", "main", "<module>"]
    assert s.place() == "time.sleep <- load_batch() hang.py:42"
    assert stacks.rank_stack(1, "n", said({"text": (DATA / "sleep.txt").read_text()})).place() \
        == "load_batch() hang.py:42"  # no source line: the frame itself


def test_library_frames_show_the_call_and_the_first_user_frame() -> None:
    s = _stack(0, "node1", "allreduce.txt")
    assert s.place() == "all_reduce <- step_once() hang.py:47"


def test_a_second_dump_in_the_same_file_wins() -> None:
    text = (DATA / "allreduce.txt").read_text() + "\n" + (DATA / "sleep.txt").read_text()
    threads = stacks.user_threads(stacks.parse_faulthandler(text))
    assert stacks.main_frames(threads)[0].func == "load_batch"


# -- folding and the culprit --------------------------------------------------------------

def _six(stuck: int = 4) -> list[stacks.RankStack]:
    hosts = ["node1", "node1", "node2", "node2", "node3", "node3"]
    return [_stack(r, hosts[r], "sleep.txt" if r == stuck else "allreduce.txt", **SLEEP_SRC)
            for r in range(6)]


def test_fold_names_the_rank_that_differs() -> None:
    folded = stacks.fold(_six(), range(6))
    assert folded.lines() == [
        "ranks 0-3,5 (5 ranks on 3 nodes): all_reduce <- step_once() hang.py:47",
        "rank 4 (node3): time.sleep <- load_batch() hang.py:42   <- likely culprit"]
    c = folded.culprit
    assert c is not None and (c.rank, c.host) == (4, "node3")
    assert c.json()["ranks"] == [4] and "the other 5 ranks wait in" in c.why
    assert (c.where, c.rule) == ("script", "wavefront")


def test_no_culprit_when_every_rank_waits_alike() -> None:
    folded = stacks.fold(_six(stuck=-1), range(6))
    assert folded.culprit is None and len(folded.groups) == 1


def test_a_rank_without_a_dump_is_its_own_group_and_the_culprit() -> None:
    ranks = [*_six(stuck=-1)[:5],
             stacks.rank_stack(5, "node3", said({"error": "no dump within 2 s"}))]
    folded = stacks.fold(ranks, range(6))
    assert folded.culprit is not None and folded.culprit.rank == 5
    assert folded.lines()[1].startswith("rank 5 (node3): no stack (no dump within 2 s)")


def test_ranks_of_one_node_name_the_node() -> None:
    ranks = _six(stuck=-1)
    ranks[4] = _stack(4, "node3", "sleep.txt", **SLEEP_SRC)
    ranks[5] = _stack(5, "node3", "sleep.txt", **SLEEP_SRC)
    c = stacks.fold(ranks, range(6)).culprit
    assert c is not None and c.rank is None and c.host == "node3"
    assert c.describe().startswith("ranks 4-5 on node3: time.sleep")


def test_missing_ranks_are_listed() -> None:
    folded = stacks.fold(_six()[:4], range(6))
    assert folded.missing == (4, 5)
    assert folded.lines()[-1] == "ranks 4-5: no answer from their node"


def _dump(*threads: tuple[str, list[tuple[str, int, str]]]) -> str:
    """A faulthandler dump: (header, [(path, line, func), innermost first]) per thread."""
    out = []
    for head, frames in threads:
        out.append(f"{head} (most recent call first):")
        out += [f'  File "{p}", line {n} in {f}' for p, n, f in frames]
        out.append("")
    return "\n".join(out)


LIB = "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py"
RUNPY = [("/usr/lib/python3.11/runpy.py", 88, "_run_code"),
         ("<frozen runpy>", 198, "_run_module_as_main")]


def test_parse_dumps_repeated_thread_and_crlf() -> None:
    first = _dump(("Thread 0x1", [("a.py", 1, "old")]), ("Thread 0x2", [("a.py", 2, "old2")]))
    # the same thread again with no current thread at all: a second dump; it wins
    second = _dump(("Thread 0x1", [("a.py", 10, "new")]))
    threads = stacks.parse_faulthandler(first + second)
    assert [(t.ident, t.current, [f.func for f in t.frames]) for t in threads] == [
        ("0x1", False, ["new"])]
    # two dumps whose threads differ, each with its current thread: the second wins
    a = _dump(("Current thread 0xa", [("x.py", 1, "one")]))
    b = _dump(("Current thread 0xb", [("x.py", 2, "two")]), ("Thread 0xc", [("x.py", 5, "helper")]))
    assert [(t.ident, t.current) for t in stacks.parse_faulthandler(a + b)] == [
        ("0xb", True), ("0xc", False)]
    # a dump through a Windows pipe (CRLF) reads the same; frames before any thread are noise
    crlf = ('  File "z.py", line 9 in stray\r\n' + b.replace("\n", "\r\n"))
    assert stacks.parse_faulthandler(crlf) == stacks.parse_faulthandler(b)
    assert stacks.parse_faulthandler("") == ()


def test_the_main_thread_without_dtrain_s_wrapper() -> None:
    # another launcher's dump: the thread at <module>, runpy's frames cut off
    worker = ("Current thread 0x2", [("w.py", 3, "work")])
    main = ("Thread 0x1", [("t.py", 7, "step"), ("t.py", 9, "<module>")])
    assert [f.func for f in stacks.main_frames(
        stacks.parse_faulthandler(_dump(worker, main)))] == ["step", "<module>"]
    # python -m: runpy's frames outside <module> are cut off the chosen thread
    by_m = ("Current thread 0x1", [("t.py", 7, "step"), ("t.py", 9, "<module>"), *RUNPY])
    assert [f.func for f in stacks.main_frames(
        stacks.parse_faulthandler(_dump(by_m)))] == ["step", "<module>"]
    # no thread at <module>: the current one; none current: the first
    no_module = stacks.parse_faulthandler(_dump(("Thread 0x1", [("t.py", 1, "a")]),
                                                ("Current thread 0x2", [("t.py", 2, "b")])))
    assert [f.func for f in stacks.main_frames(no_module)] == ["b"]
    none_current = stacks.parse_faulthandler(_dump(("Thread 0x1", [("t.py", 1, "a")]),
                                                   ("Thread 0x2", [("t.py", 2, "b")])))
    assert [f.func for f in stacks.main_frames(none_current)] == ["a"]
    assert stacks.main_frames(()) == ()
    # a thread that merely calls a function named like the wrapper's is not the wrapper
    lookalike = stacks.parse_faulthandler(_dump(
        ("Thread 0x1", [("mine.py", 4, "main")]),
        ("Current thread 0x2", [("t.py", 5, "step"), ("t.py", 6, "<module>")])))
    assert [f.func for f in stacks.main_frames(lookalike)] == ["step", "<module>"]


def test_rank_without_a_dump_errors_fold_by_their_text() -> None:
    none = stacks.rank_stack(0, "n1", said({}))
    assert (none.error, none.place(), none.key()) == ("no dump", "no stack (no dump)",
                                                      ("error", "no dump"))
    assert stacks.rank_stack(1, "n1", said({"text": "  \n", "error": "timeout 2 s"})).place() == \
        "no stack (timeout 2 s)"
    assert stacks.rank_stack(2, "n1", said({"text": "garbage"})).place() == "no Python frame"
    folded = stacks.fold([stacks.rank_stack(r, "n1", said({"error": e})) for r, e in
                          [(0, "x"), (1, "x"), (2, "y")]])
    assert [g.ranks for g in folded.groups] == [(0, 1), (2,)]


def _at(rank: int, host: str, *frames: tuple[str, int, str]) -> stacks.RankStack:
    text = _dump(("Current thread 0x1", list(frames)))
    return stacks.rank_stack(rank, host, said({"text": text}))


def test_culprit_rules_and_their_words() -> None:
    coll = [(LIB, 3252, "all_reduce"), ("t.py", 47, "step"), ("t.py", 60, "<module>")]
    other = [("t.py", 42, "load"), ("t.py", 60, "<module>")]
    # two groups of one: the one waiting in a collective waits for the other
    pair = stacks.fold([_at(0, "n1", *other), _at(1, "n2", *coll)])
    assert [g.ranks for g in pair.groups] == [(1,), (0,)]  # the collective first among equals
    assert pair.culprit is not None and pair.culprit.describe() == "rank 0 on n1: load() t.py:42"
    assert pair.culprit.json() == {
        "rank": 0, "host": "n1", "ranks": [0], "hosts": ["n1"], "place": "load() t.py:42",
        "why": "it has not reached the collective the other rank waits in, at "
               "all_reduce <- step() t.py:47", "where": "script", "rule": "wavefront"}
    # two equal groups, neither in a collective: no majority, no culprit
    third = [("t.py", 43, "save"), ("t.py", 60, "<module>")]
    assert stacks.fold([_at(0, "n1", *other), _at(1, "n1", *third)]).culprit is None
    # three places: every rank off the majority's, their places joined
    many = stacks.fold([_at(0, "n1", *coll), _at(1, "n1", *coll), _at(2, "n2", *other),
                        _at(3, "n3", *third)])
    c = many.culprit
    assert c is not None and (c.rank, c.host, c.ranks) == (None, None, (2, 3))
    assert c.place == "load() t.py:42; save() t.py:43"
    assert c.why == ("they have not reached the collective the other 2 ranks wait in, at "
                     "all_reduce <- step() t.py:47")
    assert c.describe() == "ranks 2-3: load() t.py:42; save() t.py:43"
    assert c.json()["hosts"] == ["n2", "n3"] and c.json()["host"] is None
    assert many.json()[1:] == [
        {"ranks": [2], "hosts": ["n2"], "place": "load() t.py:42",
         "frames": [{"path": "t.py", "line": 42, "func": "load"},
                    {"path": "t.py", "line": 60, "func": "<module>"}]},
        {"ranks": [3], "hosts": ["n3"], "place": "save() t.py:43",
         "frames": [{"path": "t.py", "line": 43, "func": "save"},
                    {"path": "t.py", "line": 60, "func": "<module>"}]}]
    assert many.json()[0]["ranks"] == [0, 1] and many.json()[0]["hosts"] == ["n1"]


def _majority_stuck() -> list[stacks.RankStack]:
    """Real dumps: ranks 0-3 (node1, node2) in time.sleep inside load_batch, ranks 4-5
    (node3) in all_reduce: a storage stall on two of three nodes."""
    hosts = ["node1", "node1", "node2", "node2", "node3", "node3"]
    return [_stack(r, hosts[r], "sleep.txt" if r < 4 else "allreduce.txt", **SLEEP_SRC)
            for r in range(6)]


def test_the_ranks_that_have_not_reached_the_collective_are_the_culprits_however_many() -> None:
    folded = stacks.fold(_majority_stuck(), range(6))
    c = folded.culprit
    assert c is not None and c.ranks == (0, 1, 2, 3), folded.lines()
    assert 4 not in c.ranks and 5 not in c.ranks
    assert c.place == "time.sleep <- load_batch() hang.py:42" and c.where == "script"
    assert c.why == ("they have not reached the collective the other 2 ranks wait in, at "
                     "all_reduce <- step_once() hang.py:47")
    assert folded.lines() == [
        "ranks 0-3 (4 ranks on 2 nodes): time.sleep <- load_batch() hang.py:42   <- likely culprit",
        "ranks 4-5 (node3): all_reduce <- step_once() hang.py:47"]
    # one rank stuck, one waiting: the one waiting is the victim either way round
    pair = stacks.fold([_stack(0, "n1", "allreduce.txt"), _stack(1, "n2", "sleep.txt")])
    assert pair.culprit is not None and pair.culprit.ranks == (1,)


def test_the_flight_recorder_s_sequence_numbers_say_who_is_behind() -> None:
    at = flight.RankFlight
    six = _majority_stuck()
    # it agrees with the stacks: ranks 0-3 are at #3, 4-5 wait in #4
    pos = {r: at(r, 3 if r < 4 else 4, 3, "gloo:all_reduce") for r in range(6)}
    c = stacks.fold(six, range(6), pos).culprit
    assert c is not None and (c.ranks, c.rule, c.where) == ((0, 1, 2, 3), "flight", "script")
    assert c.why == ("they have not entered collective #4 (gloo:all_reduce), which the other "
                     "2 ranks wait in (flight recorder: at #3)")
    # every rank inside a collective by its own stack: each waits by its own word, and
    # another rank's higher number, or the op most ranks wait in, accuses nobody
    # (tests/test_no_cross_blame.py)
    coll = [_stack(r, "node1" if r < 3 else "node2", "allreduce.txt") for r in range(6)]
    pos = {r: at(r, 7, 6, "gloo:all_reduce") for r in range(6)}
    pos[1] = at(1, 6, 5, "gloo:all_reduce")
    assert stacks.fold(coll, range(6), pos).culprit is None
    pos = {r: at(r, 5 if r < 5 else 6, 5, None) for r in range(6)}
    assert stacks.fold(coll, range(6), pos).culprit is None
    pos = {r: at(r, 7, 6, "gloo:broadcast" if r == 2 else "gloo:all_reduce") for r in range(6)}
    assert stacks.fold(coll, range(6), pos).culprit is None
    # numbers that do not tell (nothing in flight anywhere): the stacks decide; ranks with no
    # stack ignored
    same = {r: at(r, 4, 4, None) for r in range(6)} | {9: at(9, 1, 1, None)}
    c = stacks.fold(six, range(6), same).culprit
    assert c is not None and (c.ranks, c.rule) == ((0, 1, 2, 3), "wavefront")
    # a rank outside the collective whose own record shows one in flight waits (NCCL returns
    # from the call at once): cleared by its own word
    pending = {r: at(r, 4, 3, None) for r in range(6)}
    assert stacks.fold(six, range(6), pending).culprit is None


def test_only_when_nothing_else_tells_the_group_that_differs() -> None:
    coll = [(LIB, 3252, "all_reduce"), ("t.py", 47, "step"), ("t.py", 60, "<module>")]
    bar = [(LIB, 99, "barrier"), ("t.py", 50, "sync"), ("t.py", 60, "<module>")]
    # every rank waits in some collective by its own stack: a majority is no evidence against
    # the rank in another one (tests/test_no_cross_blame.py)
    assert stacks.fold([_at(0, "n1", *coll), _at(1, "n1", *coll), _at(2, "n2", *bar)]
                       ).culprit is None
    # no rank in a collective: the group that differs
    load = [("t.py", 42, "load"), ("t.py", 60, "<module>")]
    save = [("t.py", 43, "save"), ("t.py", 60, "<module>")]
    c = stacks.fold([_at(0, "n1", *load), _at(1, "n1", *load), _at(2, "n2", *save)]).culprit
    assert c is not None and (c.ranks, c.rule, c.where) == ((2,), "differs", "script")
    none = stacks.fold([_at(0, "n1", *coll), _at(1, "n2", {"error": "x"} and ("t.py", 1, "f"))])
    assert none.culprit is not None and none.culprit.ranks == (1,)
    # no stack at all: not inside a collective, and native
    gone = stacks.fold([_at(0, "n1", *coll),
                        stacks.rank_stack(1, "n2", said({"error": "no dump"}))])
    assert gone.culprit is not None and gone.culprit.where == "native"


def test_a_library_frame_with_no_user_frame_is_shown_as_it_is() -> None:
    s = _at(0, "n1", (LIB, 10, "barrier"))
    assert s.place() == "barrier() distributed_c10d.py:10"


# -- progress -------------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "step 12 loss 0.3", "Epoch 2/10", "{'loss': 0.3121, 'learning_rate': 1e-4}",
    "train_loss=0.3", "global_step=100", "iter: 3", " 45%|####5     | 45/100 [00:10<00:12]",
    "Epoch 0: 10%|#| 10/100 [00:01<00:09, 9.52it/s]", "it 3"])
def test_default_progress_matches_common_lines(text: str) -> None:
    assert hang.compile_progress(None).search(text)


@pytest.mark.parametrize("text", ["waiting for data", "stepping down", "NCCL INFO Bootstrap",
                                  "Loaded 3 shards"])
def test_default_progress_skips_other_lines(text: str) -> None:
    assert not hang.compile_progress(None).search(text)


def _line(t: float, text: str, rank: int = 0, stream: str = "out") -> OutputLine:
    return OutputLine("node1", stream, text, rank, 0, t)


def test_only_progress_lines_count_once_one_was_seen() -> None:
    policy = hang.HangPolicy(timeout=3)
    w = hang.ProgressWatch(hang.compile_progress(r"^it \d+"), range(2), start=100.0)
    w.observe([_line(101, "loading"), _line(102, "it 0")])
    w.observe([_line(t, "waiting for data") for t in (103, 104, 105, 106)])
    assert w.baseline() == 102 and w.ranks[0].last_line == 106
    assert hang.hang_due(w, 105.5, policy, all_alive=True, declared=None)
    assert not hang.hang_due(w, 105.5, policy, all_alive=False, declared=None)
    assert not hang.hang_due(w, 105.5, policy, all_alive=True, declared=102)  # said once
    w.observe([_line(107, "it 1", rank=1)])
    assert not hang.hang_due(w, 109, policy, all_alive=True, declared=102)
    assert hang.hang_due(w, 110.5, policy, all_alive=True, declared=102)  # a new stall


def test_before_any_progress_line_any_line_counts_and_startup_has_grace() -> None:
    policy = hang.HangPolicy(timeout=3, startup_grace=60)
    w = hang.ProgressWatch(hang.compile_progress(None), range(1), start=100.0)
    assert not hang.hang_due(w, 150, policy, all_alive=True, declared=None)  # importing
    assert hang.hang_due(w, 161, policy, all_alive=True, declared=None)  # never a line
    w.observe([_line(200, "downloading shards")])
    assert not hang.hang_due(w, 202, policy, all_alive=True, declared=None)
    assert hang.hang_due(w, 203.5, policy, all_alive=True, declared=None)
    assert not hang.hang_due(w, 1e9, hang.HangPolicy(timeout=0), all_alive=True,
                             declared=None)  # 0 = off


def _ticks(w: hang.ProgressWatch, policy: hang.HangPolicy, start: float, end: float,
           late_at: float | None = None, stall: float = 0.0) -> list[float]:
    """The hang watch's 0.5 s ticks from start to end (the one due at ``late_at`` runs
    ``stall`` s late, the launcher stopped): the times a hang was due."""
    due, hung = start, []
    while due < end:
        now = due + (stall if late_at is not None and abs(due - late_at) < 1e-9 else 0.0)
        w.look(now, due, 0.5)
        if hang.hang_due(w, now, policy, all_alive=True, declared=None):
            hung.append(now)
        due = now + 0.5
    return hung


def test_a_stopped_launcher_is_not_a_hang_and_a_real_stall_still_is() -> None:
    """The launcher is stopped 8 s (past --hang-timeout 3) while the ranks progress: the
    stall is its own (decide/outcome/liveness.py), not counted; the lines of that time, read after
    the late tick, move the baseline. Then the ranks really stop: hung 3 s later."""
    policy = hang.HangPolicy(timeout=3)
    w = hang.ProgressWatch(hang.compile_progress(r"^it \d+"), range(1), start=100.0)
    w.observe([_line(100.2, "it 0"), _line(101.2, "it 1")])
    assert _ticks(w, policy, 100.5, 102.5, late_at=102.0, stall=8.0) == []  # late: 110.0
    assert w.stalled_for(110.0) == pytest.approx(0.8)  # 101.2 .. 102.0, the rest is ours
    w.observe([_line(110.1, f"it {n}") for n in range(2, 18)])  # the backlog, read now
    assert _ticks(w, policy, 110.5, 113.0) == []
    assert _ticks(w, policy, 113.0, 114.0) == [113.5]  # 110.1 + 3: a real stall
    # the old judgement (wall time) would have called the stop itself a hang
    old = hang.ProgressWatch(hang.compile_progress(r"^it \d+"), range(1), start=100.0)
    old.observe([_line(101.2, "it 1")])
    assert old.stalled_for(110.0) == pytest.approx(8.8)


def test_a_hang_through_a_launcher_stall_counts_only_the_launcher_s_running_time() -> None:
    policy = hang.HangPolicy(timeout=3)
    w = hang.ProgressWatch(hang.compile_progress(r"^it \d+"), range(1), start=100.0)
    w.observe([_line(100.0, "it 0")])
    # stalled 2 s, then 8 s stopped (its late tick judges with one more tick of margin),
    # nothing read after it either: hung at 2 + 1 s more of the launcher's running time
    assert _ticks(w, policy, 100.5, 113.0, late_at=102.0, stall=8.0)[0] == pytest.approx(111.0)
    # a loaded loop's jitter (tens of ms) is not a stall of ours: counted as the ranks'
    j = hang.ProgressWatch(hang.compile_progress(r"^it \d+"), range(1), start=100.0)
    j.observe([_line(100.0, "it 0")])
    for k in range(1, 7):
        j.look(100.0 + 0.5 * k + 0.05, 100.0 + 0.5 * k, 0.5)
    assert hang.hang_due(j, 103.05, policy, all_alive=True, declared=None)


def test_a_late_look_waits_one_more_tick_before_it_declares_a_hang() -> None:
    """A look that came late (the launcher itself stalled) may run before the reader has
    drained what the ranks sent meanwhile: past the timeout by the ranks' own silence, it
    still waits one tick (the margin); the next look on time declares the hang."""
    policy = hang.HangPolicy(timeout=3)
    w = hang.ProgressWatch(hang.compile_progress(r"^it \d+"), range(1), start=100.0)
    w.observe([_line(100.0, "it 0")])
    for k in range(1, 6):  # on time, every 0.5 s: 2.5 s of the ranks' silence
        w.look(100.0 + 0.5 * k, 100.0 + 0.5 * k, 0.5)
        assert not hang.hang_due(w, 100.0 + 0.5 * k, policy, all_alive=True, declared=None)
    w.look(104.0, 103.0, 0.5)  # 1 s late: ours; the ranks' silence is 3 s, the timeout
    assert w.stalled_for(104.0) == pytest.approx(3.0)
    assert w.margin == 0.5
    assert not hang.hang_due(w, 104.0, policy, all_alive=True, declared=None)
    w.look(104.5, 104.5, 0.5)  # on time: no margin, 3.7 s of silence
    assert w.margin == 0.0
    assert hang.hang_due(w, 104.5, policy, all_alive=True, declared=None)


def test_bad_progress_pattern_is_a_usage_error() -> None:
    from launcher.errors import UsageError

    with pytest.raises(UsageError) as err:
        hang.compile_progress("(")
    assert (err.value.message, err.value.hint) == (
        "--progress '(': missing ), unterminated subpattern at position 0",
        "a Python regular expression, searched in each output line")


def test_which_lines_count_and_what_meta_json_keeps_per_rank() -> None:
    w = hang.ProgressWatch(hang.compile_progress(r"^it \d+"), [0, 1], start=100.0)
    # dtrain's own lines and the node program's (no rank) are not the job's; they never
    # stop the rest of a batch from counting
    w.observe([_line(101, "it 0", stream="dtrain"),
               OutputLine("node1", "out", "it 0", None, 0, 101),
               _line(102, "it 0", rank=0, stream="err"), _line(102, "it 0", rank=1)])
    # a rank the watch was not told about (an elastic restart's) is followed too
    w.observe([_line(103, "it 1", rank=5)])
    assert w.json() == {
        "0": {"last_line": 102, "last_progress": 102, "progress_line": "it 0"},
        "1": {"last_line": 102, "last_progress": 102, "progress_line": "it 0"},
        "5": {"last_line": 103, "last_progress": 103, "progress_line": "it 1"}}
    assert (w.last, w.last_rank, w.last_text) == (103, 5, "it 1")


def test_progress_is_kept_to_a_second_and_a_tie_goes_to_the_later_line() -> None:
    w = hang.ProgressWatch(hang.compile_progress(r"^it \d+"), [0, 1], start=100.0)
    w.observe([_line(110, "it 1", rank=0), _line(110, "it 1", rank=1)])
    assert (w.last, w.last_rank) == (110, 1)  # the same time: the later line names the rank
    w.observe([_line(110.5, "it 2", rank=0)])  # under RESOLUTION_S: not looked at
    assert w.ranks[0].progress_text == "it 1" and w.ranks[0].last_line == 110.5
    # a skipped line does not end the batch: the next rank's line in it still counts
    w2 = hang.ProgressWatch(hang.compile_progress(r"^it \d+"), [0, 1], start=100.0)
    w2.observe([_line(110, "it 1", rank=0)])
    w2.observe([_line(110.5, "it 2", rank=0), _line(110.6, "it 5", rank=1)])
    assert (w2.ranks[0].progress_text, w2.ranks[1].progress_text) == ("it 1", "it 5")
    w.observe([_line(111, "it 3", rank=0)])  # exactly RESOLUTION_S later: counted
    assert (w.ranks[0].last_progress, w.ranks[0].progress_text) == (111, "it 3")
    # a stall is measured from the baseline, never negative, and due exactly at the timeout
    assert w.stalled_for(111) == 0.0 and w.stalled_for(100) == 0.0
    policy = hang.HangPolicy(timeout=3)
    assert hang.hang_due(w, 114, policy, all_alive=True, declared=None)
    assert not hang.hang_due(w, 113.9, policy, all_alive=True, declared=None)


def test_a_watch_before_any_line_has_no_last_progress() -> None:
    w = hang.ProgressWatch(hang.compile_progress(None), [0], start=5.0)
    assert (w.last_text, w.last_rank, w.any_line, w.any_progress) == (None, None, False, False)
    assert w.json() == {"0": {"last_line": None, "last_progress": None, "progress_line": None}}


# -- the flight recorder ------------------------------------------------------------------

def _fr(enq: int, done: int) -> bytes:
    return pickle.dumps({"version": "2.10", "pg_status": {"0": {
        "last_enqueued_collective": enq, "last_started_collective": -1,
        "last_completed_collective": done}}, "entries": [
        {"pg_id": 0, "collective_seq_id": enq, "profiling_name": "gloo:all_reduce",
         "process_group": ("0", "default_pg")}]})


def test_flight_summary_names_the_rank_behind() -> None:
    dumps = {r: flight.load_dump(_fr(3, 3) if r == 4 else _fr(4, 3)) for r in range(6)}
    positions = {r: p for r, d in dumps.items() if d and (p := flight.rank_flight(r, d))}
    s = flight.summarize(positions)
    assert s is not None and s.behind == (4,)
    assert s.lines == ("ranks 0-3,5 wait in collective #4 (gloo:all_reduce)",
                       "rank 4 is at collective #3: it has not entered #4")


def _pos(enq: int, done: int, op: str | None = "gloo:all_reduce") -> dict[str, object]:
    return {"pg_status": {"0": {"last_enqueued_collective": enq,
                                "last_completed_collective": done}},
            "entries": [{"pg_id": 0, "collective_seq_id": enq, "profiling_name": op}]}


def test_rank_flight_reads_the_default_group_and_its_last_collective() -> None:
    assert flight.rank_flight(0, _pos(4, 3)) == flight.RankFlight(0, 4, 3, "gloo:all_reduce")
    # the default group is "0"; without it the first group listed
    two = {"pg_status": {"1": {"last_enqueued_collective": 9, "last_completed_collective": 9},
                         "0": {"last_enqueued_collective": 4, "last_completed_collective": 3}}}
    assert flight.rank_flight(0, two) == flight.RankFlight(0, 4, 3, None)
    other = {"pg_status": {"7": {"last_enqueued_collective": 2, "last_completed_collective": 1}}}
    assert flight.rank_flight(0, other) == flight.RankFlight(0, 2, 1, None)
    # the op is the default group's entry at that sequence number, the latest one
    entries = [{"pg_id": 0, "collective_seq_id": 4, "profiling_name": "nccl:broadcast"},
               {"pg_id": 1, "collective_seq_id": 4, "profiling_name": "nccl:all_gather"},
               {"collective_seq_id": 4, "profiling_name": "nccl:all_reduce"},
               {"pg_id": 0, "collective_seq_id": 5, "profiling_name": "nccl:barrier"},
               "junk"]
    assert flight.rank_flight(0, {**two, "entries": entries}).last_op == "nccl:all_reduce"
    assert flight.rank_flight(0, {**two, "entries": entries[:2]}).last_op == "nccl:broadcast"
    assert flight.rank_flight(0, {**two, "entries": [{"pg_id": "", "collective_seq_id": 4,
                                                      "profiling_name": "x"}]}).last_op == "x"
    assert flight.rank_flight(0, _pos(4, 3, op="")).last_op is None
    assert flight.rank_flight(0, _pos(4, 3, op=None)).last_op is None
    for bad in ({}, {"pg_status": {}}, {"pg_status": []}, {"pg_status": {"0": []}},
                {"pg_status": {"0": {"last_enqueued_collective": 1}}},
                {"pg_status": {"0": {"last_completed_collective": 1}}},
                {"pg_status": {"0": {"last_enqueued_collective": "1",
                                     "last_completed_collective": 1}}}):
        assert flight.rank_flight(0, bad) is None, bad


def test_flight_summary_words() -> None:
    at = flight.RankFlight
    one = flight.summarize({0: at(0, 4, 3, "gloo:all_reduce"), 1: at(1, 4, 4, None),
                            2: at(2, 3, 3, "gloo:all_reduce")})
    assert one is not None and one.lines == (
        "rank 0 waits in collective #4 (gloo:all_reduce)",
        "rank 1 completed collective #4 (gloo:all_reduce)",
        "rank 2 is at collective #3: it has not entered #4")
    # the op is taken from a rank at the front that knows it; none knows: no name
    anon = flight.summarize({2: at(2, 3, 3, "x"), 0: at(0, 4, 3, None), 1: at(1, 4, 3, None)})
    assert anon is not None and anon.lines[0] == "ranks 0-1 wait in collective #4"
    done = flight.summarize({0: at(0, 4, 4, None), 1: at(1, 4, 4, None)})
    assert done is not None and done.lines == ("ranks 0-1 completed collective #4",)
    assert done.behind == ()
    assert flight.summarize({}) is None


def test_flight_dumps_that_are_not_a_mapping_and_versions_that_do_not_parse() -> None:
    assert flight.load_dump(pickle.dumps([1, 2])) is None
    assert flight.load_dump(pickle.dumps({"a": 1})) == {"a": 1}
    with pytest.raises(pickle.UnpicklingError, match="io.BytesIO is not plain data"):
        flight._PlainUnpickler(io.BytesIO(pickle.dumps(io.BytesIO))).load()
    assert [flight.flight_names(v) for v in ("", "2.9+cu1", "nightly", "3.0")] == [
        "both", "current", "both", "current"]


def test_a_dump_that_names_a_class_is_not_loaded() -> None:
    evil = pickle.dumps({"x": io.BytesIO})  # any global: os.system would be the same
    assert flight.load_dump(evil) is None
    assert flight.load_dump(b"not a pickle") is None


@pytest.mark.parametrize("version, names", [("2.13.0+cpu", "current"), ("2.9.1", "current"),
                                            ("2.5.1+cu124", "both"), (None, "both")])
def test_flight_names_follow_torch(version: str | None, names: str) -> None:
    assert flight.flight_names(version) == names


def test_flight_defaults_leave_a_users_settings_alone() -> None:
    d = "/tmp/dtrain-x/flight"
    assert rankshim.flight_defaults({"TORCH_NCCL_TRACE_BUFFER_SIZE": "100"}, d) == {}
    assert rankshim.flight_defaults({}, d) == {
        "TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_FR_DUMP_TEMP_FILE": d + "/rank_"}
    mine = rankshim.flight_defaults({"TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
                                       "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/x/"}, d, "both")
    assert mine == {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}


def test_a_real_nccl_flight_dump_from_an_h200_names_the_collective() -> None:
    """A rank stuck in a GPU kernel before its all_reduce (bench/gpu/check.sh on an H200,
    torch 2.11, NCCL 2.28.9): NCCL's own recorder, as the shim dumps it now."""
    data = (Path(__file__).parent / "data" / "hangs"
            / "h200_nccl_2_28_9_flight_rank_0.pickle").read_bytes()
    dump = flight.load_dump(data)
    assert dump is not None and dump["comm_lib_version"] == "2.28.9"
    rf = flight.rank_flight(0, dump)
    assert rf == flight.RankFlight(0, 6, 5, "nccl:all_reduce")
    summary = flight.summarize({0: rf})
    assert summary is not None
    assert summary.lines == ("rank 0 waits in collective #6 (nccl:all_reduce)",)


@pytest.mark.parametrize("backend, expected", [
    ("nccl", b"nccl"), ("cpu:gloo,cuda:nccl", b"nccl"), ("gloo", b"fr")])
def test_an_nccl_job_dumps_nccls_own_recorder(backend: str, expected: bytes,
                                              monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    """torch keeps NCCL's collectives in their own recorder (_dump_nccl_trace); the other
    one is empty for an NCCL job (an H200 run, docs/gpu-check.md). A CPU torch has only
    _dump_fr_trace: then it is used whatever the backend."""
    calls: list[dict[str, Any]] = []

    def recorder(tag: bytes) -> Any:
        def dump(**kw: Any) -> bytes:
            calls.append(kw)
            return tag
        return dump

    c10d = types.SimpleNamespace(_dump_fr_trace=recorder(b"fr"),
                                 _dump_nccl_trace=recorder(b"nccl"))
    torch = types.SimpleNamespace(_C=types.SimpleNamespace(_distributed_c10d=c10d))
    dist = types.SimpleNamespace(is_initialized=lambda: True, get_backend=lambda: backend)
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    out = tmp_path / "rank_0"
    assert rankshim._flight_dump(str(out)) == {"ok": True, "size": len(expected)}
    assert out.read_bytes() == expected and calls == [{"includeStackTraces": False}]
    del c10d._dump_nccl_trace  # a torch built without NCCL
    assert rankshim._flight_dump(str(out))["ok"] and out.read_bytes() == b"fr"


# -- the rank wrapper behaves as `python SCRIPT` ----------------------------------------

SCRIPT = '''import sys, os
print(repr(sys.argv), __name__, os.path.basename(__file__), sys.path[0] == os.path.dirname(
    os.path.realpath(__file__)), __spec__)
def f():
    raise ValueError("bad batch")
if len(sys.argv) > 1 and sys.argv[1] == "raise":
    f()
if len(sys.argv) > 1 and sys.argv[1] == "exit":
    sys.exit(3)
'''


@pytest.mark.parametrize("arg", ["ok", "raise", "exit"])
def test_rank_wrapper_runs_a_script_as_python_does(tmp_path: Path, arg: str) -> None:
    script = tmp_path / "user.py"
    script.write_text(SCRIPT)
    plain = subprocess.run([sys.executable, "-u", str(script), arg], capture_output=True,
                           text=True, cwd=tmp_path)
    sock = tmp_path / "ranks.sock"  # nobody listens: arming is best effort
    wrapped = subprocess.run([sys.executable, "-u", str(SHIM), str(script), arg],
                             capture_output=True, text=True, cwd=tmp_path,
                             env={**os.environ, "DTRAIN_ARM_SOCK": str(sock), "RANK": "0"})
    assert (wrapped.returncode, wrapped.stdout, wrapped.stderr) == (
        plain.returncode, plain.stdout, plain.stderr)
    assert (tmp_path / "stacks" / "r0.txt").exists()  # armed all the same


def test_rank_wrapper_runs_a_module(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "job.py").write_text("import sys\nprint(__name__, sys.argv[1:])\n")
    wrapped = subprocess.run([sys.executable, "-u", str(SHIM), "-m", "pkg.job", "a"],
                             capture_output=True, text=True, cwd=tmp_path,
                             env={**os.environ, "DTRAIN_ARM_SOCK": str(tmp_path / "s"),
                                  "RANK": "0"})
    assert wrapped.stdout == "__main__ ['a']\n", wrapped.stderr


def test_the_shim_starts_workers_through_the_wrapper(monkeypatch: pytest.MonkeyPatch) -> None:
    # in the bundle the nodes run, the wrapper is the bundle's own file
    bundled = runpy.run_path(str(SHIM), run_name="dtrain_bundle")
    argv = bundled["rank_argv"](["train.py", "--lr", "1"], "/tmp/d/ranks.sock")
    assert argv[1:] == ["-u", str(SHIM), "train.py", "--lr", "1"]
    assert rankshim.rank_env("/tmp/d/ranks.sock")["DTRAIN_ARM_SOCK"] == "/tmp/d/ranks.sock"
    monkeypatch.setenv("DTRAIN_STACKS", "0")  # the escape hatch: plain python -u SCRIPT
    assert rankshim.rank_argv(["train.py"], "s")[1:] == ["-u", "train.py"]
    assert "DTRAIN_ARM_SOCK" not in rankshim.rank_env("s")


@pytest.mark.torch
def test_py_spy_where_the_node_has_it_lands_beside_the_stacks(tmp_path: Path) -> None:
    """A node with py-spy on the job's PATH: the supervisor runs `py-spy dump --native --pid
    P` for every rank and the archive holds what it printed (a stand-in py-spy here: the
    real one needs ptrace rights the test cannot count on)."""
    from tests.util import dtrain, need_module

    need_module("torch")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    spy = bin_dir / "py-spy"
    spy.write_text('#!/bin/sh\necho "py-spy stand-in: $*"\n'
                   'echo "    clock_nanosleep (libc.so.6)"\n')
    spy.chmod(0o755)
    archive = tmp_path / "runs"
    res = dtrain(["run", "-H", "localhost", "--nproc-per-node", "2", "--archive-dir",
                  str(archive), "--run-id", "spy", "--no-color", "--hang-timeout", "3",
                  "--on-hang", "stop", "--grace", "2", "--env",
                  f"PATH={bin_dir}:{os.environ['PATH']}", "tests/workloads/stall.py"],
                 timeout=170)
    assert res.returncode == 125, res.stdout + res.stderr
    dump = archive / "spy" / "stacks" / "h1"
    deadline = time.monotonic() + 10
    while not (dump / "r1.py-spy.txt").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    text = (dump / "r1.py-spy.txt").read_text()
    assert text.startswith("py-spy stand-in: dump --native --pid "), text
    assert "clock_nanosleep" in text


def _memory_cgroup() -> Path | None:
    """A fresh child of this process's memory cgroup (v1, or v2 with the memory controller
    delegated), or None where the machine does not let a test make one."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            base = Path("/sys/fs/cgroup/memory" + path.rstrip("/"))
        elif controllers == "" and Path("/sys/fs/cgroup/cgroup.controllers").exists():
            base = Path("/sys/fs/cgroup" + path.rstrip("/"))
            if "memory" not in (base / "cgroup.subtree_control").read_text():
                continue
        else:
            continue
        child = base / f"dtrain-oom-{os.getpid()}"
        try:
            child.mkdir()
            limit = child / ("memory.limit_in_bytes" if (child / "memory.limit_in_bytes")
                             .exists() else "memory.max")
            limit.write_text(str(200 * 1024 * 1024))
        except OSError:
            return None
        return child
    return None


@pytest.mark.torch
def test_an_oom_killed_rank_is_explained_as_oom(tmp_path: Path) -> None:
    """Live, on this machine (localhost; the sshd test nodes hide the cgroup tree and the
    kernel log): a rank moved into a 200 MiB memory cgroup allocates until the OOM killer
    ends it; dtrain says so, from the cgroup counter and (as root) the kernel log."""
    from tests.util import cannot_run, need_module

    need_module("torch")
    if os.getuid() != 0:
        cannot_run("moving a process into a memory cgroup needs root")
    cgroup = _memory_cgroup()
    if cgroup is None:
        cannot_run("this machine gives no memory cgroup a test can limit")
    archive = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "launcher", "run", "-H", "localhost",
                             "--nproc-per-node", "1", "--archive-dir", str(archive),
                             "--run-id", "oom", "--no-color", "--hang-timeout", "0",
                             "tests/workloads/oom.py"], cwd=Path(__file__).parents[1],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stdout is not None
        out = []
        for line in proc.stdout:
            out.append(line)
            if "oom-ready pid " in line:
                pid = line.rsplit(" ", 1)[1].strip()
                (cgroup / "cgroup.procs").write_text(pid)
        code = proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for _ in range(50):
            try:
                cgroup.rmdir()
                break
            except OSError:
                time.sleep(0.1)
    text = "".join(out)
    assert code == 137, text[-3000:]
    assert "why: rank 0 on localhost was killed by the kernel's OOM killer" in text, text[-3000:]
    failure = json.loads((archive / "oom" / "meta.json").read_text())[
        "root_cause"]["failure"]
    assert failure["kind"] == "oom" and failure["scope"] == "user", failure


def test_a_hang_is_typed_and_its_record_keeps_meta_json_s_shape() -> None:
    """decide/outcome/hang.Hang (issue 54 item 1): the watch keeps it typed; meta.json's hangs[]
    and --json's run.hangs are its json(), key for key what the dict record was."""
    culprit = stacks.Culprit((3,), ("n2",), "time.sleep <- f() a.py:1", "not in the collective",
                             "script", "wavefront")
    h = hang.Hang(5.0, 1, 3.0, culprit, None, "h1", None, "dump")
    assert json.dumps(h.json()) == json.dumps({
        "t": 5.0, "attempt": 1, "stalled_s": 3.0,
        "culprit": {"rank": 3, "host": "n2", "ranks": [3], "place": "time.sleep <- f() a.py:1",
                    "why": "not in the collective", "where": "script", "rule": "wavefront"},
        "folded": [], "dump": "h1", "dir": None, "action": "dump"})
    assert hang.Hang(5.0, 2, 3.0, None, None, "h2", "/r/stacks/h2", "stop").json()["culprit"] \
        is None
