"""`dtrain top RUN` without a cluster: a hand-made archive read as it grows (line ages, step
rate, meta.json state and stragglers, samples.jsonl priming), and the step-rate rule."""

from __future__ import annotations

import json
import re
from pathlib import Path

from launcher.commands.top.model import TopState
from launcher.commands.top.runwatch import RunWatch, Tail, plan_iface
from launcher.decide.outcome.steprate import PROGRESS, StepRate
from tests.reports import validate_top


def make_run(tmp_path: Path) -> Path:
    run = tmp_path / "20261201-101500-ab12"
    run.mkdir()
    meta = {"archive_version": 1, "run_id": run.name, "world_size": 4, "state": "running",
            "hosts": ["node1", "alt2:2222"],
            "host_entries": [{"label": "node1", "name": "node1", "user": "me", "port": None,
                              "python": "/opt/py/bin/python3"}],
            "layout": [{"host": "node1", "node_rank": 0, "ranks": [0, 1]},
                       {"host": "alt2:2222", "node_rank": 1, "ranks": [2, 3]}],
            "plan": {"nodes": [
                {"host": "node1", "env": [{"name": "GLOO_SOCKET_IFNAME", "value": "ens1f0"}]},
                {"host": "alt2:2222",
                 "env": [{"name": "NCCL_SOCKET_IFNAME", "value": "=eth0"}]}]},
            "stragglers": [{"host": "alt2:2222", "ranks": [3], "busy": 0.9, "others": 0.1,
                            "since": 100.0, "flagged": 130.0, "window": 30.0, "hold": 30.0,
                            "ratio": 2.0, "attempt": None, "cleared": None,
                            "signal": "cpu"}]}
    (run / "meta.json").write_text(json.dumps(meta))
    return run


def line(t: float, rank: int, text: str, stream: str = "out") -> str:
    return json.dumps({"t": t, "host": "node1", "node_rank": 0, "rank": rank,
                       "stream": stream, "line": text}) + "\n"


