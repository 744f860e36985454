"""The straggler rule (decide/stragglers.py): pure, fed with hand-made CPU series."""

from __future__ import annotations

from collections.abc import Mapping

from launcher.decide.stragglers import StragglerDetector, StragglerSettings

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
                             python="python3", env=[])
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
