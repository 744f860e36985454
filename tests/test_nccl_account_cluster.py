"""On the cluster: NCCL's own account read from its per-process files (no change to the
script): one node falls back to NET/Socket -> warned; refused under --require-fabric rdma."""

from __future__ import annotations

import json
import re

import pytest

from tests.util import assert_exit, dtrain

pytestmark = [pytest.mark.ssh, pytest.mark.torch]


def run_args(cluster, tmp_path, *extra):
    return ["run", "-H", "node[1-2]", "--python", cluster.python, "--nproc-per-node", "2",
            "--archive-dir", str(tmp_path / "runs"), "--no-preflight", *extra,
            "tests/workloads/nccl_info.py", "--socket", "node2", "--sleep", "20"]


def meta(tmp_path):
    [path] = (tmp_path / "runs").glob("*/meta.json")
    return json.loads(path.read_text())


def test_socket_fallback_is_warned_with_the_ranks_and_node(cluster, tmp_path):
    args = run_args(cluster, tmp_path, "--json")
    args[-1] = "1"  # --sleep 1
    res = dtrain(args, env=cluster.client_env(), timeout=120)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "WARNING: ranks 2-3 (node2) use NET/Socket (TCP): NET/IB found no device" \
        in res.stderr, res.stderr
    assert "NCCL 2.21.5: mixed:" in res.stderr
    # dtrain asked NCCL itself: the script saw NCCL_DEBUG=INFO, nothing on the console
    assert "NCCL INFO" not in res.stderr + res.stdout
    fabric = meta(tmp_path)["fabric"]
    assert fabric["transports"] == {"0": "gdr", "1": "gdr", "2": "socket", "3": "socket"}
    assert fabric["version"] == "2.21.5"
    doc = json.loads(res.stdout)
    assert doc["run"]["fabric"]["transports"]["2"] == "socket"
    # the report shows what the console said: the line, then the warning
    run_dir = next((tmp_path / "runs").glob("*/meta.json")).parent
    rep = dtrain(["report", str(run_dir), "--json"], env=cluster.client_env(), timeout=60)
    assert rep.returncode == 0, rep.stderr
    shown = json.loads(rep.stdout)["runs"][0]["fabric"]
    assert shown[0] == fabric["line"] and shown[0] in res.stderr
    assert any("ranks 2-3 (node2) use NET/Socket" in x for x in shown[1:]), shown


def test_require_fabric_rdma_refuses_at_once(cluster, tmp_path):
    res = dtrain(run_args(cluster, tmp_path, "--require-fabric", "rdma"),
                 env=cluster.client_env(), timeout=120)
    assert_exit(res, 123)
    # refused as soon as one rank of node2 said NET/Socket (whichever came first)
    assert re.search(r"--require-fabric rdma: rank(s 2-3| [23]) \(node2\) uses? socket",
                     res.stdout), res.stdout
    m = meta(tmp_path)
    assert m["exit_code"] == 123 and m["root_cause"]["kind"] == "fabric"
    # the ranks did not sleep their 20 s out: dtrain stopped them
    for node in m["nodes"]:
        for r in node["ranks"].values():
            assert r["exit_code"] != 0 and r["duration"] < 15, node


def test_the_users_own_nccl_debug_is_never_overridden(cluster, tmp_path):
    args = run_args(cluster, tmp_path, "--env", "NCCL_DEBUG=INFO")
    args[-1] = "1"
    res = dtrain(args, env=cluster.client_env(), timeout=120)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    # their NCCL_DEBUG: NCCL prints on stdout as it always does, dtrain reads no file
    assert "NCCL INFO Using network Socket" in res.stdout
    assert meta(tmp_path)["fabric"] is None


def test_a_site_setting_that_overrules_the_plan_is_warned_before_the_run(cluster, tmp_path):
    """docs/network-env.md: a site setting (here node2's ~/.nccl.conf) that overrules a
    detected value is printed when a run starts, not only under --dry-run."""
    import os

    home = cluster.node(2).home
    conf = home / ".nccl.conf"
    conf.write_text("NCCL_SOCKET_IFNAME=eth9\n")
    st = home.stat()
    os.chown(conf, st.st_uid, st.st_gid)
    try:
        args = run_args(cluster, tmp_path)
        args[-1] = "1"
        res = dtrain(args, env=cluster.client_env(), timeout=120)
    finally:
        conf.unlink()
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    # on stderr with dtrain's other warnings, once, node2's hostname prefix not repeated
    warned = [ln for ln in res.stderr.splitlines() if ln.startswith("dtrain: warning: ")]
    assert warned == ["dtrain: warning: node2: NCCL_SOCKET_IFNAME: /home/dtuser/.nccl.conf sets "
                      "eth9, which stays in effect; dtrain would use =eth0 (detected: route to "
                      "198.18.0.11 via eth0)"], res.stderr
