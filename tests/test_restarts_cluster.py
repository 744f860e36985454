"""`dtrain run --restarts` on the real-sshd cluster (#28): a lost node fenced and replaced
by a spare, the run resumed from its checkpoint; a crash restarted on the same nodes; a
SyntaxError tried once; a shrink within --nnodes MIN:MAX; a stop during the back-off; no
process left on any node. The cluster grows to 6 nodes: the link cuts hit nodes 5 and 6
only (other sessions' tests use nodes 1-4), and are restored in ``finally``."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import tests.cluster as tc
from tests.reports import validate_junit
from tests.test_failures import Dtrain, JobWatch, meta, new_id
from tests.util import REPO, need_module

CKPT = "tests/workloads/ckpt.py"
pytestmark = [pytest.mark.ssh, pytest.mark.torch, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def six(cluster: tc.Cluster) -> tc.Cluster:
    """The shared cluster with at least 6 nodes (``up`` only adds nodes)."""
    need_module("torch")
    return tc.up(6)


def _saw(watch: JobWatch, supervisors: int) -> None:
    """The watch saw every attempt's supervisors (one per node per attempt)."""
    assert watch.supervisors() == supervisors, watch.known


def _state(tmp_path: Path) -> dict[str, str]:
    """This test's own per-user state directory (the lemon list)."""
    return {"XDG_STATE_HOME": str(tmp_path / "state")}


def _ckdir(cluster: tc.Cluster, run_id: str) -> Path:
    folder = cluster.shared_dir / run_id
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)  # the ranks run as dtuser
    return folder


def _args(cluster: tc.Cluster, tmp_path: Path, run_id: str, hosts: str, *extra: str,
          env: dict[str, str], script: str = CKPT) -> list[str]:
    args = ["run", "-H", hosts, "--nproc-per-node", "1", "--python", cluster.python,
            "--archive-dir", str(tmp_path / "runs"), "--run-id", run_id, "--no-color", *extra]
    for key, value in env.items():
        args += ["-e", f"{key}={value}"]
    return [*args, script]


def _records(tmp_path: Path, run_id: str) -> list[dict]:
    path = tmp_path / "runs" / run_id / "output.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _lemons(tmp_path: Path) -> list[dict]:
    path = tmp_path / "state" / "dtrain" / "lemons.json"
    return json.loads(path.read_text())["lemons"] if path.exists() else []


def _timings_in_order(attempts: list[dict]) -> None:
    """Each failed attempt: started, its failure detected, the stop begun, ended, the
    relaunch started (= the next attempt's start); the last one was not relaunched. And
    attempts[] is valid dtrain.run/1."""
    _validate_attempts(attempts)
    for a, nxt in zip(attempts[:-1], attempts[1:], strict=True):
        assert a["start"] <= a["detected"] <= a["stopping"] <= a["end"] <= a["relaunched"], a
        assert a["relaunched"] == nxt["start"], (a, nxt)
    assert attempts[-1]["relaunched"] is None, attempts[-1]


def _validate_attempts(attempts: list[dict]) -> None:
    import jsonschema

    from launcher.output.report import schema_text

    schema = json.loads(schema_text("run"))
    items = schema["properties"]["run"]["properties"]["attempts"]
    jsonschema.Draft202012Validator(items).validate(attempts)


def _cut_run(cluster: tc.Cluster, tmp_path: Path, jobs: list[Dtrain], run_id: str,
             args: list[str], nodes: list[int], cut: int, after: str, until: str,
             supervisors: int) -> tuple[Dtrain, int]:
    """Run ``args``; once a line matches ``after``, cut node ``cut``'s link until a line
    matches ``until`` (restored in ``finally``); wait for the end and for every node of the
    job to be clean; (the job, its exit code)."""
    job = Dtrain(cluster, args, env=_state(tmp_path))
    jobs.append(job)
    with JobWatch(cluster, nodes, run_id=run_id) as watch:
        try:
            job.wait_line(after, timeout=120)
            cluster.link_down(cut)
            job.wait_line(until, timeout=60)
        finally:
            cluster.link_up(cut)
        rc = job.wait(180)
        watch.wait_clean(30)  # the cut node's supervisor: by its own heartbeat timeout
        watch.assert_clean(1.0)
    _saw(watch, supervisors)  # one per node of each attempt
    return job, rc


