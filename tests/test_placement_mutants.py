"""decide/runplan/placement.py: what issue 51's mutation round (docs/testing.md, "Mutation score")
found no test for: where topology.conf's places say they came from, the hostfile's
``segment=``, a fabric that gives no status or a UUID that is not hex, and the hostfile's and
topology.conf's places kept once the probe named the NVLink domains."""

from __future__ import annotations

from launcher.decide.runplan import placement as pl
from launcher.models import Host
from tests.test_placement import TOPO, UUID, _fab


def test_host_places_name_their_source_and_keep_the_hostfiles_segment() -> None:
    hosts = [Host("node1"), Host("node7", switch="x1", segment="segX")]
    places = pl.host_places(hosts, TOPO, "scontrol show topology")
    assert places == {"node1": pl.Place("s0", "spine0", None, "scontrol show topology"),
                      "node7": pl.Place("x1", "segX", None, "hostfile")}


def test_a_fabric_without_a_status_or_with_a_uuid_not_hex_is_no_domain() -> None:
    assert pl.nvlink_domain({"state": "Completed", "cluster_uuid": UUID,
                             "clique_id": "3"}) is None
    not_hex = "x" * 8 + UUID[8:]
    assert len(not_hex.replace("-", "")) == 32
    assert pl.nvlink_domain(_fab(uuid=not_hex)) is None


def test_after_the_probe_the_hostfiles_and_topology_conf_places_still_count() -> None:
    # node1..node4 in no NVLink domain but node5: the switches of topology.conf order them
    hosts = [Host(f"node{i}") for i in (1, 3, 2, 4, 5)]
    fabrics = {"node5": _fab()}
    ordered, why = pl.after_probe(hosts, fabrics, TOPO)  # type: ignore[misc]
    assert ordered == ["node1", "node2", "node3", "node4", "node5"]
    assert why == ["node1, node2: switch s0, segment spine0 (topology.conf)",
                   "node3, node4: switch s1, segment spine0 (topology.conf)",
                   f"node5: NVLink domain {UUID}/3, switch s2, segment spine1 (topology.conf)"]
    _, why = pl.after_probe(hosts, fabrics, TOPO, "slurm")  # type: ignore[misc]
    assert why[0] == "node1, node2: switch s0, segment spine0 (slurm)"


def test_topology_conf_comments_lines_without_a_switch_and_bad_lines_anywhere() -> None:
    text = ("NodeName=node1 Weight=1\n"  # no SwitchName: skipped, not the end
            "SwitchName=bad Nodes=node[9-\n"  # a bad range: skipped, not the end
            "SwitchName=s5 Nodes=node5 # was Nodes=node8 # moved in May\n"
            "SwitchName=s6 Nodes=node6\n")
    assert pl.parse_topology_conf(text) == {
        "node5": pl.Place("s5", None, None, "topology.conf"),
        "node6": pl.Place("s6", None, None, "topology.conf")}


def test_order_by_a_segment_alone_then_a_switchs_domains_together() -> None:
    places = {"a": pl.Place(segment="seg1", source="hostfile"),
              "b": pl.Place(segment="seg2", source="hostfile"),
              "c": pl.Place(segment="seg1", source="hostfile")}
    ordered, why = pl.order(["a", "b", "c", "x", "y"], places)
    assert ordered == ["a", "c", "b", "x", "y"]
    assert why == ["a, c: segment seg1 (hostfile)", "b: segment seg2 (hostfile)",
                   "x, y: no topology known (last, in the given order)"]
    # one switch, two NVLink domains: the switch's nodes stay together, domains in order
    places = {"a": pl.Place("sw1", "seg1", "d1"), "b": pl.Place("sw2", "seg1", "d2"),
              "c": pl.Place("sw1", "seg1", "d3")}
    assert pl.order(["a", "b", "c"], places)[0] == ["a", "c", "b"]


def test_a_spare_from_the_fenced_nodes_nvlink_domain_says_so() -> None:
    places = {"n1": pl.Place(nvlink="dom/1"), "n7": pl.Place(nvlink="dom/1"),
              "n8": pl.Place(nvlink="dom/2")}
    assert pl.spare_for("n1", ["n8", "n7"], places) == (
        "n7", "n7 shares n1's NVLink domain dom/1")
