"""Issue 40 item 9, the small things a new user reads: "1 node" (not "1 nodes"), the dry
run's transport for localhost, a 1-rank smoke that measured no bandwidth, the dry run of
many alike nodes folded. (`stacks`' group count: tests/test_hangs.py; top's row per GPU:
tests/test_top_cluster.py::test_key_g_gives_each_gpu_its_own_row; the report's header:
tests/test_report_texts.py.)"""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

from launcher.commands.runs import _StatusLine
from launcher.commands.smoke import render_table
from launcher.decide.fabric.smoke import MARK, SmokeResults, evaluate
from tests.report_archives import T0, write_archive
from tests.util import REPO, dtrain

# run from another directory: still this worktree's dtrain
ENV = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(REPO)}


def _one_rank() -> SmokeResults:
    res = SmokeResults(layout={0: "n1"}, nodes=["n1"])
    for msg in ({"kind": "rank", "rank": 0, "node_rank": 0, "hostname": "n1",
                 "torch": "2.13.0", "nccl": None, "device": "cpu", "device_count": 0,
                 "python": "3.11.7"},
                {"kind": "check", "rank": 0, "mismatches": {"1024": 0}},
                {"kind": "sweep", "backend": "gloo", "rows": [
                    {"size": 1024, "count": 256, "iters": 5, "time_us": 10.0, "algbw": 0.1,
                     "busbw": 0.0}]}):
        res.add_line("n1", 0, MARK + json.dumps(msg))
    return res


def test_a_one_rank_smoke_says_it_measured_no_bandwidth() -> None:
    res = _one_rank()
    v = evaluate(res, node_labels=["n1"], world_size=1, job_code=0, job_summary="")
    assert v.code == 0 and v.busbw is None
    assert "busbw not measured: one rank moves no data" in v.summary
    assert "busbw 0" not in v.summary
    out = io.StringIO()
    render_table(res, v, out)
    assert ", 1 rank\n" in out.getvalue()  # not "1 ranks"
    strict = evaluate(res, node_labels=["n1"], world_size=1, job_code=0, job_summary="",
                      min_busbw=1.0)
    assert strict.code == 1
    assert [f.check for f in strict.failures] == ["busbw"]
    assert "one rank measures no bus bandwidth" in strict.failures[0].message


def test_attach_says_1_node_1_rank(tmp_path: Path) -> None:
    run = write_archive(tmp_path / "r1", {"created_ts": T0, "start": T0, "hosts": ["node1"],
                                          "world_size": 1, "state": "running"}, [])
    text = _StatusLine(run).render()
    assert "| 1 node, 1 rank |" in text, text


def test_dry_run_on_localhost_says_local_not_ssh(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    res = dtrain(["run", "-H", "localhost", "--nproc-per-node", "1", "--python",
                  sys.executable, "--dry-run", "train.py"], cwd=tmp_path,
                 env=ENV, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "transport local (localhost runs as a subprocess: no ssh)" in res.stdout
    assert "transport ssh" not in res.stdout


def test_offline_dry_run_of_23_alike_nodes_is_one_block(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node[1-23] slots=2\n")
    res = dtrain(["run", "-f", str(hostfile), "--dry-run", "--offline", "train.py"],
                 cwd=tmp_path, env=ENV)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert len(lines) < 30, res.stdout  # was 191
    assert any(ln.startswith("nodes 0-22  node[1-23]  ranks 0-45 (2 each; 23 nodes alike")
               for ln in lines), res.stdout
    assert "--node-rank <N>" in res.stdout and "DTRAIN_NODE_RANK=<N>" in res.stdout
    # the JSON plan keeps every node
    doc = json.loads(dtrain(["run", "-f", str(hostfile), "--dry-run", "--offline", "--json",
                             "train.py"], cwd=tmp_path, env=ENV).stdout)
    assert len(doc["nodes"]) == 23
    few = tmp_path / "few"
    few.write_text("node[1-4] slots=2\n")
    four = dtrain(["run", "-f", str(few), "--dry-run", "--offline", "train.py"], cwd=tmp_path,
                  env=ENV)
    assert four.stdout.count("\nnode ") == 4  # a few nodes: each its own block
