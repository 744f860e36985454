"""A node's messages decoded once into typed events (launcher/job/events.py), and the job's
observer protocol (``Job.observe``), without the cluster: every message type, bad fields,
unknown types, a fuzzed decoder, and the observers' order."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from launcher.decide.outcome.outcomes import RankEnd
from launcher.decide.outcome.stacks import StackAnswer
from launcher.job import events
from launcher.job.events import (
    Event,
    Exit,
    Flight,
    Heartbeat,
    Hello,
    Nccl,
    Observer,
    Other,
    RankExit,
    RankRaised,
    RankStart,
    Sample,
    SamplerHello,
    Stacks,
    Stopping,
)
from launcher.models import Host, OutputLine
from tests.fuzzing import FUZZ, bounded, fuzz_seed, json_values, mutated

MINE = frozenset({2, 3})


def _decode(msg: Any, ranks: Any = MINE) -> Event | None:
    return events.decode(json.dumps(msg).encode(), ranks)


# -- every type the supervisor sends (launcher/nodeside/supervisor.py) -------------------------

def test_every_message_type_is_its_event() -> None:
    assert _decode({"type": "hello", "v": 1, "pid": 11, "pgid": 11, "supervisor_pid": 10,
                    "hostname": "n2", "t": 100.0}) == \
        Hello(100.0, pid=11, supervisor_pid=10, hostname="n2")
    assert _decode({"type": "hello", "v": 1, "error": "no such file: x", "code": 127,
                    "hostname": "n2"}) == Hello(None, hostname="n2", error="no such file: x",
                                                code=127)
    assert _decode({"type": "rank_start", "rank": 2, "t": 5.0}) == RankStart(5.0, rank=2)
    assert _decode({"type": "rank_raised", "rank": 2, "exc": "ValueError", "t": 5.5}) == \
        RankRaised(5.5, rank=2, exc="ValueError")
    assert _decode({"type": "rank_exit", "rank": "3", "code": 137, "signal": 9, "t": 6.0,
                    "duration": 1.5, "pid": 77, "stop_signal": None,
                    "evidence": {"oom": True}}) == \
        RankExit(6.0, RankEnd(3, code=137, signal=9, duration=1.5, t=6.0, pid=77,
                              evidence={"oom": True}))
    assert _decode({"type": "stacks", "id": "h1", "ranks": {"2": {"text": "x"}}, "host": "n2",
                    "t": 7.0, "took": 0.2, "pyspy": True}) == \
        Stacks(7.0, id="h1", ranks={2: StackAnswer(text="x")}, pyspy=True)
    assert _decode({"type": "stacks", "id": "h1", "native": True, "ranks": {}}) == \
        Stacks(None, id="h1", native=True)
    assert _decode({"type": "stacks", "id": "h1", "ranks": {}, "error": "boom"}) == \
        Stacks(None, id="h1", error="boom")
    assert _decode({"type": "flight", "files": {"3": "QUJD"}, "host": "n2", "t": 8.0}) == \
        Flight(8.0, files={3: "QUJD"})
    assert _decode({"type": "nccl", "rank": 2, "lines": ["NCCL INFO a", 5], "t": 9.0}) == \
        Nccl(9.0, rank=2, lines=("NCCL INFO a",))
    assert _decode({"type": "stopping", "reason": "stop from dtrain", "t": 9.5}) == \
        Stopping(9.5, reason="stop from dtrain")
    assert _decode({"type": "hb", "t": 10.0}) == Heartbeat(10.0)
    assert _decode({"type": "exit", "code": 1, "signal": None, "t": 11.0, "stopped": None,
                    "ranks": {"2": {"code": 1}}, "container": {"name": "c", "left": []}}) == \
        Exit(11.0, code=1, ranks={2: RankEnd(2, code=1)}, container={"name": "c", "left": []})


def test_a_type_it_does_not_know_is_handed_on_as_other() -> None:
    assert _decode({"type": "news", "x": 1}) == Other(None, kind="news",
                                                      fields={"type": "news", "x": 1})
    assert _decode({"x": 1}) == Other(None, kind=None, fields={"x": 1})
    assert _decode({"type": 5}) == Other(None, kind=None, fields={"type": 5})


def test_bad_fields_are_read_as_absent_and_claims_on_other_ranks_dropped() -> None:
    assert _decode({"type": "rank_start", "rank": 0}) is None  # another host's rank
    assert _decode({"type": "rank_raised", "rank": 0, "exc": "E"}) is None
    assert _decode({"type": "rank_raised", "rank": 3, "exc": ["x"] * 99}) == \
        RankRaised(None, rank=3, exc=str(["x"] * 99)[:120])
    assert _decode({"type": "rank_exit", "rank": "02", "code": 1}) is None
    assert _decode({"type": "nccl", "rank": 2, "lines": "not a list"}) is None
    ev = _decode({"type": "rank_exit", "rank": 2, "code": "1", "signal": True,
                  "stop_signal": "15", "t": math.inf, "duration": "long",
                  "evidence": ["not", "a", "map"]})
    assert ev == RankExit(None, RankEnd(2))
    assert isinstance(ev, RankExit) and not ev.end.failed
    assert _decode({"type": "hello", "pid": True, "supervisor_pid": 1.5, "t": -1,
                    "error": "", "code": "127"}) == Hello(None)
    assert _decode({"type": "exit", "code": True, "signal": "9", "stopped": "",
                    "ranks": {"9": {}, "2": 5, "3": {"code": 0}}, "t": 1e300}) == \
        Exit(None, ranks={3: RankEnd(3, code=0)})
    assert _decode({"type": "stacks", "ranks": {"7": {}}}) == Stacks(None, id="None")
    assert _decode({"type": "flight", "files": {"2": 7, "3": "x"}}) == \
        Flight(None, files={3: "x"})


def test_what_no_supervisor_sends_is_the_nodes_error() -> None:
    for data in (b"[1, 2]", b"5", b"not json", b"[" * 100_000 + b"]" * 100_000):
        with pytest.raises(events.BadMessage):
            events.decode(data, MINE)


def test_the_readers() -> None:
    assert [events.integer(v) for v in (3, True, 3.0, "3", None)] == [3, None, None, None, None]
    assert [events.number(v) for v in (3, 2.5, True, math.nan, math.inf, "1")] == \
        [3.0, 2.5, None, None, None, None]
    assert [events.text(v) for v in ("x", "", None, 5, 0)] == ["x", None, None, "5", None]
    assert events.mapping({"a": 1}) == {"a": 1} and events.mapping([1]) is None


def test_a_sampler_s_lines() -> None:
    assert events.decode_sample(b'{"type": "hello", "pid": 4}', None) == SamplerHello(4)
    assert events.decode_sample(b"Welcome to node2", None) is None
    assert events.decode_sample(b'{"type": "other"}', None) is None
    assert events.decode_sample(b"{" * 100_000, None) is None
    ev = events.decode_sample(b'{"type": "sample", "t": 5.0, "cpu": NaN, "ranks": '
                              b'{"2": {"cpu": 1.5}, "0": {"cpu": 2.0}, "3": {"cpu": 1e999}}}',
                              (2, 3))
    assert isinstance(ev, Sample) and ev.t == 5.0 and ev.data["cpu"] is None
    assert ev.ranks == {"2": {"cpu": 1.5}, "3": {}}
    assert ev.cpu() == (5.0, {2: 1.5})
    assert events.sample_cpu({"t": 5.0, "ranks": {"2": {}}}) is None
    assert events.sample_cpu({"ranks": {"2": {"cpu": 1.0}}}) is None


KEYS = ["type", "rank", "code", "signal", "t", "duration", "stop_signal", "evidence", "ranks",
        "supervisor_pid", "pid", "error", "stopped", "id", "native", "pyspy", "files", "lines",
        "reason", "container", "0", "2", "3", "-1", "\u00b2", "02"]
SEEDS = [{"type": "hello", "pid": 11, "supervisor_pid": 10, "t": 100.0},
         {"type": "rank_start", "rank": 2, "t": 1.0},
         {"type": "rank_exit", "rank": 3, "code": 7, "signal": None, "t": 5.0,
          "evidence": {"oom": True}},
         {"type": "stacks", "id": "h1", "ranks": {"2": {"text": "x"}}, "pyspy": True},
         {"type": "flight", "files": {"3": "QUJD"}},
         {"type": "nccl", "rank": 2, "lines": ["NCCL INFO x"]},
         {"type": "stopping", "reason": "why"},
         {"type": "exit", "code": 0, "ranks": {"2": {"code": 0}}, "stopped": None}]


@fuzz_seed
@FUZZ
@given(st.one_of(*(mutated(s, KEYS) for s in SEEDS), json_values(KEYS)))
def test_the_decoder_takes_any_json(msg: Any) -> None:
    """Any JSON: an event whose fields have their types (a rank the host's own), None, or
    BadMessage; never another exception."""
    with bounded():
        try:
            ev = _decode(msg)
        except events.BadMessage:
            assert not isinstance(msg, dict)
            return
        if ev is None:
            return
        assert ev.t is None or (isinstance(ev.t, float) and math.isfinite(ev.t))
        if isinstance(ev, (RankStart, Nccl)):
            assert ev.rank in MINE
        ends = [ev.end] if isinstance(ev, RankExit) else \
            list(ev.ranks.values()) if isinstance(ev, Exit) else []
        assert all(e.rank in MINE for e in ends)
        for obj in (ev, *ends):
            for name in ("code", "signal", "stop_signal", "pid", "supervisor_pid"):
                value = getattr(obj, name, None)
                assert value is None or (isinstance(value, int) and not isinstance(value, bool))
        for ranks in (getattr(ev, "ranks", {}), getattr(ev, "files", {})):
            assert all(isinstance(r, int) and r in MINE for r in ranks)
        if isinstance(ev, Stacks):
            assert all(isinstance(a, StackAnswer) for a in ev.ranks.values())
        if isinstance(ev, Nccl):
            assert all(isinstance(line, str) for line in ev.lines)
        ev.send(Observer(), Host("n2"))  # every event has its method


# -- the observer protocol ----------------------------------------------------------------------

class Recorder(Observer):
    def __init__(self, name: str, log: list[tuple[str, str]]) -> None:
        self.name, self.log = name, log

    def on_hello(self, host: Host, ev: Hello) -> None:
        self.log.append((self.name, "hello"))

    def on_rank_exit(self, host: Host, ev: RankExit) -> None:
        self.log.append((self.name, f"rank_exit {ev.end.rank}"))

    def on_lines(self, lines: Any) -> None:
        self.log.append((self.name, f"lines {len(lines)}"))


def test_observers_are_called_in_registration_order_after_the_job_s_own_rule() -> None:
    from launcher.job.orchestrate import Job, Policy

    log: list[tuple[str, str]] = []
    job = Job([Host("n1")], {}, Policy(), SimpleNamespace())  # type: ignore[arg-type]
    job._failed = lambda failure, tg: log.append(("job", f"failed r{failure.rank}"))  # type: ignore[method-assign]
    job.observe(Recorder("a", log))
    job.observe(Recorder("b", log))
    job._event(Host("n1"), RankExit(1.0, RankEnd(0, code=1, t=1.0)), None)  # type: ignore[arg-type]
    job._event(Host("n1"), Stopping(None), None)  # type: ignore[arg-type]  no one overrides it
    job._event(Host("n1"), Other(None, kind="news"), None)  # type: ignore[arg-type]
    job.observers.lines([OutputLine("n1", "out", "step 1", 0, 0, 0.0)])
    assert log == [("job", "failed r0"), ("a", "rank_exit 0"), ("b", "rank_exit 0"),
                   ("a", "lines 1"), ("b", "lines 1")]


def test_the_run_registers_its_observers_in_the_fan_out_s_order() -> None:
    """commands/launch/attempt.py (``Attempt._observe``) registers the exit-barrier fold,
    the status line, the hang watch, NCCL's account, the failure evidence, the start-up
    clock and the samplers, in that order (the order the
    hand-written fan-out had)."""
    import inspect

    from launcher.commands import launch

    source = inspect.getsource(launch.Attempt._observe) + inspect.getsource(launch.hang_watch)
    order = [source.index(s) for s in ("job.observe(out)", "job.observe(self.board)",
                                       "watch = hang_watch(", "job.observe(fabric)",
                                       "job.observe(Evidence(self.errors))",
                                       "job.observe(self.clock)",
                                       "job.observe(self.sampling)")]
    assert order == sorted(order)
    assert "job.observe(watch)" in source


def test_the_hang_watch_as_an_observer_tells_its_error_and_goes_on(tmp_path: Any) -> None:
    from launcher.decide.outcome.hang import HangPolicy, ProgressWatch, compile_progress
    from launcher.job.hangwatch import HangWatch
    from launcher.output.rundir import RunDir

    (tmp_path / "run").mkdir()
    job = SimpleNamespace(sessions={}, outcome=SimpleNamespace(nodes={}))
    said: list[str] = []
    watch = HangWatch(job, HangPolicy(timeout=5.0),  # type: ignore[arg-type]
                      ProgressWatch(compile_progress(None), range(2), 0.0),
                      {"n1": [0, 1]}, RunDir.open(tmp_path / "run"), said.append,
                      alive=lambda: True)

    def broken(*args: Any) -> None:
        raise ValueError("a bug")

    watch._flight_files = broken  # type: ignore[method-assign]
    for _ in range(2):
        watch.on_flight(Host("n1"), Flight(None, files={"0": "QUJD"}))
    watch.on_rank_start(Host("n1"), RankStart(None, rank=0))
    assert watch.started == {0}  # still watching
    assert said == ["the hang watch failed on a 'flight' message from n1 (ValueError: a bug); "
                    "it goes on watching"]
    assert watch.errors == {"ValueError: a bug": 2}
