"""--image for real (docs/containers.md): Debian's podman with crun, rootless as dtuser, inside
the test cluster's nodes (tests/cluster/podman.py); the image is the skeleton rootfs with
/usr and this Python mounted read-only.

A 3x2 gloo DDP run inside podman keeps each node's own NIC; exec runs inside the image; a
failing rank, Ctrl-C and a SIGKILLed launcher each leave no container (by the run's label)
and no process (JobWatch: every process carrying the run id, and their descendants); a node
without the image is named before anything starts; `dtrain image push` to 4 nodes, then
again (skipped), and a node with another digest named by doctor and fixed by a push."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests import cluster as tc
from tests.cluster import podman
from tests.test_failures import Dtrain, JobWatch, meta, run_args
from tests.util import cannot_run, dtrain

pytestmark = [pytest.mark.ssh, pytest.mark.torch]
IMAGE = podman.TEST_IMAGE


@pytest.fixture(scope="module")
def pcluster(cluster: tc.Cluster) -> tc.Cluster:
    reason = podman.available()
    if reason:
        cannot_run(reason)
    podman.ensure_image(cluster, range(1, 5))
    return cluster


def _args(cluster: tc.Cluster, tmp_path: Path, run_id: str, script: str, *extra: str,
          **kw: object) -> list[str]:
    return run_args(cluster, tmp_path, run_id, script, "--image", IMAGE, *podman.run_mounts(),
                    *extra, **kw)  # type: ignore[arg-type]


def _no_containers(cluster: tc.Cluster, run_id: str, nodes: range = range(1, 4)) -> None:
    left = {k: podman.containers(cluster, k, run_id) for k in nodes}
    assert not any(left.values()), f"containers of {run_id} left: {left}"


def test_three_by_two_ddp_inside_podman_keeps_each_nodes_nic(pcluster: tc.Cluster,
                                                             tmp_path: Path) -> None:
    run_id = f"ctr-ddp-{uuid.uuid4().hex[:8]}"
    with JobWatch(pcluster, [1, 2, 3], run_id=run_id) as watch:
        res = dtrain(_args(pcluster, tmp_path, run_id, "tests/workloads/env_report.py",
                           nproc=2, script_args=["GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME",
                                                 "container"]),
                     env=pcluster.client_env(), timeout=180)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        watch.assert_clean(5.0)
    reports = [json.loads(line.split("REPORT ", 1)[1]) for line in res.stdout.splitlines()
               if "REPORT " in line]
    assert sorted(r["rank"] for r in reports) == list(range(6))
    for r in reports:
        ifname = pcluster.node(int(r["host"][4:])).ifname
        assert r["env"]["GLOO_SOCKET_IFNAME"] == ifname
        assert r["env"]["NCCL_SOCKET_IFNAME"] == "=" + ifname
        assert r["env"]["container"] == "podman"  # podman's mark: the rank ran inside
        assert r["sum"] == 6.0
    _no_containers(pcluster, run_id)
    plan = meta(tmp_path, run_id)["plan"]["nodes"]
    assert [n["container"][:2] for n in plan] == [["podman", "run"]] * 3
    assert plan[1]["container"][plan[1]["container"].index("--name") + 1] == \
        f"dtrain-{run_id}-node2-a1"


def test_exec_runs_inside_the_image_with_the_nodes_network(pcluster: tc.Cluster) -> None:
    res = dtrain(["exec", "-H", "node[1-3]", "--image", IMAGE, "--mount", "/usr:/usr:ro", "--",
                  "sh", "-c", "echo $(cat /proc/1/comm) $(ls /sys/class/net | tr '\\n' ' ')"],
                 env=pcluster.client_env(), timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    for k in (1, 2, 3):
        # podman's init is pid 1: we are in the container, and it sees the node's own NIC
        line = next(ln for ln in res.stdout.splitlines() if ln.startswith(f"node{k}: "))
        assert line.split()[1] == "podman-init", line
        assert pcluster.node(k).ifname in line.split()[2:], line


def test_a_node_without_the_image_is_named_before_anything_starts(pcluster: tc.Cluster,
                                                                  tmp_path: Path) -> None:
    partial = "localhost/dtrain-test:partial"
    podman.ensure_image(pcluster, [1, 2], partial)
    podman.remove_image(pcluster, 3, partial)
    run_id = f"ctr-miss-{uuid.uuid4().hex[:8]}"
    args = run_args(pcluster, tmp_path, run_id, "tests/workloads/env_report.py", "--image",
                    partial, *podman.run_mounts())
    res = dtrain(args, env=pcluster.client_env(), timeout=120)
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"node3: image {partial} is not there (podman); copy it with: dtrain image push " \
           f"{partial}" in res.stderr
    assert "node1: image" not in res.stderr and "node2: image" not in res.stderr
    _no_containers(pcluster, run_id)
    res = dtrain(["exec", "-H", "node[1-3]", "--image", partial, "true"],
                 env=pcluster.client_env(), timeout=120)
    assert res.returncode == 1 and "node3: image" in res.stderr, res.stderr


def test_a_failing_rank_leaves_no_container_and_no_process(pcluster: tc.Cluster,
                                                           tmp_path: Path) -> None:
    run_id = f"ctr-fail-{uuid.uuid4().hex[:8]}"
    with JobWatch(pcluster, [1, 2, 3], run_id=run_id) as watch:
        res = dtrain(_args(pcluster, tmp_path, run_id, "tests/workloads/warn_fail.py",
                           "--grace", "3"), env=pcluster.client_env(), timeout=180)
        watch.assert_clean(5.0)
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    assert "boom on purpose" in res.stdout + res.stderr
    _no_containers(pcluster, run_id)


@pytest.mark.parametrize("how", ["ctrl-c", "sigkill"])
def test_ctrl_c_or_a_killed_launcher_leaves_no_container_and_no_process(
        pcluster: tc.Cluster, tmp_path: Path, jobs: list, how: str) -> None:
    run_id = f"ctr-{how}-{uuid.uuid4().hex[:8]}"
    extra = ["--grace", "3", "--heartbeat-timeout", "6"]
    with JobWatch(pcluster, [1, 2, 3], run_id=run_id) as watch:
        job = Dtrain(pcluster, _args(pcluster, tmp_path, run_id, "tests/workloads/tick.py",
                                     *extra))
        jobs.append(job)
        job.wait_line(r"r\d: tick \d 2", timeout=120, count=3)
        assert {k: podman.containers(pcluster, k, run_id) for k in (1, 2, 3)} == {
            k: [f"dtrain-{run_id}-node{k}-a1"] for k in (1, 2, 3)}
        if how == "ctrl-c":
            job.signal(signal.SIGINT)
            assert job.wait(60) == 130, job.output
            watch.assert_clean(5.0, since=job.ended)
        else:
            job.signal(signal.SIGKILL)
            job.wait(10)
            # the nodes notice (channel closed / no heartbeat) and stop the container by name
            watch.assert_clean(40.0)
    _no_containers(pcluster, run_id)
    assert re.search(r"tick \d 2", job.output)


def _local(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *argv], capture_output=True, text=True, timeout=120,
                          check=False)


def test_image_push_to_four_nodes_then_again_skipped(pcluster: tc.Cluster,
                                                     tmp_path: Path) -> None:
    tag = f"localhost/dtrain-push:{uuid.uuid4().hex[:8]}"
    tar = tmp_path / "skel.tar"
    tar.write_bytes(podman.skeleton_tar([sys.prefix]))
    other = tmp_path / "other.tar"
    other.write_bytes(podman.skeleton_tar([sys.prefix, "/opt/other"]))
    if _local("import", "-q", str(tar), tag).returncode != 0:
        cannot_run("podman cannot import an image on this machine (the login node)")
    want = _local("image", "inspect", "--format", "{{.Id}}", tag).stdout.strip()
    nodes = range(1, 5)
    try:
        res = dtrain(["image", "push", "-H", "node[1-4]", tag], env=pcluster.client_env(),
                     timeout=300)
        assert res.returncode == 0, res.stdout + res.stderr
        assert f"saving {tag}" in res.stderr and f"4 nodes loaded {tag} in " in res.stderr
        assert re.search(r"copied to 4 nodes in [0-9.]+ s; loading it \(podman load\)",
                         res.stderr), res.stderr
        for k in nodes:
            got = pcluster.node_exec(k, ["podman", "image", "inspect", "--format", "{{.Id}}",
                                         tag]).stdout.strip()
            assert got.removeprefix("sha256:") == want.removeprefix("sha256:"), k
            assert not list((pcluster.node(k).home / ".cache/dtrain/images").glob("*.tar"))
        res = dtrain(["image", "push", "-H", "node[1-4]", tag], env=pcluster.client_env(),
                     timeout=300)
        assert res.returncode == 0, res.stdout + res.stderr
        assert f"4 nodes already have {tag}" in res.stderr and "saving" not in res.stderr
        # node4 gets another image under the same name: doctor names it, a push fixes it
        pcluster.node_exec(4, ["podman", "rmi", "-f", tag])
        shared = pcluster.shared_dir / f"other-{uuid.uuid4().hex[:8]}.tar"
        shared.write_bytes(other.read_bytes())
        shared.chmod(0o644)
        try:
            assert pcluster.node_exec(4, ["podman", "import", "-q", str(shared), tag]
                                      ).returncode == 0
        finally:
            shared.unlink()
        doc = dtrain(["doctor", "-H", "node[1-4]", "--image", tag, "--python", pcluster.python,
                      "--json"], env=pcluster.client_env(), timeout=300)
        rows = {r["host"]: r for r in json.loads(doc.stdout)["doctor"]["checks"]
                if r["check"] == "image"}
        assert sorted(rows) == ["node1", "node2", "node3", "node4"], doc.stdout[-2000:]
        assert [rows[h]["status"] for h in sorted(rows)] == ["ok", "ok", "ok", "fail"]
        assert "has digest" in rows["node4"]["detail"]
        res = dtrain(["image", "push", "-H", "node[1-4]", tag], env=pcluster.client_env(),
                     timeout=300)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "3 nodes already have" in res.stderr and f"1 node loaded {tag}" in res.stderr
    finally:
        for k in nodes:
            podman.remove_image(pcluster, k, tag)
        _local("rmi", "-f", tag)


@pytest.mark.parametrize("given", ["--via", "config"])
def test_image_push_via_a_directory_the_nodes_share_copies_once(pcluster: tc.Cluster,
                                                                  tmp_path: Path,
                                                                  given: str) -> None:
    """--via (or image_via in the user's config) a directory every node sees (the cluster's
    shared filesystem, as an NFS home would be): one exclusive marker finds that the four
    nodes share it, one node receives the archive, all four load it from there, and neither
    the archive nor the marker is left. (The test before this one: the nodes' own homes, a
    copy each.)"""
    tag = f"localhost/dtrain-push:{uuid.uuid4().hex[:8]}"
    tar = tmp_path / "skel.tar"
    tar.write_bytes(podman.skeleton_tar([sys.prefix]))
    if _local("import", "-q", str(tar), tag).returncode != 0:
        cannot_run("podman cannot import an image on this machine (the login node)")
    want = _local("image", "inspect", "--format", "{{.Id}}", tag).stdout.strip()
    via = pcluster.shared_dir / f"images-{uuid.uuid4().hex[:8]}"
    try:
        env = pcluster.client_env()
        args = ["image", "push", "-H", "node[1-4]", tag]
        if given == "--via":
            args += ["--via", str(via)]
        else:
            cfg = tmp_path / "config.toml"
            cfg.write_text(f'image_via = "{via}"\n')
            env = {**env, "DTRAIN_CONFIG": str(cfg)}
        res = dtrain(args, env=env, timeout=300)
        assert res.returncode == 0, res.stdout + res.stderr
        assert f"node[2-4] share {via} with node1: one copy for them" in res.stderr, res.stderr
        assert re.search(r"copied to 1 node in [0-9.]+ s; loading it \(podman load\)",
                         res.stderr), res.stderr
        assert f"4 nodes loaded {tag} in " in res.stderr, res.stderr
        for k in range(1, 5):
            got = pcluster.node_exec(k, ["podman", "image", "inspect", "--format", "{{.Id}}",
                                         tag]).stdout.strip()
            assert got.removeprefix("sha256:") == want.removeprefix("sha256:"), k
        assert sorted(p.name for p in via.iterdir()) == [], "the archive or a marker was left"
        assert via.stat().st_mode & 0o077 == 0  # made by the push: the user's alone
    finally:
        for k in range(1, 5):
            podman.remove_image(pcluster, k, tag)
        _local("rmi", "-f", tag)
        if via.exists():
            for p in via.iterdir():
                p.unlink()
            via.rmdir()


def test_image_push_refuses_a_directory_others_can_write_into(pcluster: tc.Cluster,
                                                               tmp_path: Path) -> None:
    """--via the cluster's shared directory itself (root's, mode 1777, like /tmp): another
    user could leave an archive there under the name the nodes load, so every node is
    refused with what to do, nothing is saved or copied, exit 1."""
    tag = f"localhost/dtrain-push:{uuid.uuid4().hex[:8]}"
    tar = tmp_path / "skel.tar"
    tar.write_bytes(podman.skeleton_tar([sys.prefix]))
    if _local("import", "-q", str(tar), tag).returncode != 0:
        cannot_run("podman cannot import an image on this machine (the login node)")
    via = pcluster.shared_dir
    before = sorted(p.name for p in via.iterdir())
    try:
        res = dtrain(["image", "push", "-H", "node[1-2]", "--via", str(via), tag],
                     env=pcluster.client_env(), timeout=300)
        assert res.returncode == 1, res.stdout + res.stderr
        mode = f"{stat.S_IMODE(via.stat().st_mode):o}"
        why = (f"{via} is not this user's alone (root (uid 0)'s, mode {mode}): the node would "
               "load whatever archive lies there; --via a directory of your own, on a path "
               "that only root and you can change (or ask its owner to make it so)")
        assert res.stderr.splitlines() == [f"dtrain: node1: {why}", f"dtrain: node2: {why}"], \
            res.stderr
        assert sorted(p.name for p in via.iterdir()) == before
    finally:
        for k in range(1, 3):
            podman.remove_image(pcluster, k, tag)
        _local("rmi", "-f", tag)


def test_image_push_names_a_node_the_archive_cannot_reach(pcluster: tc.Cluster,
                                                           tmp_path: Path) -> None:
    """node3's ~/.cache/dtrain/images is a file: the copy names node3, node1-2 load the image,
    and node3's line says the archive never arrived and what to do (--via), not podman's own
    words about a path; exit 1."""
    tag = f"localhost/dtrain-push:{uuid.uuid4().hex[:8]}"
    tar = tmp_path / "skel.tar"
    tar.write_bytes(podman.skeleton_tar([sys.prefix]))
    if _local("import", "-q", str(tar), tag).returncode != 0:
        cannot_run("podman cannot import an image on this machine (the login node)")
    pcluster.node_exec(3, ["sh", "-c", "rm -rf ~/.cache/dtrain/images && mkdir -p "
                           "~/.cache/dtrain && : > ~/.cache/dtrain/images"], check=True)
    try:
        res = dtrain(["image", "push", "-H", "node[1-3]", tag], env=pcluster.client_env(),
                     timeout=300)
        assert res.returncode == 1, res.stdout + res.stderr
        assert "node3: /home/dtuser/.cache/dtrain/images exists and is not a directory" \
            in res.stderr, res.stderr
        assert re.search(r"the copy failed on some node \(exit 1, after [0-9.]+ s\): loading "
                         r"it \(podman load\) where it landed", res.stderr), res.stderr
        assert "copied to" not in res.stderr
        assert f"2 nodes loaded {tag} in " in res.stderr, res.stderr
        assert res.stderr.rstrip().endswith(
            "node3: the archive did not arrive in .cache/dtrain/images/dtrain-image-"
            f"{want_short(tag)}.tar (the copy's error is above); --via DIR puts it elsewhere, "
            "e.g. node-local scratch"), res.stderr
    finally:
        pcluster.node_exec(3, ["rm", "-f", str(pcluster.node(3).home / ".cache/dtrain/images")])
        for k in range(1, 4):
            podman.remove_image(pcluster, k, tag)
        _local("rmi", "-f", tag)


def want_short(tag: str) -> str:
    """This machine's id of ``tag``, as dtrain shortens it."""
    return _local("image", "inspect", "--format", "{{.Id}}", tag).stdout.strip() \
        .removeprefix("sha256:")[:12]


