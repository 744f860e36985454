"""Hangs on the real-sshd cluster: the culprit named, every rank's stacks, no code change.

3 nodes x 2 ranks over gloo (tests/workloads/hang.py): rank 4, on node3, blocks in
``time.sleep`` inside ``load_batch`` before an all_reduce the other five ranks wait in.
What is asserted is what a user reads: the console's folded verdict, the archive's files,
meta.json, --json and JUnit, the exit code, and (JobWatch) that nothing is left on any node.
"""

from __future__ import annotations

import json
import re
import signal
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests import cluster as tc
from tests.reports import validate_json, validate_junit
from tests.test_failures import Dtrain, JobWatch, meta, new_id, run_args
from tests.util import dtrain

HANG = "tests/workloads/hang.py"
PROGRESS = "tests/workloads/progress.py"
pytestmark = [pytest.mark.timeout(180)]


def _culprit_line(out: str) -> str:
    m = re.search(r"^dtrain: likely culprit: (.*)$", out, re.M)
    assert m, out[-3000:]
    return m.group(1)


@pytest.mark.ssh
@pytest.mark.torch
def test_hang_names_rank_and_node_folds_the_rest_and_stop_cleans(
        cluster: tc.Cluster, tmp_path: Path, jobs) -> None:
    run_id = new_id("hang")
    junit = tmp_path / "hang.xml"
    args = run_args(cluster, tmp_path, run_id, HANG, "--hang-timeout", "5", "--on-hang",
                    "stop", "--grace", "3", "--json", "--junit", str(junit), nproc=2,
                    env={"WL_HANG_RANK": "4", "WL_HANG_STEP": "3"})
    with JobWatch(cluster, [1, 2, 3], run_id=run_id) as watch:
        job = Dtrain(cluster, args)
        jobs.append(job)
        rc = job.wait(150)
        watch.assert_saw(3)
        watch.assert_clean(since=job.ended)
    out = job.output
    assert rc == 125, out[-4000:]
    # the console: rank 4 on node3, its blocking call; the other five folded in all_reduce
    assert re.search(r"^dtrain: HANG: no rank made progress for \d+ s", out, re.M), out
    assert re.search(r"^dtrain:   ranks 0-3,5 \(5 ranks on 3 nodes\): all_reduce <- "
                     r"step_once\(\) hang\.py:\d+$",
                     out, re.M), out
    assert re.search(r"^dtrain:   rank 4 \(node3\): time\.sleep <- load_batch\(\) hang\.py:\d+"
                     r"   <- likely culprit$", out, re.M), out
    assert _culprit_line(out).startswith("rank 4 on node3: time.sleep <- load_batch()")
    assert re.search(r"flight recorder: ranks 0-3,5 wait in collective #\d+ \(gloo:all_reduce"
                     r"\); rank 4 is at collective #\d+", out), out
    # the archive: every rank's stacks, the blocking function in rank 4's
    dump = tmp_path / "runs" / run_id / "stacks" / "h1"
    for rank in range(6):
        text = (dump / f"r{rank}.txt").read_text()
        assert "(most recent call first)" in text, text
    assert re.search(r'File ".*hang\.py", line \d+ in load_batch', (dump / "r4.txt").read_text())
    assert "in all_reduce" in (dump / "r0.txt").read_text()
    for rank in range(6):
        assert (tmp_path / "runs" / run_id / "flight" / "h1" / f"rank_{rank}").stat().st_size
    m = meta(tmp_path, run_id)
    (hang,) = m["hangs"]
    assert hang["culprit"]["rank"] == 4 and hang["culprit"]["host"] == "node3", hang
    assert [g["ranks"] for g in hang["folded"]] == [[0, 1, 2, 3, 5], [4]], hang
    assert m["root_cause"]["kind"] == "hang" and m["exit_code"] == 125
    assert set(m["progress"]) == {str(r) for r in range(6)}
    assert m["progress"]["0"]["last_progress"] is not None
    # --json and JUnit name the culprit too
    doc = json.loads(job.output[job.output.index("{\n"):job.output.rindex("}") + 1])
    validate_json(doc, "run")
    validate_junit(junit.read_text())
    assert doc["root_cause"]["kind"] == "hang" and doc["root_cause"]["rank"] == 4
    assert doc["run"]["hangs"][0]["culprit"]["host"] == "node3"
    failures = [(c.get("name"), f.get("message")) for c in ET.parse(junit).iter("testcase")
                for f in c.iter("failure")]
    assert any("rank 4" in (name or "") and "load_batch" in (msg or "")
               for name, msg in failures), failures


