"""On the cluster: only the node with an (emulated) RDMA fabric gets NCCL_IB_HCA."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tests.util import assert_exit, dtrain

pytestmark = [pytest.mark.ssh, pytest.mark.torch]


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def make_ib_tree(root):
    """A one-port InfiniBand HCA, as the kernel's sysfs shows it."""
    dev = root / "mlx5_0"
    port = dev / "ports" / "1"
    _write(port / "state", "4: ACTIVE\n")
    _write(port / "phys_state", "5: LinkUp\n")
    _write(port / "link_layer", "InfiniBand\n")
    _write(port / "rate", "200 Gb/sec (4X HDR)\n")
    _write(port / "gids" / "0", "fe80:0000:0000:0000:0c42:a103:0065:1a2b\n")
    driver = root.parent / "drivers" / "mlx5_core"
    driver.mkdir(parents=True, exist_ok=True)
    (dev / "device").mkdir(parents=True, exist_ok=True)
    os.symlink(driver, dev / "device" / "driver")


def test_only_the_rdma_node_gets_nccl_ib_hca(cluster, tmp_path):
    node2 = cluster.node(2)
    tree = node2.home / "fake-sys" / "infiniband"
    shutil.rmtree(node2.home / "fake-sys", ignore_errors=True)
    make_ib_tree(tree)
    uid, gid = node2.home.stat().st_uid, node2.home.stat().st_gid
    for dirpath, dirnames, filenames in os.walk(node2.home / "fake-sys"):
        for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
            os.lchown(name, uid, gid)
    try:
        setup = ('test -d "$HOME/fake-sys/infiniband" && '
                 'export DTRAIN_IB_SYSFS="$HOME/fake-sys/infiniband"; true')
        args = ["run", "-H", "node[1-2]", "--python", cluster.python, "--nproc-per-node", "1",
                "--archive-dir", str(tmp_path / "runs"), "--setup", setup,
                "tests/workloads/env_report.py", "NCCL_IB_HCA", "NCCL_IB_DISABLE"]
        # RDMA with a limited memlock is refused before launch, naming the node...
        res = dtrain(args, env=cluster.client_env(), timeout=120)
        assert_exit(res, 1)
        assert "node2: memlock" in res.stderr, res.stderr
        # ...and runs once the user takes responsibility for it
        res = dtrain([*args[:1], "--no-preflight", *args[1:]], env=cluster.client_env(),
                     timeout=120)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        reports = {json.loads(ln.split("REPORT ", 1)[1])["host"]:
                   json.loads(ln.split("REPORT ", 1)[1])["env"]
                   for ln in res.stdout.splitlines() if "REPORT " in ln}
        assert reports["node2"]["NCCL_IB_HCA"] == "=mlx5_0:1"
        assert reports["node1"]["NCCL_IB_HCA"] is None
        assert reports["node1"]["NCCL_IB_DISABLE"] is None
    finally:
        shutil.rmtree(node2.home / "fake-sys", ignore_errors=True)


def test_a_run_orders_node_ranks_by_the_hostfiles_switches(cluster, tmp_path):
    """Placement end to end (issue 36 item 4): switch= keys in the hostfile put the nodes
    that share a switch next to each other in the node ranks (node1 and node3 on s2, then
    node2 on s1), said in one `placement:` line per group, and the ranks torchrun starts
    follow it (each rank reports where it ran)."""
    hf = tmp_path / "hosts.txt"
    hf.write_text("node1 switch=s2\nnode2 switch=s1\nnode3 switch=s2\n")
    res = dtrain(["run", "-f", str(hf), "--python", cluster.python, "--nproc-per-node", "1",
                  "--archive-dir", str(tmp_path / "runs"), "--no-color",
                  "tests/workloads/env_report.py", "GROUP_RANK"],
                 env=cluster.client_env(), timeout=180)
    assert_exit(res, 0)
    out = res.stdout + res.stderr
    assert "placement: node1, node3: switch s2 (hostfile)" in out, out[-3000:]
    assert "placement: node2: switch s1 (hostfile)" in out, out[-3000:]
    reports = [json.loads(line.split("REPORT ", 1)[1]) for line in res.stdout.splitlines()
               if "REPORT " in line]
    where = {r["host"]: (r["rank"], r["env"]["GROUP_RANK"]) for r in reports}
    assert where == {"node1": (0, "0"), "node3": (1, "1"), "node2": (2, "2")}, where


def test_a_run_orders_node_ranks_by_the_nvlink_domains_the_probe_found(big_cluster, tmp_path):
    """NVLink domains end to end (issue 36 item 4): four fake-GPU nodes made IMEX machines
    (/etc/nvidia-imex/nodes_config.cfg), their nvidia-smi reporting two ClusterUUIDs; the
    probe asks each for its fabric, and the plan keeps each domain's nodes together (node4,
    node8, then node6, node10), said in one `placement:` line per domain, the ranks torchrun
    starts following it. Without the IMEX mark nothing is asked and the given order stands."""
    from tests.cluster import gpus

    a, b = "6a130f54-faaa-4b8f-847f-be44ab70f917", "dc6e40c4-d722-4357-9ba6-5291dd461278"
    domain = {4: a, 6: b, 8: a, 10: b}
    nodes = [big_cluster.node(k) for k in domain]
    hf = tmp_path / "hosts.txt"
    hf.write_text("".join(f"node{k}\n" for k in domain))
    args = ["run", "-f", str(hf), "--python", big_cluster.python, "--nproc-per-node", "1",
            "--archive-dir", str(tmp_path / "runs"), "--no-color",
            "tests/workloads/env_report.py", "GROUP_RANK"]

    def where(res):
        reports = [json.loads(line.split("REPORT ", 1)[1]) for line in res.stdout.splitlines()
                   if "REPORT " in line]
        return {r["host"]: r["rank"] for r in reports}

    try:
        for k, node in zip(domain, nodes, strict=True):
            (node.home / ".fake-nvidia-smi.json").write_text(json.dumps({
                str(i): {"fabric.state": "Completed", "fabric.status": "Success",
                         "fabric.clusterUuid": domain[k], "fabric.cliqueId": "7"}
                for i in (0, 1)}))
        # the fabric is there, but no IMEX mark: the probe does not ask, the order stands
        res = dtrain(args, env=big_cluster.client_env(), timeout=180)
        assert_exit(res, 0)
        assert "placement:" not in res.stdout + res.stderr
        assert where(res) == {"node4": 0, "node6": 1, "node8": 2, "node10": 3}
        for node in nodes:
            gpus.imex_config(node.dir).write_text("198.18.0.14\n")
        res = dtrain(args, env=big_cluster.client_env(), timeout=180)
        assert_exit(res, 0)
        out = res.stdout + res.stderr
        assert f"placement: node4, node8: NVLink domain {a}/7 (nvidia-smi)" in out, out[-3000:]
        assert f"placement: node6, node10: NVLink domain {b}/7 (nvidia-smi)" in out, out[-3000:]
        assert where(res) == {"node4": 0, "node8": 1, "node6": 2, "node10": 3}
    finally:
        for node in nodes:
            gpus.imex_config(node.dir).unlink(missing_ok=True)
            (node.home / ".fake-nvidia-smi.json").unlink(missing_ok=True)
