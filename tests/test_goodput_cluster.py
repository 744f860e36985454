"""The goodput ledger of a real run on the real-sshd cluster (docs/goodput.md): one run under
`--restarts` with two injected faults, a crash (rank 1 raises at step 7) and a lost node
(node5's link cut after checkpoint step 15; spare node6 comes in). The ledger in meta.json
must equal, cause by cause, what this test computes on its own from the archive's records
(meta.json attempts[] and rank 0's lines in output.jsonl; ckpt.py's line formats)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import tests.cluster as tc
from tests.test_failures import Dtrain, meta, new_id
from tests.test_notify import server  # noqa: F401
from tests.test_restarts_cluster import _args, _ckdir, _cut_run, _records, six  # noqa: F401

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