def test_the_probe_runs_inside_the_image_with_the_images_python(pcluster: tc.Cluster,
                                                                 tmp_path: Path) -> None:
    """--python names the image's interpreter (here only inside, through a mount): the host
    probe and supervisor use the host's python3, the facts come from a probe in the image,
    torchrun runs there. A python the image lacks is named per node before the job."""
    pydir = pcluster.shared_dir / f"imgpy-{uuid.uuid4().hex[:8]}"
    pydir.mkdir()
    pydir.chmod(0o755)
    (pydir / "python3").symlink_to(sys.executable)
    try:
        run_id = f"ctr-py-{uuid.uuid4().hex[:8]}"
        args = run_args(pcluster, tmp_path, run_id, "tests/workloads/env_report.py", "--image",
                        IMAGE, *podman.run_mounts(), "--mount", f"{pydir}:/opt/dtrain-py:ro")
        args[args.index("--python") + 1] = "/opt/dtrain-py/python3"
        res = dtrain(args, env=pcluster.client_env(), timeout=240)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        assert res.stdout.count("REPORT ") == 3
        plan = meta(tmp_path, run_id)["plan"]["nodes"]
        assert all(n["command"][0] == "/opt/dtrain-py/python3" for n in plan)
        assert not Path("/opt/dtrain-py").exists()  # not on the hosts
        # without the mount the image has no such python: named before anything starts
        run_id = f"ctr-nopy-{uuid.uuid4().hex[:8]}"
        args = run_args(pcluster, tmp_path, run_id, "tests/workloads/env_report.py", "--image",
                        IMAGE, *podman.run_mounts())
        args[args.index("--python") + 1] = "/opt/dtrain-py/python3"
        res = dtrain(args, env=pcluster.client_env(), timeout=240)
        assert res.returncode == 1, res.stdout + res.stderr
        assert "inside the image: node" in res.stderr
        for k in (1, 2, 3):
            assert f"node{k}: the probe inside the image gave no answer" in res.stderr
        _no_containers(pcluster, run_id)
    finally:
        (pydir / "python3").unlink()
        pydir.rmdir()


