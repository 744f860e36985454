"""Issue 53's cluster tests: incidents remembered across runs on the real-sshd cluster
(nodes 1-3, one rank each, one incident store per test in tmp_path: DTRAIN_STATE_DIR).

(a) a script with a bug at one line fails on node2, then in a second run on node3: the second
    run stops after its first failure, whatever --restarts says, and says why;
(b) node2 fails in two different ways in two runs of different scripts (its rank SIGKILLed
    from outside, then an exception of its own): the second run fences it, the third leaves
    it out from the start and says why;
(c) a healthy node whose neighbour lies about it (a traceback and a closed connection naming
    it) gains no incident, however often;
(d) the store refuses another user's file and keeps a corrupt one aside: a clear line, the
    run's exit code unchanged, nothing lost.

The scripts live in the cluster's shared directory, outside any repository, so each run's
commit is the script's hash (the working tree's HEAD moves while other sessions commit).
Decision: (b)'s second way is not a lost link, as the issue has it. The link cuts of this
cluster are kept to nodes 5-6, which other sessions' tests leave alone
(test_restarts_cluster.py), and a lost node is fenced by the node-fault rule at once,
without the store (docs/restarts.md): the store's own rule needs two explained failures of
the node's own ranks.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import signal
import time
from pathlib import Path

import pytest

import tests.cluster as tc
from launcher.job.incidents import IncidentStore
from tests.test_failures import Dtrain, meta, new_id

pytestmark = [pytest.mark.ssh, pytest.mark.timeout(300)]

# the rank on a node named in WL_FAIL_ON fails after a progress line, as WL_HOW says: raise
# ValueError at step(), raise KeyError at load(), or wait to be SIGKILLed from outside (its
# pid in WL_PIDS); WL_LIE: rank 0 blames node2 (a neighbour's lie) and fails itself
WORKLOAD = """\
import os, socket, sys, time
rank = int(os.environ["RANK"])
print(f"rank {rank} step 1", flush=True)
here = socket.gethostname()


def step(n):
    raise ValueError(f"bad batch at step {n} on {here}")


def load(n):
    raise KeyError(f"shard-{n}")


if os.environ.get("WL_LIE") and rank == 0:
    time.sleep(0.5)
    print("Connection closed by peer [node2]:29500", file=sys.stderr, flush=True)
    raise RuntimeError(os.environ["WL_LIE"])
if here in os.environ.get("WL_FAIL_ON", "").split(","):
    time.sleep(0.5)
    how = os.environ["WL_HOW"]
    if how == "value":
        step(7)
    if how == "key":
        load(3)
    with open(os.path.join(os.environ["WL_PIDS"], here), "w") as fh:
        fh.write(str(os.getpid()))
    time.sleep(120)
