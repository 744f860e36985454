"""HCA selection and RoCE GID decisions (pure) against port tables and the checked-in tree."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from launcher.decide.fabric.rdma import (
    AF_INET6,
    GidChoice,
    GidPlan,
    check_gid_index,
    nccl_gid_index,
    plan_gids,
    roce_gid,
    select_hcas,
)
from launcher.decide.runplan.facts import Addr, Gid, Iface, NodeFacts, RdmaPort
from launcher.nodeside import probenet

TREE = Path(__file__).parent / "data" / "sysfs" / "roce-vlan" / "infiniband"
FE80 = "fe80:0000:0000:0000:0ac0:ebff:fe3d:ca54"
V1, V2 = "IB/RoCE v1", "RoCE v2"


def mapped(ip: str) -> str:
    """An IPv4-mapped GID as the kernel prints it."""
    a, b, c, d = (int(x) for x in ip.split("."))
    return f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"


def gids(*rows: tuple[int, str, str | None, str | None]) -> tuple[Gid, ...]:
    return tuple(Gid(i, g, t, n) for i, g, t, n in rows)


def basic(ip: str = "10.0.0.5", ndev: str = "ens1f0") -> tuple[Gid, ...]:
    """fe80 v1, fe80 v2, IPv4 v1, IPv4 v2: the layout that makes '3' folklore."""
    return gids((0, FE80, V1, ndev), (1, FE80, V2, ndev), (2, mapped(ip), V1, ndev),
                (3, mapped(ip), V2, ndev))


def port(dev: str = "mlx5_0", *, netdev: str = "ens1f0", state: str = "4: ACTIVE",
         phys: str = "5: LinkUp", link: str = "Ethernet", rate: str = "200 Gb/sec (4X HDR)",
         driver: str = "mlx5_core", table: Sequence[Gid] | None = None, num: int = 1) -> RdmaPort:
    return RdmaPort(dev, num, state, phys, link, rate, driver, netdev, (netdev,),
                    tuple(basic(ndev=netdev) if table is None else table))


def vlan_first() -> tuple[Gid, ...]:
    """A management VLAN address sorts before the backend one (nccl#890)."""
    return gids((0, FE80, V1, "ens2f0"), (1, FE80, V2, "ens2f0"),
                (2, mapped("192.168.0.5"), V1, "ens2f0.100"),
                (3, mapped("192.168.0.5"), V2, "ens2f0.100"),
                (4, mapped("10.200.2.10"), V1, "ens2f0"), (5, mapped("10.200.2.10"), V2, "ens2f0"))


IFACES = (Iface("ens2f0", "up", addrs=(Addr("inet", "10.200.2.10", 24),)),
          Iface("ens2f0.100", "up", virtual=True, lower=("ens2f0",),
                addrs=(Addr("inet", "192.168.0.5", 24),)))


# --------------------------------------------------------------------------- HCA selection


def test_down_port_is_excluded_with_its_state() -> None:
    choice = select_hcas([port("mlx5_0"), port("mlx5_1", state="1: DOWN", netdev="ens2f0")])
    assert choice.hcas == ("mlx5_0:1",)
    assert choice.excluded == (("mlx5_1:1", "state 1: DOWN"),)
    assert choice.env_value == "=mlx5_0:1"


def test_active_but_not_linkup_is_excluded() -> None:
    choice = select_hcas([port(phys="3: Disabled")])
    assert choice.hcas == () and choice.excluded == (("mlx5_0:1", "phys_state 3: Disabled"),)


def test_mixed_link_layers_keep_infiniband() -> None:
    ports = [port("mlx5_ib0", link="InfiniBand", rate="400 Gb/sec (4X NDR)", netdev="ib0"),
             port("mlx5_ib1", link="InfiniBand", rate="400 Gb/sec (4X NDR)", netdev="ib1"),
             port("mlx5_an0", link="Ethernet", rate="100 Gb/sec", netdev="eth1")]
    choice = select_hcas(ports, "eth0")
    assert choice.hcas == ("mlx5_ib0:1", "mlx5_ib1:1")
    assert choice.link_layer == "InfiniBand"
    assert [n for n, _ in choice.excluded] == ["mlx5_an0:1"]
    assert "mix" in choice.excluded[0][1]


def test_front_end_roce_nic_is_excluded_when_backend_ports_exist() -> None:
    ports = [port("mlx5_0", netdev="eth0", rate="100 Gb/sec"),
             port("mlx5_1", netdev="ens2f0", rate="100 Gb/sec")]
    choice = select_hcas(ports, "eth0")
    assert choice.hcas == ("mlx5_1:1",)
    assert choice.excluded[0][0] == "mlx5_0:1" and "front-end" in choice.excluded[0][1]


def test_a_single_roce_port_carrying_the_socket_traffic_is_kept() -> None:
    assert select_hcas([port(netdev="eth0")], "eth0").hcas == ("mlx5_0:1",)


def test_only_the_fastest_ports_are_kept_and_names_sort() -> None:
    ports = [port("mlx5_10", netdev="a", rate="400 Gb/sec (4X NDR)"),
             port("mlx5_2", netdev="b", rate="400 Gb/sec (4X NDR)"),
             port("mlx5_3", netdev="c", rate="25 Gb/sec (1X EDR)")]
    choice = select_hcas(ports)
    assert choice.env_value == "=mlx5_10:1,mlx5_2:1"
    assert choice.excluded == (("mlx5_3:1", "rate 25 Gb/sec (1X EDR) below the fastest 400 "
                                            "Gb/sec"),)


def test_efa_means_no_hca_choice_at_all() -> None:
    choice = select_hcas([port("rdmap0s6", driver="efa", link="Unspecified"), port("mlx5_0")])
    assert choice.efa and choice.hcas == () and choice.env_value is None


def test_no_rdma_ports_no_choice() -> None:
    choice = select_hcas([])
    assert (choice.hcas, choice.env_value, choice.efa) == ((), None, False)


# --------------------------------------------------------------------------- NCCL's own rule


@pytest.mark.parametrize(("table", "expected"), [
    pytest.param(basic(), 3, id="usual-layout"),
    pytest.param(vlan_first(), 3, id="vlan-first-wins-in-nccl"),
    pytest.param(gids((0, FE80, V1, "e"), (1, FE80, V2, "e")), 0, id="link-local-only-falls-to-0"),
    pytest.param((), 0, id="empty"),
    pytest.param(gids((0, FE80, V1, "e"), (2, mapped("10.0.0.5"), V1, "e")), 2,
                 id="ipv4-v1-only-nccl-takes-the-v1"),
    pytest.param(gids((0, FE80, V1, "e"), (2, mapped("10.0.0.5"), V1, "e"),
                      (3, mapped("10.0.0.5"), None, "e"), (5, mapped("10.0.0.6"), V2, "e")), 5,
                 id="unreadable-type-skipped"),
])
def test_nccl_rule_replay(table: tuple[Gid, ...], expected: int) -> None:
    assert nccl_gid_index(table) == expected


def test_nccl_rule_honours_addr_range() -> None:
    assert nccl_gid_index(vlan_first(), addr_range="10.200.2.0/24") == 5
    assert nccl_gid_index(vlan_first(), addr_range="192.168.0.0/16") == 3


# --------------------------------------------------------------------------- dtrain's wanted GID


@pytest.mark.parametrize(("table", "netdev", "want", "nccl"), [
    pytest.param(basic(), "ens1f0", 3, 3, id="basic-agrees"),
    pytest.param(vlan_first(), "ens2f0", 5, 3, id="vlan-before-backend"),
    pytest.param(gids((0, FE80, V1, "ens1f0"), (1, FE80, V2, "ens1f0"),
                      (2, mapped("10.9.0.1"), V2, "docker9"),
                      (3, mapped("10.0.0.5"), V2, "ens1f0")),
                 "ens1f0", 3, 2, id="other-netdev-ignored"),
    pytest.param(gids((0, FE80, V1, "ens1f0"), (3, mapped("10.0.0.5"), None, "ens1f0"),
                      (5, mapped("10.0.0.5"), V2, "ens1f0")),
                 "ens1f0", 5, 5, id="unreadable-type-counts-as-absent"),
    pytest.param(gids((0, FE80, V2, "ens1f0"), (1, mapped("169.254.3.1"), V2, "ens1f0"),
                      (2, mapped("10.0.0.5"), V2, "ens1f0")),
                 "ens1f0", 2, 1, id="ipv4-link-local-skipped"),
    pytest.param(gids((0, FE80, V1, "ens1f0"), (3, mapped("192.168.7.5"), V2, "ens1f0.7")),
                 "ens1f0", 3, 3, id="vlan-child-when-netdev-has-none"),
])
def test_roce_gid(table: tuple[Gid, ...], netdev: str, want: int, nccl: int) -> None:
    choice = roce_gid(port(netdev=netdev, table=table))
    assert (choice.want, choice.nccl_default) == (want, nccl), choice.reason


def test_ipv6_only_port_falls_back_to_a_global_ipv6_gid() -> None:
    table = gids((0, FE80, V1, "ens1f0"), (1, FE80, V2, "ens1f0"),
                 (2, "2001:0db8:0000:0000:0000:0000:0000:0005", V1, "ens1f0"),
                 (3, "2001:0db8:0000:0000:0000:0000:0000:0005", V2, "ens1f0"))
    choice = roce_gid(port(table=table))
    assert (choice.want, choice.family, choice.nccl_default) == (3, AF_INET6, 3)
    plan = plan_gids([port(table=table)])
    assert plan.env == (("NCCL_IB_ADDR_FAMILY", "AF_INET6", "RoCE ports have only IPv6 GIDs"),)


def test_link_local_only_port_is_an_error() -> None:
    table = gids((0, FE80, V1, "ens1f0"), (1, FE80, V2, "ens1f0"))
    choice = roce_gid(port(table=table))
    assert choice.want is None and "no RoCE v2 GID" in choice.reason
    plan = plan_gids([port(table=table)])
    assert plan.env == () and plan.errors and "mlx5_0:1" in plan.errors[0]


def test_subnets_restrict_the_choice() -> None:
    import ipaddress

    only_vlan = [ipaddress.ip_network("192.168.0.0/24")]
    choice = roce_gid(port(netdev="ens2f0", table=vlan_first()), subnets=only_vlan)
    assert choice.want == 3


# --------------------------------------------------------------------------- per-node plan


@pytest.mark.parametrize(("table", "netdev", "version", "env"), [
    pytest.param(basic(), "ens1f0", None, (), id="basic-unknown-nccl-nothing"),
    pytest.param(basic(), "ens1f0", (2, 21, 5), (), id="basic-new-nccl-nothing"),
    pytest.param(basic(), "ens1f0", (2, 18, 1), (("NCCL_IB_GID_INDEX", "3"),),
                 id="basic-old-nccl-defaults-to-0"),
    pytest.param(vlan_first(), "ens2f0", None, (("NCCL_IB_GID_INDEX", "5"),),
                 id="vlan-unknown-nccl-gid-index"),
    pytest.param(vlan_first(), "ens2f0", (2, 23, 4), (("NCCL_IB_ADDR_RANGE", "10.200.2.0/24"),),
                 id="vlan-new-nccl-addr-range"),
    pytest.param(vlan_first(), "ens2f0", (2, 18, 1), (("NCCL_IB_GID_INDEX", "5"),),
                 id="vlan-old-nccl-gid-index"),
])
def test_plan_gids(table: tuple[Gid, ...], netdev: str, version: tuple[int, ...] | None,
                   env: tuple[tuple[str, str], ...]) -> None:
    plan = plan_gids([port(netdev=netdev, table=table)], nccl_version=version, ifaces=IFACES)
    assert tuple((n, v) for n, v, _ in plan.env) == env
    assert plan.errors == ()
    for _, _, reason in plan.env:
        assert "mlx5_0:1" in reason  # the reason names the port and NCCL's other pick
    assert plan.notes and "mlx5_0:1" in plan.notes[0]


def test_plan_ports_needing_different_indices_on_old_nccl_is_an_error() -> None:
    ports = [port("mlx5_0", netdev="ens1f0"), port("mlx5_1", netdev="ens2f0", table=vlan_first())]
    plan = plan_gids(ports, nccl_version=(2, 18, 1), ifaces=IFACES)
    assert plan.env == () and "upgrade NCCL" in plan.errors[0]


def test_plan_ignores_infiniband_ports() -> None:
    ib = port(link="InfiniBand", table=gids((0, FE80, None, None)))
    assert plan_gids([ib]) == plan_gids([])


def test_check_gid_index_names_bad_ports() -> None:
    ports = [port("mlx5_0", netdev="ens1f0"), port("mlx5_1", netdev="ens2f0", table=vlan_first())]
    assert check_gid_index(ports[:1], 3) == []
    problems = check_gid_index(ports, 3)
    assert len(problems) == 1 and "ens2f0.100" in problems[0]
    assert "not RoCE v2" in check_gid_index(ports[:1], 2)[0]
    assert "empty" in check_gid_index(ports[:1], 9)[0]
    assert "not a routable IPv4" in check_gid_index(ports[:1], 1)[0]


# --------------------------------------------------------------------------- the checked-in tree


def test_checked_in_tree_end_to_end() -> None:
    facts = NodeFacts.from_json({"rdma": {"devices": probenet.read_rdma(str(TREE))}})
    choice = select_hcas(facts.rdma, "eth0")
    assert choice.hcas == ("mlx5_1:1",)
    assert dict(choice.excluded) == {
        "mlx5_2:1": "state 1: DOWN",
        "mlx5_0:1": "front-end NIC: its netdev eth0 carries the socket traffic",
    }
    gid = roce_gid(choice.ports[0])
    assert (gid.want, gid.nccl_default, gid.address) == (5, 3, "10.200.2.10")
    assert "192.168.0.5 on ens2f0.100" in gid.reason


# --------------------------------------------------------------------------- whole output
# The reasons, notes and errors below are what --dry-run and the doctor print: asserted whole.


def test_exclusion_reasons_whole() -> None:
    choice = select_hcas([port("a", state=None), port("b", phys=None), port("c", link=None),
                          port("d", link="Weird"), port("f", rate=None), port("e")])
    assert choice.excluded == (
        ("a:1", "state unknown"), ("b:1", "phys_state unknown"), ("c:1", "link layer unknown"),
        ("d:1", "link layer Weird"), ("f:1", "rate ? below the fastest 200 Gb/sec"))
    assert choice.hcas == ("e:1",)
    mixed = select_hcas([port("a", state="1: DOWN"), port("ib0", link="InfiniBand", netdev="ib0"),
                         port("r0")])
    assert mixed.excluded == (
        ("a:1", "state 1: DOWN"),
        ("r0:1", "Ethernet (RoCE) port while InfiniBand ports exist: NCCL cannot mix link layers"))
    assert (mixed.hcas, mixed.link_layer) == (("ib0:1",), "InfiniBand")


def test_efa_excludes_every_port_by_name() -> None:
    choice = select_hcas([port("rdmap0", driver="efa"), port("mlx5_0")])
    assert choice.efa and choice.hcas == () and choice.env_value is None
    assert choice.excluded == (("rdmap0:1", "EFA: handled by aws-ofi-nccl"),
                               ("mlx5_0:1", "EFA: handled by aws-ofi-nccl"))


def _vf() -> RdmaPort:
    return port("mlx5_0", netdev="ens2f0", table=vlan_first())


VF_NOTE = ("mlx5_0:1: backend GID 5 (10.200.2.10 on ens2f0); NCCL 2.21+ would pick 3 "
           "(192.168.0.5 on ens2f0.100)")


@pytest.mark.parametrize(("version", "env"), [
    pytest.param(None, (("NCCL_IB_GID_INDEX", "5", VF_NOTE + "; NCCL version unknown: an index "
                         "works on every version, ADDR_RANGE does not"),), id="unknown"),
    pytest.param((2, 18, 3), (("NCCL_IB_GID_INDEX", "5", "NCCL 2.18.3 < 2.21 defaults to GID 0; "
                               + VF_NOTE),), id="old"),
    pytest.param((2, 21), (("NCCL_IB_ADDR_RANGE", "10.200.2.0/24", VF_NOTE),), id="exactly-2.21"),
    pytest.param((2, 21, 5), (("NCCL_IB_ADDR_RANGE", "10.200.2.0/24", VF_NOTE),), id="new"),
])
def test_plan_whole_for_a_vlan_first_port(version: tuple[int, ...] | None,
                                          env: tuple[tuple[str, str, str], ...]) -> None:
    plan = plan_gids([_vf()], nccl_version=version, ifaces=IFACES)
    assert plan == GidPlan(env=env, notes=(VF_NOTE,))


def test_plan_whole_old_nccl_and_ipv6() -> None:
    same = "mlx5_0:1: backend GID 3 (10.0.0.5 on ens1f0); NCCL 2.21+ picks the same"
    assert plan_gids([port()], nccl_version=(2, 18)) == GidPlan(
        env=(("NCCL_IB_GID_INDEX", "3", "NCCL 2.18 < 2.21 defaults to GID 0; " + same),),
        notes=(same,))
    assert plan_gids([port()]) == GidPlan(notes=(same,))
    zero = port(table=gids((0, mapped("10.0.0.5"), V2, "ens1f0")))
    assert plan_gids([zero], nccl_version=(2, 18)) == GidPlan(notes=(
        "mlx5_0:1: backend GID 0 (10.0.0.5 on ens1f0); NCCL 2.21+ picks the same",))
    v6 = port(table=gids((0, FE80, V1, "ens1f0"), (1, FE80, V2, "ens1f0"),
                         (2, "fd00:0000:0000:0000:0000:0000:0000:0005", V2, "ens1f0")))
    v6_note = "mlx5_0:1: only IPv6 GIDs; index 2 (fd00::5) on ens1f0"
    assert plan_gids([v6]) == GidPlan(
        env=(("NCCL_IB_ADDR_FAMILY", AF_INET6, "RoCE ports have only IPv6 GIDs"),),
        notes=(v6_note,))
    assert plan_gids([v6], nccl_version=(2, 18)) == GidPlan(
        env=(("NCCL_IB_GID_INDEX", "2", "NCCL 2.18 < 2.21 defaults to GID 0; " + v6_note),),
        notes=(v6_note,))
    assert plan_gids([v6, port("mlx5_1")]) == GidPlan(
        notes=(v6_note, "mlx5_1:1: backend GID 3 (10.0.0.5 on ens1f0); NCCL 2.21+ picks the same"),
        errors=("RoCE ports mix IPv4 and IPv6-only GIDs: NCCL_IB_ADDR_FAMILY cannot serve both",))


def test_plan_whole_errors() -> None:
    other = port("mlx5_1", netdev="ens2f0", table=gids(
        (0, FE80, V1, "ens2f0"), (1, FE80, V2, "ens2f0"), (2, mapped("10.0.0.6"), V2, "ens2f0")))
    assert plan_gids([port(), other], nccl_version=(2, 18)) == GidPlan(
        notes=("mlx5_0:1: backend GID 3 (10.0.0.5 on ens1f0); NCCL 2.21+ picks the same",
               "mlx5_1:1: backend GID 2 (10.0.0.6 on ens2f0); NCCL 2.21+ picks the same"),
        errors=("ports need different GID indices and NCCL < 2.21 takes one NCCL_IB_GID_INDEX: "
                "upgrade NCCL to 2.21 or later",))
    none = port(table=gids((0, FE80, V1, "ens1f0")))
    assert plan_gids([none, port("mlx5_1")]) == GidPlan(
        notes=("mlx5_1:1: backend GID 3 (10.0.0.5 on ens1f0); NCCL 2.21+ picks the same",),
        errors=("mlx5_0:1: no RoCE v2 GID with a routable address on ens1f0; NCCL would fall "
                "back to index 0",))
    assert plan_gids([none]) == GidPlan(errors=(
        "mlx5_0:1: no RoCE v2 GID with a routable address on ens1f0; NCCL would fall back to "
        "index 0",))


def _two_vlan_first() -> tuple[list[RdmaPort], tuple[Iface, ...]]:
    b = port("mlx5_1", netdev="ens3f0", table=gids(
        (0, FE80, V1, "ens3f0"), (1, FE80, V2, "ens3f0"),
        (2, mapped("192.168.1.5"), V2, "ens3f0.100"), (3, mapped("10.201.0.10"), V2, "ens3f0"),
        (4, mapped("10.201.0.10"), V1, "ens3f0")))
    ifaces = IFACES + (Iface("ens3f0", "up", addrs=(Addr("inet", "10.201.0.10", 24),)),
                       Iface("ens3f0.100", "up", virtual=True, lower=("ens3f0",),
                             addrs=(Addr("inet", "192.168.1.5", 24),)))
    return [_vf(), b], ifaces


def test_two_ports_wanting_different_gids_one_range_or_an_error() -> None:
    ports, ifaces = _two_vlan_first()
    notes = (VF_NOTE, "mlx5_1:1: backend GID 3 (10.201.0.10 on ens3f0); NCCL 2.21+ would pick 2 "
             "(192.168.1.5 on ens3f0.100)")
    # a known new NCCL: the smallest range covering both backend subnets steers both ports
    assert plan_gids(ports, nccl_version=(2, 21, 5), ifaces=ifaces) == GidPlan(
        env=(("NCCL_IB_ADDR_RANGE", "10.200.0.0/15", "; ".join(notes)),), notes=notes)
    # an unknown one: no single index serves both
    assert plan_gids(ports, ifaces=ifaces) == GidPlan(notes=notes, errors=(
        f"NCCL's GID choice misses the backend address ({'; '.join(notes)}) and no single "
        "NCCL_IB_GID_INDEX or NCCL_IB_ADDR_RANGE fixes every port; set them with --env",))


def test_a_macvlan_child_named_by_its_lower_link_counts_as_the_port_s() -> None:
    table = gids((0, FE80, V1, "ens2f0"), (1, mapped("10.9.9.9"), V2, "macv0"))
    child = (Iface("macv0", "up", virtual=True, lower=("ens2f0",)),
             Iface("other", "up", virtual=True, lower=("ens9",)))
    # the reason names the interface that holds the address
    assert plan_gids([port(netdev="ens2f0", table=table)], ifaces=child) == GidPlan(
        notes=("mlx5_0:1: backend GID 1 (10.9.9.9 on macv0); NCCL 2.21+ picks the same",))
    assert plan_gids([port(netdev="ens2f0", table=table)]).errors == (
        "mlx5_0:1: no RoCE v2 GID with a routable address on ens2f0; NCCL would fall back to "
        "index 1",)


def test_check_gid_index_every_message() -> None:
    bad = port("mlx5_0", netdev="ens2f0", table=vlan_first() + gids(
        (6, FE80, None, "ens2f0"), (7, mapped("10.0.0.9"), V2, "eth9"), (8, FE80, V2, "ens2f0")))
    ib = port("ib", link="InfiniBand")  # never checked: it comes first and is skipped
    expected = {
        9: ["mlx5_0:1: GID index 9 is empty"],
        2: ["mlx5_0:1: GID 2 is IB/RoCE v1, not RoCE v2"],
        6: ["mlx5_0:1: GID 6 is of unknown type, not RoCE v2"],
        8: ["mlx5_0:1: GID 8 (fe80:0000:0000:0000:0ac0:ebff:fe3d:ca54) is not a routable IPv4 "
            "address"],
        7: ["mlx5_0:1: GID 7 belongs to eth9, not ens2f0"],
        3: ["mlx5_0:1: GID 3 (192.168.0.5) is on ens2f0.100; the backend address is GID 5 "
            "(10.200.2.10 on ens2f0)"],
        5: [],
    }
    for index, problems in expected.items():
        assert check_gid_index([ib, bad], index) == problems, index
    # on a child with no better address on the netdev itself: fine
    only_child = port("mlx5_0", netdev="ens2f0", table=gids(
        (0, FE80, V1, "ens2f0"), (1, mapped("192.168.0.5"), V2, "ens2f0.100")))
    assert check_gid_index([only_child], 1) == []


def test_nccl_rule_ranges_given_as_text_and_ipv6() -> None:
    # a range typed with host bits set is accepted (strict=False), as NCCL does
    assert nccl_gid_index(vlan_first(), addr_range="10.200.2.77/24") == 5
    assert nccl_gid_index(vlan_first(), addr_range="fd00::/64") == 0  # IPv4 GIDs: never in it
    v6t = gids((0, FE80, V2, "e"), (1, "fd00:0000:0000:0000:0000:0000:0000:0005", V2, "e"),
               (2, "fd01:0000:0000:0000:0000:0000:0000:0005", V2, "e"))
    assert nccl_gid_index(v6t, family=AF_INET6) == 1
    assert nccl_gid_index(v6t, family=AF_INET6, addr_range="fd01::/64") == 2
    assert nccl_gid_index(v6t, family=AF_INET6, addr_range="10.0.0.0/8") == 0
    assert nccl_gid_index(()) == 0


def test_roce_gid_fallbacks_whole() -> None:
    assert roce_gid(port(netdev=None, table=basic())) == GidChoice(
        None, 3, "mlx5_0:1: no RoCE v2 GID with a routable address on ?; NCCL would fall back "
        "to index 3")
    # multicast, loopback and link-local IPv6 GIDs are skipped; the global one is taken
    odd = port(table=gids((0, FE80, V2, "ens1f0"),
                          (1, "ff02:0000:0000:0000:0000:0000:0000:0001", V2, "ens1f0"),
                          (2, "0000:0000:0000:0000:0000:0000:0000:0001", V2, "ens1f0"),
                          (3, "fd00:0000:0000:0000:0000:0000:0000:0007", V2, "ens1f0")))
    assert roce_gid(odd) == GidChoice(3, 1, "mlx5_0:1: only IPv6 GIDs; index 3 (fd00::7) on "
                                      "ens1f0; NCCL 2.21+ would pick 1 (ff02::1 on ens1f0)",
                                      AF_INET6, "fd00::7")
    # an unreadable type (EINVAL) is no version: not v1, not v2
    untyped = port(table=gids((0, FE80, V1, "ens1f0"), (1, mapped("10.0.0.5"), None, "ens1f0"),
                              (2, mapped("10.0.0.5"), "RoCE v1", "ens1f0"),
                              (3, mapped("10.0.0.5"), " RoCE v2 ", "ens1f0")))
    assert roce_gid(untyped).want == 3


ZERO = "0000:0000:0000:0000:0000:0000:0000:0000"
V6 = "fd00:0000:0000:0000:0000:0000:0000:0005"


def test_nccl_rule_edge_rows_replayed() -> None:
    # an unconfigured (zero) GID is never taken, even typed RoCE v2
    assert nccl_gid_index(gids((0, FE80, V2, "e"), (1, ZERO, V2, "e"), (2, V6, V2, "e")),
                          family=AF_INET6) == 2
    # a table without row 0 (NCCL starts there: a zero GID)
    assert nccl_gid_index(gids((1, V6, V2, "e")), family=AF_INET6) == 1
    # no candidate past the table's last row
    assert nccl_gid_index(gids((0, mapped("10.0.0.5"), V2, "e")), family=AF_INET6) == 0
    # an unparsable GID is never in a range
    assert nccl_gid_index(gids((0, mapped("10.0.0.5"), V2, "e"), (1, "garbage", V2, "e")),
                          family=AF_INET6, addr_range="fd00::/8") == 0
    # RoCE v1 asked for (NCCL_IB_ROCE_VERSION_NUM=1), both spellings of the type
    assert nccl_gid_index(basic(), roce_version=1) == 2
    assert nccl_gid_index(gids((0, mapped("10.0.0.5"), V2, "e"), (1, mapped("10.0.0.5"), V1, "e")),
                          roce_version=1) == 1
    v1 = gids((0, FE80, "RoCE v1", "e"), (1, mapped("10.0.0.5"), V2, "e"),
              (2, mapped("10.0.0.5"), "RoCE v1", "e"))
    assert nccl_gid_index(v1, roce_version=1) == 2 and nccl_gid_index(v1) == 1


def test_plans_with_errors_alongside_keep_both() -> None:
    none = port("mlx5_9", netdev="ens9", table=gids((0, FE80, V1, "ens9")))
    err = ("mlx5_9:1: no RoCE v2 GID with a routable address on ens9; NCCL would fall back to "
           "index 0",)
    old = plan_gids([none, port()], nccl_version=(2, 18))
    assert [e[0] for e in old.env] == ["NCCL_IB_GID_INDEX"] and old.errors == err
    assert old.warnings == ()
    zero = port(table=gids((0, mapped("10.0.0.5"), V2, "ens1f0")))
    assert plan_gids([none, zero], nccl_version=(2, 18)).errors == err
    new = plan_gids([none, _vf()], nccl_version=(2, 21, 5), ifaces=IFACES)
    assert [e[0] for e in new.env] == ["NCCL_IB_ADDR_RANGE"] and new.errors == err
    unknown = plan_gids([none, _vf()], ifaces=IFACES)
    assert [e[0] for e in unknown.env] == ["NCCL_IB_GID_INDEX"] and unknown.errors == err
    assert unknown.warnings == ()


def test_old_nccl_reason_joins_every_port_s_note() -> None:
    two = plan_gids([port("mlx5_0"), port("mlx5_1", netdev="ens2f0")], nccl_version=(2, 18))
    assert two.env == (("NCCL_IB_GID_INDEX", "3",
                        "NCCL 2.18 < 2.21 defaults to GID 0; mlx5_0:1: backend GID 3 (10.0.0.5 "
                        "on ens1f0); NCCL 2.21+ picks the same; mlx5_1:1: backend GID 3 "
                        "(10.0.0.5 on ens2f0); NCCL 2.21+ picks the same"),)


def test_plan_subnets_and_a_range_without_interface_facts() -> None:
    import ipaddress
    # the coordinator's subnets: only the VLAN child's address is on them
    plan = plan_gids([_vf()], ifaces=IFACES, subnets=[ipaddress.ip_network("192.168.0.0/24")])
    assert plan == GidPlan(notes=("mlx5_0:1: backend GID 3 (192.168.0.5 on ens2f0.100); NCCL "
                                  "2.21+ picks the same",))
    # no interface facts: the range is the address itself
    assert plan_gids([_vf()], nccl_version=(2, 21, 5)).env[0][:2] == (
        "NCCL_IB_ADDR_RANGE", "10.200.2.10/32")


def test_odd_gids_in_reasons_and_checks() -> None:
    nodev = port("mlx5_0", netdev="ens2f0", table=gids(
        (0, FE80, V1, "ens2f0"), (2, mapped("192.168.0.5"), V2, None),
        (3, mapped("10.200.2.12"), V2, "ens2f0")))
    assert roce_gid(nodev).reason == ("mlx5_0:1: backend GID 3 (10.200.2.12 on ens2f0); NCCL "
                                      "2.21+ would pick 2 (192.168.0.5 on ?)")
    garbage = port("mlx5_0", netdev="ens2f0", table=gids((4, "garbage", V2, "ens2f0")))
    assert check_gid_index([garbage], 4) == [
        "mlx5_0:1: GID 4 (garbage) is not a routable IPv4 address"]


def test_an_ipv6_only_port_where_nccl_misses_the_backend_gid_gets_an_ipv6_range() -> None:
    # NCCL's rule takes the first valid IPv6 v2 GID (a container network's, index 2); the
    # range that steers it is checked with the IPv6 family (mutant _override 21 checked it
    # with IPv4's, found no match and fell back to an index). The reason said "" before:
    # the IPv6 note did not say what NCCL would pick.
    table = gids((0, FE80, V1, "ens1f0"), (1, FE80, V2, "ens1f0"),
                 (2, "fd01:0000:0000:0000:0000:0000:0000:0009", V2, "docker0"),
                 (3, "fd00:0000:0000:0000:0000:0000:0000:0005", V2, "ens1f0"))
    note = ("mlx5_0:1: only IPv6 GIDs; index 3 (fd00::5) on ens1f0; NCCL 2.21+ would pick 2 "
            "(fd01::9 on docker0)")
    family = ("NCCL_IB_ADDR_FAMILY", AF_INET6, "RoCE ports have only IPv6 GIDs")
    assert plan_gids([port(table=table)], nccl_version=(2, 23, 4)) == GidPlan(
        env=(family, ("NCCL_IB_ADDR_RANGE", "fd00::5/128", note)), notes=(note,))
    assert plan_gids([port(table=table)]) == GidPlan(env=(family, (
        "NCCL_IB_GID_INDEX", "3",
        note + "; NCCL version unknown: an index works on every version, ADDR_RANGE does not")),
        notes=(note,))
