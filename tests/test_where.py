"""hosts/where.py: the hostfile lines failing hosts came from and the exact --exclude that
leaves them out, as messages show them (pure; exec's and run's preflight print these)."""

from __future__ import annotations

import shlex

from launcher.hosts.hostfile import filter_hosts, parse_host_expr
from launcher.hosts.where import exclude_option, failed_hosts_lines, leave_out_hint, where
from launcher.models import Host


def test_where_lists_each_file_s_lines_once_in_the_order_met() -> None:
    hosts = [Host("a", source="one.txt:4"), Host("b", source="two.yaml:2"),
             Host("c", source="one.txt:1"), Host("d", source="one.txt:4"),
             Host("e", source="two.yaml:9")]
    assert where(hosts) == "one.txt:4,1, two.yaml:2,9"
    assert where([]) == ""


def test_where_splits_at_the_last_colon_and_skips_what_is_no_line() -> None:
    hosts = [Host("a", source="/mnt/x:y/hosts.txt:12"), Host("b", source="-H"),
             Host("c", source="SLURM_JOB_NODELIST (job 7, slots from X)"),
             Host("d", source="h.txt:"), Host("e", source=":5"), Host("f", source=""),
             Host("g", source="h.txt:x1")]
    assert where(hosts) == "/mnt/x:y/hosts.txt:12"


def test_the_exclude_option_is_the_folded_names_quoted_for_a_shell() -> None:
    assert exclude_option([Host("node3")]) == "--exclude node3"
    assert exclude_option([Host("node5"), Host("node3"), Host("node4")]) == (
        "--exclude 'node[3-5]'")
    # as the hostfile spells it (issue 55 item 1): a bare name would leave out every
    # host on that address, whatever its port
    assert exclude_option([Host("node1", port=2222)]) == "--exclude node1:2222"
    assert exclude_option([Host("127.0.0.1", port=2202), Host("node2", user="dtuser"),
                           Host("fe80::1", port=22)]) == (
        "--exclude '127.0.0.1:2202,dtuser@node2,[fe80::1]:22'")


def test_the_exclude_hint_leaves_out_exactly_the_failed_hosts() -> None:
    """Issue 55 item 1: the hint for 127.0.0.1:2202 was `--exclude 127.0.0.1`, which drops
    every host on that address."""
    hosts = parse_host_expr("localhost,127.0.0.1:2201,127.0.0.1:2202,dtuser@n[1-3]:22")
    failed = [hosts[2], hosts[3], hosts[5]]
    option = exclude_option(failed)
    assert option == "--exclude '127.0.0.1:2202,dtuser@n[1,3]:22'"
    expr = shlex.split(option)[1]
    assert [h.label for h in filter_hosts(hosts, None, expr)] == [
        "localhost", "127.0.0.1:2201", "n2:22"]


def test_failed_hosts_are_one_line_per_reason_in_hostfile_order() -> None:
    hosts = [Host("n1", source="h.txt:1"), Host("n2", port=2222, source="h.txt:2"),
             Host("n3", source="h.txt:3"), Host("x1", source="-H"), Host("ok1", source="h.txt:5")]
    errors = {"n3": "connection refused", "n2:2222": "timed out", "n1": "connection refused",
              "x1": "timed out", "gone": "never listed"}
    assert failed_hosts_lines(hosts, errors) == [
        "n[1,3] (h.txt:1,3): connection refused",
        "n2:2222,x1 (h.txt:2): timed out",
    ]
    assert failed_hosts_lines([Host("x1", source="-H")], {"x1": "refused"}) == ["x1: refused"]
    assert failed_hosts_lines(hosts, {}) == []


def test_the_hint_says_it_or_them() -> None:
    assert leave_out_hint([Host("node3")]) == "fix it, or leave it out: --exclude node3"
    assert leave_out_hint([Host("node3"), Host("node4")]) == (
        "fix them, or leave them out: --exclude 'node[3-4]'")
