"""On the cluster: the health gate (issue 36 item 3; docs/fabric.md). node4 (a fake-GPU
node, tests/cluster/gpus.py) reports a pending row remap and is isolated; node3's fake
IB port counter grows between the two readings and is reported; the next run skips node4
with the reason, and `run --health-check` without a spare refuses it."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tests.reports import validate_json
from tests.util import assert_exit, dtrain

pytestmark = [pytest.mark.ssh]


def _own(root, home):
    uid, gid = home.stat().st_uid, home.stat().st_gid
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
            os.lchown(name, uid, gid)


@pytest.fixture
def sick(cluster):
    """node4: GPU 1 with a pending row remap; node3: one IB port whose symbol_error
    counter a background shell (--setup) bumps 1 s after the collector starts."""
    node3, node4 = cluster.node(3), cluster.node(4)
    remap = node4.home / ".fake-nvidia-smi.json"
    remap.write_text(json.dumps({"1": {"remapped_rows.pending": "Yes"}}))
    _own(remap, node4.home)
    port = node3.home / "fake-sys" / "infiniband" / "mlx5_0" / "ports" / "1"
    shutil.rmtree(node3.home / "fake-sys", ignore_errors=True)
    (port / "counters").mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    (port / "rate").write_text("200 Gb/sec (4X HDR)\n")
    (port / "counters" / "symbol_error").write_text("2\n")
    (port / "counters" / "link_downed").write_text("0\n")
    _own(node3.home / "fake-sys", node3.home)
    counter = "$HOME/fake-sys/infiniband/mlx5_0/ports/1/counters/symbol_error"
    setup = ('if test -d "$HOME/fake-sys/infiniband"; then '
             'export DTRAIN_IB_SYSFS="$HOME/fake-sys/infiniband"; '
             f'(sleep 1; echo 9 > "{counter}") >/dev/null 2>&1 & fi; true')
    try:
        yield setup
    finally:
        remap.unlink(missing_ok=True)
        shutil.rmtree(node3.home / "fake-sys", ignore_errors=True)


def test_health_gate_isolates_and_the_next_run_skips(cluster, sick, tmp_path):
    env = cluster.client_env(DTRAIN_STATE_DIR=str(tmp_path / "state"))
    res = dtrain(["doctor", "--health", "--json", "-H", "node[1,3-4]", "--health-interval",
                  "4", "--python", cluster.python, "--setup", sick], env=env, timeout=120)
    assert_exit(res, 1)
    doc = json.loads(res.stdout)
    validate_json(doc, "health")
    nodes = {n["host"]: n for n in doc["nodes"]}
    assert doc["isolated"] == ["node4"] and nodes["node4"]["gpus"]
    assert [f["message"] for f in nodes["node4"]["findings"]] == [
        "GPU 1: row remapping pending (1): out until a GPU reset applies it"]
    assert nodes["node3"]["verdict"] == "monitor" and nodes["node3"]["ports"] == ["mlx5_0:1"]
    assert "mlx5_0:1: symbol_error grew by 7 (2 -> 9)" in [
        f["message"] for f in nodes["node3"]["findings"]]
    assert nodes["node1"]["verdict"] == "ok" and not nodes["node1"]["gpus"]
    assert "node4: ISOLATE (GPUs" in res.stderr and "node4: isolated" in res.stderr
    # the lemon list has it: the next run with a host to spare leaves it out, saying why
    res = dtrain(["nodes", "--json"], env=env, timeout=30)
    assert "row remapping pending" in res.stdout, res.stdout
    run = ["run", "--python", cluster.python, "--nproc-per-node", "1",
           "--archive-dir", str(tmp_path / "runs"), "--no-preflight",
           "tests/workloads/env_report.py", "HOSTNAME"]
    res = dtrain([*run[:1], "-H", "node[1,3-4]", "--nnodes", "2", *run[1:]], env=env,
                 timeout=180)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert ("node4 skipped: fenced by run doctor-health-" in res.stdout
            and "health gate: GPU 1: row remapping pending" in res.stdout), res.stdout


def test_run_health_check_refuses_without_a_spare(cluster, sick, tmp_path):
    env = cluster.client_env(DTRAIN_STATE_DIR=str(tmp_path / "state"))
    res = dtrain(["run", "--health-check", "-H", "node[3-4]", "--python", cluster.python,
                  "--nproc-per-node", "1", "--archive-dir", str(tmp_path / "runs"),
                  "--setup", sick, "tests/workloads/env_report.py", "HOSTNAME"],
                 env=env, timeout=180)
    assert_exit(res, 1)
    out = res.stdout + res.stderr
    assert "health check: node4 isolated: health gate: GPU 1: row remapping pending" in out
    assert "the run needs 2 node(s) and has no spare" in out, out
    assert "REPORT" not in res.stdout  # nothing started


def test_doctor_health_dcgm(cluster, tmp_path):
    """--dcgm 1 on node4's fake dcgmi (DCGM's diag JSON) with GPU 1 failing GPU Memory:
    isolated, quoting DCGM; node3 has no dcgmi: nothing run there."""
    node4 = cluster.node(4)
    fail = node4.home / ".fake-dcgmi.json"
    fail.write_text(json.dumps({"Hardware/GPU Memory": {"1": "FAIL"}}))
    _own(fail, node4.home)
    try:
        env = cluster.client_env(DTRAIN_STATE_DIR=str(tmp_path / "state"))
        res = dtrain(["doctor", "--health", "--dcgm", "1", "--json", "-H", "node[3-4]",
                      "--health-interval", "0.1", "--python", cluster.python], env=env,
                     timeout=120)
        assert_exit(res, 1)
        doc = json.loads(res.stdout)
        validate_json(doc, "health")
        nodes = {n["host"]: n for n in doc["nodes"]}
        assert nodes["node4"]["dcgm"] and not nodes["node3"]["dcgm"]
        assert [f["message"] for f in nodes["node4"]["findings"]] == [
            "dcgmi diag -r 1: Hardware/GPU Memory FAIL on GPU 1: fake GPU Memory failure "
            "on GPU 1"]
        assert doc["isolated"] == ["node4"]
    finally:
        fail.unlink(missing_ok=True)


def test_xids_since_boot_and_since_the_last_check(cluster, tmp_path):
    node3 = cluster.node(3)
    log = node3.home / "fake-kmsg"
    line = "[ {t}.0] NVRM: Xid (PCI:0000:18:00): 79, pid=1234, GPU has fallen off the bus.\n"
    log.write_text(line.format(t=12))
    _own(log, node3.home)
    env = cluster.client_env(DTRAIN_STATE_DIR=str(tmp_path / "state"))
    args = ["doctor", "--health", "--json", "-H", "node3", "--health-interval", "0.1",
            "--python", cluster.python, "--setup", 'export DTRAIN_KERNEL_LOG="$HOME/fake-kmsg"']
    try:
        res = dtrain(args, env=env, timeout=120)
        assert_exit(res, 1)
        assert [f["message"] for f in json.loads(res.stdout)["nodes"][0]["findings"]] == [
            "Xid 79 (GPU fallen off the bus) on PCI:0000:18:00"]
        with log.open("a") as f:
            f.write(line.format(t=99))
        res = dtrain(args, env=env, timeout=120)
        assert [f["message"] for f in json.loads(res.stdout)["nodes"][0]["findings"]] == [
            "Xid 79 (GPU fallen off the bus) on PCI:0000:18:00 x2 (1 new since the last "
            "check)"]
    finally:
        log.unlink(missing_ok=True)
