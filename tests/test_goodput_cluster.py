"""The goodput ledger of a real run on the real-sshd cluster (docs/goodput.md): one run under
`--restarts` with two injected faults, a crash (rank 1 raises at step 7) and a lost node
(node5's link cut after checkpoint step 15; spare node6 comes in). The ledger in meta.json
must equal, cause by cause, what this test computes on its own from the archive's records
(meta.json attempts[] and rank 0's lines in output.jsonl; ckpt.py's line formats). And
where start-up goes on 2 nodes: every part of the split there, non-negative, summing to
startup."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import tests.cluster as tc
from tests.test_failures import Dtrain, meta, new_id
from tests.test_notify import server  # noqa: F401
from tests.test_restarts_cluster import _args, _ckdir, _cut_run, _records, six  # noqa: F401
from tests.util import need_module

pytestmark = [pytest.mark.ssh, pytest.mark.torch, pytest.mark.timeout(300)]
STEP = re.compile(r"step (\d+)")


def expected(m: dict, records: list[dict]) -> list[dict[str, float]]:
    """Per attempt, seconds per cause, from ckpt.py's rank-0 lines and attempts[] alone."""
    out = []
    attempts = m["attempts"]
    t0 = min(m["start"], attempts[0]["start"])
    mine = {a["n"]: [r for r in records if r.get("rank") == 0 and r.get("attempt", 1) == a["n"]
                     and r["stream"] != "dtrain"] for a in attempts}
    for i, a in enumerate(attempts):
        lines = mine[a["n"]]
        steps = [(r["t"], int(STEP.search(r["line"]).group(1))) for r in lines
                 if STEP.search(r["line"])]
        first, last = steps[0][0], steps[-1][0]
        start = t0 if i == 0 else a["start"]
        cause = {"startup": first - start, "detection": 0.0, "restart": 0.0,
                 "winddown": 0.0, "backoff": 0.0, "lost": 0.0, "checkpoint_save": 0.0,
                 "checkpoint_restore": 0.0}
        end_prog = last
        if i + 1 < len(attempts):
            resumed = next(int(STEP.search(r["line"]).group(1)) for r in mine[a["n"] + 1]
                           if STEP.search(r["line"]))
            end_prog = max(t for t, s in steps if s < resumed)
            cause["lost"] = last - end_prog
            cause["detection"] = a["detected"] - last
            cause["restart"] = a["end"] - a["detected"]
            cause["backoff"] = a["relaunched"] - a["end"]
        else:
            cause["winddown"] = max(m["end"], a["end"]) - last  # the run ends after both
        cause["productive"] = end_prog - first
        # checkpoint lines: the gap to rank 0's line before, out of the cause it fell in
        for prev, cur in zip(lines, lines[1:], strict=False):
            kind = ("checkpoint_save" if cur["line"].startswith("checkpoint step") else
                    "checkpoint_restore" if cur["line"].startswith("resumed at") else None)
            if kind is None:
                continue
            gap = cur["t"] - prev["t"]
            cause[kind] += gap
            where = ("startup" if cur["t"] <= first else "productive" if cur["t"] <= end_prog
                     else "lost" if cur["t"] <= last else "winddown")
            cause[where] -= gap
        out.append(cause)
    return out


