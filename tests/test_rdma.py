"""HCA selection and RoCE GID decisions (pure) against port tables and the checked-in tree."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from launcher.decide.facts import Addr, Gid, Iface, NodeFacts, RdmaPort
from launcher.decide.rdma import (
    AF_INET6,
    check_gid_index,
    nccl_gid_index,
    plan_gids,
    roce_gid,
    select_hcas,
)
from launcher.nodeside import probe

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
    facts = NodeFacts.from_json({"rdma": {"devices": probe.read_rdma(str(TREE))}})
    choice = select_hcas(facts.rdma, "eth0")
    assert choice.hcas == ("mlx5_1:1",)
    assert dict(choice.excluded) == {
        "mlx5_2:1": "state 1: DOWN",
        "mlx5_0:1": "front-end NIC: its netdev eth0 carries the socket traffic",
    }
    gid = roce_gid(choice.ports[0])
    assert (gid.want, gid.nccl_default, gid.address) == (5, 3, "10.200.2.10")
    assert "192.168.0.5 on ens2f0.100" in gid.reason
