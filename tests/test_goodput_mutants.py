"""decide/outcome/goodput.py: what issue 51's mutation round (docs/testing.md, "Mutation score")
found
no test for: the JSON document key by key and its rounding, the records the ledger skips, the
attempts meta.json lists (or not), hangs given oddly, checkpoints outside the carved causes,
and the progress and checkpoint patterns a run recorded."""

from __future__ import annotations

from typing import Any

import pytest

from launcher.decide.outcome.goodput import CAUSES, compile_checkpoint, ledger_of, percent
from launcher.errors import UsageError
from tests.test_goodput import rec


def zeros(**seconds: float) -> dict[str, float]:
    return {**dict.fromkeys(CAUSES, 0.0), **seconds}


def test_the_json_document_key_by_key_rounded() -> None:
    lines = [rec(1.50045 + s, f"step {s}", host="n1") for s in range(3)]
    lines += [rec(2.0 + s, f"step {s}", rank=1, host="n2") for s in range(3)]
    meta = {"start": 0.0, "end": 4.123456, "state": "finished"}
    doc = ledger_of(meta, lines).json()
    assert doc == {
        "schema": 1, "wall_s": 4.123, "goodput": 0.485, "running": False,
        "seconds": zeros(startup=1.5, productive=2.0, winddown=0.623),
        "attempts": [{"n": 1, "wall_s": 4.123, "goodput": 0.485,
                      "seconds": zeros(startup=1.5, productive=2.0, winddown=0.623),
                      "resumed_at": 0, "highest_step": 2, "lost_steps": None,
                      "startup_split": None}],
        "not_measured": [], "notes": [],
        "step_time": {"ranks": {"0": 1.0, "1": 1.0}, "nodes": {"n1": 1.0, "n2": 1.0}},
        "startup_split": None,
        "segments": [[0.0, 1.5, "startup", 1], [1.5, 3.5, "productive", 1],
                     [3.5, 4.123, "winddown", 1]]}
    assert [type(x) for x in doc["segments"][1][:2]] == [float, float]
    # not measured: None in the document, and named
    none = ledger_of({"start": 0.0, "end": 2.0, "state": "finished"}, [rec(1.0, "hi")]).json()
    assert none["goodput"] is None and none["seconds"]["productive"] is None
    assert none["not_measured"] == ["lost", "productive"]
    assert none["notes"] == ["no progress line in the output: productive and lost time not "
                             "measured (give --progress REGEX)"]


def test_percent() -> None:
    assert percent(None) == "-"
    assert percent(0.5) == "50%" and percent(0.874) == "87%" and percent(1.0) == "100%"


def test_records_the_ledger_skips() -> None:
    lines = [rec(1.0 + s, f"step {s}") for s in range(4)]
    junk: list[dict[str, Any]] = [
        {**rec(9.0, "step 99"), "stream": "dtrain"},  # dtrain's own lines
        {**rec(9.0, "step 99"), "rank": None},  # no rank
        {**rec(9.0, "step 99"), "rank": True},
        {**rec(9.0, "step 99"), "line": None},
        {**rec(9.0, "step 99"), "line": b"step 99"},
        {**rec(9.0, "step 99"), "t": None},
        {**rec(9.0, "step 99"), "t": "9.0"},
    ]
    led = ledger_of({"start": 0.0, "end": 10.0, "state": "finished"}, lines + junk)
    assert led.totals["productive"] == 3.0 and led.totals["winddown"] == 6.0
    assert led.attempts[0].highest == 3


def test_a_record_without_an_attempt_is_the_first_attempts() -> None:
    lines = [{k: v for k, v in rec(1.0 + s, f"step {s}").items() if k != "attempt"}
             for s in range(4)]
    led = ledger_of({"start": 0.0, "end": 5.0, "state": "finished"}, lines)
    assert led.totals["productive"] == 3.0 and led.attempts[0].highest == 3


def test_a_node_is_named_only_by_a_string() -> None:
    lines = [{**rec(1.0 + s, f"step {s}"), "host": 7} for s in range(3)]
    lines += [rec(1.0 + s, f"step {s}", rank=1, host="n2") for s in range(3)]
    led = ledger_of({"start": 0.0, "end": 4.0, "state": "finished"}, lines)
    assert led.step_time == {"ranks": {"0": 1.0, "1": 1.0}, "nodes": {"n2": 1.0}}


