"""The health gate's pure half: nvidia-smi fields, Xid lines and port counter growth ->
findings tiered isolate / reset / monitor (decide/fabric/health.py)."""

from __future__ import annotations

from launcher.decide.fabric import health as h


def test_gpu_fields_tiered():
    csv = ("0, 0, 0, 0, 0, Not Active, 45\n"
           "1, 2, 1, 0, 0, Active, 91\n"
           "2, [N/A], 0, 1, 0, Not Active, 40\n")
    f = h.gpu_findings(csv)
    assert [(x.tier, x.where) for x in f] == [
        ("reset", "GPU 1"), ("isolate", "GPU 1"), ("monitor", "GPU 1"), ("monitor", "GPU 1"),
        ("isolate", "GPU 2")]
    assert "row remapping pending (1): out until a GPU reset applies it" in f[1].message
    assert h.verdict(f) == "isolate" and h.verdict(f[:1]) == "reset" and h.verdict([]) == "ok"


def test_xids_counted_and_application_ones_left_out():
    lines = ["[ 12.3] NVRM: Xid (PCI:0000:18:00): 79, pid=1234, GPU has fallen off the bus.",
             "[ 13.0] NVRM: Xid (PCI:0000:18:00): 79, pid=1234, GPU has fallen off the bus.",
             "[ 14.0] NVRM: Xid (PCI:0000:3b:00): 13, pid=99, Graphics Exception",
             "[ 15.0] NVRM: Xid (PCI:0000:3b:00): 92, pid=99, High single-bit ECC error rate"]
    f = h.xid_findings(lines)
    assert [(x.tier, x.message) for x in f] == [
        ("isolate", "Xid 79 (GPU fallen off the bus) on PCI:0000:18:00 x2"),
        ("monitor", "Xid 92 (high single-bit ECC rate) on PCI:0000:3b:00")]


def test_port_counters_that_grow_between_two_readings():
    before = {"mlx5_0:1": {"symbol_error": 5, "link_downed": 1, "port_rcv_errors": 0}}
    after = {"mlx5_0:1": {"symbol_error": 5, "link_downed": 2, "port_rcv_errors": 7}}
    f = h.port_findings(before, after, {"mlx5_0:1": "4: ACTIVE", "mlx5_1:1": "1: DOWN"})
    assert [(x.tier, x.message) for x in f] == [
        ("isolate", "mlx5_1:1: port state '1: DOWN'"),
        ("reset", "mlx5_0:1: link_downed grew by 1 (1 -> 2)"),
        ("monitor", "mlx5_0:1: port_rcv_errors grew by 7 (0 -> 7)")]
    assert h.port_findings(before, before) == []  # an absolute count alone is no finding


DCGM_DOC = {"DCGM GPU Diagnostic": {"version": "3.3.5", "test_categories": [
    {"category": "Deployment", "tests": [
        {"name": "Denylist", "results": [{"gpu_ids": "0,1", "status": "PASS"}]}, None]},
    {"category": "Hardware", "tests": [
        {"name": "GPU Memory", "results": [
            {"gpu_ids": "0", "status": "PASS"},
            {"gpu_ids": "1", "status": "FAIL",
             "warnings": [{"warning": "Error using CUDA API cudaMalloc", "error_id": 68}]}]}]},
    {"category": "Integration", "tests": [
        {"name": "PCIe", "results": [{"gpu_ids": "0", "status": "Warn"}]}]}]}}


def test_dcgm_diag_json():
    f = h.dcgm_findings(DCGM_DOC, 1)
    assert [(x.tier, x.where) for x in f] == [("isolate", "GPU 1"), ("monitor", "GPU 0")]
    assert "Hardware/GPU Memory FAIL on GPU 1: Error using CUDA API cudaMalloc" in f[0].message
    assert h.dcgm_findings({"nonsense": 1}, 1) == [] and h.dcgm_findings([], 1) == []


