"""decide/copies/broadcast.py: which files go by broadcast, the chain, and who falls back (pure)."""

from __future__ import annotations

import pytest

from launcher.decide.copies.broadcast import (
    Link,
    Outcome,
    cut_chain,
    fallbacks,
    parse_size,
    plan_chain,
    relay_address,
    use_broadcast,
)

MIB = 1 << 20


@pytest.mark.parametrize(("text", "size"), [
    ("64M", 64 * MIB), ("64MiB", 64 * MIB), ("64mb", 64 * MIB), ("1G", 1 << 30),
    ("4096", 4096), ("2k", 2048), (" 3 G ", 3 << 30)])
def test_parse_size(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "M", "-1M", "1.5G", "64 megs", "1P"])
def test_parse_size_refuses_what_is_not_a_size(text):
    with pytest.raises(ValueError, match="is not a size"):
        parse_size(text)


def test_default_is_large_files_to_three_nodes_or_more():
    assert use_broadcast(64 * MIB, 3, mode=None, min_size=64 * MIB)
    assert not use_broadcast(64 * MIB - 1, 16, mode=None, min_size=64 * MIB)
    assert not use_broadcast(1 << 30, 2, mode=None, min_size=64 * MIB)


def test_forced_from_two_nodes_and_off_means_off():
    assert use_broadcast(64 * MIB, 2, mode=True, min_size=64 * MIB)
    assert not use_broadcast(64 * MIB, 1, mode=True, min_size=64 * MIB)
    assert not use_broadcast(1 << 30, 2, mode=True, min_size=2 << 30)  # still the size
    assert not use_broadcast(1 << 30, 64, mode=False, min_size=1)


@pytest.mark.parametrize(("addr", "ok"), [
    ("198.18.0.11", True), ("fd00::5", True), ("fe80::1%eth0", True), (None, False),
    ("", False), ("127.0.0.1", False), ("::1", False), ("0.0.0.0", False),
    ("node1", False)])
def test_relay_address(addr, ok):
    assert (relay_address(addr) is not None) is ok


def test_chain_keeps_host_order_and_links_each_node_to_the_next():
    links, out = plan_chain([("n1", "10.0.0.1"), ("n2", "10.0.0.2"), ("n3", "10.0.0.3")])
    assert out == []
    assert links == [Link("n1", "10.0.0.1", upstream=None, downstream="n2"),
                     Link("n2", "10.0.0.2", upstream="n1", downstream="n3"),
                     Link("n3", "10.0.0.3", upstream="n2", downstream=None)]


def test_nodes_without_a_relay_address_are_left_out_and_the_chain_closes_over_them():
    links, out = plan_chain([("local", "127.0.0.1"), ("n1", "10.0.0.1"), ("x", None),
                             ("n2", "10.0.0.2")])
    assert out == ["local", "x"]
    assert [(ln.label, ln.upstream, ln.downstream) for ln in links] == [
        ("n1", None, "n2"), ("n2", "n1", None)]


OK = Outcome(True)


def test_all_ok_nobody_falls_back():
    assert fallbacks(["a", "b", "c"], {"a": OK, "b": OK, "c": OK}) == {}


def test_a_lost_relay_fails_the_nodes_after_it_naming_it():
    got = fallbacks(["a", "b", "c", "d"], {
        "a": OK, "b": Outcome(True, forward_error="forwarding to the next node failed"),
        "c": None, "d": Outcome(False, "the upstream closed after 5 of 9 bytes")})
    assert got == {"c": "its relay was lost",
                   "d": "chain broken at c (the upstream closed after 5 of 9 bytes)"}


def test_a_broken_link_between_live_nodes_names_the_node_before_it():
    got = fallbacks(["a", "b", "c"], {
        "a": Outcome(True, forward_error="cannot connect to the next node"),
        "b": Outcome(False, "no upstream node connected within the timeout"),
        "c": Outcome(False, "no upstream node connected within the timeout")})
    assert got["b"].startswith("chain broken after a (cannot connect to the next node)")
    assert got["c"].startswith("chain broken after a")


def test_a_node_failing_on_its_own_keeps_the_chain_when_it_still_forwarded():
    got = fallbacks(["a", "b", "c"], {"a": OK, "b": Outcome(False, "sha256 mismatch"),
                                      "c": OK})
    assert got == {"b": "sha256 mismatch"}


def test_no_report_at_all_is_a_fallback_for_everyone():
    got = fallbacks(["a", "b"], {})
    assert got == {"a": "its relay was lost", "b": "chain broken at a"}


def test_a_bad_broadcast_min_is_exit_2_naming_the_option(tmp_path):
    from tests.util import dtrain

    src = tmp_path / "f"
    src.write_text("x")
    res = dtrain(["cp", "-H", "198.18.0.250", "--broadcast-min", "12X", str(src), "dst/"])
    assert res.returncode == 2, res.stderr
    assert "--broadcast-min" in res.stderr and "'12X' is not a size" in res.stderr
    assert "timed out" not in res.stderr  # refused before connecting


def test_cut_chain_keeps_everything_when_every_link_is_up():
    assert cut_chain(["a", "b", "c"], {"a": "", "b": "", "c": ""}) == (["a", "b", "c"], {})


def test_a_link_that_cannot_connect_cuts_the_chain_after_its_node():
    kept, cut = cut_chain(["a", "b", "c", "d"],
                          {"a": "", "b": "cannot connect to the next node", "c": "", "d": ""})
    assert kept == ["a", "b"]
    why = "chain broken after b (cannot connect to the next node)"
    assert cut == dict.fromkeys(("c", "d"), why)


def test_a_relay_lost_before_linking_falls_back_with_everything_after_it():
    kept, cut = cut_chain(["a", "b", "c"], {"a": "", "b": None, "c": ""})
    assert kept == ["a"]
    assert cut == {"b": "its relay was lost", "c": "chain broken at b"}


def test_the_last_node_has_no_link_to_fail():
    assert cut_chain(["a", "b"], {"a": "", "b": "whatever"}) == (["a", "b"], {})


def test_a_scoped_ipv6_address_can_relay() -> None:
    """fe80::1%eth0: the zone is not part of the address to check, and it is kept."""
    assert relay_address("fe80::1%eth0") == "fe80::1%eth0"
    assert relay_address("::1%lo") is None


def test_a_node_that_cannot_reach_its_successor_cuts_the_chain_after_itself() -> None:
    chain = ["a", "b", "c"]
    assert cut_chain(chain, {"a": "", "b": "refused", "c": ""}) == (
        ["a", "b"], {"c": "chain broken after b (refused)"})
    # the last node has no successor: its error cuts nothing
    assert cut_chain(chain, {"a": "", "b": "", "c": "refused"}) == (chain, {})


def test_fallback_reasons_name_the_first_break_not_the_echo() -> None:
    chain = ["a", "b", "c"]
    # a failed by itself (no message from its relay), b then was lost: b is an echo of a
    assert fallbacks(chain, {"a": Outcome(False), "b": None, "c": Outcome(True)}) == {
        "a": "relay failed", "b": "chain broken at a"}
    # two failures: the second names the first, then its own error
    assert fallbacks(chain, {"a": Outcome(False, "disk full"), "b": Outcome(False, "eof"),
                             "c": Outcome(True)}) == {
        "a": "disk full", "b": "chain broken at a (eof)"}