def test_a_lost_node_is_fenced_a_spare_comes_in_and_the_run_resumes(
        six: tc.Cluster, tmp_path: Path, jobs: list[Dtrain]) -> None:
    run_id = new_id("restart-lost")
    ck = _ckdir(six, run_id)
    args = _args(six, tmp_path, run_id, "node[3-6]", "--nnodes", "3", "--restarts", "2",
                 "--heartbeat-timeout", "5",
                 env={"CK_DIR": str(ck), "CK_STEPS": "60", "CK_STEP_SLEEP": "0.2"})
    job, rc = _cut_run(six, tmp_path, jobs, run_id, args, [3, 4, 5, 6], 5,
                       r"checkpoint step 10$", r"node5 lost .*: fenced, spare node6 in; "
                       r"attempt 2 from the last checkpoint", supervisors=3 + 3)
    assert rc == 0, job.output
    out = job.output
    assert "node6: spare for a fenced node (--nnodes 3)" in out
    assert re.search(r"node5 lost \(no heartbeat for 5 s, node or network down\): fenced, "
                     r"spare node6 in; attempt 2 from the last checkpoint", out), out
    resumed = [r for r in _records(tmp_path, run_id) if r["line"].startswith("resumed at step")]
    assert resumed and all(r.get("attempt") == 2 for r in resumed), resumed
    assert {r["host"] for r in resumed} == {"node3", "node4", "node6"}
    assert all(int(r["line"].split()[-1]) >= 10 for r in resumed), resumed
    m = meta(tmp_path, run_id)
    first, second = m["attempts"]
    assert first["cause"] == "node" and first["exit_code"] == 255
    assert [f["host"] for f in first["fenced"]] == ["node5"]
    assert first["fenced"][0]["why"].startswith("lost (no heartbeat for 5 s")
    assert first["hosts"] == ["node3", "node4", "node5"]
    assert second["hosts"] == ["node3", "node4", "node6"] and second["exit_code"] == 0
    assert m["exit_code"] == 0 and m["fenced"][0]["host"] == "node5"
    _timings_in_order(m["attempts"])
    lemons = _lemons(tmp_path)
    assert [x["host"] for x in lemons] == ["node5"] and lemons[0]["run_id"] == run_id

    # a later run leaves node5 out, and says so (a dry run: the plan shows the hosts)
    later = subprocess.run(
        [sys.executable, "-m", "launcher",
         *_args(six, tmp_path, new_id("restart-later"), "node[3-6]", "--nnodes", "3",
                "--dry-run", env={"CK_DIR": str(ck)})], cwd=REPO, text=True,
        capture_output=True, env=six.client_env(**_state(tmp_path)), timeout=120)
    text = later.stdout + later.stderr
    assert later.returncode == 0, text
    assert re.search(rf"node5 skipped: fenced by run {run_id} \d+ (s|min) ago \(lost \(no "
                     r"heartbeat for 5 s, node or network down\)\); `dtrain nodes unfence "
                     r"node5` brings it back", text), text
    assert "hosts node[3-4,6]" in text, text
    nodes = subprocess.run([sys.executable, "-m", "launcher", "nodes", "--json"], cwd=REPO,
                           text=True, capture_output=True,
                           env=six.client_env(**_state(tmp_path)))
    assert [n["host"] for n in json.loads(nodes.stdout)["nodes"]] == ["node5"]


def test_a_rank_that_crashes_once_is_restarted_on_the_same_nodes(
        six: tc.Cluster, tmp_path: Path, jobs: list[Dtrain]) -> None:
    run_id = new_id("restart-crash")
    ck = _ckdir(six, run_id)
    junit = tmp_path / "junit.xml"
    args = _args(six, tmp_path, run_id, "node[1-3]", "--restarts", "2",
                 "--restart-backoff", "0.2", "--junit", str(junit),
                 env={"CK_DIR": str(ck), "CK_STEPS": "15", "CK_CRASH_RANK": "1"})
    job = Dtrain(six, args, env=_state(tmp_path))
    jobs.append(job)
    with JobWatch(six, [1, 2, 3], run_id=run_id) as watch:
        rc = job.wait(180)
        watch.assert_clean(1.0, since=job.ended)
    assert rc == 0, job.output
    _saw(watch, 6)
    out = job.output
    assert re.search(r"rank 1 on node2 raised RuntimeError: injected crash at step 7 in main\(\) "
                     r"ckpt.py:\d+; attempt 2 on the same nodes from the last checkpoint in "
                     r"0.2 s", out), out
    assert "world size 3 attempt 2 restart_count 1" in out  # TORCHELASTIC_RESTART_COUNT
    assert re.search(r"r\d: resumed at step 5$", out, re.M), out
    m = meta(tmp_path, run_id)
    assert [a["hosts"] for a in m["attempts"]] == [["node1", "node2", "node3"]] * 2
    assert [a["cause"] for a in m["attempts"]] == ["process", "ok"]
    assert [a["exit_code"] for a in m["attempts"]] == [3, 0]
    assert m["attempts"][0]["fenced"] == [] and _lemons(tmp_path) == []
    _timings_in_order(m["attempts"])
    # the back-off (0.2 s) lies between the end and the relaunch
    assert m["attempts"][0]["relaunched"] - m["attempts"][0]["end"] >= 0.19
    suite = validate_junit(junit.read_text()).find("testsuite")
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    first = "".join(cases["attempt 1"].itertext())
    assert re.search(r"timings: detected \+[\d.]+ s, stopping \+[\d.]+ s, ended \+[\d.]+ s, "
                     r"relaunched \+[\d.]+ s", first), first
    # relaunched: skipped with what happened, not a failure a CI job would count (issue 55)
    skipped = cases["attempt 1"].find("skipped")
    assert cases["attempt 1"].find("failure") is None and skipped is not None
    assert re.match(r"attempt 1 failed: .*; relaunched$", skipped.get("message")), \
        skipped.get("message")
    assert cases["attempt 2"].find("failure") is None


