"""On the cluster (nodes 5-8, brought up here; nodes 1-4 are shared and get no tc):
`smoke --pairs` names the node whose link tc tbf slowed, in O(log n) rounds; busbw under
--line-fraction of the line rate (the veth's speed from the probe) fails with the numbers."""

from __future__ import annotations

import re

import pytest

from tests import cluster as test_cluster
from tests.test_smoke_cluster import _failed_cases, _smoke
from tests.util import tbf

pytestmark = [pytest.mark.ssh, pytest.mark.torch]


@pytest.fixture(scope="module")
def eight(cluster):
    """Nodes 1-8 (adds 5-8, removes none: `python3 -m tests.cluster up --nodes 8`)."""
    return test_cluster.up(8)


@pytest.fixture
def slow_node5(eight):
    """Everything into node5 goes at 50 Mbit/s (tbf on its root-side veth); removed after."""
    with tbf(eight.node(5).veth, "50mbit"):
        yield


def test_pairs_name_the_slow_node_in_log_rounds(eight, tmp_path, slow_node5):
    res, doc, root = _smoke(eight, tmp_path, "--pairs", "--max-size", "64K",
                            hosts="node[5-8]")
    assert res.returncode == 1, res.stderr[-3000:]
    fails = doc["smoke"]["failures"]
    assert [(f["check"], f["hosts"]) for f in fails] == [("pairs", ["node5"])], fails
    assert doc["smoke"]["pair_rounds"] == 2  # 4 nodes: 2 rounds (the default: 3)
    slow = {(p["a"], p["b"]) for p in doc["smoke"]["pairs"] if p["slow"]}
    assert slow == {("node5", "node6"), ("node5", "node7")}
    assert "node5" in _failed_cases(root)
    assert "# node pairs measured in 2 rounds" in res.stderr


def test_busbw_under_the_line_rate_fails_with_the_numbers(eight, tmp_path):
    res, doc, root = _smoke(eight, tmp_path, "--line-fraction", "0.8", "--max-size", "64K",
                            hosts="node[5-6]")
    assert res.returncode == 1, res.stderr[-3000:]
    line = doc["smoke"]["line_rate"]
    assert line["gbytes"] == 1.25 and line["how"] == "eth0 10000 Mb/s", line
    [fail] = [f for f in doc["smoke"]["failures"] if "line rate" in f["message"]]
    assert fail["check"] == "busbw"
    assert re.search(r"all-reduce busbw [\d.e-]+ GB/s is \d+% of the line rate 1.25 GB/s "
                     r"\(node[56]: eth0 10000 Mb/s\); under --line-fraction 0.8",
                     fail["message"]), fail
    # gloo is not judged by default (a CPU all-reduce is no measure of the NIC)
    res, doc, root = _smoke(eight, tmp_path / "2", "--max-size", "4K", hosts="node[5-6]")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "(not judged on gloo)" in res.stderr


@pytest.fixture
def failing_node5(eight):
    """Everything into node5 at 200 kbit/s: the job's start and its 1 KiB sweep get through,
    a 1 MiB pair exchange would take ~40 s (a link that has as good as failed)."""
    with tbf(eight.node(5).veth, "200kbit", latency="400ms"):
        yield


def test_a_failing_link_is_named_at_once_not_at_the_timeout(eight, tmp_path, failing_node5):
    """A pair exchange not done within --pair-timeout: the job says which pair and ends;
    the verdict names the link (exit 1), long before --timeout (before: the job hung in the
    exchange until --timeout, 124, with no pair named)."""
    import time

    t0 = time.monotonic()
    res, doc, root = _smoke(eight, tmp_path, "--pairs", "--max-size", "1K", "--pair-timeout",
                            "5", "--timeout", "160", hosts="node[5-8]")
    took = time.monotonic() - t0
    assert res.returncode == 1, res.stderr[-3000:]
    fails = doc["smoke"]["failures"]
    assert [(f["check"], f["hosts"]) for f in fails] == [("pairs", ["node5", "node6"])], fails
    assert fails[0]["message"] == ("link node5 <-> node6 failed: no exchange of 1M within "
                                   "5 s (--pair-timeout)")
    assert "smoke: FAIL: link node5 <-> node6 failed" in res.stderr, res.stderr[-3000:]
    assert took < 120, took  # not --timeout's 160 s