@pytest.mark.ssh
@pytest.mark.torch
def test_the_ranks_that_have_not_reached_the_collective_are_named_not_the_few_that_wait(
        cluster: tc.Cluster, tmp_path: Path, jobs) -> None:
    """Ranks 0-3 (node1, node2) block in load_batch, ranks 4-5 (node3) wait in all_reduce:
    the four are the culprits, the two waiting are victims (decide/outcome/stacks.py)."""
    run_id = new_id("hang4")
    args = run_args(cluster, tmp_path, run_id, HANG, "--hang-timeout", "5", "--on-hang",
                    "stop", "--grace", "3", nproc=2,
                    env={"WL_HANG_RANK": "0,1,2,3", "WL_HANG_STEP": "3"})
    job = Dtrain(cluster, args)
    jobs.append(job)
    rc = job.wait(150)
    out = job.output
    assert rc == 125, out[-4000:]
    assert re.search(r"^dtrain:   ranks 0-3 \(4 ranks on 2 nodes\): time\.sleep <- "
                     r"load_batch\(\) hang\.py:\d+"
                     r"   <- likely culprit$", out, re.M), out
    assert re.search(r"^dtrain:   ranks 4-5 \(node3\): all_reduce <- step_once\(\) "
                     r"hang\.py:\d+$", out, re.M), out
    line = _culprit_line(out)
    assert line.startswith("ranks 0-3: time.sleep <- load_batch()"), line
    assert "not entered collective" in line, line  # the flight recorder's numbers decided
    (hang,) = meta(tmp_path, run_id)["hangs"]
    assert hang["culprit"]["ranks"] == [0, 1, 2, 3], hang
    assert hang["culprit"]["where"] == "script"


@pytest.mark.ssh
@pytest.mark.torch
def test_dtrain_stacks_on_a_detached_run_from_another_shell(
        cluster: tc.Cluster, tmp_path: Path) -> None:
    run_id = new_id("stacks")
    archive = tmp_path / "runs"
    args = run_args(cluster, tmp_path, run_id, HANG, "--detach", "--hang-timeout", "0",
                    "--grace", "2", nproc=2, env={"WL_HANG_RANK": "4", "WL_HANG_STEP": "2"})
    with JobWatch(cluster, [1, 2, 3], run_id=run_id) as watch:
        res = dtrain(args, env=cluster.client_env(), timeout=120)
        assert res.returncode == 0, res.stdout + res.stderr
        try:
            deadline = time.monotonic() + 90
            log = archive / run_id / "output.jsonl"
            while "blocking before the all_reduce" not in (
                    log.read_text() if log.exists() else ""):
                assert time.monotonic() < deadline, "rank 4 never blocked"
                time.sleep(0.2)
            # the others reach the all_reduce: asked until every one of them is in it
            waiting = re.compile(r"^  ranks 0-3,5 \(5 ranks on 3 nodes\): all_reduce <- ", re.M)
            while True:
                got = dtrain(["stacks", run_id, "--archive-dir", str(archive)],
                             env=cluster.client_env(), timeout=60)
                assert got.returncode == 0, got.stdout + got.stderr
                if waiting.search(got.stdout) or time.monotonic() > deadline:
                    break
            out = got.stdout
            assert re.search(r"^  ranks 0-3,5 \(5 ranks on 3 nodes\): all_reduce <- "
                             r"step_once\(\) hang\.py:\d+$",
                             out, re.M), out
            assert re.search(r"^  rank 4 \(node3\): time\.sleep <- load_batch\(\) hang\.py:\d+",
                             out, re.M), out
            assert re.search(r"^likely culprit: rank 4 on node3: ", out, re.M), out
            for rank in range(6):
                assert (archive / run_id / "stacks" / "s1" / f"r{rank}.txt").exists()
        finally:
            stop = dtrain(["stop", run_id, "--archive-dir", str(archive)],
                          env=cluster.client_env(), timeout=60)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        ok, _ = watch.wait_clean(20)
        assert ok, watch.left()
    assert meta(tmp_path, run_id)["stacks"][0]["culprit"]["rank"] == 4


