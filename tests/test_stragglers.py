"""The straggler rule (decide/outcome/stragglers.py): pure, fed with hand-made CPU series."""

from __future__ import annotations

from collections.abc import Mapping

from launcher.decide.outcome.stragglers import StragglerDetector, StragglerSettings

S = StragglerSettings(window=10.0, hold=10.0, ratio=2.0, min_gap=0.1)
LAYOUT = {"node1": (0, 1), "node2": (2, 3), "node3": (4, 5), "node4": (6, 7)}


def feed(det: StragglerDetector, busy: Mapping[str, float], t0: float, t1: float,
         cpu: dict[int, float], step: float = 1.0) -> list[str]:
    """Sample every node each ``step`` s from t0 to t1 with these busy rates; the hosts
    flagged on the way, in order."""
    flagged = []
    t = t0
    while t <= t1 + 1e-9:
        for host, ranks in LAYOUT.items():
            for r in ranks:
                cpu[r] = cpu.get(r, 0.0) + busy[host] * step
            det.add(host, t, {r: cpu[r] for r in ranks})
        flagged += [s.host for s in det.evaluate(t)]
        t += step
    return flagged


def test_the_node_that_rarely_waits_is_flagged_once_after_the_hold_and_no_other() -> None:
    det = StragglerDetector(S, attempt=1)
    busy = {"node1": 0.1, "node2": 0.12, "node3": 0.95, "node4": 0.09}
    cpu: dict[int, float] = {}
    # the evidence needs half a window of samples, then `hold` seconds of holding
    assert feed(det, busy, 0, 14, cpu) == []
    assert feed(det, busy, 15, 40, cpu) == ["node3"]  # once, not at every sample
    flag = det.flagged["node3"]
    assert flag.ranks == (4, 5) and flag.attempt == 1
    assert 0.9 < flag.busy < 1.0 and 0.09 <= flag.others <= 0.12
    assert flag.flagged - flag.since >= S.hold
    assert flag.flagged <= 5 + S.hold + 1  # flagged as soon as the hold is over
    assert "node3 (ranks 4,5) is rarely waiting" in flag.line()
    assert [s["host"] for s in det.as_json()] == ["node3"]


def test_equal_ranks_and_idle_ranks_flag_nothing() -> None:
    det = StragglerDetector(S)
    assert feed(det, dict.fromkeys(LAYOUT, 0.5), 0, 60, {}) == []
    # 0.04 is 4x 0.01, but 0.03 CPU-s/s is noise (min_gap), not a straggler
    idle = {"node1": 0.01, "node2": 0.01, "node3": 0.04, "node4": 0.01}
    assert feed(StragglerDetector(S), idle, 0, 60, {}) == []


def test_evidence_that_breaks_before_the_hold_flags_nothing() -> None:
    det = StragglerDetector(S)
    cpu: dict[int, float] = {}
    slow = {"node1": 0.1, "node2": 0.1, "node3": 0.9, "node4": 0.1}
    even = dict.fromkeys(LAYOUT, 0.1)
    flagged = []
    for k in range(4):  # 2 s slow in every 20: suspect for ~9.5 s of each, the hold is 10
        flagged += feed(det, slow, k * 20, k * 20 + 1, cpu)
        flagged += feed(det, even, k * 20 + 2, k * 20 + 19, cpu)
    assert flagged == []


def test_a_flag_is_cleared_when_the_evidence_stops_and_restarts_are_not_speed() -> None:
    det = StragglerDetector(S)
    cpu: dict[int, float] = {}
    slow = {"node1": 0.1, "node2": 0.1, "node3": 0.9, "node4": 0.1}
    assert feed(det, slow, 0, 30, cpu) == ["node3"]
    assert feed(det, dict.fromkeys(LAYOUT, 0.1), 31, 70, cpu) == []
    assert det.flagged["node3"].cleared is not None
    # a restarted rank's counter starts again from 0: a new series, not negative speed
    cpu = dict.fromkeys(cpu, 0.0)
    assert feed(det, dict.fromkeys(LAYOUT, 0.1), 71, 90, cpu) == []
    det.reset(attempt=2)
    assert det.flagged == {} and [s["host"] for s in det.as_json()] == ["node3"]


