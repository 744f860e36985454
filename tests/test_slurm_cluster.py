"""dtrain inside a real Slurm allocation on the test cluster (tests/cluster/slurm.py).

``salloc -N 3 python -m launcher run ...`` for real: hosts from the allocation, node programs
started through srun, and the same promises as over SSH (per-rank tags, the right interface
per node, the root cause's exit code, 130 on Ctrl-C, nothing left on any node). A job's
processes are found by its DTRAIN_RUN_ID (JobWatch, as in test_failures.py), which over srun
includes the step's slurmstepd: "clean" means the step ended too.

dtrain runs as root on the login node here (salloc as root); the nodes are the cluster's.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests import cluster as tc
from tests.test_failures import JobWatch, new_id
from tests.util import proc_environ

REPO = Path(__file__).resolve().parents[1]
TRAIN = "tests/workloads/train.py"
REPORT = "tests/workloads/env_report.py"

pytestmark = [pytest.mark.ssh, pytest.mark.slurm, pytest.mark.timeout(120)]


class Salloc:
    """``salloc -N n python -m launcher ARGS`` with its output collected line by line."""

    def __init__(self, cluster: tc.Cluster, slurm: Any, n: int, args: list[str],
                 salloc: tuple[str, ...] = ()) -> None:
        env = slurm.env(cluster.client_env(PYTHONUNBUFFERED="1"))
        self.proc = subprocess.Popen(
            ["salloc", "-N", str(n), "-Q", *salloc, sys.executable, "-m", "launcher", *args],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True)
        self.lines: list[str] = []
        self.cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                self.cond.notify_all()

    @property
    def output(self) -> str:
        with self.cond:
            return "\n".join(self.lines)

    def wait_line(self, pattern: str, timeout: float, count: int = 1) -> None:
        rx = re.compile(pattern)
        with self.cond:
            ok = self.cond.wait_for(lambda: sum(bool(rx.search(ln)) for ln in self.lines)
                                    >= count or self.proc.poll() is not None, timeout)
        assert ok and self.proc.poll() is None, f"no {pattern!r}:\n{self.output}"

    def dtrain_pid(self) -> int:
        """dtrain itself: salloc's child (a terminal's Ctrl-C reaches it, not salloc)."""
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        return int(children.split()[0])

    def wait(self, timeout: float = 90) -> int:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            pytest.fail(f"salloc + dtrain did not end within {timeout}s:\n{self.output}")
        time.sleep(0.05)
        return rc


def run_args(cluster: tc.Cluster, tmp_path: Path, run_id: str, script: str, *extra: str,
             env: dict[str, str] | None = None) -> list[str]:
    args = ["run", "--nproc-per-node", "1", "--python", cluster.python, "--archive-dir",
            str(tmp_path / "runs"), "--run-id", run_id, "--no-color", *extra]
    for key, value in (env or {}).items():
        args += ["-e", f"{key}={value}"]
    return [*args, script]


def meta(tmp_path: Path, run_id: str) -> dict[str, Any]:
    return json.loads((tmp_path / "runs" / run_id / "meta.json").read_text())  # type: ignore[no-any-return]


@pytest.fixture
def allocs():
    started: list[Salloc] = []
    yield started
    for job in started:
        if job.proc.poll() is None:
            os.killpg(job.proc.pid, signal.SIGKILL)
            job.proc.wait(10)


@pytest.mark.torch
def test_ddp_over_srun_in_a_real_allocation(cluster: tc.Cluster, slurm: Any, tmp_path: Path,
                                            allocs: list[Salloc]) -> None:
    """3 nodes from salloc, gloo through srun: per-rank tags, each node's own interface."""
    run_id = new_id("srun-ddp")
    t0 = time.monotonic()
    job = Salloc(cluster, slurm, 3, run_args(cluster, tmp_path, run_id, REPORT) + [
        "GLOO_SOCKET_IFNAME", "MASTER_ADDR", "SLURM_JOB_ID"])
    allocs.append(job)
    with JobWatch(cluster, [1, 2, 3], run_id=run_id) as watch:
        rc = job.wait()
        watch.assert_clean(5)
    assert rc == 0, job.output
    reports = {}
    for line in job.output.splitlines():
        m = re.match(r"(node\d) r(\d): REPORT (.*)", line)
        if m:
            reports[int(m.group(2))] = (m.group(1), json.loads(m.group(3)))
    assert sorted(reports) == [0, 1, 2], job.output
    for rank, (tag, report) in reports.items():
        k = rank + 1
        assert tag == report["host"] == f"node{k}"
        assert report["sum"] == 3.0
        assert report["env"]["GLOO_SOCKET_IFNAME"] == cluster.node(k).ifname
        assert report["env"]["MASTER_ADDR"] == cluster.node(1).ip
        assert report["env"]["SLURM_JOB_ID"]  # it ran inside the job, as a step
    m = meta(tmp_path, run_id)
    assert m["transport"] == "srun"
    job_id = reports[0][1]["env"]["SLURM_JOB_ID"]
    assert [n["source"] for n in m["plan"]["nodes"]] == [
        f"SLURM_JOB_NODELIST (job {job_id}, slots from SLURM_JOB_CPUS_PER_NODE)"] * 3
    print(f"srun ddp: 3 nodes in {time.monotonic() - t0:.1f}s (salloc + torch imports)")


