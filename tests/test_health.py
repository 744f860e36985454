"""The health gate's pure half: nvidia-smi fields, Xid lines and port counter growth ->
findings tiered isolate / reset / monitor (decide/health.py)."""

from __future__ import annotations

from launcher.decide import health as h


def test_gpu_fields_tiered():
    csv = ("0, 0, 0, 0, 0, Not Active, 45\n"
           "1, 2, 1, 0, 0, Active, 91\n"
           "2, [N/A], 0, 1, 0, Not Active, 40\n")
    f = h.gpu_findings(csv)
    assert [(x.tier, x.where) for x in f] == [
        ("reset", "GPU 1"), ("reset", "GPU 1"), ("monitor", "GPU 1"), ("monitor", "GPU 1"),
        ("isolate", "GPU 2")]
    assert "row remapping pending (1): a GPU reset applies it" in f[1].message
    assert h.verdict(f) == "isolate" and h.verdict(f[:2]) == "reset" and h.verdict([]) == "ok"


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
