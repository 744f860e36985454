"""The supervisor's exec path at 64 nodes on the real-sshd cluster (docs/scaling.md).

One short run, so a regression in concurrency (a per-host await in a row, an fd or
connection limit, a lost or mistagged node) shows up in CI. No wall time is asserted.
"""

from __future__ import annotations

import pytest

from tests.conftest import BIG_CLUSTER_NODES
from tests.util import dtrain

pytestmark = pytest.mark.ssh


@pytest.mark.timeout(600)  # the first run builds nodes 5..64 (see docs/scaling.md)
def test_exec_reaches_every_node_of_64(big_cluster):
    n = BIG_CLUSTER_NODES
    assert len(big_cluster.nodes) == n
    hosts = f"{big_cluster.user}@198.18.0.[11-{10 + n}]"
    res = dtrain(["exec", "-H", hosts, "--fanout", "64", "--", "hostname"],
                 env=big_cluster.client_env(), timeout=150)
    assert res.returncode == 0, res.stderr[-2000:]
    assert sorted(res.stdout.splitlines()) == sorted(
        f"198.18.0.{10 + k}: node{k}" for k in range(1, n + 1))


FOLD_NODES = 16  # launcher.output.hostgroups.FOLD_AT: where folding starts


def _sixteen(big_cluster) -> str:
    return f"{big_cluster.user}@198.18.0.[11-{10 + FOLD_NODES}]"


@pytest.mark.timeout(300)
def test_doctor_at_16_nodes_folds_identical_rows_failures_first(big_cluster):
    """Issue 24.8: one row per check and result, not per node (it was 258 lines at 16
    nodes), the FAIL rows first; --failures shows only FAIL and warn rows."""
    folded = "198.18.0.[11-26]"
    res = dtrain(["doctor", "-H", _sixteen(big_cluster), "--python", "/usr/bin/python3",
                  "--no-color"], env=big_cluster.client_env(), timeout=240)
    assert res.returncode == 1, res.stderr[-2000:]
    rows = [line.split(None, 3) for line in res.stdout.splitlines()]
    assert rows[0][:3] == ["torch", folded, "FAIL"], res.stdout
    assert ["ssh", folded, "ok", "connected"] in rows, res.stdout
    rank = [{"FAIL": 0, "warn": 1}.get(r[2], 2) for r in rows]
    assert rank == sorted(rank), res.stdout
    # per-node values (hostnames, clock offsets) are one ok row with a count
    assert len(rows) <= 2 * len({r[0] for r in rows}), res.stdout  # was 16 per check
    assert res.stderr.startswith("dtrain: 16 nodes, "), res.stderr
    only = dtrain(["doctor", "-H", _sixteen(big_cluster), "--python", "/usr/bin/python3",
                   "--no-color", "--failures"], env=big_cluster.client_env(), timeout=240)
    assert only.returncode == 1
    kept = [line.split(None, 3) for line in only.stdout.splitlines()]
    assert kept and {r[2] for r in kept} <= {"FAIL", "warn"}, only.stdout
    assert kept[0][:3] == ["torch", folded, "FAIL"]


@pytest.mark.timeout(300)
def test_cp_at_16_nodes_prints_one_folded_line_and_the_total(big_cluster, tmp_path):
    """Issue 24.8: the nodes that did the same are one line, then the total with the
    throughput (it was a line per node and no total)."""
    src = tmp_path / "f.txt"
    src.write_text("x" * 1000)
    res = dtrain(["cp", "-H", _sixteen(big_cluster), str(src), "~/dtrain-fold-test.txt"],
                 env=big_cluster.client_env(), timeout=240)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = res.stdout.splitlines()
    assert len(lines) == 2, res.stdout
    assert lines[0].startswith("198.18.0.[11-26]: sent 1 (1000 B)") or lines[0].startswith(
        "198.18.0.[11-26]: sent 0 (0 B), skipped 1"), res.stdout
    assert lines[1].startswith("total 16 nodes: ") and lines[1].endswith("/s"), res.stdout
