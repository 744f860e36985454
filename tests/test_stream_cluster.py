"""Issue: one tagged stream and a run archive, on the cluster, without losing a line."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from tests.util import dtrain

pytestmark = [pytest.mark.ssh, pytest.mark.torch]
N = 20000


@pytest.fixture(scope="module")
def chatter_run(cluster, tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    res = dtrain(["run", "-H", "node[1-3]", "--python", cluster.python, "--nproc-per-node",
                  "2", "--archive-dir", str(runs), "--run-id", "chatter", "--no-color",
                  "tests/workloads/chatter.py", str(N)], env=cluster.client_env(), timeout=170)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return res, runs / "chatter"


def test_every_line_once_on_the_console_with_its_rank(chatter_run):
    """EVERY numbered line: its tag is its own rank's (the rank is in the text), it comes
    once, in order within its rank, and it is whole."""
    res, _ = chatter_run
    rx = re.compile(r"rank(\d+) line(\d+) (x*)")
    nxt = dict.fromkeys(range(6), 0)
    for n, line in enumerate(res.stdout.splitlines()):
        tag, sep, text = line.partition(": ")
        m = rx.fullmatch(text)
        if not sep or m is None:
            continue
        rank, i = int(m[1]), int(m[2])
        assert tag == f"node{rank // 2 + 1} r{rank}", f"console line {n} mistagged: {line!r}"
        assert i == nxt[rank], f"console line {n}: rank{rank} line{i}, expected line{nxt[rank]}"
        assert m[3] == "x" * (i % 50), f"console line {n} cut or merged: {line!r}"
        nxt[rank] += 1
    assert nxt == dict.fromkeys(range(6), N), nxt


def test_every_line_once_in_output_jsonl_with_its_rank(chatter_run):
    _, run = chatter_run
    seen: Counter[tuple[int, int]] = Counter()
    progress, big = [], []
    with open(run / "output.jsonl", encoding="utf-8") as f:
        for raw in f:
            obj = json.loads(raw)
            line = obj["line"]
            if line.startswith("rank") and " line" in line:
                head = line.split(" ", 2)
                assert head[0] == f"rank{obj['rank']}" and obj["stream"] == "out"
                assert obj["host"] == f"node{obj['rank'] // 2 + 1}"
                assert obj["node_rank"] == obj["rank"] // 2
                seen[(obj["rank"], int(head[1][4:]))] += 1
            elif line.startswith("progress"):
                progress.append(line)
            elif line.startswith("BBBB"):
                big.append((obj["rank"], len(line)))
    assert len(seen) == 6 * N and set(seen.values()) == {1}
    # \r progress bars collapse to their last state: one line per rank
    assert sorted(progress) == ["progress 100%"] * 6
    assert big == [(4, 5 * 1024 * 1024)]
    meta = json.loads((run / "meta.json").read_text())
    assert meta["exit_code"] == 0 and meta["hosts"] == ["node1", "node2", "node3"]
    assert (run / "hosts" / "node2.log").is_file()


def test_stderr_is_kept_apart(chatter_run):
    res, _ = chatter_run
    assert "node3 r5 [err]: rank5 to stderr" in res.stdout


def test_logs_replays_only_the_chosen_rank(chatter_run, cluster):
    _, run = chatter_run
    res = dtrain(["logs", str(run), "--rank", "4", "--no-color"], env=cluster.client_env())
    assert res.returncode == 0
    tagged = [ln for ln in res.stdout.splitlines() if not ln.startswith("dtrain:")]
    assert tagged and all(ln.startswith("node3 r4") for ln in tagged)
    assert sum(1 for ln in tagged if " line" in ln) == N
    res = dtrain(["logs", str(run), "--grep", "line1999 ", "--json"], env=cluster.client_env())
    objs = [json.loads(ln) for ln in res.stdout.splitlines()]
    assert sorted(o["rank"] for o in objs) == list(range(6))


def test_torchrun_s_exit_barrier_trace_after_success_is_one_line_per_node(cluster, tmp_path):
    """torchrun's exit-barrier race, made to happen every time (tests/workloads/barrier_race:
    node2's and node3's agents check in late and read the store after node1's agent, its
    host, left): each prints a c10d C++ warning and a traceback, then exits 0. Every rank
    had finished: the console has one line per node (fold.ExitBarrierNoise), the archive
    every line of it."""
    from tests.test_failures import Dtrain, new_id, run_args
    from tests.util import REPO

    run_id = new_id("barrier")
    # --no-preload: the race's sitecustomize patches an agent it knows by its command line,
    # which a cold agent has; a forked one ran no sitecustomize of its own (docs/warm-start.md)
    job = Dtrain(cluster, run_args(
        cluster, tmp_path, run_id, "tests/workloads/tick.py", "--no-preload", hosts="node[1-3]",
        env={"TICK_S": "0.2", "TICK_N": "3", "DTRAIN_BARRIER_RACE": "1",
             "PYTHONPATH": str(REPO / "tests" / "workloads" / "barrier_race")}))
    assert job.wait(120) == 0, job.output
    out = job.output
    folded = {}
    for m in re.finditer(r"^dtrain: (node\d): torchrun's exit barrier failed after every rank "
                         r"here finished \(the rendezvous store's host left first: (.*)\); "
                         r"harmless, (\d+) lines in the archive$", out, re.M):
        folded[m.group(1)] = (m.group(2), int(m.group(3)))
    assert set(folded) == {"node2", "node3"}, out
    assert "Connection was likely closed" in folded["node2"][0], folded
    for raw in ("Error waiting on exit barrier", "frame #", "Traceback", "[c10d] recv"):
        assert not [ln for ln in out.splitlines()
                    if raw in ln and not ln.startswith("dtrain: ")], (raw, out)
    records = [json.loads(ln) for ln in
               (tmp_path / "runs" / run_id / "output.jsonl").read_text().splitlines()]
    for host, (_, n) in folded.items():
        agent = [r["line"] for r in records if r.get("host") == host and r.get("rank") is None
                 and r.get("stream") == "err"]
        assert any("Error waiting on exit barrier" in ln for ln in agent), agent
        assert n <= len(agent), (n, agent)