HANG = "tests/workloads/hang.py"


def _hang_run(six: tc.Cluster, tmp_path: Path, jobs: list[Dtrain], run_id: str, mode: str,
              restarts: int) -> tuple[Dtrain, int]:
    """node1-2 run hang.py (1 rank each), node3 is the spare; rank 1 blocks at step 2 of
    every attempt, in ``mode``."""
    args = _args(six, tmp_path, run_id, "node[1-3]", "--nnodes", "2", "--restarts",
                 str(restarts), "--restart-backoff", "0.2", "--hang-timeout", "4",
                 "--grace", "2", script=HANG,
                 env={"WL_HANG_RANK": "1", "WL_HANG_STEP": "2", "WL_HANG_MODE": mode,
                      "WL_QUIET": "1"})
    job = Dtrain(six, args, env=_state(tmp_path))
    jobs.append(job)
    with JobWatch(six, [1, 2, 3], run_id=run_id) as watch:
        rc = job.wait(200)
        watch.wait_clean(30)
        watch.assert_clean(1.0)
    return job, rc


def test_a_hang_in_the_script_s_own_code_never_fences_the_node(
        six: tc.Cluster, tmp_path: Path, jobs: list[Dtrain]) -> None:
    """Rank 1 sleeps in load_batch in every attempt: the same nodes again, then a stop;
    nothing fenced, nothing on the lemon list (it fenced the node for 24 h)."""
    run_id = new_id("restart-hang-user")
    job, rc = _hang_run(six, tmp_path, jobs, run_id, "sleep", restarts=2)
    out = job.output
    assert rc == 125, out[-4000:]
    assert re.search(r"node2: hang culprit blocked in the script's own code, not a node fault "
                     r"\(.*\); attempt 2 on the same nodes from the last checkpoint", out), out
    assert re.search(r"node2: hang culprit blocked in the script's own code at the same place "
                     r"as the attempt before, not a node fault .*: not restarted", out), out
    assert not re.search(r": fenced", out), out
    m = meta(tmp_path, run_id)
    assert [a["hosts"] for a in m["attempts"]] == [["node1", "node2"]] * 2
    assert [a["cause"] for a in m["attempts"]] == ["process", "user"]
    assert all(a["fenced"] == [] and a["suspect"] == [] for a in m["attempts"])
    assert m.get("fenced", []) == [] and _lemons(tmp_path) == []
    assert m["hangs"][-1]["culprit"]["where"] == "script"


def test_a_culprit_outside_the_script_named_again_after_a_restart_is_fenced(
        six: tc.Cluster, tmp_path: Path, jobs: list[Dtrain]) -> None:
    """Rank 1 stops itself (no Python stack answers, as a rank in uninterruptible sleep):
    a suspect the first time (the same nodes again), fenced the second (the spare in)."""
    run_id = new_id("restart-hang-node")
    job, rc = _hang_run(six, tmp_path, jobs, run_id, "stop", restarts=1)
    out = job.output
    assert rc == 125, out[-4000:]
    assert re.search(r"node2: hang culprit outside Python, once \(.*\): a suspect, fenced if "
                     r"named again; attempt 2 on the same nodes", out), out
    assert re.search(r"node2: hang culprit again after a restart, outside Python \(.*\): "
                     r"fenced, spare node3 in; no restart left \(--restarts 1\)", out), out
    m = meta(tmp_path, run_id)
    assert [a["hosts"] for a in m["attempts"]] == [["node1", "node2"]] * 2
    assert [a["cause"] for a in m["attempts"]] == ["process", "node"]
    assert [x["host"] for x in m["attempts"][0]["suspect"]] == ["node2"]
    assert [x["host"] for x in m["attempts"][1]["fenced"]] == ["node2"]
    (lemon,) = _lemons(tmp_path)
    assert (lemon["host"], lemon["tier"], lemon["count"]) == ("node2", "isolate", 2), lemon
    assert lemon["until"] - lemon["t"] == pytest.approx(24 * 3600, abs=1)
    assert m["hangs"][-1]["culprit"]["where"] == "native"