def test_two_nodes_the_busy_one_is_the_straggler() -> None:
    det = StragglerDetector(S)
    cpu = {0: 0.0, 1: 0.0}
    out = []
    for t in range(40):
        cpu[0] += 1.0
        cpu[1] += 0.2
        det.add("a", float(t), {0: cpu[0]})
        det.add("b", float(t), {1: cpu[1]})
        out += [s.host for s in det.evaluate(float(t))]
    assert out == ["a"]


def test_busy_is_cpu_seconds_per_second_over_the_window() -> None:
    det = StragglerDetector(S)
    for t in range(0, 21):
        det.add("n", float(t), {0: t * 0.25, 1: t * 1.5})  # 1.5: a rank with 2 busy threads
    busy = det.busy()
    assert abs(busy[0] - 0.25) < 1e-9 and abs(busy[1] - 1.5) < 1e-9


def test_a_flag_whole_its_times_json_and_line() -> None:
    det = StragglerDetector(S, attempt=1)
    cpu: dict[int, float] = {}
    slow = {"node1": 0.1, "node2": 0.1, "node3": 0.9, "node4": 0.1}
    assert feed(det, slow, 0, 30, cpu) == ["node3"]
    # busy needs half a window (t=5); flagged the moment the hold (10 s) is over
    assert det.as_json() == [{
        "host": "node3", "ranks": [4, 5], "busy": 0.9, "others": 0.1, "since": 5.0,
        "flagged": 15.0, "window": 10.0, "hold": 10.0, "ratio": 2.0, "attempt": 1,
        "cleared": None, "signal": "cpu",
        "summary": "straggler: node3 (ranks 4,5) is rarely waiting: busy 0.90 CPU-s/s against "
                   "0.10 on the other nodes (x9.0) for 10 s; every rank steps at its pace"}]
    # the evidence stops holding at t=39 (the window still sees the slow part before):
    # cleared after another hold, dated from when it stopped, in the flags and the history
    assert feed(det, dict.fromkeys(LAYOUT, 0.1), 31, 48, cpu) == []
    assert det.flagged["node3"].cleared is None
    assert feed(det, dict.fromkeys(LAYOUT, 0.1), 49, 49, cpu) == []
    assert det.flagged["node3"].cleared == 39.0 and det.as_json()[0]["cleared"] == 39.0
    # slow again: the node is not flagged a second time in the same attempt
    assert feed(det, slow, 50, 90, cpu) == []


def test_the_line_for_one_rank_and_an_idle_rest() -> None:
    from launcher.decide.outcome.stragglers import Straggler
    one = Straggler("n2", (3,), 1.23456, 0.0, 100.0, 130.4, 30.0, 30.0, 2.0, cleared=140.12345)
    assert one.line() == ("straggler: n2 (rank 3) is rarely waiting: busy 1.23 CPU-s/s against "
                          "0.00 on the other nodes (x1234.6) for 30 s; every rank steps at its "
                          "pace")
    j = one.as_json()
    assert (j["busy"], j["others"], j["since"], j["flagged"], j["cleared"], j["attempt"]) == (
        1.235, 0.0, 100.0, 130.4, 140.123, None)
    odd = Straggler("n2", (3,), 1.0, 0.12345, 100.6666, 130.4444, 30.0, 30.0, 2.0)
    j = odd.as_json()
    assert (j["others"], j["since"], j["flagged"]) == (0.123, 100.667, 130.444)


def test_busy_takes_the_newest_point_a_window_old_and_needs_half_a_window() -> None:
    det = StragglerDetector(S)  # window 10
    det.add("n", 0.0, {0: 0.0})
    det.add("n", 4.0, {0: 4.0})
    assert det.busy() == {}  # 4 s < half the window
    det.add("n", 5.0, {0: 5.0})
    assert det.busy() == {0: 1.0}  # exactly half: enough
    for t, c in [(6.0, 5.0), (15.0, 5.0), (16.0, 6.0)]:
        det.add("n", t, {0: c})
    # at t=16 the newest point at least 10 s old is t=6 (c=5): 1 CPU-s in 10 s
    assert det.busy() == {0: 0.1}


