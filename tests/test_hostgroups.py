"""output/hostgroups.py: identical per-node rows said once by hostlist, failures first (pure;
the 68-node halves are tests/test_scale_cluster.py's doctor, cp and run summaries)."""

from __future__ import annotations

from launcher.output.hostgroups import FOLD_AT, folded, group


def test_rows_fold_from_sixteen_nodes_on() -> None:
    assert FOLD_AT == 16  # docs/architecture.md: "from 16 nodes on"


def test_equal_keys_group_in_the_order_of_each_group_s_first_host() -> None:
    rows = [("node3", "ok"), ("node1", "refused"), ("node2", "ok"), ("node4", "refused"),
            ("node5", "slow")]
    assert group(rows) == [(["node3", "node2"], "ok"), (["node1", "node4"], "refused"),
                           (["node5"], "slow")]
    assert group([]) == []
    assert group(iter([("a", 1)])) == [(["a"], 1)]  # any iterable, read once


def test_folded_names_each_group_by_hostlist_failures_first() -> None:
    rows = [(f"node{i}", "ok") for i in range(1, 9)]
    rows[2] = ("node3", "refused")
    rows[6] = ("node7", "refused")
    rows.append(("login1", "timeout"))
    failed = lambda key: key != "ok"  # noqa: E731
    assert folded(rows, failed) == [("node[3,7]", "refused"), ("login1", "timeout"),
                                    ("node[1-2,4-6,8]", "ok")]


def test_without_a_failure_test_the_groups_keep_their_order() -> None:
    rows = [("b2", "y"), ("a1", "x"), ("b1", "y")]
    assert folded(rows) == [("b[1-2]", "y"), ("a1", "x")]


def test_the_passing_groups_follow_in_their_own_order() -> None:
    rows = [("n1", 2), ("n2", 1), ("n3", 3), ("n4", 0)]
    assert folded(rows, lambda key: key % 2 == 1) == [("n2", 1), ("n3", 3), ("n1", 2),
                                                       ("n4", 0)]
