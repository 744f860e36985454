"""A node that lies, on the real-sshd cluster (issue 34, item 3): node2's interpreter (the
hostfile's ``python=``) pipes its supervisor's stream through
tests/cluster/hostile_frames.py, which rewrites its control messages to speak for ranks it
does not own, with keys no supervisor sends (tests/hostile.py ``python_wrapper``: the liar
of the pure tests, on sshd). node1 is honest. What node2 claims changes nothing of what
dtrain says about node1 (docs/security.md, "What nodes send: the run").
"""

from __future__ import annotations

import base64
import json
import pickle
import re
import uuid
from pathlib import Path

import pytest

from tests import cluster as tc
from tests import hostile
from tests.test_failures import Dtrain, JobWatch, meta, new_id

HANG = "tests/workloads/hang.py"
pytestmark = [pytest.mark.ssh, pytest.mark.torch, pytest.mark.timeout(200)]


def _hostile_hosts(cluster: tc.Cluster, tmp_path: Path, config: dict) -> Path:
    wrapper = hostile.python_wrapper(
        cluster.shared_dir / f"hostile-frames-{uuid.uuid4().hex[:8]}", cluster.python, config)
    hostfile = tmp_path / "hosts"
    hostfile.write_text(f"node1 python={cluster.python}\nnode2 python={wrapper}\n")
    return hostfile


def _run(cluster: tc.Cluster, tmp_path: Path, jobs: list, config: dict) -> tuple[Dtrain, str]:
    run_id = new_id("liar")
    hostfile = _hostile_hosts(cluster, tmp_path, config)
    args = ["run", "-f", str(hostfile), "--nproc-per-node", "2", "--archive-dir",
            str(tmp_path / "runs"), "--run-id", run_id, "--no-color", "--hang-timeout", "5",
            "--on-hang", "stop", "--grace", "3", "--timeout", "100",
            "-e", "WL_HANG_RANK=1", "-e", "WL_HANG_STEP=2", HANG]
    with JobWatch(cluster, [1, 2], run_id=run_id) as watch:
        job = Dtrain(cluster, args)
        jobs.append(job)
        job.wait(170)
        watch.assert_clean(since=job.ended)
    return job, run_id


def test_a_node_cannot_speak_for_ranks_it_does_not_own(cluster: tc.Cluster, tmp_path: Path,
                                                       jobs: list) -> None:
    """node2 (ranks 2, 3) answers the hang's stacks with node1's ranks 0 and 1 (waiting in
    all_reduce, as its own) and invented ranks 6 and 7, and says ranks 0, 1 started: rank 1
    on node1, blocked in load_batch, is still the culprit, every rank is counted once, and
    node1's stacks in the archive are node1's."""
    fake = "Thread 0x1 (most recent call first):\n  File \"/x/hostile.py\", line 1 in lie\n"
    job, run_id = _run(cluster, tmp_path, jobs, {
        "stacks": {"0": fake, "1": fake, "6": fake, "7": fake}, "rank_start": [0, 1]})
    out = job.output
    assert job.proc.returncode == 125, out[-4000:]
    m = meta(tmp_path, run_id)
    (hang,) = m["hangs"]
    assert hang["culprit"]["rank"] == 1 and hang["culprit"]["host"] == "node1", hang
    assert sorted(r for g in hang["folded"] for r in g["ranks"]) == [0, 1, 2, 3], hang
    assert "hostile.py" not in json.dumps(hang)
    dump = tmp_path / "runs" / run_id / "stacks" / "h1"
    for rank in (0, 1):
        assert "hostile.py" not in (dump / f"r{rank}.txt").read_text()
    assert not (dump / "r6.txt").exists() and not (dump / "r7.txt").exists()
    assert re.search(r"^dtrain: likely culprit: rank 1 on node1: ", out, re.M), out[-3000:]


def test_keys_no_supervisor_sends_leave_the_run_watched(cluster: tc.Cluster, tmp_path: Path,
                                                        jobs: list) -> None:
    """node2's stacks answer carries the rank key "²" and flight dumps whose ``entries`` is
    an int, and its end-of-run flight files name ranks of node1: the hang watch goes on, the
    hang is declared and the run stopped (exit 125), never left to --timeout (exit 124)."""
    bad = base64.b64encode(pickle.dumps({"pg_status": {"0": {
        "last_enqueued_collective": 3, "last_completed_collective": 2}}, "entries": 5},
        protocol=2)).decode()
    job, run_id = _run(cluster, tmp_path, jobs, {
        "bad_key": True, "bad_flight": bad, "flight": {"0": bad, "\u00b2": bad}})
    out = job.output
    assert job.proc.returncode == 125, out[-4000:]
    assert "Traceback" not in out, out[-4000:]
    (hang,) = meta(tmp_path, run_id)["hangs"]
    assert hang["culprit"]["rank"] == 1 and hang["culprit"]["host"] == "node1", hang
