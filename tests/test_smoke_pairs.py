"""smoke against the line rate and `smoke --pairs` (pure): the O(log n) pair rounds, the
slow node or link named from them, the line rate from the probe's facts, busbw judged
against it with the numbers."""

from __future__ import annotations

import pytest

from launcher.decide.fabric import smoke as sm
from launcher.decide.fabric.linerate import LineRate, below_line, fabric_rate, node_rate
from launcher.decide.runplan.facts import Iface, NodeFacts, RdmaPort
from launcher.nodeside import smoke_job


@pytest.mark.parametrize("n", range(1, 40))
def test_rounds_are_disjoint_small_and_the_same_on_the_node(n):
    rounds = sm.log_rounds(n)
    assert rounds == smoke_job.log_rounds(n)  # the node program's copy
    for rnd in rounds:
        ends = [x for p in rnd for x in p]
        assert len(ends) == len(set(ends))  # a node is in one pair per round
    met: dict[int, set[int]] = {}
    for a, b in (p for rnd in rounds for p in rnd):
        met.setdefault(a, set()).add(b)
        met.setdefault(b, set()).add(a)
    assert all(len(met.get(i, ())) >= min(2, n - 1) for i in range(n))
    assert len(rounds) <= max(1, (n - 1).bit_length()) + 2


def test_sixteen_nodes_in_four_rounds():
    assert len(sm.log_rounds(16)) == 4
    assert len(sm.pair_schedule(16, True)) == 4
    assert len(sm.pair_schedule(16, False)) == 2  # the ring (names no node on its own)


def measured(n: int, slow_node: int | None = None,
             slow_link: tuple[int, int] | None = None) -> list[sm.PairResult]:
    labels = [f"n{i}" for i in range(n)]
    res = sm.SmokeResults(layout={i: labels[i] for i in range(n)}, nodes=labels)
    for a, b in (p for rnd in sm.log_rounds(n) for p in rnd):
        slow = slow_node in (a, b) or slow_link == (a, b)
        res.pairs.append({"a": a, "b": b, "size": 1 << 24, "time_us": 1.0,
                          "gbps": 0.05 if slow else 10.0})
    pairs, best = sm.pair_results(res, labels, 0.25)
    return sm.slow_failures(pairs, best, 0.25)


@pytest.mark.parametrize("n", [3, 4, 5, 8, 9, 16])
def test_a_slow_node_is_named_from_its_pairs(n):
    for bad in range(n):
        fails = measured(n, slow_node=bad)
        assert [f.hosts for f in fails] == [(f"n{bad}",)], (n, bad, fails)


def test_a_slow_link_is_named_not_its_nodes():
    fails = measured(16, slow_link=(4, 5))
    assert [f.hosts for f in fails] == [("n4", "n5")]
    assert "link n4 <-> n5 is slow" in fails[0].message


def facts(**kw: object) -> NodeFacts:
    return NodeFacts(hostname="h", **kw)  # type: ignore[arg-type]


def test_line_rate_from_hca_ports_or_nic_speed():
    ports = (RdmaPort("mlx5_0", 1, "4: ACTIVE", "5: LinkUp", "InfiniBand", "400 Gb/sec (4X NDR)"),
             RdmaPort("mlx5_1", 1, "4: ACTIVE", "5: LinkUp", "InfiniBand", "400 Gb/sec (4X NDR)"),
             RdmaPort("mlx5_2", 1, "4: ACTIVE", "5: LinkUp", "Ethernet", "25 Gb/sec (1X EDR)"))
    f = facts(rdma=ports, interfaces=(Iface("eth0", speed=25000),))
    rate = node_rate("a", f, {"NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1"})
    assert rate.gbytes == 100.0 and rate.how == "2 x 400 Gb/s (mlx5_0:1, mlx5_1:1)"
    rate = node_rate("a", f, {"NCCL_SOCKET_IFNAME": "=eth0", "NCCL_IB_DISABLE": "1"})
    assert rate.gbytes == 3.125 and rate.how == "eth0 25000 Mb/s"
    assert node_rate("a", facts(), {}).gbytes is None
    slow = LineRate("b", 3.125, "eth0 25000 Mb/s")
    assert fabric_rate({"a": LineRate("a", 100.0, "x"), "b": slow}) == slow
    assert fabric_rate({"a": LineRate("a", None, "unknown"), "b": slow}) is None


def test_busbw_under_the_line_fraction_fails_with_the_numbers():
    rate = LineRate("node2", 50.0, "1 x 400 Gb/s (mlx5_0:1)")
    assert below_line(45.0, rate, 0.8) is None
    assert below_line(20.0, rate, 0.8) == (
        "all-reduce busbw 20 GB/s is 40% of the line rate 50 GB/s (node2: 1 x 400 Gb/s "
        "(mlx5_0:1)); under --line-fraction 0.8")
    assert below_line(20.0, rate, 0.0) is None  # 0: off
    labels = ["node1", "node2"]
    res = sm.SmokeResults(layout={0: "node1", 1: "node2"}, nodes=labels)
    res.sweep = [{"size": 1 << 26, "count": 1 << 24, "iters": 5, "time_us": 1.0,
                  "algbw": 20.0, "busbw": 20.0}]
    v = sm.evaluate(res, node_labels=labels, world_size=2, job_code=0, job_summary="",
                    line_rate=rate, line_fraction=0.8)
    assert [f.check for f in v.failures if "line rate" in f.message] == ["busbw"]
    assert v.code == 1