def test_a_progress_bar_counts_its_steps() -> None:
    lines = [rec(1.0 + s, f" {s}/10 [00:0{s}<00:10, 1.0it/s]") for s in range(5, 8)]
    led = ledger_of({"start": 0.0, "end": 4.0, "state": "finished"}, lines)
    assert (led.attempts[0].resumed_at, led.attempts[0].highest) == (5, 7)


def test_a_checkpoint_line_that_opens_a_ranks_output_has_no_gap_to_measure() -> None:
    lines = [rec(0.5, "saving checkpoint to /ckpt"), rec(1.0, "step 0"), rec(2.0, "step 1")]
    led = ledger_of({"start": 0.0, "end": 3.0, "state": "finished"}, lines)
    assert led.totals == zeros(startup=1.0, productive=1.0, winddown=1.0)


def test_a_checkpoint_during_the_detection_is_not_carved_out_of_it() -> None:
    lines = [rec(1.0 + s, f"step {s}") for s in range(3)]
    lines.append(rec(5.0, "saving checkpoint to /ckpt"))
    meta = {"start": 0.0, "end": 8.0, "state": "finished",
            "attempts": [{"n": 1, "start": 0.0, "end": 8.0, "detected": 6.0}]}
    led = ledger_of(meta, lines)
    assert led.totals == zeros(startup=1.0, productive=2.0, detection=3.0, restart=2.0)


def test_a_restore_in_startup_and_a_save_later_are_both_carved() -> None:
    lines = [rec(0.5, "hello"), rec(1.5, "resumed from checkpoint /ckpt/40")]
    lines += [rec(2.0 + s, f"step {s}") for s in range(5)]
    lines.insert(5, rec(4.5, "saving checkpoint"))  # after step 2 (t=4.0)
    led = ledger_of({"start": 0.0, "end": 7.0, "state": "finished"}, lines)
    assert led.totals == zeros(startup=1.0, checkpoint_restore=1.0, productive=3.5,
                               checkpoint_save=0.5, winddown=1.0)


def test_the_one_attempt_listed_without_its_end() -> None:
    lines = [rec(1.0 + s, f"step {s}") for s in range(3)]
    meta: dict[str, Any] = {"start": 0.0, "end": 6.0, "state": "finished",
                            "attempts": [{"n": 1, "start": 0.0, "end": None}]}
    done = ledger_of(meta, lines)
    assert done.attempts[0].end == 6.0 and done.totals["winddown"] == 3.0
    assert not done.running
    # not finished (a run that died with dtrain): the attempt is open, measured up to now
    crashed = ledger_of({**meta, "state": "failed", "end": None}, lines, now=4.0)
    assert crashed.running and crashed.attempts[0].end == 4.0
    assert crashed.totals["productive"] == 3.0 and crashed.totals["winddown"] == 0.0


def test_the_last_attempt_of_two_without_its_end() -> None:
    lines = [rec(1.0 + s, f"step {s}") for s in range(3)]
    lines += [rec(6.0 + s, f"step {s}", 2) for s in range(3)]
    meta: dict[str, Any] = {
        "start": 0.0, "end": 10.0, "state": "finished",
        "attempts": [{"n": 1, "start": 0.0, "end": 4.0, "detected": 3.5, "relaunched": 5.0},
                     {"n": 2, "start": 5.0, "end": None}]}
    led = ledger_of(meta, lines)
    assert [a.end for a in led.attempts] == [5.0, 10.0]
    assert led.attempts[1].seconds == zeros(startup=1.0, productive=2.0, winddown=2.0)


def test_a_running_run_whose_next_attempt_is_not_listed_yet() -> None:
    lines = [rec(1.0 + s, f"step {s}") for s in range(3)]
    lines += [rec(7.0 + s, f"step {s}", 2) for s in range(3)]
    first = {"n": 1, "start": 0.0, "end": 4.0, "detected": 3.5, "relaunched": 5.0}
    for state in ("running", "starting"):
        led = ledger_of({"start": 0.0, "state": state, "attempts": [first]}, lines, now=12.0)
        assert [(a.n, a.start, a.end) for a in led.attempts] == [(1, 0.0, 5.0),
                                                                 (2, 5.0, 12.0)], state
        assert led.attempts[1].seconds == zeros(startup=2.0, productive=5.0)
    # finished: the attempts listed are all there were
    done = ledger_of({"start": 0.0, "end": 6.0, "state": "finished", "attempts": [first]},
                     lines)
    assert [a.n for a in done.attempts] == [1]
    # running, but the last attempt was not relaunched (the run is stopping)
    stop = ledger_of({"start": 0.0, "state": "running",
                      "attempts": [{**first, "relaunched": None}]}, lines, now=12.0)
    assert [a.n for a in stop.attempts] == [1]