def test_samples_out_of_order_restarted_or_moved_and_the_series_kept() -> None:
    det = StragglerDetector(S)
    det.add("n", 10.0, {0: 5.0})
    det.add("n", 10.0, {0: 9.0})  # a repeated time: ignored
    det.add("n", 9.0, {0: 1.0})  # older: ignored
    assert list(det.series[0].points) == [(10.0, 5.0)]
    det.add("n", 11.0, {0: 2.0})  # the counter went down: the rank restarted
    assert list(det.series[0].points) == [(11.0, 2.0)]
    det.add("m", 12.0, {0: 3.0})  # the rank is on another node now: a new series
    assert det.series[0].host == "m" and list(det.series[0].points) == [(12.0, 3.0)]
    for t in range(13, 60):
        det.add("m", float(t), {0: float(t)})
    # kept: the points within 2 windows + 1 s of the newest (and always two)
    # (at t=59: the second point must be under 21 s old, so the first is t=38)
    assert det.series[0].points[0][0] == 38.0 and det.series[0].points[-1][0] == 59.0


def test_suspects_at_the_boundaries_and_on_one_node() -> None:
    det = StragglerDetector(StragglerSettings(window=10.0, hold=10.0, ratio=2.0, min_gap=0.1))
    for t in (0.0, 10.0):
        det.add("a", t, {0: 0.0 + 2.0 * t / 10})  # busy 0.2
        det.add("b", t, {1: 0.1 * t / 10})  # busy 0.01
        det.add("b", t, {2: 0.1 * t / 10})
    # 0.2 is 20x 0.01 but only 0.19 more: suspect; rank 1 and 2 are not
    assert set(det.suspects()) == {0}
    exact = StragglerDetector(StragglerSettings(window=10.0, hold=10.0, ratio=2.0, min_gap=0.1))
    for t in (0.0, 10.0):
        exact.add("a", t, {0: 2.0 * t / 10})  # busy exactly 2x and 0.1 more than b's
        exact.add("b", t, {1: 1.0 * t / 10})
    assert set(exact.suspects()) == {0}
    # one node only: its ranks are compared with each other
    solo = StragglerDetector(S)
    for t in (0.0, 10.0):
        solo.add("n", t, {0: 9.0 * t / 10, 1: 1.0 * t / 10, 2: 1.0 * t / 10})
    assert set(solo.suspects()) == {0}
    lone = StragglerDetector(S)
    for t in (0.0, 10.0):
        lone.add("n", t, {0: t})
    assert lone.suspects() == {}


def test_defaults_and_reset() -> None:
    det = StragglerDetector()
    assert det.settings == StragglerSettings(30.0, 30.0, 2.0, 0.05) and det.attempt is None
    det.add("n", 0.0, {0: 0.0})
    det.reset()
    assert det.series == {} and det.attempt is None
    det.reset(attempt=2)
    assert det.attempt == 2


def test_one_sample_of_several_ranks_and_half_windows_late_in_a_run() -> None:
    det = StragglerDetector(S)
    det.add("n", 10.0, {0: 5.0})
    det.add("n", 10.0, {0: 6.0, 1: 1.0})  # rank 0 repeated, rank 1 new: rank 1 still counts
    assert list(det.series[1].points) == [(10.0, 1.0)]
    det.add("n", 20.0, {1: 6.0})  # rank 0 has one point, rank 1 two: rank 1 has a busy
    assert det.busy() == {1: 0.5}
    late = StragglerDetector(S)
    late.add("n", 100.0, {0: 0.0})
    late.add("n", 101.0, {0: 1.0})  # 1 s of a 10 s window, late in the run: not enough
    assert late.busy() == {}


def test_a_busy_node_is_compared_with_the_other_nodes_only() -> None:
    det = StragglerDetector(S)
    for t in (0.0, 10.0):
        det.add("a", t, {0: t, 1: t})  # both ranks of node a: 1.0 CPU-s/s
        det.add("b", t, {2: 0.1 * t})
    assert set(det.suspects()) == {0, 1}
    gap = StragglerDetector(S)  # min_gap 0.1: 0.08 against 0.03 is 2.7x but 0.05 more
    for t in (0.0, 10.0):
        gap.add("a", t, {0: 0.08 * t})
        gap.add("b", t, {1: 0.03 * t})
    assert gap.suspects() == {}