def test_smoke_inside_the_image(pcluster: tc.Cluster, tmp_path: Path) -> None:
    run_id = f"ctr-smoke-{uuid.uuid4().hex[:8]}"
    res = dtrain(["smoke", "-H", "node[1-2]", "--python", pcluster.python, "--archive-dir",
                  str(tmp_path / "runs"), "--run-id", run_id, "--max-size", "1M", "--image",
                  IMAGE, *podman.run_mounts()], env=pcluster.client_env(), timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "smoke: PASS: 2 nodes" in res.stdout + res.stderr
    _no_containers(pcluster, run_id, range(1, 3))
    plan = meta(tmp_path, run_id)["plan"]["nodes"]
    assert [n["container"][:2] for n in plan] == [["podman", "run"]] * 2


def _sshd_session(pid: int) -> int:
    """The per-connection sshd above a supervisor (its parent)."""
    stat = tc.proc_stat(pid)
    assert stat is not None, pid
    return stat[0]


@pytest.mark.parametrize("how", ["supervisor-kill", "sshd-kill"])
def test_a_lost_node_leaves_no_container_and_no_process(pcluster: tc.Cluster, tmp_path: Path,
                                                        jobs: list, how: str) -> None:
    """node3's supervisor SIGKILLed, or the sshd of its connection: the launcher names node3
    lost (255) and stops the others; node3 itself has nobody left to run `podman stop`, yet
    its container and every process of the run end (the shim inside sees its socket close,
    or the supervisor its stdin end) and the container is removed (--rm)."""
    from tests.test_failures import _supervisor_pid

    run_id = f"ctr-{how}-{uuid.uuid4().hex[:8]}"
    extra = ["--grace", "3", "--heartbeat-timeout", "5"]
    with JobWatch(pcluster, [1, 2, 3], run_id=run_id) as watch:
        job = Dtrain(pcluster, _args(pcluster, tmp_path, run_id, "tests/workloads/tick.py",
                                     *extra))
        jobs.append(job)
        job.wait_line(r"r\d: tick \d 2", timeout=120, count=3)
        assert podman.containers(pcluster, 3, run_id) == [f"dtrain-{run_id}-node3-a1"]
        sup = _supervisor_pid(watch, 3)
        os.kill(_sshd_session(sup) if how == "sshd-kill" else sup, signal.SIGKILL)
        rc = job.wait(60)
        # the others are stopped by dtrain; node3 by itself (3 heartbeat timeouts at most)
        watch.assert_clean(3 * 5 + 3 + 10, since=job.ended)
    assert rc == 255, job.output
    assert re.search(r"node node3 lost", job.output), job.output[-3000:]
    m = meta(tmp_path, run_id)
    assert (m["root_cause"]["kind"], m["root_cause"]["host"]) == ("lost", "node3"), m
    deadline = time.monotonic() + 30
    while any(podman.containers(pcluster, k, run_id) for k in (1, 2, 3)) and \
            time.monotonic() < deadline:
        time.sleep(0.5)
    _no_containers(pcluster, run_id)


def test_restarts_fence_a_lost_node_and_the_spare_runs_in_its_container(
        pcluster: tc.Cluster, tmp_path: Path, jobs: list) -> None:
    """--restarts inside podman: node2's supervisor SIGKILLed in attempt 1, node2 fenced
    (the run's own lemon list: exactly node2), spare node4 in with its own container
    (attempt 2's name), the run ends 0; nothing of either attempt is left anywhere."""
    run_id = f"ctr-restart-{uuid.uuid4().hex[:8]}"
    state = tmp_path / "state"
    extra = ["--grace", "3", "--heartbeat-timeout", "5", "--nnodes", "3", "--restarts", "2",
             "--restart-backoff", "0.5"]
    args = run_args(pcluster, tmp_path, run_id, "tests/workloads/tick.py", "--image", IMAGE,
                    *podman.run_mounts(), *extra, hosts="node[1-4]",
                    env={"TICK_S": "0.2", "TICK_N": "40"})
    with JobWatch(pcluster, [1, 2, 3, 4], run_id=run_id) as watch:
        job = Dtrain(pcluster, args, env={"DTRAIN_STATE_DIR": str(state)})
        jobs.append(job)
        job.wait_line(r"r\d: tick \d 2$", timeout=120, count=3)
        assert podman.containers(pcluster, 2, run_id) == [f"dtrain-{run_id}-node2-a1"]
        watch.wait_saw(3)  # node4, the spare, has nothing yet
        with watch._lock:
            (sup,) = [key[0] for key in watch.known[2] if key in watch.sup_keys]
        os.kill(sup, signal.SIGKILL)
        job.wait_line(r"spare node4 in", timeout=60)
        rc = job.wait(150)
        watch.assert_clean(3 * 5 + 3 + 10, since=job.ended)
    assert rc == 0, job.output[-4000:]
    lemons = json.loads((state / "lemons.json").read_text())["lemons"]
    assert [(r["host"], r.get("tier", "isolate")) for r in lemons] == [("node2", "isolate")]
    m = meta(tmp_path, run_id)
    assert [a["cause"] for a in m["attempts"]] == ["node", "ok"], m["attempts"]
    hosts = [n["host"] for n in m["plan"]["nodes"]]
    assert hosts == ["node1", "node4", "node3"], hosts  # the spare in node2's place
    names = [n["container"][n["container"].index("--name") + 1] for n in m["plan"]["nodes"]]
    assert names == [f"dtrain-{run_id}-{h}-a2" for h in hosts], names
    ticks = [ln for ln in job.output.splitlines() if re.search(r"r1: tick 1 39$", ln)]
    assert ticks, job.output[-3000:]  # attempt 2's rank 1 (node4) ran to its end
    _no_containers(pcluster, run_id, range(1, 5))


def test_hang_stacks_top_and_the_report_of_a_run_inside_containers(
        pcluster: tc.Cluster, tmp_path: Path, jobs: list) -> None:
    """3 nodes x 2 ranks of tests/workloads/hang.py inside podman, sampled every second: while
    it runs, `dtrain top RUN --once --json` shows every rank's process state and CPU found
    inside the containers (the sampler scans the host's /proc; the container's processes
    carry the run's id); the hang is named with rank 4's stack (faulthandler inside the
    image), every rank's stack and flight dump archived; `dtrain report` draws the run: its
    hang marker, the culprit's stack, each node's CPU chart."""
    run_id = f"ctr-hang-{uuid.uuid4().hex[:8]}"
    archive = tmp_path / "runs"
    args = _args(pcluster, tmp_path, run_id, "tests/workloads/hang.py", "--hang-timeout", "8",
                 "--on-hang", "stop", "--grace", "3", "--sample-interval", "1", nproc=2,
                 env={"WL_HANG_RANK": "4", "WL_HANG_STEP": "25"})
    with JobWatch(pcluster, [1, 2, 3], run_id=run_id) as watch:
        job = Dtrain(pcluster, args)
        jobs.append(job)
        job.wait_line(r"r0: step 5 ", timeout=150)
        top = dtrain(["top", run_id, "--archive-dir", str(archive), "--once", "--json",
                      "--no-gpu"], env=pcluster.client_env(), timeout=60)
        rc = job.wait(150)
        watch.assert_clean(5.0, since=job.ended)
    assert top.returncode == 0, top.stdout[-2000:] + top.stderr[-2000:]
    view = json.loads(top.stdout)
    info = {n["host"]: n.get("rank_info") or {} for n in view["nodes"]}
    assert {h: sorted(info[h]) for h in info} == {
        "node1": ["0", "1"], "node2": ["2", "3"], "node3": ["4", "5"]}, info
    assert all(r["state"] for ranks in info.values() for r in ranks.values()), info
    assert rc == 125, job.output[-4000:]
    run = archive / run_id
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    cpu: dict[str, float] = {}
    for rec in samples:
        for rank, r in (rec.get("ranks") or {}).items():
            cpu[rank] = max(cpu.get(rank, 0.0), r["cpu"])
    assert sorted(cpu) == [str(r) for r in range(6)], cpu
    assert all(v > 0 for v in cpu.values()), cpu  # importing torch alone costs CPU seconds
    out = tmp_path / "page.html"
    res = dtrain(["report", str(run), "-o", str(out)])
    assert res.returncode == 0, res.stderr
    page = out.read_text()
    assert 'data-kind="hang"' in page
    doc = json.loads(dtrain(["report", str(run), "--json"]).stdout)
    (drawn,) = doc["runs"]
    assert "cpu" in {u["name"] for u in drawn["usage"]}, drawn["usage"]
    _no_containers(pcluster, run_id)
    # a rank registers its container's pid; the supervisor takes the kernel's (SO_PEERCRED)
    assert re.search(r"^dtrain:   rank 4 \(node3\): time\.sleep <- load_batch\(\) hang\.py:\d+",
                     job.output, re.M), job.output[-4000:]
    for rank in range(6):
        assert "(most recent call first)" in (run / "stacks" / "h1" / f"r{rank}.txt").read_text()
    assert "load_batch" in page


# ------------------------------------------------------------------------- root podman

@pytest.fixture(scope="module")
def rootcluster(pcluster: tc.Cluster) -> tc.Cluster:
    """Root logs in to nodes 1-2 (root@nodeK, the client's key) and each has the image in
    its own root store (tests/cluster/podman.py)."""
    podman.ensure_image(pcluster, [1, 2], user="root")
    return pcluster


def test_root_podman_runs_ddp_and_a_killed_launcher_leaves_nothing(
        rootcluster: tc.Cluster, tmp_path: Path, jobs: list) -> None:
    """The same gang as root: a 2x2 gloo DDP run inside root podman (overlay storage, the
    node's own NIC, ranks as uid 0 in the container), exec inside the image as root; then a
    SIGKILLed launcher: the nodes stop their root containers by name, nothing is left in
    root's store, and dtuser's rootless store never saw the run."""
    c = rootcluster
    hosts = "root@node[1-2]"
    run_id = f"ctr-root-{uuid.uuid4().hex[:8]}"
    with JobWatch(c, [1, 2], run_id=run_id) as watch:
        res = dtrain(_args(c, tmp_path, run_id, "tests/workloads/env_report.py", nproc=2,
                           hosts=hosts, script_args=["GLOO_SOCKET_IFNAME", "container"]),
                     env=c.client_env(), timeout=180)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        watch.assert_clean(5.0)
    reports = [json.loads(line.split("REPORT ", 1)[1]) for line in res.stdout.splitlines()
               if "REPORT " in line]
    assert sorted(r["rank"] for r in reports) == list(range(4))
    for r in reports:
        assert r["env"]["GLOO_SOCKET_IFNAME"] == c.node(int(r["host"][4:])).ifname
        assert r["env"]["container"] == "podman" and r["sum"] == 4.0
    for k in (1, 2):
        assert podman.containers(c, k, run_id, user="root") == []
    assert meta(tmp_path, run_id)["plan"]["nodes"][0]["container"][:2] == ["podman", "run"]

    res = dtrain(["exec", "-H", hosts, "--image", IMAGE, *podman.run_mounts(), "--",
                  "sh", "-c", "echo $(id -u) $(cat /proc/1/comm) $container"],
                 env=c.client_env(), timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert sorted(res.stdout.splitlines()) == [f"node{k}: 0 podman-init podman" for k in (1, 2)]

    run_id = f"ctr-root-kill-{uuid.uuid4().hex[:8]}"
    with JobWatch(c, [1, 2], run_id=run_id) as watch:
        job = Dtrain(c, _args(c, tmp_path, run_id, "tests/workloads/tick.py", "--grace", "3",
                              "--heartbeat-timeout", "6", hosts=hosts))
        jobs.append(job)
        job.wait_line(r"r\d: tick \d 2", timeout=120, count=2)
        assert {k: podman.containers(c, k, run_id, user="root") for k in (1, 2)} == {
            k: [f"dtrain-{run_id}-node{k}-a1"] for k in (1, 2)}
        assert podman.containers(c, 1, run_id) == []  # not in dtuser's rootless store
        job.signal(signal.SIGKILL)
        job.wait(10)
        watch.assert_clean(40.0)
    deadline = time.monotonic() + 30
    while any(podman.containers(c, k, run_id, user="root") for k in (1, 2)) and \
            time.monotonic() < deadline:
        time.sleep(0.5)
    assert {k: podman.containers(c, k, run_id, user="root") for k in (1, 2)} == {1: [], 2: []}