@pytest.mark.ssh
@pytest.mark.parametrize("chatter, hung", [(0, False), (30, True)])
def test_progress_by_regex_not_output(cluster: tc.Cluster, tmp_path: Path, jobs,
                                      chatter: int, hung: bool) -> None:
    """Quiet ranks and a rank 0 that prints only its progress lines is not a hang; a rank 0
    that goes on printing, but no progress, is."""
    run_id = new_id("progress")
    args = run_args(cluster, tmp_path, run_id, PROGRESS, "--hang-timeout", "3",
                    "--progress", r"^it \d+$", hosts="node[1-2]",
                    env={"WL_TICKS": "12", "WL_EVERY": "0.8", "WL_CHATTER": str(chatter)})
    job = Dtrain(cluster, args)
    jobs.append(job)
    assert job.wait(120) == 0, job.output
    assert bool(re.search(r"^dtrain: HANG: ", job.output, re.M)) is hung, job.output
    assert bool(meta(tmp_path, run_id)["hangs"]) is hung


@pytest.mark.ssh
@pytest.mark.torch
@pytest.mark.parametrize("mode, code, why, kind", [
    ("segv", 139, r"rank 1 on node2 crashed: SIGSEGV \(segmentation fault\) in string_at <- "
                  r"load_batch\(\) hang\.py:\d+", "segfault"),
    # the test nodes hide the kernel log (dmesg_restrict) and the cgroup tree (their /sys is
    # the netns's): dtrain says it cannot tell whether the OOM killer did it
    ("sigkill", 137, r"rank 1 on node2 was killed by SIGKILL, not by dtrain; whether the OOM "
                     r"killer did it cannot be told on node2", "signal"),
    ("raise", 1, r"rank 1 on node2 raised ValueError: bad batch at step 1 in load_batch\(\) "
                 r"hang\.py:\d+", "exception"),
])
def test_why_it_died(cluster: tc.Cluster, tmp_path: Path, jobs, mode: str,
                     code: int, why: str, kind: str) -> None:
    run_id = new_id(f"why-{mode}")
    args = run_args(cluster, tmp_path, run_id, HANG, "--grace", "3", hosts="node[1-2]",
                    env={"WL_HANG_RANK": "1", "WL_HANG_STEP": "1", "WL_HANG_MODE": mode})
    job = Dtrain(cluster, args)
    jobs.append(job)
    assert job.wait(120) == code, job.output[-3000:]
    out = job.output
    assert re.search(rf"^dtrain: why: {why}", out, re.M), out[-3000:]
    assert re.search(r"^dtrain: next: ", out, re.M), out[-3000:]
    failure = meta(tmp_path, run_id)["root_cause"]["failure"]
    assert (failure["kind"], failure["rank"], failure["host"]) == (kind, 1, "node2")
    if mode == "segv":  # the Python stack of the crash, from faulthandler on the node
        assert re.search(r"^dtrain:     load_batch\(\) hang\.py:\d+$", out, re.M), out[-3000:]


@pytest.mark.ssh
def test_a_stopped_launcher_is_not_a_hang_and_a_real_one_still_is(
        cluster: tc.Cluster, tmp_path: Path, jobs) -> None:
    """dtrain itself is SIGSTOPped 7 s (past its --hang-timeout of 3) while rank 0 goes on
    printing its progress; SIGCONTed, it reads what came meanwhile: its own stop is not the
    ranks' stall (decide/outcome/hang.py, counted as decide/outcome/liveness.py counts a node's
    silence).
    Then rank 0 really goes silent for 8 s: that is a hang, declared once."""
    run_id = new_id("launcher-stop-hang")
    args = run_args(cluster, tmp_path, run_id, PROGRESS, "--hang-timeout", "3",
                    "--progress", r"^it \d+$", hosts="node[1-2]",
                    env={"WL_TICKS": "30", "WL_EVERY": "0.5", "WL_HOLD": "8"})
    job = Dtrain(cluster, args)
    jobs.append(job)
    job.wait_line(r"r0: it 3$", timeout=90)
    job.proc.send_signal(signal.SIGSTOP)
    try:
        time.sleep(7.0)
    finally:
        job.proc.send_signal(signal.SIGCONT)
    assert job.wait(120) == 0, job.output
    out = job.output
    hangs = [ln for ln in out.splitlines() if re.search(r"^dtrain: HANG: ", ln)]
    assert len(hangs) == 1, out
    assert out.index("dtrain: HANG: ") > out.index("r0: it 29"), out  # the silence, not the stop
    (hang,) = meta(tmp_path, run_id)["hangs"]
    assert hang["stalled_s"] >= 3, hang