def test_hangs_given_oddly() -> None:
    lines = [rec(1.0 + s, f"step {s}") for s in range(3)]
    lines += [rec(11.0 + s, f"step {s}", 2) for s in range(3)]
    meta: dict[str, Any] = {
        "start": 0.0, "end": 20.0, "state": "finished",
        "attempts": [{"n": 1, "start": 0.0, "end": 8.0, "detected": 7.0, "relaunched": 9.0},
                     {"n": 2, "start": 9.0, "end": 20.0, "detected": 18.0}]}
    for junk in (7, "hang", {"t": 5.0}):
        led = ledger_of({**meta, "hangs": junk}, lines)
        assert led.totals["hang"] == 0.0, junk
    led = ledger_of({**meta, "hangs": ["junk", {"t": None}, {"t": "5"}, {"t": 5.0}]}, lines)
    assert led.attempts[0].seconds["hang"] == 2.0  # no attempt named: the first
    led = ledger_of({**meta, "hangs": [{"t": 16.0, "attempt": 2}]}, lines)
    assert led.attempts[0].seconds["hang"] == 0.0
    assert led.attempts[1].seconds["hang"] == 3.0


def test_the_run_starts_at_the_earlier_of_its_start_and_its_first_attempts() -> None:
    lines = [rec(3.0 + s, f"step {s}") for s in range(3)]
    meta = {"start": 1.0, "end": 6.0, "state": "finished",
            "attempts": [{"n": 1, "start": 2.0, "end": 6.0}]}
    led = ledger_of(meta, lines)
    assert led.start == 1.0 and led.wall == 5.0 and led.totals["startup"] == 2.0


def test_the_progress_and_checkpoint_patterns_the_run_recorded() -> None:
    lines = [rec(1.0 + s, f"tick {s}") for s in range(4)]
    lines.insert(2, rec(2.5, "EXPORT weights"))
    meta: dict[str, Any] = {"start": 0.0, "end": 5.0, "state": "finished",
                            "hang_policy": {"progress": r"^tick"},
                            "checkpoint_pattern": "EXPORT"}
    led = ledger_of(meta, lines)
    assert led.totals == zeros(startup=1.0, productive=2.5, checkpoint_save=0.5, winddown=1.0)
    # --checkpoint over the recorded one
    assert ledger_of(meta, lines, checkpoint="nothing").totals["checkpoint_save"] == 0.0
    # not a mapping, not a string: the defaults (no progress line then)
    for policy in ("^tick", {"progress": 5}, None):
        odd = ledger_of({**meta, "hang_policy": policy, "checkpoint_pattern": 5}, lines)
        assert odd.totals["productive"] is None, policy


def test_a_bad_checkpoint_pattern_says_what_and_what_to_do() -> None:
    assert compile_checkpoint(r"saved \d+").search("saved 40")
    with pytest.raises(UsageError) as err:
        compile_checkpoint("(")
    assert err.value.message.startswith("--checkpoint '(': missing )")
    assert err.value.hint == "a Python regular expression, searched in each output line"


def test_running_is_the_state_or_no_end() -> None:
    lines = [rec(1.0 + s, f"step {s}") for s in range(3)]
    for state in ("starting", "running", "restarting"):
        led = ledger_of({"start": 0.0, "end": 5.0, "state": state}, lines)
        assert led.running, state
    assert not ledger_of({"start": 0.0, "end": 5.0, "state": "failed"}, lines).running
    assert ledger_of({"start": 0.0, "state": "failed"}, lines, now=5.0).running


def test_a_run_without_a_start_starts_at_zero() -> None:
    led = ledger_of({"state": "finished", "end": 4.0}, [rec(1.0, "step 0"), rec(2.0, "step 1")])
    assert led.start == 0.0 and led.wall == 4.0 and led.totals["startup"] == 1.0


def _steps(first: int, n: int, t0: float, attempt: int = 1) -> list[dict[str, Any]]:
    return [rec(t0 + i, f"step {first + i}", attempt) for i in range(n)]


def _meta(*attempts: dict[str, Any], end: float) -> dict[str, Any]:
    return {"start": 0.0, "end": end, "state": "finished", "attempts": list(attempts)}


