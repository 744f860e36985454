"""Placement (issue 36 item 4, decide/runplan/placement.py, pure): topology.conf parsed, rank order
keeping switch/segment/NVLink-domain neighbours together with the reason, the spare from the
fenced node's switch or segment."""

from __future__ import annotations

from launcher.decide.runplan import placement as pl
from launcher.models import Host

TOPO = """
# a two-level tree
SwitchName=s0 Nodes=node[1-2]
SwitchName=s1 Nodes=node[3-4]
SwitchName=s2 Nodes=node[5-6]
SwitchName=spine0 Switches=s[0-1]
switchname=spine1 switches=s2  # keys in any case, as Slurm reads them
SwitchName=broken Nodes=node[9-
"""


def test_topology_conf():
    t = pl.parse_topology_conf(TOPO)
    assert t["node1"] == pl.Place("s0", "spine0", None, "topology.conf")
    assert t["node4"].segment == "spine0" and t["node6"] == pl.Place("s2", "spine1", None,
                                                                     "topology.conf")
    assert "node9" not in t and len(t) == 6


def test_order_keeps_neighbours_together_and_says_why():
    t = pl.parse_topology_conf(TOPO)
    hosts = ["node1", "node5", "node3", "node2", "node7", "node6", "node4"]
    ordered, why = pl.order(hosts, t)
    assert ordered == ["node1", "node2", "node3", "node4", "node5", "node6", "node7"]
    assert why == ["node1, node2: switch s0, segment spine0 (topology.conf)",
                   "node3, node4: switch s1, segment spine0 (topology.conf)",
                   "node5, node6: switch s2, segment spine1 (topology.conf)",
                   "node7: no topology known (last, in the given order)"]
    assert pl.order(["b", "a"], {}) == (["b", "a"], [])  # nothing known: the given order


def test_hostfile_keys_win_and_nvlink_domains_group_first():
    t = pl.parse_topology_conf(TOPO)
    hostfile = {"node1": pl.Place("x9", "segB", None, "hostfile")}
    nvl = {h: pl.Place(nvlink="uuid-A" if h in ("node2", "node4") else "uuid-B",
                       source="nvlink") for h in ("node2", "node3", "node4")}
    m = pl.merge(hostfile, t, nvl)
    assert m["node1"] == pl.Place("x9", "segB", None, "hostfile")
    assert m["node2"] == pl.Place("s0", "spine0", "uuid-A", "topology.conf")
    ordered, _ = pl.order(["node2", "node3", "node4", "node1"], m)
    # node2 and node4 differ in switch, so they are not one group; segment spine0 first
    assert ordered == ["node2", "node3", "node4", "node1"]
    same = {h: pl.Place(nvlink="A" if h in "ac" else "B", source="nvlink") for h in "abcd"}
    assert pl.order(list("abcd"), same)[0] == list("acbd")


def test_spare_from_the_same_switch_then_segment():
    t = pl.parse_topology_conf(TOPO)
    assert pl.spare_for("node1", ["node5", "node2"], t) == (
        "node2", "node2 shares node1's switch s0")
    assert pl.spare_for("node1", ["node5", "node3"], t) == (
        "node3", "node3 shares node1's segment spine0")
    assert pl.spare_for("node1", ["node5"], t)[0] == "node5"
    assert pl.spare_for("node1", [], t) == (None, "no spare")


def test_hostfile_keys_order_the_dry_run(tmp_path):
    """`run --dry-run --offline` with switch=/segment= in the hostfile: node ranks follow
    the switches, and the why is printed."""
    from launcher.hosts.hostfile import parse_hostfile_text
    from tests.util import dtrain

    text = ("node1 switch=s1 segment=p1\nnode2 switch=s2 segment=p2\n"
            "node3 switch=s1 segment=p1\nnode4 switch=s2 segment=p2\nnode5\n")
    hosts = parse_hostfile_text(text, "h.txt")
    assert (hosts[0].switch, hosts[0].segment, hosts[4].switch) == ("s1", "p1", None)
    hf = tmp_path / "hosts"
    hf.write_text(text)
    res = dtrain(["run", "--dry-run", "--offline", "-f", str(hf), "--nproc-per-node", "1",
                  "train.py"], timeout=60)
    assert res.returncode == 0, res.stderr
    assert "placement: node1, node3: switch s1, segment p1 (hostfile)" in res.stdout
    assert "placement: node5: no topology known (last, in the given order)" in res.stdout
    order = [ln.split()[2] for ln in res.stdout.splitlines() if ln.startswith("node ")]
    assert order == ["node1", "node3", "node2", "node4", "node5"]