@pytest.mark.torch
def test_rank_failure_over_srun_is_its_exit_code(cluster: tc.Cluster, slurm: Any,
                                                 tmp_path: Path, allocs: list[Salloc]) -> None:
    run_id = new_id("srun-exit7")
    job = Salloc(cluster, slurm, 3, run_args(cluster, tmp_path, run_id, TRAIN,
                                             env={"WL_FAIL_RANK": "1", "WL_FAIL_STEP": "2"}))
    allocs.append(job)
    with JobWatch(cluster, [1, 2, 3], run_id=run_id) as watch:
        rc = job.wait()
        watch.assert_clean(5)
    assert rc == 7, job.output
    assert "FAILED: rank 1 on node2 exited 7 (exit 7)" in job.output
    assert "srun: error" not in job.output
    assert meta(tmp_path, run_id)["root_cause"]["host"] == "node2"


@pytest.mark.torch
def test_ctrl_c_over_srun_is_130_and_leaves_nothing(cluster: tc.Cluster, slurm: Any,
                                                     tmp_path: Path,
                                                     allocs: list[Salloc]) -> None:
    run_id = new_id("srun-ctrl-c")
    job = Salloc(cluster, slurm, 3, run_args(cluster, tmp_path, run_id, TRAIN))
    allocs.append(job)
    with JobWatch(cluster, [1, 2, 3], run_id=run_id) as watch:
        job.wait_line(r"r\d: step 1 ", timeout=60, count=3)
        # a terminal's Ctrl-C: dtrain's process group (salloc gives the command its own)
        os.killpg(os.getpgid(job.dtrain_pid()), signal.SIGINT)
        rc = job.wait(30)
        watch.assert_clean(5)
    assert rc == 130, job.output
    assert "Ctrl-C: stopping every node" in job.output
    assert meta(tmp_path, run_id)["outcome"].startswith("interrupted")


def test_allocation_smaller_than_asked_is_exit_2(cluster: tc.Cluster, slurm: Any,
                                                  allocs: list[Salloc]) -> None:
    job = Salloc(cluster, slurm, 2, ["exec", "-H", "node[1-3]", "--transport", "srun",
                                     "hostname"])
    allocs.append(job)
    assert job.wait(60) == 2, job.output
    assert "smaller than asked: node3 not in it" in job.output