# DCGM 4.x's shape (its release notes' breaking changes: the root renamed, results per
# entity, a per-test summary); modelled, not captured from a real DCGM 4 here
DCGM4_DOC = {"DCGM Diagnostic": {"version": "4.4.1", "test_categories": [
    {"category": "Hardware", "tests": [
        {"name": "memory", "test_summary": {"status": "Fail"}, "results": [
            {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 0, "status": "Pass"},
            {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 3, "status": "Fail",
             "warnings": [{"warning": "DBE pending page retirement", "error_id": 95}]}]},
        {"name": "pcie", "test_summary": {"status": "Fail"}, "results": []},
        {"name": "software", "test_summary": {"status": "Pass"}}]},
    {"category": "Deployment", "tests": [
        {"name": "nvswitch", "results": [
            {"entity_group": "NvSwitch", "entity_id": 2, "status": "Warn"}]}]}]}}


def test_dcgm_4_diag_json():
    f = h.dcgm_findings(DCGM4_DOC, 2)
    assert [(x.tier, x.where) for x in f] == [
        ("isolate", "GPU 3"), ("isolate", "GPU ?"), ("monitor", "NvSwitch 2")], f
    assert "Hardware/memory FAIL on GPU 3: DBE pending page retirement" in f[0].message
    assert "Hardware/pcie FAIL on GPU ?" in f[1].message  # the summary alone failed


def test_node_findings_and_document():
    raw = {"gpu_csv": "0, 0, Yes, No, 0, Not Active, 40\n", "xid_lines": [],
           "dcgm": {"available": True, "level": 1, "json": DCGM_DOC},
           "ports": {"mlx5_0:1": {"state": "4: ACTIVE", "before": {"symbol_error": 1},
                                  "after": {"symbol_error": 4}}},
           "memlock": 65536, "shm_bytes": 64 << 20}
    f = h.node_findings(raw)
    msgs = [x.message for x in f]
    assert "GPU 0: row remapping pending (1): out until a GPU reset applies it" in msgs
    assert "mlx5_0:1: symbol_error grew by 3 (1 -> 4)" in msgs
    assert any("memlock 65536" in m for m in msgs) and any("/dev/shm is 64 MiB" in m
                                                            for m in msgs)
    node = h.node_json("node4", f, raw)
    doc = h.document([node, h.node_json("node5", [], None, "ssh: refused")], 0.5)
    assert doc["schema"] == "dtrain.health/1" and doc["isolated"] == ["node4"]
    assert doc["counts"]["unreachable"] == 1 and node["ports"] == ["mlx5_0:1"]
    assert h.isolate_reason(f).startswith("health gate: GPU 0: row remapping pending")
    older = h.node_findings({"gpu_csv": None, "gpu_error": 'Field "x" is not a valid field'})
    assert [(x.tier, x.message) for x in older] == [
        ("monitor", 'nvidia-smi --query-gpu failed: Field "x" is not a valid field')]


def test_node_collector_fields_match():
    import ast
    from pathlib import Path

    src = Path(h.__file__).parents[2] / "nodeside" / "health.py"
    tree = ast.parse(src.read_text())
    fields = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                  and getattr(n.targets[0], "id", "") == "GPU_FIELDS")
    assert fields == h.GPU_FIELDS


def test_document_matches_its_schema():
    from tests.reports import validate_json

    raw = {"gpu_csv": "0, 1, No, Yes, 0, Active, 95\n",
           "xid_lines": ["NVRM: Xid (PCI:0000:18:00): 79, pid=1, off the bus"],
           "dcgm": {"available": True, "level": 2, "json": DCGM_DOC},
           "ports": {"mlx5_0:1": {"state": "1: DOWN", "before": {"link_downed": 0},
                                  "after": {"link_downed": 1}}},
           "memlock": 1, "shm_bytes": 1}
    f = h.node_findings(raw)
    assert {x.what for x in f} == {"gpu", "xid", "dcgm", "port", "limits"}
    validate_json(h.document([h.node_json("a", f, raw), h.node_json("b", [], None, "x")],
                             1.0), "health")