def test_a_syntax_error_gets_exactly_one_attempt(six: tc.Cluster, tmp_path: Path,
                                                 jobs: list[Dtrain]) -> None:
    run_id = new_id("restart-syntax")
    ck = _ckdir(six, run_id)
    bad = ck / "broken.py"
    bad.write_text("print('starting')\ndef broken(:\n    pass\n")
    bad.chmod(0o644)
    args = _args(six, tmp_path, run_id, "node[1-2]", "--restarts", "5",
                 "--restart-backoff", "0", env={}, script=str(bad))
    job = Dtrain(six, args, env=_state(tmp_path))
    jobs.append(job)
    with JobWatch(six, [1, 2], run_id=run_id) as watch:
        rc = job.wait(120)
        watch.assert_clean(1.0, since=job.ended)
    assert rc == 1, job.output
    _saw(watch, 2)
    out = job.output
    assert re.search(r"raised SyntaxError: .*\(a SyntaxError fails the same way on every "
                     r"attempt\): not restarted", out), out
    assert "attempt 2" not in out
    m = meta(tmp_path, run_id)
    assert len(m["attempts"]) == 1 and m["attempts"][0]["cause"] == "user"


def test_nnodes_min_max_without_a_spare_shrinks_and_the_job_sees_it(
        six: tc.Cluster, tmp_path: Path, jobs: list[Dtrain]) -> None:
    run_id = new_id("restart-shrink")
    ck = _ckdir(six, run_id)
    args = _args(six, tmp_path, run_id, "node[4-6]", "--nnodes", "2:3", "--restarts", "1",
                 "--heartbeat-timeout", "5",
                 env={"CK_DIR": str(ck), "CK_STEPS": "50", "CK_STEP_SLEEP": "0.2"})
    job, rc = _cut_run(six, tmp_path, jobs, run_id, args, [4, 5, 6], 6,
                       r"checkpoint step 5$",
                       r"node6 lost .*: fenced, shrinking to 2 nodes; attempt 2",
                       supervisors=3 + 2)
    assert rc == 0, job.output
    assert re.search(r"r\d: world size 2 attempt 2", job.output), job.output
    m = meta(tmp_path, run_id)
    assert [a["world_size"] for a in m["attempts"]] == [3, 2]
    assert m["attempts"][1]["hosts"] == ["node4", "node5"] and m["world_size"] == 2


@pytest.mark.parametrize("how", ["stop", "ctrl-c"])
def test_a_stop_during_the_back_off_ends_the_run_at_once(
        six: tc.Cluster, tmp_path: Path, jobs: list[Dtrain], how: str) -> None:
    run_id = new_id(f"restart-{how}")
    ck = _ckdir(six, run_id)
    args = _args(six, tmp_path, run_id, "node[1-2]", "--restarts", "3",
                 "--restart-backoff", "600",
                 env={"CK_DIR": str(ck), "CK_STEPS": "30", "CK_CRASH_RANK": "1"})
    job = Dtrain(six, args, env=_state(tmp_path))
    jobs.append(job)
    with JobWatch(six, [1, 2], run_id=run_id) as watch:
        job.wait_line(r"attempt 2 on the same nodes from the last checkpoint in 600 s",
                      timeout=120)
        if how == "stop":
            stop = subprocess.run([*[sys.executable, "-m", "launcher", "stop", run_id],
                                   "--archive-dir", str(tmp_path / "runs")], cwd=REPO,
                                  text=True, capture_output=True, env=six.client_env())
            assert stop.returncode == 0, stop.stdout + stop.stderr
        else:
            job.signal(signal.SIGINT)
        rc = job.wait(30)  # bounded: far below the 600 s back-off
        watch.assert_clean(1.0, since=job.ended)
    assert rc == 130, job.output
    who = r"`dtrain stop` \(pid \d+\)" if how == "stop" else "Ctrl-C"
    assert re.search(rf"stopped by {who} before attempt 2: nothing more is started",
                     job.output), job.output
    m = meta(tmp_path, run_id)
    assert m["state"] == "finished" and m["exit_code"] == 130 and len(m["attempts"]) == 1
    assert m["attempts"][0]["relaunched"] is None  # stopped in the back-off: no relaunch
    _validate_attempts(m["attempts"])