def test_the_ledger_of_a_crash_and_a_lost_node_equals_the_archive_cause_by_cause(
        six: tc.Cluster, tmp_path: Path, jobs: list[Dtrain],  # noqa: F811
        server: tuple[str, list[dict]]) -> None:  # noqa: F811
    run_id = new_id("goodput")
    ck = _ckdir(six, run_id)
    junit = tmp_path / "junit.xml"
    args = _args(six, tmp_path, run_id, "node[3-6]", "--nnodes", "3", "--restarts", "3",
                 "--heartbeat-timeout", "5", "--restart-backoff", "0.5", "--junit", str(junit),
                 "--notify", f"{server[0]}/hook",
                 env={"CK_DIR": str(ck), "CK_STEPS": "40", "CK_STEP_SLEEP": "0.2",
                      "CK_CRASH_RANK": "1"})
    job, rc = _cut_run(six, tmp_path, jobs, run_id, args, [3, 4, 5, 6], 5,
                       r"checkpoint step 15$", r"node5 lost .*: fenced, spare node6 in",
                       supervisors=3 + 3 + 3)
    assert rc == 0, job.output
    m = meta(tmp_path, run_id)
    assert [a["cause"] for a in m["attempts"]] == ["process", "node", "ok"], m["attempts"]
    g = m["goodput"]
    want = expected(m, _records(tmp_path, run_id))
    for got, exp in zip(g["attempts"], want, strict=True):
        for cause, secs in exp.items():
            assert got["seconds"][cause] == pytest.approx(secs, abs=0.01), (got["n"], cause)
    assert [a["resumed_at"] for a in g["attempts"]] == [0, 5, 15]
    assert g["attempts"][0]["lost_steps"] == 3  # steps 5, 6, 7 done again
    assert g["attempts"][1]["lost_steps"] >= 1
    total = sum(v for v in g["seconds"].values())
    assert total == pytest.approx(g["wall_s"], abs=0.02)
    assert g["goodput"] == pytest.approx(g["seconds"]["productive"] / g["wall_s"], abs=1e-3)
    assert 0 < g["goodput"] < 1 and g["not_measured"] == []
    # --notify: every event, in order, with the fenced node and the goodput
    events = server[1]
    assert [e["event"] for e in events] == ["started", "relaunched", "fenced", "relaunched",
                                            "ended"], events
    assert events[2]["host"] == "node5" and events[-1]["goodput"] == g["goodput"]
    text = junit.read_text()
    assert f'<property name="goodput" value="{g["goodput"]:.4f}"' in text
    assert '<property name="goodput.lost_s"' in text


PARTS = ("connect_probe", "agent_start", "rendezvous", "rank_start", "script")


def test_where_startup_goes_on_two_nodes_each_part_there_and_summing_to_startup(
        cluster: tc.Cluster, tmp_path: Path, jobs: list[Dtrain]) -> None:
    """A 2-node gloo run under --restarts 1 whose rank 1 crashes once: both attempts' start-up
    split per node (docs/goodput.md, "Where start-up goes"), every part present and
    non-negative, their sum the attempt's startup; meta.json's startup[] holds the instants
    in order, on the launcher's clock (the cluster's nodes share the login node's clock)."""
    need_module("torch")
    run_id = new_id("startup")
    ck = _ckdir(cluster, run_id)
    args = _args(cluster, tmp_path, run_id, "node[1-2]", "--restarts", "1",
                 "--restart-backoff", "0.5",
                 env={"CK_DIR": str(ck), "CK_STEPS": "8", "CK_STEP_SLEEP": "0.1",
                      "CK_CRASH_RANK": "1", "CK_CRASH_STEP": "3"})
    job = Dtrain(cluster, args)
    jobs.append(job)
    assert job.wait(180) == 0, job.output
    m = meta(tmp_path, run_id)
    g = m["goodput"]
    assert [r["attempt"] for r in m["startup"]] == [1, 2]
    for rec, a in zip(m["startup"], g["attempts"], strict=True):
        for node in rec["nodes"]:
            times = [node[k] for k in ("supervisor", "agent", "rank_start", "script")]
            # in order (the supervisor's rank_start may lag a rank's own arm under load)
            assert None not in times, node
            assert all(b >= a - 0.05 for a, b in zip(times, times[1:], strict=False)), node
            assert node["clock_offset"] == 0.0, node  # one machine, one clock
        split = a["startup_split"]
        assert split["node"] == "node1" and set(split["nodes"]) == {"node1", "node2"}
        for parts in split["nodes"].values():
            assert all(parts[p] is not None and parts[p] >= 0 for p in PARTS), parts
            assert parts["unsplit"] == 0.0
            assert sum(parts.values()) == pytest.approx(a["seconds"]["startup"], abs=0.006)
        # torchrun's imports and the script's own start take time on a real node
        assert split["seconds"]["agent_start"] > 0 and split["seconds"]["script"] > 0
    run = g["startup_split"]
    assert sum(run.values()) == pytest.approx(g["seconds"]["startup"], abs=0.012)