def test_exec_over_srun_tags_hosts(cluster: tc.Cluster, slurm: Any,
                                   allocs: list[Salloc]) -> None:
    """Inside the allocation, auto picks srun: each command runs in a step of the job (its
    SLURM_JOB_ID and a SLURM_STEP_ID, no SSH_CONNECTION); over SSH it would be the reverse."""
    show = 'echo "$(hostname) job=${SLURM_JOB_ID-none} step=${SLURM_STEP_ID-none} ' \
           'ssh=${SSH_CONNECTION:+yes}"; exit 3'
    job = Salloc(cluster, slurm, 4, ["exec", "--no-color", "--", "sh", "-c", show])
    allocs.append(job)
    assert job.wait(60) == 3, job.output
    rows = dict(re.findall(r"^(node\d): (node\d job=\d+ step=\d+ ssh=)$", job.output, re.M))
    assert sorted(rows) == [f"node{k}" for k in range(1, 5)], job.output
    for k in range(1, 5):
        assert rows[f"node{k}"].startswith(f"node{k} job="), job.output


@pytest.mark.torch
def test_the_allocations_switches_order_the_node_ranks(cluster: tc.Cluster, slurm: Any,
                                                       tmp_path: Path,
                                                       allocs: list[Salloc]) -> None:
    """Placement from Slurm itself (issue 36 item 4): inside an allocation dtrain asks
    `scontrol show topology`; node1 and node3 share switch s0, node2 and node4 s1, so the
    node ranks go node1, node3, node2, node4, one `placement:` line per switch."""
    from tests.cluster import slurm as test_slurm

    rest = [n.name for n in slurm.nodes if n.name not in ("node1", "node2", "node3", "node4")]
    test_slurm.set_topology(slurm, (
        "SwitchName=s0 Nodes=node1,node3\nSwitchName=s1 Nodes=node2,node4\n"
        + (f"SwitchName=s2 Nodes={','.join(rest)}\n" if rest else "")
        + f"SwitchName=top Switches=s0,s1{',s2' if rest else ''}\n"))
    try:
        job = Salloc(cluster, slurm, 4, [*run_args(cluster, tmp_path, "topo", REPORT),
                                         "GROUP_RANK"],
                     salloc=("-w", "node[1-4]"))
        allocs.append(job)
        assert job.wait(90) == 0, job.output
    finally:
        test_slurm.set_topology(slurm, None)
    out = job.output
    assert "placement: node1, node3: switch s0, segment top (scontrol show topology)" in out, out
    assert "placement: node2, node4: switch s1, segment top (scontrol show topology)" in out, out
    reports = [json.loads(line.split("REPORT ", 1)[1]) for line in out.splitlines()
               if "REPORT " in line]
    assert {r["host"]: r["rank"] for r in reports} == {"node1": 0, "node3": 1, "node2": 2,
                                                       "node4": 3}, out