LITE = {"CK_LITE": "1"}  # ckpt.py's torch-free ranks: the same checkpoint protocol


def _launcher(cli: list[str], tmp_path: Path, cluster: tc.Cluster,
              timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "launcher", *cli, "--archive-dir",
                           str(tmp_path / "runs")], cwd=REPO, text=True, capture_output=True,
                          env=cluster.client_env(**_state(tmp_path)), timeout=timeout)


def _until(what: str, check, timeout: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.2)


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0] in "ZX"
    except OSError:
        return True


def _start_detached(cluster: tc.Cluster, tmp_path: Path, run_id: str, *, backoff: str) -> int:
    """`run --detach --restarts 2` of the lite workload on node[1-2], rank 1 crashing once;
    the detached launcher's pid once it said so."""
    args = _args(cluster, tmp_path, run_id, "node[1-2]", "--restarts", "2",
                 "--restart-backoff", backoff, "--detach",
                 env={"CK_DIR": str(_ckdir(cluster, run_id)), "CK_STEPS": "15",
                      "CK_CRASH_RANK": "1", **LITE})
    started = subprocess.run([sys.executable, "-m", "launcher", *args], cwd=REPO, text=True,
                             capture_output=True, timeout=120,
                             env=cluster.client_env(**_state(tmp_path)))
    assert started.returncode == 0, started.stdout + started.stderr
    assert f"run {run_id} started; detached" in started.stdout + started.stderr
    return int(meta(tmp_path, run_id)["launcher"]["pid"])


def test_a_detached_run_restarts_and_is_stoppable_in_its_back_off(
        six: tc.Cluster, tmp_path: Path, jobs: list[Dtrain]) -> None:
    """--detach --restarts: the detached launcher runs the loop (a crash once, then the
    same nodes); ps says the attempt; logs --attempt shows one attempt; a second detached
    run is stopped by `dtrain stop` in its back-off; nothing left on the nodes."""
    run_id = new_id("restart-detach")
    with JobWatch(six, [1, 2], run_id=run_id) as watch:
        pid = _start_detached(six, tmp_path, run_id, backoff="0.2")
        _until("the detached run ends", lambda: _gone(pid), 120)
        watch.assert_clean(5.0)
    _saw(watch, 4)  # 2 nodes x 2 attempts
    m = meta(tmp_path, run_id)
    assert (m["state"], m["exit_code"], m["launcher"]["detached"]) == ("finished", 0, True)
    assert [a["cause"] for a in m["attempts"]] == ["process", "ok"]
    _timings_in_order(m["attempts"])
    assert any("attempt 2 on the same nodes" in r["line"] for r in _records(tmp_path, run_id))
    ps = _launcher(["ps"], tmp_path, six)
    assert re.search(rf"^{run_id} +run +finished \(0, attempt 2\)", ps.stdout, re.M), ps.stdout
    logs = _launcher(["logs", run_id, "--attempt", "2", "--no-color"], tmp_path, six)
    assert logs.returncode == 0, logs.stderr
    # no collective in the lite ranks: rank 0 may have checkpointed past the crash step
    assert re.search(r"r\d: resumed at step (5|10)$", logs.stdout, re.M), logs.stdout
    assert "starting at step 0" not in logs.stdout  # attempt 1's lines are left out

    # a second detached run, stopped between its attempts
    run_id = new_id("restart-detach-stop")
    with JobWatch(six, [1, 2], run_id=run_id) as watch:
        pid = _start_detached(six, tmp_path, run_id, backoff="600")
        _until("the back-off", lambda: meta(tmp_path, run_id).get("state") == "restarting",
               120)
        ps = _launcher(["ps"], tmp_path, six)
        assert re.search(rf"^{run_id} +run +restarting \(attempt 2\)", ps.stdout, re.M), ps.stdout
        stop = _launcher(["stop", run_id], tmp_path, six)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        _until("the launcher ends", lambda: _gone(pid), 30)  # far below the 600 s back-off
        watch.assert_clean(5.0)
    m = meta(tmp_path, run_id)
    assert (m["state"], m["exit_code"], len(m["attempts"])) == ("finished", 130, 1)
    assert m["attempts"][0]["relaunched"] is None
    assert any(re.search(r"stopped by `dtrain stop` \(pid \d+\) before attempt 2", r["line"])
               for r in _records(tmp_path, run_id))