def _run(det: StragglerDetector, plan: list[tuple[int, int, dict[str, float]]],
         cpu: dict[int, float] | None = None) -> list[str]:
    cpu = {} if cpu is None else cpu
    out = []
    for t0, t1, busy in plan:
        out += feed(det, busy, t0, t1, cpu)
    return out


def test_two_nodes_flagged_and_cleared_each_on_its_own_clock() -> None:
    even = dict.fromkeys(LAYOUT, 0.1)
    slow3 = {**even, "node3": 0.9}
    both = {**even, "node1": 0.9, "node3": 0.9}
    det = StragglerDetector(S)
    cpu: dict[int, float] = {}
    # node3 flagged; node1 becomes slow as well while node3 stays slow: flagged too
    assert _run(det, [(0, 30, slow3), (31, 60, both)], cpu) == ["node3", "node1"]
    # node1 recovers while node3 stays slow: only node1's flag clears
    assert _run(det, [(61, 100, slow3)], cpu) == []
    assert det.flagged["node3"].cleared is None and det.flagged["node1"].cleared is not None
    assert [f["cleared"] is None for f in det.as_json()] == [True, False]


def test_a_flag_cleared_then_another_node_clears_later_with_its_own_time() -> None:
    even = dict.fromkeys(LAYOUT, 0.1)
    det = StragglerDetector(S)
    cpu: dict[int, float] = {}
    assert _run(det, [(0, 30, {**even, "node3": 0.9}), (31, 60, even),
                      (61, 90, {**even, "node1": 0.9})], cpu) == ["node3", "node1"]
    assert det.flagged["node3"].cleared == 39.0
    assert _run(det, [(91, 130, even)], cpu) == []
    assert det.flagged["node1"].cleared == 99.0
    assert [f["cleared"] for f in det.as_json()] == [39.0, 99.0]


def test_evidence_back_during_the_clearing_restarts_the_countdown() -> None:
    even = dict.fromkeys(LAYOUT, 0.1)
    slow = {**even, "node3": 0.9}
    det = StragglerDetector(S)
    # slow, even (the evidence stops at 39, for 5 s: less than the hold), slow again, then
    # even for good: the countdown starts again where the evidence stops the second time
    _run(det, [(0, 30, slow), (31, 44, even), (45, 70, slow), (71, 110, even)], {})
    assert det.flagged["node3"].cleared == 79.0


def test_a_later_attempt_keeps_the_earlier_attempts_flags_in_meta_json(monkeypatch) -> None:
    """--restarts: each attempt has its own sampling (and detector); meta.json `stragglers`
    keeps attempt 1's flag when attempt 2 flags again (it was replaced by [] before)."""
    from types import SimpleNamespace

    from launcher.commands import run_sampling

    monkeypatch.setattr(run_sampling.time, "time", lambda: clock[0])
    clock = [0.0]
    earlier = {"host": "node3", "ranks": [4], "attempt": 1, "summary": "straggler: node3 ..."}

    class Archive:
        run_id = "r"
        meta: dict[str, object] = {"stragglers": [earlier]}

        def update_meta(self, **kw: object) -> None:
            self.meta = {**self.meta, **kw}

    nodes = [SimpleNamespace(host=SimpleNamespace(label=h), node_rank=i, ranks=list(r),
                             python="python3", env=[], container=None)
             for i, (h, r) in enumerate(LAYOUT.items())]
    archive = Archive()
    said: list[str] = []
    sampling = run_sampling.RunSampling(archive, SimpleNamespace(nodes=nodes), 1.0, S,  # type: ignore[arg-type]
                                        said.append, attempt=2)
    assert sampling.meta()["stragglers"] == [earlier]
    busy = {"node1": 0.05, "node2": 0.05, "node3": 0.9, "node4": 0.05}
    cpu: dict[int, float] = {}
    for t in range(40):
        clock[0] = float(t)
        for host, ranks in LAYOUT.items():
            for r in ranks:
                cpu[r] = cpu.get(r, 0.0) + busy[host]
            sampling.on_sample(host, {"t": float(t), "ranks": {
                str(r): {"cpu": cpu[r]} for r in ranks}})
    assert len(said) == 1 and said[0].startswith("straggler: node3")
    kept = archive.meta["stragglers"]
    assert isinstance(kept, list) and kept[0] == earlier
    assert [(s["host"], s["attempt"]) for s in kept] == [("node3", 1), ("node3", 2)]