def test_three_attempts_each_with_its_own_lost_steps() -> None:
    # a1: steps 0-9 at 1..10, a2 resumes at 5 (steps 5-9 lost), a3 resumes at 8 (9 lost)
    lines = _steps(0, 10, 1.0) + _steps(5, 5, 13.0, 2) + _steps(8, 6, 20.0, 3)
    meta = _meta({"n": 1, "start": 0.0, "end": 11.0, "detected": 10.5, "relaunched": 12.0},
                 {"n": 2, "start": 12.0, "end": 18.0, "detected": 17.5, "relaunched": 19.0},
                 {"n": 3, "start": 19.0, "end": 26.0}, end=26.0)
    led = ledger_of(meta, lines)
    a1, a2, a3 = led.attempts
    assert (a1.lost_steps, a2.lost_steps, a3.lost_steps) == (5, 2, None)
    assert (a1.resumed_at, a2.resumed_at, a3.resumed_at) == (0, 5, 8)
    assert a1.seconds == zeros(startup=1.0, productive=4.0, lost=5.0, detection=0.5,
                               restart=0.5, backoff=1.0)
    assert a2.seconds == zeros(startup=1.0, productive=2.0, lost=2.0, detection=0.5,
                               restart=0.5, backoff=1.0)
    assert a1.goodput == pytest.approx(4.0 / 12.0)


def test_attempts_listed_without_their_numbers() -> None:
    lines = _steps(0, 4, 1.0) + _steps(2, 3, 8.0, 2)
    meta = _meta({"start": 0.0, "end": 6.0, "detected": 5.5, "relaunched": 7.0},
                 {"start": 7.0, "end": 11.0}, end=11.0)
    led = ledger_of(meta, lines)
    assert [a.n for a in led.attempts] == [1, 2]
    assert led.attempts[0].lost_steps == 2 and led.attempts[1].resumed_at == 2


def test_a_restart_from_scratch_loses_every_step_and_one_at_the_end_none() -> None:
    # no checkpoint: the next attempt starts at step 0 again, all 5 steps were lost
    lines = _steps(0, 5, 1.0) + _steps(0, 3, 9.0, 2)
    meta = _meta({"n": 1, "start": 0.0, "end": 6.0, "detected": 5.5, "relaunched": 8.0},
                 {"n": 2, "start": 8.0, "end": 12.0}, end=12.0)
    a1 = ledger_of(meta, lines).attempts[0]
    assert a1.lost_steps == 5 and a1.seconds["productive"] == 0.0 and a1.seconds["lost"] == 4.0
    # a checkpoint at the last step: the next attempt goes on from step 5, nothing lost
    lines = _steps(0, 5, 1.0) + _steps(5, 3, 9.0, 2)
    a1 = ledger_of(meta, lines).attempts[0]
    assert a1.lost_steps == 0 and a1.seconds["lost"] == 0.0
    # the next attempt's second point differs from its first: the first is where it resumed
    lines = _steps(0, 5, 1.0) + [rec(9.0, "step 3", 2), rec(10.0, "step 4", 2)]
    assert ledger_of(meta, lines).attempts[0].lost_steps == 2


def test_what_the_next_attempt_printed_decides_what_is_measured() -> None:
    meta = _meta({"n": 1, "start": 0.0, "end": 6.0, "detected": 5.5, "relaunched": 8.0},
                 {"n": 2, "start": 8.0, "end": 12.0}, end=12.0)
    a1 = _steps(0, 5, 1.0)
    # no progress line at all: nothing to compare with, so no lost step
    led = ledger_of(meta, a1 + [rec(9.0, "hello", 2)])
    assert led.attempts[0].lost_steps is None and led.attempts[0].seconds["lost"] == 0.0
    assert led.attempts[1].goodput is None and led.attempts[1].resumed_at is None
    assert led.attempts[1].highest is None and led.attempts[1].lost_steps is None
    # one numbered line, and a stepless one at its very instant
    last = [rec(9.0, "step 3", 2), rec(9.0, "done: 4 steps, final loss 1.0", 2)]
    led = ledger_of(meta, a1 + last)
    assert led.attempts[0].lost_steps == 2
    # this attempt's lines carry no numbers, the next one's do: lost not measured
    stepless = [rec(1.0 + i, f"loss {i}") for i in range(5)]
    led = ledger_of(meta, stepless + _steps(3, 2, 9.0, 2))
    assert led.attempts[0].seconds["lost"] is None and led.attempts[0].goodput is None
    # numbered and stepless lines mixed: neither where it resumed nor how high it got
    mixed = _steps(0, 3, 1.0) + [rec(4.5, "loss 0.5")]
    led = ledger_of(meta, mixed + _steps(1, 2, 9.0, 2))
    assert (led.attempts[0].resumed_at, led.attempts[0].highest) == (None, None)