def test_topology_conf_orders_the_dry_run(tmp_path):
    from tests.util import dtrain

    topo = tmp_path / "topology.conf"
    topo.write_text(TOPO)
    res = dtrain(["run", "--dry-run", "--offline", "-H", "node[1-6]", "--topology", str(topo),
                  "--nproc-per-node", "1", "train.py"], timeout=60)
    assert res.returncode == 0, res.stderr
    assert "placement: node5, node6: switch s2, segment spine1 (topology.conf)" in res.stdout
    topo.write_text("SwitchName=a Nodes=node[1,3]\nSwitchName=b Nodes=node[2,4]\n")
    res = dtrain(["run", "--dry-run", "--offline", "-H", "node[1-5]", "--topology",
                  str(topo), "--nproc-per-node", "1", "train.py"], timeout=60)
    order = [ln.split()[2] for ln in res.stdout.splitlines() if ln.startswith("node ")]
    assert order == ["node1", "node3", "node2", "node4", "node5"], res.stdout
    res = dtrain(["run", "--dry-run", "--offline", "-H", "node1", "--topology",
                  str(tmp_path / "missing"), "train.py"], timeout=60)
    assert res.returncode == 2 and "--topology" in res.stderr


def test_next_gang_takes_the_spare_from_the_fenced_nodes_switch():
    from launcher.decide.outcome.restarts import NodeCount, next_gang

    t = pl.parse_topology_conf(TOPO)
    count = NodeCount(2, 2)
    gang = next_gang(["node1", "node5"], ["node6", "node3", "node2"], ["node1"], count, t)
    assert gang.active == ("node2", "node5") and gang.replaced == (("node1", "node2"),)
    assert gang.spares == ("node6", "node3")
    plain = next_gang(["node1", "node5"], ["node6", "node3", "node2"], ["node1"], count)
    assert plain.active == ("node6", "node5")  # no places: the first spare, as before


def test_host_places_merge_the_hostfile_over_topology_conf_by_host_name():
    """What run orders by and a restart picks spares by: labels as keys (topology.conf
    names hosts), the hostfile's switch= winning for node3, topology.conf for the rest."""
    from launcher.decide.outcome.restarts import NodeCount, next_gang
    from launcher.models import Host

    hosts = [Host("node1", port=2201), Host("node3", port=2203, switch="s0"),
             Host("node2", port=2202), Host("node6", port=2206)]
    places = pl.host_places(hosts, TOPO)
    assert {k: (p.switch, p.source) for k, p in places.items()} == {
        "node1:2201": ("s0", "topology.conf"), "node2:2202": ("s0", "topology.conf"),
        "node3:2203": ("s0", "hostfile"), "node6:2206": ("s2", "topology.conf")}
    assert pl.host_places(hosts, None) == {"node3:2203": pl.Place("s0", None, None, "hostfile")}
    gang = next_gang(["node1:2201", "node6:2206"], ["node2:2202", "node3:2203"],
                     ["node6:2206"], NodeCount(2, 2), places)
    assert gang.replaced == (("node6:2206", "node2:2202"),)  # no s2 spare: the first
    gang = next_gang(["node1:2201", "node6:2206"], ["node6:2206", "node3:2203"],
                     ["node1:2201"], NodeCount(2, 2), places)
    assert gang.replaced == (("node1:2201", "node3:2203"),)  # s0, as node1


UUID = "6a130f54-faaa-4b8f-847f-be44ab70f917"


def _fab(uuid: str = UUID, clique: str = "3", state: str = "Completed",
         status: str = "Success") -> dict[str, str]:
    return {"state": state, "status": status, "cluster_uuid": uuid, "clique_id": clique}


def test_an_nvlink_domain_is_a_completed_fabrics_nonzero_uuid_and_clique():
    assert pl.nvlink_domain(_fab()) == f"{UUID}/3"
    assert pl.nvlink_domain(_fab(uuid=UUID.upper(), clique="03")) == f"{UUID}/3"
    zero = "00000000-0000-0000-0000-000000000000"  # a non-MNNVL H100's "Completed"
    for bad in (_fab(uuid=zero), _fab(state="In Progress"), _fab(status="Failure"),
                _fab(uuid="N/A", clique="N/A", state="N/A", status="N/A"),
                _fab(clique="-1"), _fab(uuid="not-a-uuid"), {}):
        assert pl.nvlink_domain(bad) is None, bad


def test_after_the_probe_nvlink_domains_order_the_ranks_and_node_0_stays():
    hosts = [Host(f"node{i}") for i in (1, 2, 3, 4)]
    other = "1b2c0000-0000-4000-8000-000000000001"
    fabrics = {"node1": _fab(), "node2": _fab(uuid=other), "node3": _fab(),
               "node4": _fab(uuid=other)}
    assert pl.after_probe(hosts, fabrics, None) == (
        ["node1", "node3", "node2", "node4"],
        [f"node1, node3: NVLink domain {UUID}/3 (nvidia-smi)",
         f"node2, node4: NVLink domain {other}/3 (nvidia-smi)"])
    # node1 in no domain: it stays node 0 all the same (its address is the checked master)
    fabrics["node1"] = _fab(state="N/A")
    ordered, why = pl.after_probe(hosts, fabrics, None)  # type: ignore[misc]
    assert ordered == ["node1", "node2", "node4", "node3"]
    assert why[-1] == "node1 stays node 0 (the master address was checked there)"
    assert pl.after_probe(hosts, {h.label: _fab(state="N/A") for h in hosts}, None) is None
    assert pl.after_probe(hosts, {}, None) is None