def test_collector_runs_for_real(tmp_path):
    """The node program, run as the bootstrap runs it, over a fake sysfs tree whose counter
    a second process bumps between the two readings."""
    import json
    import subprocess
    import sys
    import threading
    import time

    from launcher.nodeside import wire

    port = tmp_path / "ib" / "mlx5_0" / "ports" / "1"
    (port / "counters").mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    (port / "rate").write_text("400 Gb/sec (4X NDR)\n")
    (port / "counters" / "symbol_error").write_text("3\n")
    (port / "counters" / "link_downed").write_text("0\n")
    # a RoCE port: its netdev, and an ethtool whose pause counters grow between readings
    (port / "gid_attrs" / "ndevs").mkdir(parents=True)
    (port / "gid_attrs" / "ndevs" / "0").write_text("enp1s0f0\n")
    (tmp_path / "bin").mkdir()
    stats = tmp_path / "ethtool-S"
    stats.write_text("NIC statistics:\n     rx_prio3_pause: 10\n     tx_prio3_pause: 0\n"
                     "     rx_bytes: 99\n")
    fake = tmp_path / "bin" / "ethtool"
    fake.write_text(f"#!/bin/sh\n[ \"$1 $2\" = \"-S enp1s0f0\" ] || exit 1\ncat {stats}\n")
    fake.chmod(0o755)
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "DTRAIN_IB_SYSFS": str(tmp_path / "ib"),
           "HOME": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-c", wire.BOOTSTRAP], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=env)
    assert proc.stdin is not None
    proc.stdin.write(wire.payload(wire.program_source("health"), {"interval": 2.0}))
    proc.stdin.close()
    bump = threading.Timer(1.0, lambda: (
        (port / "counters" / "symbol_error").write_text("8\n"),
        stats.write_text("     rx_prio3_pause: 15\n     tx_prio3_pause: 7\n")))
    bump.start()
    t0 = time.monotonic()
    assert proc.stdout is not None
    out = proc.stdout.read()
    proc.wait(timeout=60)
    bump.join()
    raw = json.loads(out)
    assert raw["ok"] and time.monotonic() - t0 >= 2.0
    assert raw["ports"]["mlx5_0:1"]["before"] == {"symbol_error": 3, "link_downed": 0}
    msgs = [x.message for x in h.node_findings(raw)]
    assert "mlx5_0:1: symbol_error grew by 5 (3 -> 8)" in msgs
    assert raw["ports"]["mlx5_0:1"]["netdev"] == "enp1s0f0"
    assert raw["ports"]["mlx5_0:1"]["pfc_before"] == {"rx_prio3_pause": 10, "tx_prio3_pause": 0}
    assert [m for m in msgs if "pause" in m] == [  # rx grew by 5 only: below PFC_RX_MIN
        "mlx5_0:1 (enp1s0f0): tx_prio3_pause grew by 7 between two readings (the node paused "
        "the switch: it cannot take what arrives)"]
    assert raw["gpu_csv"] is None and isinstance(raw["shm_bytes"], int)


def test_pfc_pauses_growing_between_the_readings():
    from launcher.nodeside.health import pause_counters

    assert pause_counters("NIC statistics:\n     rx_prio3_pause: 12\n     rx_pause_ctrl_phy: 4\n"
                          "     rx_prio3_pause_duration: 9\n     tx_bytes: 1\n") == {
        "rx_prio3_pause": 12, "rx_pause_ctrl_phy": 4}
    ports = {"mlx5_0:1": {"netdev": "eth2", "pfc_before": {"rx_prio3_pause": 0,
                                                           "tx_prio3_pause": 5},
                          "pfc_after": {"rx_prio3_pause": h.PFC_RX_MIN, "tx_prio3_pause": 5}},
             "mlx5_1:1": {"netdev": "eth3", "pfc_before": {"rx_prio3_pause": 0},
                          "pfc_after": {"rx_prio3_pause": h.PFC_RX_MIN - 1}},
             "mlx5_2:1": {"before": {}}}
    f = h.pfc_findings(ports)
    assert [(x.tier, x.where) for x in f] == [("monitor", "mlx5_0:1")]
    assert f[0].message.startswith(f"mlx5_0:1 (eth2): rx_prio3_pause grew by {h.PFC_RX_MIN} ")