def test_the_archive_read_as_it_grows(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    out = run / "output.jsonl"
    out.write_text(line(1000.0, 0, "step 10 loss 1.0") + line(1001.0, 1, "hello"))
    watch = RunWatch(run)
    assert watch.layout == {"node1": [0, 1], "alt2:2222": [2, 3]}
    assert watch.ifaces() == {"node1": "ens1f0", "alt2:2222": "eth0"}
    hosts = watch.hosts()
    assert (hosts[0].name, hosts[0].user, hosts[0].python) == ("node1", "me",
                                                               "/opt/py/bin/python3")
    assert (hosts[1].name, hosts[1].port) == ("alt2", 2222)  # no entry: from the label
    assert watch.line_age(1, 1011.0) == 10.0 and watch.line_age(2, 1011.0) is None
    with open(out, "a") as fh:  # more lines, and half of one (a write in progress)
        fh.write(line(1010.0, 0, "step 30 loss 0.9") + line(1020.0, 0, "step 50")[:20])
    watch.poll()
    assert watch.steps.step() == 30 and watch.steps.rate(1011.0) == 2.0
    with open(out, "a") as fh:
        fh.write(line(1020.0, 0, "step 50")[20:])
    watch.poll()
    assert watch.steps.step() == 50
    assert watch.flagged_hosts() == {"alt2:2222"}


def test_a_huge_output_file_is_read_from_near_its_end(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    path.write_bytes(b"x" * (5 << 20) + b"\n" + b'{"last": 1}\n')
    assert Tail(path).lines() == [b'{"last": 1}']


def test_the_document_for_a_run_is_valid_and_primed_from_samples(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    (run / "output.jsonl").write_text(line(1000.0, 0, "iter: 5"))
    with open(run / "samples.jsonl", "w") as fh:
        for t in range(0, 40, 10):
            for host, ranks, busy in (("node1", (0, 1), 0.1), ("alt2:2222", (2, 3), 0.9)):
                rec = {"t": 1000.0 + t, "host": host,
                       "ranks": {str(r): {"cpu": busy * t, "pids": 2, "state": "S"}
                                 for r in ranks}}
                fh.write(json.dumps(rec) + "\n")
    watch = RunWatch(run)
    state = TopState(["node1", "alt2:2222"], 1.0, run=watch)
    state.poll_run()
    doc = state.document()
    validate_top(doc)
    busy = {n["host"]: n["rank_info"] for n in doc["nodes"]}
    assert abs(busy["alt2:2222"]["3"]["busy"] - 0.9) < 1e-6  # from samples.jsonl alone
    assert doc["nodes"][1]["straggler"] and not doc["nodes"][0]["straggler"]
    assert [s["host"] for s in doc["stragglers"]] == ["alt2:2222"]  # the launcher's flag once
    assert doc["run"]["run_id"] == run.name and doc["run"]["step"] == 5


def test_plan_iface() -> None:
    assert plan_iface([{"name": "NCCL_SOCKET_IFNAME", "value": "^lo,docker"}]) is None
    assert plan_iface([{"name": "NCCL_SOCKET_IFNAME", "value": "=ib0,ib1"}]) == "ib0"


def test_step_numbers_and_counted_lines() -> None:
    rate = StepRate(re.compile(PROGRESS), window=30.0)
    for i, t in enumerate(range(0, 20, 2)):
        assert rate.feed(0, float(t), f"epoch 1 iter {i * 5}: loss 0.5")
    assert rate.step() == 45 and rate.rate(18.0) == 2.5
    assert not rate.feed(0, 20.0, "saving checkpoint")
    assert rate.rate(60.0) == 0.0  # silent for a whole window: not stepping
    bar = StepRate(re.compile(PROGRESS))
    bar.feed(1, 0.0, " 45/100 [00:10<00:12, 4.50it/s]")
    bar.feed(1, 5.0, " 70/100 [00:15<00:07, 4.80it/s]")
    assert bar.step() == 70 and bar.rate(5.0) == 5.0
    counted = StepRate(re.compile(r"loss"))
    for t in range(5):
        counted.feed(2, float(t), "loss 0.3")
    assert counted.step() == 5 and counted.rate(4.0) == 1.0


def test_step_rate_window_restarts_and_ranks() -> None:
    r = StepRate(re.compile(PROGRESS), window=10.0)
    assert r.rate(0.0) is None and r.step() is None
    r.feed(0, 0.0, "step 10")
    assert r.rate(0.0) is None and r.step() == 10  # one point: no rate yet
    r.feed(0, 0.0, "step 12")
    assert r.rate(0.0) is None  # two points at the same time: no rate
    for t, step in [(5.0, 20), (10.0, 30), (20.0, 50)]:
        r.feed(0, t, f"global_step={step}")
    # the window keeps the first point within 10 s of the last (and always two points)
    assert list(r.ranks[0].points) == [(10.0, 30), (20.0, 50)]
    assert r.rate(20.0) == 2.0
    assert r.rate(30.0) == 2.0 and r.rate(30.5) == 0.0  # silent past the whole window: 0
    # a smaller step number: a restart; counting starts over there
    r.feed(0, 21.0, "iteration 3")
    assert list(r.ranks[0].points) == [(21.0, 3)] and r.rate(21.0) is None
    # the lowest rank that prints progress is the one measured
    r.feed(4, 22.0, "batch 100")
    r.feed(4, 23.0, "batch 200")
    assert r.step() == 3 and r.rate(23.0) is None
    r2 = StepRate(re.compile(PROGRESS), window=10.0)
    r2.feed(4, 22.0, "Batch #100")
    r2.feed(2, 22.0, "ITER: 7")
    assert r2.step() == 7


def test_step_numbers_in_each_spelling() -> None:
    for text, step in [("step 120 loss 0.3", 120), ("iter: 55", 55), ("global_step=9", 9),
                       ("'step': 4", 4), ("batch#8", 8), ("substep 3 step 5", 5),
                       (" 45/100 [00:10<00:12", 45)]:
        r = StepRate(re.compile(r"."))
        r.feed(0, 0.0, text)
        assert r.step() == step, text


def test_step_rate_over_every_point_of_the_window_and_repeated_steps() -> None:
    r = StepRate(re.compile(PROGRESS), window=10.0)
    for t, step in [(0.0, 0), (5.0, 10), (8.0, 11)]:
        r.feed(0, t, f"step {step}")
    assert list(r.ranks[0].points) == [(0.0, 0), (5.0, 10), (8.0, 11)]
    assert r.rate(8.0) == 11 / 8  # first to last point, not the last two
    same = StepRate(re.compile(PROGRESS), window=10.0)
    for t, step in [(0.0, 5), (5.0, 5), (10.0, 10)]:
        same.feed(0, t, f"step {step}")  # a step printed twice is not a restart
    assert same.rate(10.0) == 0.5