def test_hosts_from_a_mixed_nodelist_over_ssh(cluster: tc.Cluster) -> None:
    """SLURM_JOB_NODELIST with two ranges, one of them ssh-config aliases on port 2222, each
    out of order: the hosts are the list, in its order (the --json report lists the nodes
    in host order, node 0 first), reached over SSH (~/.ssh/config honoured)."""
    env = cluster.client_env(SLURM_JOB_ID="99", SLURM_JOB_NODELIST="node[2,1],alt[4,3]")
    show = 'echo "$(hostname) ${SSH_CONNECTION##* }"'
    proc = subprocess.run([sys.executable, "-m", "launcher", "exec", "--transport", "ssh",
                           "--no-color", "--json", "--", "sh", "-c", show],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert [node["host"] for node in report["nodes"]] == ["node2", "node1", "alt4", "alt3"]
    assert sorted(proc.stderr.splitlines()) == ["alt3: node3 2222", "alt4: node4 2222",
                                                "node1: node1 22", "node2: node2 22"], \
        proc.stderr


def test_restarts_over_srun_relaunch_fresh_steps_on_the_same_nodes(
        cluster: tc.Cluster, slurm: Any, tmp_path: Path, allocs: list[Salloc]) -> None:
    """--restarts inside an allocation (docs/restarts.md "With Slurm"): the allocation's
    node beyond --nnodes is the spare, a rank that crashes once is relaunched as new srun
    steps on the same nodes, resumes from its checkpoint; nothing left (slurmstepd
    included)."""
    run_id = new_id("srun-restart")
    ck = cluster.shared_dir / run_id
    ck.mkdir(mode=0o777)
    ck.chmod(0o777)
    job = Salloc(cluster, slurm, 3, run_args(
        cluster, tmp_path, run_id, "tests/workloads/ckpt.py", "--nnodes", "2",
        "--restarts", "2", "--restart-backoff", "0.2",
        env={"CK_DIR": str(ck), "CK_STEPS": "15", "CK_CRASH_RANK": "1", "CK_LITE": "1"}))
    allocs.append(job)
    with JobWatch(cluster, [1, 2, 3], run_id=run_id) as watch:
        rc = job.wait()
        watch.assert_clean(5)
    assert rc == 0, job.output
    out = job.output
    assert "node3: spare for a fenced node (--nnodes 2)" in out, out
    assert re.search(r"rank 1 on node2 raised RuntimeError: injected crash at step 7 .*; "
                     r"attempt 2 on the same nodes from the last checkpoint in 0.2 s", out), out
    assert re.search(r"node\d r\d: resumed at step (5|10)$", out, re.M), out  # no collective
    m = meta(tmp_path, run_id)
    assert m["transport"] == "srun"
    assert [a["hosts"] for a in m["attempts"]] == [["node1", "node2"]] * 2
    assert [a["cause"] for a in m["attempts"]] == ["process", "ok"]
    assert watch.count() > 0  # the watch saw the job's processes: "clean" means something


def test_cp_over_srun_in_a_real_allocation(cluster: tc.Cluster, slurm: Any, tmp_path: Path,
                                           allocs: list[Salloc]) -> None:
    """cp takes --transport (issue 23 item 5): a push through srun steps, no SSH."""
    dest = f"/tmp/dtrain-cp-srun-{tmp_path.name}.txt"
    src = tmp_path / "payload.txt"
    src.write_text("over srun\n")
    job = Salloc(cluster, slurm, 2, ["cp", "--transport", "srun", "--python", cluster.python,
                                     str(src), dest])
    allocs.append(job)
    try:
        assert job.wait() == 0, job.output
        assert "total 2 nodes" in job.output, job.output
        seen = [cluster.node_exec(k, ["cat", dest]) for k in (1, 2, 3)]
        assert any(r.returncode == 0 and r.stdout == "over srun\n" for r in seen), seen
    finally:
        for k in (1, 2, 3):
            cluster.node_exec(k, ["rm", "-f", dest], user="root")


@pytest.mark.torch
def test_smoke_over_srun_in_a_real_allocation(cluster: tc.Cluster, slurm: Any, tmp_path: Path,
                                              allocs: list[Salloc]) -> None:
    """smoke takes --transport (issue 23 item 5; it was SSH only): its job runs as srun
    steps and its archive says so."""
    job = Salloc(cluster, slurm, 2, ["smoke", "--transport", "srun", "--python",
                                     cluster.python, "--backend", "gloo", "--max-size", "64K",
                                     "--archive-dir", str(tmp_path / "runs"), "--no-color"])
    allocs.append(job)
    assert job.wait(110) == 0, job.output
    assert "smoke: PASS: 2 nodes" in job.output, job.output
    (meta_file,) = (tmp_path / "runs").glob("*/meta.json")
    assert json.loads(meta_file.read_text())["transport"] == "srun"


def _crash_node(cluster: tc.Cluster, k: int, run_id: str) -> list[int]:
    """Node k dies as in a crash: its supervisor and every process of the job there are
    SIGKILLed at once, by pid (start time checked; never by name). The supervisor is the
    parent of the topmost process tagged with the run's DTRAIN_RUN_ID (torchrun); the
    step's slurmstepd and slurmd are left alone, as Slurm's own. Returns the pids killed."""
    tag = f"DTRAIN_RUN_ID={run_id}".encode()
    stats = {pid: st for pid in cluster.node_pids(k) if (st := tc.proc_stat(pid)) is not None}

    job = [pid for pid in stats if tag in proc_environ(pid)]
    tops = {stats[pid][0] for pid in job if stats[pid][0] not in job}
    assert len(tops) == 1, (k, job, tops)  # one supervisor on the node, above torchrun
    victims = [*tops, *job]
    for pid in victims:
        st = tc.proc_stat(pid)
        if st is not None and st[1] == stats[pid][1]:  # still the process we found
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    return victims


@pytest.mark.torch
@pytest.mark.parametrize("transport", ["srun", "ssh"])
def test_a_node_that_dies_in_an_allocation_is_fenced_and_the_run_resumes_on_the_others(
        cluster: tc.Cluster, slurm: Any, tmp_path: Path, allocs: list[Salloc],
        transport: str) -> None:
    """--restarts inside a real 3-node allocation, --nnodes 2: node2's job dies as in a
    crash (its supervisor and job SIGKILLed by pid) after the first checkpoint; dtrain
    fences node2 and carries on from the checkpoint on node1 and the allocation's third
    node, over srun steps or SSH; node2 goes to the lemon list; nothing left anywhere."""
    run_id = new_id(f"{transport}-fence")
    ck = cluster.shared_dir / run_id
    ck.mkdir(mode=0o777)
    ck.chmod(0o777)
    job = Salloc(cluster, slurm, 3, run_args(
        cluster, tmp_path, run_id, "tests/workloads/ckpt.py", "--nnodes", "2",
        "--restarts", "2", "--restart-backoff", "0.2", "--heartbeat-timeout", "5",
        "--transport", transport,
        env={"CK_DIR": str(ck), "CK_STEPS": "30", "CK_STEP_SLEEP": "0.2", "CK_LITE": "1"}))
    allocs.append(job)
    with JobWatch(cluster, [1, 2, 3], run_id=run_id) as watch:
        job.wait_line(r"^node1 r0: checkpoint step 5$", timeout=90)
        killed = _crash_node(cluster, 2, run_id)
        rc = job.wait(150)
        watch.assert_clean(10)
    assert rc == 0, job.output
    out = job.output
    assert re.search(r"node2 lost \([^)]*\): fenced, spare node3 in; attempt 2 from the last "
                     r"checkpoint", out), out
    resumed = re.findall(r"^(node\d) r(\d): resumed at step (\d+)$", out, re.M)
    assert sorted((host, rank) for host, rank, _ in resumed) == [("node1", "0"),
                                                                 ("node3", "1")], out
    assert all(int(step) >= 5 for _, _, step in resumed), resumed
    assert re.search(r"^node1 r0: done$", out, re.M) and re.search(r"^node3 r1: done$", out,
                                                                   re.M), out
    m = meta(tmp_path, run_id)
    assert m["transport"] == transport
    first, second = m["attempts"]
    assert first["hosts"] == ["node1", "node2"] and first["cause"] == "node", first
    assert [f["host"] for f in first["fenced"]] == ["node2"], first
    assert second["hosts"] == ["node1", "node3"] and second["exit_code"] == 0, second
    assert m["exit_code"] == 0 and [f["host"] for f in m["fenced"]] == ["node2"]
    lemons = json.loads((Path(os.environ["XDG_STATE_HOME"]) / "dtrain" / "lemons.json")
                        .read_text())["lemons"]
    assert [x["host"] for x in lemons] == ["node2"] and lemons[0]["run_id"] == run_id
    assert killed and watch.count() > len(killed)