def test_an_attempt_without_progress_is_startup_then_restart() -> None:
    lines = _steps(0, 3, 9.0, 2)
    meta = _meta({"n": 1, "start": 0.0, "end": 5.0, "detected": 3.0, "relaunched": 6.0},
                 {"n": 2, "start": 6.0, "end": 12.0}, end=12.0)
    a1 = ledger_of(meta, lines).attempts[0]
    assert a1.seconds == zeros(startup=3.0, restart=2.0, backoff=1.0) and a1.goodput is None
    assert a1.resumed_at is None and a1.highest is None and a1.lost_steps is None
    # noticed the instant it started: all of it restart
    meta["attempts"][0]["detected"] = 0.0
    assert ledger_of(meta, lines).attempts[0].seconds == zeros(restart=5.0, backoff=1.0)


def test_a_hang_or_a_detection_at_the_edges_of_its_window() -> None:
    lines = _steps(0, 3, 1.0)  # last progress at 3.0
    hung = _meta({"n": 1, "start": 0.0, "end": 8.0, "detected": 6.0}, end=8.0)
    # declared at the last progress line itself, or at the attempt's very end
    led = ledger_of({**hung, "hangs": [{"t": 3.0, "attempt": 1}]}, lines)
    assert led.totals == zeros(startup=1.0, productive=2.0, restart=5.0)
    led = ledger_of({**hung, "hangs": [{"t": 8.0, "attempt": 1}]}, lines)
    assert led.totals == zeros(startup=1.0, productive=2.0, hang=5.0)
    led = ledger_of({**hung, "hangs": [{"t": 5.0, "attempt": 1}]}, lines)
    assert led.totals == zeros(startup=1.0, productive=2.0, hang=2.0, restart=3.0)
    # noticed at the attempt's very end: detection, not wind-down
    led = ledger_of(_meta({"n": 1, "start": 0.0, "end": 8.0, "detected": 8.0}, end=8.0), lines)
    assert led.totals == zeros(startup=1.0, productive=2.0, detection=5.0)


def test_a_live_run_without_now_is_measured_to_its_last_progress_line() -> None:
    led = ledger_of({"start": 0.0, "state": "running"}, _steps(0, 3, 1.0))
    assert led.end == 3.0 and led.totals["productive"] == 2.0
    one = ledger_of({"start": 0.0, "state": "running"}, [rec(2.0, "step 0")])
    assert one.end == 2.0 and one.totals["startup"] == 2.0


def test_a_later_attempt_without_a_start_starts_with_the_run() -> None:
    lines = _steps(0, 3, 1.0)
    meta = _meta({"n": 1, "start": 0.0, "end": 4.0, "relaunched": 5.0},
                 {"n": 2, "start": None, "end": 9.0}, end=9.0)
    led = ledger_of(meta, lines)
    assert led.attempts[1].start == 0.0 and led.attempts[1].seconds["startup"] == 9.0


def test_the_last_attempt_listed_without_its_end_but_noticed() -> None:
    meta = _meta({"n": 1, "start": 0.0, "end": None, "detected": 4.5}, end=6.0)
    led = ledger_of(meta, _steps(0, 3, 1.0))
    assert led.totals == zeros(startup=1.0, productive=2.0, detection=1.5, restart=1.5)


def test_the_startup_split_is_the_reference_ranks_node() -> None:
    nodes = [{"host": "n1", "supervisor": 0.5, "agent": 1.0, "rank_start": 1.5, "script": 2.0},
             {"host": "n2", "supervisor": 0.25, "agent": 0.5, "rank_start": 1.0,
              "script": 1.5}]
    lines = [rec(3.0 + s, f"step {s}", host="n2") for s in range(3)]
    lines += [rec(3.0 + s, f"step {s}", rank=1, host="n1") for s in range(3)]
    meta = {**_meta({"n": 1, "start": 0.0, "end": 6.0}, end=6.0),
            "startup": [{"attempt": 1, "nodes": nodes}]}
    split = ledger_of(meta, lines).attempts[0].startup_split
    assert split is not None and split["node"] == "n2"