def test_xids_since_boot_and_since_the_last_check():
    old = ["[ 12.3] NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off the bus."]
    now = [*old, "[ 99.0] NVRM: Xid (PCI:0000:18:00): 79, pid=2, GPU has fallen off the bus.",
           "[ 99.5] NVRM: Xid (PCI:0000:3b:00): 48, pid=2, DBE"]
    assert h.new_lines(old, now) == now[1:] and h.new_lines(now, old) == []
    assert [x.message for x in h.xid_findings(now, old)] == [
        "Xid 79 (GPU fallen off the bus) on PCI:0000:18:00 x2 (1 new since the last check)",
        "Xid 48 (double-bit ECC error) on PCI:0000:3b:00 (1 new since the last check)"]
    assert [x.message for x in h.xid_findings(old, old)] == [
        "Xid 79 (GPU fallen off the bus) on PCI:0000:18:00 (none new since the last check)"]


def test_xid_lines_kept_between_checks(tmp_path):
    from launcher.commands.health import load_xids, save_xids

    assert load_xids(tmp_path) == {}
    save_xids({"node1": ["a"], "node2": ["b"]}, tmp_path / "state")
    save_xids({"node2": ["c"]}, tmp_path / "state")
    assert load_xids(tmp_path / "state") == {"node1": ["a"], "node2": ["c"]}
    assert (tmp_path / "state" / "health-xids.json").stat().st_mode & 0o777 == 0o600


Q_OLD_DRIVER = """
==============NVSMI LOG==============
Attached GPUs                             : 2
GPU 00000000:18:00.0
    Product Name                          : NVIDIA A100-SXM4-80GB
    Clocks Throttle Reasons
        Idle                              : Active
        HW Slowdown                       : Not Active
    ECC Errors
        Volatile
            SRAM Correctable              : 0
            SRAM Uncorrectable            : 0
            DRAM Correctable              : 3
            DRAM Uncorrectable            : 2
        Aggregate
            DRAM Uncorrectable            : 9
    Retired Pages
        Pending Page Blacklist            : No
    Remapped Rows
        Correctable Error                 : 0
        Pending                           : Yes
        Remapping Failure Occurred        : No
    Temperature
        GPU Current Temp                  : 93 C
GPU 00000000:3B:00.0
    Clocks Throttle Reasons
        HW Slowdown                       : Active
    Remapped Rows
        Pending                           : No
"""


def test_nvidia_smi_q_when_the_query_is_refused():
    assert h.q_to_csv(Q_OLD_DRIVER) == ("0, 2, Yes, No, No, Not Active, 93\n"
                                        "1, [N/A], No, [N/A], [N/A], Active, [N/A]\n")
    f = h.node_findings({"gpu_csv": None, "gpu_error": "Field ... is not a valid field",
                         "gpu_q": Q_OLD_DRIVER})
    assert [(x.tier, x.message) for x in f] == [
        ("reset", "GPU 0: uncorrected ECC errors (volatile): 2"),
        ("isolate", "GPU 0: row remapping pending (1): out until a GPU reset applies it"),
        ("monitor", "GPU 0: 93 C (>= 90 C)"),
        ("monitor", "GPU 1: hardware slowdown active")]


def test_the_cluster_fakes_q_agrees_with_its_query_fields(tmp_path):
    """tests/cluster/gpus.py's fake nvidia-smi, run here: -q and the query give the same
    rows."""
    import subprocess
    import sys

    from tests.cluster import gpus

    fake = tmp_path / "nvidia-smi"
    fake.write_text(gpus.script_text())
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    (tmp_path / ".fake-nvidia-smi.json").write_text('{"1": {"remapped_rows.pending": "Yes"}}')

    def run(*args: str) -> str:
        return subprocess.run([sys.executable, str(fake), *args], capture_output=True,
                              text=True, env=env, check=True).stdout

    csv = run("--query-gpu=" + ",".join(h.GPU_FIELDS), "--format=csv,noheader,nounits")
    assert h.q_to_csv(run("-q")) == csv
    assert "1, 0, Yes, No, No, Not Active, 45" in csv