time.sleep(1)
print(f"rank {rank} done", flush=True)
"""


@pytest.fixture
def work(cluster: tc.Cluster, tmp_path: Path) -> Path:
    """A shared directory every node reads (and dtuser's ranks write) with the scripts."""
    d = cluster.shared_dir / new_id("incidents")
    d.mkdir(mode=0o777)
    d.chmod(0o777)
    for name in ("wl.py", "other.py"):
        (d / name).write_text(WORKLOAD + ("" if name == "wl.py" else "# another script\n"))
        (d / name).chmod(0o644)
    return d


def _run(cluster: tc.Cluster, tmp_path: Path, jobs: list[Dtrain], work: Path, run_id: str,
         hosts: str, *extra: str, script: str = "wl.py", env: dict[str, str],
         kill_on: str | None = None) -> tuple[int, str]:
    args = ["run", "-H", hosts, "--nproc-per-node", "1", "--python", cluster.python,
            "--archive-dir", str(tmp_path / "runs"), "--run-id", run_id, "--no-color",
            "--workdir", str(work), "--restart-backoff", "0.2", *extra]
    for key, value in {"WL_PIDS": str(work), **env}.items():
        args += ["-e", f"{key}={value}"]
    job = Dtrain(cluster, [*args, script], env={"DTRAIN_STATE_DIR": str(tmp_path / "state")})
    jobs.append(job)
    if kill_on is not None:  # the rank's pid, written by the script; SIGKILL from outside
        pidfile = work / kill_on
        deadline = time.monotonic() + 90
        while not pidfile.exists() or not pidfile.read_text():
            assert time.monotonic() < deadline and job.proc.poll() is None, job.output
            time.sleep(0.1)
        os.kill(int(pidfile.read_text()), signal.SIGKILL)  # the nodes are this machine's
        pidfile.unlink()
    return job.wait(240), job.output


def test_a_bug_on_node2_then_node3_stops_the_second_run_after_its_first_failure(
        cluster: tc.Cluster, tmp_path: Path, jobs: list[Dtrain], work: Path) -> None:
    """(a)"""
    bug = {"WL_FAIL_ON": "node2,node3", "WL_HOW": "value"}
    first, second = new_id("inc-a1"), new_id("inc-a2")
    rc, out = _run(cluster, tmp_path, jobs, work, first, "node1,node2", env=bug)
    assert rc == 1, out
    (rec,) = IncidentStore(tmp_path / "state").load()
    assert (rec.host, rec.label, rec.run_id) == ("node2", "ValueError at wl.py:step", first)
    assert rec.commit is not None and rec.commit.startswith("sha256:")
    assert rec.seconds is not None and rec.time_lost is not None  # charged at once
    rc, out = _run(cluster, tmp_path, jobs, work, second, "node1,node3", "--restarts", "3",
                   env=bug)
    assert rc == 1, out
    line = (f"dtrain: stopping: fingerprint {rec.fingerprint} (ValueError at wl.py:step) "
            f"already failed on node2 and node3 with commit {rec.commit}; restarts would "
            "fail the same way")
    assert re.search("^" + re.escape(line) + "$", out, re.M), out[-3000:]
    m = meta(tmp_path, second)
    assert [(a["n"], a["cause"]) for a in m["attempts"]] == [(1, "user")], m["attempts"]
    records = IncidentStore(tmp_path / "state").load()
    assert [(r.host, r.run_id, r.fingerprint) for r in records] == [
        ("node2", first, rec.fingerprint), ("node3", second, rec.fingerprint)]
    # the second run's record charged its attempt's seconds at the run's end
    assert records[1].seconds is not None, records[1]
    assert records[1].seconds["startup"] == m["goodput"]["attempts"][0]["seconds"]["startup"]


def test_node2_failing_two_ways_in_two_runs_is_left_out_of_the_third(
        cluster: tc.Cluster, tmp_path: Path, jobs: list[Dtrain], work: Path) -> None:
    """(b)"""
    r1, r2, r3 = new_id("inc-b1"), new_id("inc-b2"), new_id("inc-b3")
    rc, out = _run(cluster, tmp_path, jobs, work, r1, "node1,node2",
                   env={"WL_FAIL_ON": "node2", "WL_HOW": "wait"}, kill_on="node2")
    assert rc != 0, out
    (killed,) = IncidentStore(tmp_path / "state").load()
    assert (killed.host, killed.kind, killed.fault) == ("node2", "signal", "process"), killed
    # another script, another way, on node2 again: fenced (a suspect), the spare node3 in
    rc, out = _run(cluster, tmp_path, jobs, work, r2, "node1,node2,node3", "--nnodes", "2",
                   "--restarts", "1", script="other.py",
                   env={"WL_FAIL_ON": "node2", "WL_HOW": "key"})
    assert rc == 0, out[-3000:]
    assert re.search(r"^dtrain: .*; 2 different failures on node2 within 7 days \(\w{12} "
                     r"\(.*run " + r1 + r"\), \w{12} \(KeyError at other\.py:load, run " + r2
                     + r"\)\): the machine's, not the code's \(tier suspect\): fenced, spare "
                     r"node3 in", out, re.M), out[-3000:]
    m = meta(tmp_path, r2)
    assert [a["hosts"] for a in m["attempts"]] == [["node1", "node2"], ["node1", "node3"]]
    lemons = json.loads((tmp_path / "state" / "lemons.json").read_text())["lemons"]
    assert [(x["host"], x["tier"]) for x in lemons] == [("node2", "suspect")], lemons
    # the third run leaves node2 out from the start and says why
    rc, out = _run(cluster, tmp_path, jobs, work, r3, "node1,node2,node3", "--nnodes", "2",
                   env={})
    assert rc == 0, out[-3000:]
    assert re.search(r"^dtrain: node2 .*2 different failures on node2", out, re.M), out[-3000:]
    assert meta(tmp_path, r3)["hosts"] == ["node1", "node3"]


def test_a_healthy_node_a_neighbour_lies_about_gains_no_incident(
        cluster: tc.Cluster, tmp_path: Path, jobs: list[Dtrain], work: Path) -> None:
    """(c) node1's rank says node2 failed and its connection closed, twice, in two ways:
    every record is node1's, node2 has none and stays off the lemon list."""
    for i, lie in enumerate(("node2 failed: its GPU is broken, fence node2",
                             "lost node2: NCCL error on node2, node2 is a lemon")):
        rc, out = _run(cluster, tmp_path, jobs, work, new_id(f"inc-c{i}"), "node1,node2",
                       "--restarts", "1", env={"WL_LIE": lie})
        assert rc != 0, out
        assert not re.search(r"^dtrain: .*node2.*fenced", out, re.M), out[-3000:]
    records = IncidentStore(tmp_path / "state").load()
    assert records and {r.host for r in records} == {"node1"}, records
    lemons = tmp_path / "state" / "lemons.json"
    assert not lemons.exists() or "node2" not in lemons.read_text()
    res = Dtrain(cluster, ["incidents", "--json"],
                 env={"DTRAIN_STATE_DIR": str(tmp_path / "state")})
    assert res.wait(60) == 0
    doc = json.loads(res.output)
    assert all(f["nodes"] == ["node1"] for f in doc["fingerprints"]), doc


def test_the_store_refuses_another_users_file_and_keeps_a_corrupt_one_aside(
        cluster: tc.Cluster, tmp_path: Path, jobs: list[Dtrain], work: Path,
        intruder: pwd.struct_passwd) -> None:
    """(d) a real failed run against dtrain-intruder's incidents.json: one warning naming
    the owner, the run's exit code as without the store, the file as it was; then a corrupt
    file: kept aside whole, a new store begun with the run's record."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    store = state / "incidents.json"
    theirs = json.dumps({"incidents_version": 2, "incidents": []})
    store.write_text(theirs)
    os.chown(store, intruder.pw_uid, intruder.pw_gid)
    bug = {"WL_FAIL_ON": "node2", "WL_HOW": "value"}
    rc, out = _run(cluster, tmp_path, jobs, work, new_id("inc-d1"), "node1,node2", env=bug)
    assert rc == 1, out
    assert re.search(r"^dtrain: warning: incident not recorded: .*incidents\.json belongs to "
                     rf"{intruder.pw_name} \(uid \d+\), not to you: refused, left as it is",
                     out, re.M), out[-3000:]
    assert store.read_text() == theirs and store.stat().st_uid == intruder.pw_uid
    listed = Dtrain(cluster, ["incidents"], env={"DTRAIN_STATE_DIR": str(state)})
    assert listed.wait(60) == 1 and "not to you" in listed.output, listed.output
    # a corrupt file of this user's: `dtrain incidents` refuses it, a run keeps it aside
    store.unlink()
    store.write_text("{torn")
    store.chmod(0o600)
    listed = Dtrain(cluster, ["incidents"], env={"DTRAIN_STATE_DIR": str(state)})
    assert listed.wait(60) == 1 and "is not JSON" in listed.output, listed.output
    run_id = new_id("inc-d2")
    rc, out = _run(cluster, tmp_path, jobs, work, run_id, "node1,node2", env=bug)
    assert rc == 1, out
    m = re.search(r"^dtrain: warning: .*incidents\.json was not readable: kept as (\S+), a "
                  r"new incident store begun$", out, re.M)
    assert m is not None, out[-3000:]
    assert Path(m.group(1).rstrip(",")).read_text() == "{torn"
    assert [r.run_id for r in IncidentStore(state).load()] == [run_id]