def test_dtrains_own_end_after_the_last_attempt_is_wind_down_of_that_attempt() -> None:
    lines = _steps(0, 3, 1.0) + _steps(1, 3, 8.0, 2)
    meta = _meta({"n": 1, "start": 0.0, "end": 5.0, "detected": 4.0, "relaunched": 6.0},
                 {"n": 2, "start": 6.0, "end": 12.0}, end=14.0)
    led = ledger_of(meta, lines)
    a2 = led.attempts[1]
    assert (a2.n, a2.start, a2.end, a2.wall) == (2, 6.0, 14.0, 8.0)
    assert a2.seconds == zeros(startup=2.0, productive=2.0, winddown=4.0)
    assert a2.goodput == pytest.approx(2.0 / 8.0)
    assert (a2.resumed_at, a2.highest, a2.lost_steps) == (1, 3, None)
    assert led.segments[-1] == (12.0, 14.0, "winddown", 2) and led.end == 14.0
    assert led.totals["winddown"] == 4.0 and led.goodput == pytest.approx(2.0 / 14.0)
    # the last attempt printed no progress: its goodput stays not measured
    led = ledger_of(meta, _steps(0, 3, 1.0))
    assert led.attempts[1].goodput is None and led.attempts[1].seconds["winddown"] == 2.0
    # still running: the end recorded is not the run's (yet)
    live = ledger_of({**meta, "state": "running"}, lines)
    assert live.attempts[1].end == 12.0


def test_the_note_when_lost_time_cannot_be_measured() -> None:
    meta = _meta({"n": 1, "start": 0.0, "end": 6.0, "detected": 5.5, "relaunched": 8.0},
                 {"n": 2, "start": 8.0, "end": 12.0}, end=12.0)
    stepless = [rec(1.0 + i, f"loss {i}") for i in range(5)]
    led = ledger_of(meta, stepless + [rec(9.0 + i, f"loss {i}", 2) for i in range(2)])
    assert led.notes == ("the progress lines carry no step numbers: the steps redone after "
                         "a restart (lost) are not measured",)


def test_seconds_per_step_skip_stepless_lines_and_take_a_nodes_slowest_rank() -> None:
    lines = [rec(1.0, "step 0"), rec(1.5, "loss 1"), rec(3.0, "step 2"), rec(3.5, "loss 2"),
             rec(4.0, "step 3")]
    lines += [rec(1.0 + 0.123456 * s, f"step {s}", rank=1) for s in range(3)]
    lines += [rec(1.0 + 0.1 * s, f"step {s}", rank=2, host="n2") for s in range(3)]
    led = ledger_of({"start": 0.0, "end": 5.0, "state": "finished"}, lines)
    assert led.step_time == {"ranks": {"0": 1.0, "1": 0.1235, "2": 0.1},
                             "nodes": {"n1": 1.0, "n2": 0.1}}


def test_startup_records_without_an_attempt_are_the_first_attempts() -> None:
    nodes = [{"host": "n1", "supervisor": 0.5, "agent": 1.0, "rank_start": 1.5, "script": 2.0}]
    meta = {**_meta({"n": 1, "start": 0.0, "end": 6.0}, end=6.0),
            "startup": [{"nodes": nodes}]}
    split = ledger_of(meta, _steps(0, 3, 3.0)).attempts[0].startup_split
    assert split is not None and split["node"] == "n1"


def test_a_run_of_a_second_has_a_goodput_too() -> None:
    led = ledger_of({"start": 0.0, "end": 1.0, "state": "finished"},
                    [rec(0.25, "step 0"), rec(0.75, "step 1")])
    assert led.goodput == 0.5 and led.attempts[0].goodput == 0.5


def test_the_wind_down_after_the_last_attempt_keeps_its_split_and_a_zero_goodput() -> None:
    nodes = [{"host": "n1", "supervisor": 0.5, "agent": 1.0, "rank_start": 1.5, "script": 2.0}]
    meta = {**_meta({"n": 1, "start": 0.0, "end": 5.0}, end=8.0),
            "startup": [{"attempt": 1, "nodes": nodes}]}
    a = ledger_of(meta, [rec(3.0, "step 0")]).attempts[0]
    assert a.end == 8.0 and a.seconds["winddown"] == 5.0 and a.lost_steps is None
    assert a.startup_split is not None and a.startup_split["node"] == "n1"
    assert a.goodput == 0.0  # one progress line: measured, and nothing productive
