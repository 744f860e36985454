"""Master address, socket interface and the per-node env decision (pure, from NodeFacts)."""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

import pytest

from launcher.decide import netenv
from launcher.decide.facts import Addr, Gid, Iface, NodeFacts, RdmaPort, Route, SiteVar
from launcher.decide.netenv import (
    SOURCES,
    choose_master,
    decide_env,
    load_profile,
    parse_profile,
    pick_master_addr,
    socket_iface,
)
from launcher.errors import ConfigError, PreflightFailed

PROFILES = Path(__file__).parent.parent / "hostfiles" / "profiles"
FE80 = "fe80:0000:0000:0000:0ac0:ebff:fe3d:ca54"


def iface(name: str, *addrs: str, operstate: str = "up", virtual: bool = False,
          kind: int = 1) -> Iface:
    """An interface with "ip/len" addresses."""
    rows = []
    for a in addrs:
        ip, _, plen = a.partition("/")
        rows.append(Addr("inet6" if ":" in ip else "inet", ip, int(plen or 32)))
    return Iface(name, operstate, 1500, kind, 1, virtual, addrs=tuple(rows))


LO = iface("lo", "127.0.0.1/8", "::1/128", operstate="unknown", virtual=True, kind=772)
DOCKER0 = iface("docker0", "172.17.0.1/16", virtual=True)


def route(target: str, dev: str | None, *, gateway: str | None = None, kind: str = "unicast",
          error: str | None = None) -> Route:
    return Route(target, dev, None, gateway, kind, "ip", error)


def node(host: str, *ifaces: Iface, default: str | None = None,
         routes: Mapping[str, Route] | None = None, site: tuple[SiteVar, ...] = (),
         rdma: tuple[RdmaPort, ...] = (), nccl: str | None = None,
         files: tuple[str, ...] = ()) -> NodeFacts:
    return NodeFacts(hostname=host, interfaces=(LO, *ifaces), default_iface=default,
                     routes=dict(routes or {}), site_env=site, rdma=rdma, nccl_version=nccl,
                     files=files)


MASTER_IP = "198.18.0.11"
MASTER = node(
    "node0",
    DOCKER0,
    iface("br-5f1e", "172.18.0.1/16", virtual=True),
    iface("veth12ab", virtual=True),
    iface("eth1", "169.254.3.1/16"),
    iface("ens2", "10.1.0.11/24"),
    iface("ens1f0", "198.18.0.11/24"),
    iface("ens9", "10.9.0.11/24", operstate="down"),
    default="ens1f0",
)
NODE1 = node("node1", DOCKER0, iface("eth0", "198.18.0.12/24"),
             routes={MASTER_IP: route(MASTER_IP, "eth0")})
NODE2 = node("node2", iface("enp3s0", "198.18.0.13/24"),
             routes={MASTER_IP: route(MASTER_IP, "enp3s0")})


def decide(facts: NodeFacts, *, is_master: bool = False, user: Mapping[str, str] | None = None,
           profile: Mapping[str, str] | None = None, nnodes: int = 3,
           master_addr: str = MASTER_IP, **kw: object) -> netenv.EnvDecision:
    return decide_env(facts, master_addr=master_addr, is_master=is_master, user_env=user or {},
                      profile=profile, nnodes=nnodes, **kw)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- master address


def test_master_candidates_skip_loopback_docker_overlays_link_local_and_down() -> None:
    assert pick_master_addr(MASTER) == ["198.18.0.11", "10.1.0.11"]


def test_docker_default_bridge_address_is_skipped_under_any_name() -> None:
    facts = node("n", iface("bridge0", "172.17.0.1/16"), iface("eth0", "127.0.1.1/8"))
    assert pick_master_addr(facts) == []


def test_physical_interfaces_before_virtual_ones_after_the_default() -> None:
    facts = node("n", iface("bond0", "10.2.0.1/24", virtual=True), iface("eno1", "10.3.0.1/24"),
                 iface("eno2", "10.4.0.1/24"), default="eno2")
    assert pick_master_addr(facts) == ["10.4.0.1", "10.3.0.1", "10.2.0.1"]


def test_choose_master_takes_the_first_candidate_every_worker_reaches_on_link() -> None:
    routes = {"node1": NODE1.routes, "node2": NODE2.routes}
    choice = choose_master(pick_master_addr(MASTER), routes)
    assert choice.addr == MASTER_IP and choice.warning is None
    assert "on-link" in choice.reason


def test_choose_master_skips_a_candidate_one_worker_cannot_reach() -> None:
    routes = {
        "node1": {MASTER_IP: route(MASTER_IP, "eth0"), "10.1.0.11": route("10.1.0.11", "eth1")},
        "node2": {MASTER_IP: route(MASTER_IP, None, kind="unreachable", error="no route"),
                  "10.1.0.11": route("10.1.0.11", "eno1")},
    }
    assert choose_master([MASTER_IP, "10.1.0.11"], routes).addr == "10.1.0.11"


def test_choose_master_falls_back_to_a_routed_candidate_with_a_warning() -> None:
    routes = {"node1": {MASTER_IP: route(MASTER_IP, "eth0", gateway="198.18.1.1")}}
    choice = choose_master([MASTER_IP], routes)
    assert choice.addr == MASTER_IP
    assert choice.warning and "node1 via 198.18.1.1" in choice.warning


def test_choose_master_names_the_hosts_that_cannot_reach_it() -> None:
    routes = {
        "node1": {MASTER_IP: route(MASTER_IP, "eth0")},
        "node2": {MASTER_IP: route(MASTER_IP, None, kind="unreachable",
                                   error="RTNETLINK answers: Network is unreachable")},
        "node3": {MASTER_IP: route(MASTER_IP, "lo", kind="local")},  # same IP on node3
        "node4": {},
    }
    with pytest.raises(PreflightFailed) as err:
        choose_master([MASTER_IP], routes)
    text = str(err.value)
    assert "node2 (RTNETLINK" in text and "node3 (the address is also local" in text
    assert "node4 (not probed)" in text and "node1" not in text


def test_choose_master_single_node_and_no_candidates() -> None:
    assert choose_master(["10.0.0.1"], {}).addr == "10.0.0.1"
    with pytest.raises(PreflightFailed, match="no usable IPv4"):
        choose_master([], {"node1": {}})


# --------------------------------------------------------------------------- socket interface


@pytest.mark.parametrize(("facts", "is_master", "expected"), [
    pytest.param(MASTER, True, "ens1f0", id="master-owns-the-address"),
    pytest.param(NODE1, False, "eth0", id="worker-eth0"),
    pytest.param(NODE2, False, "enp3s0", id="worker-enp3s0"),
])
def test_socket_iface_per_node(facts: NodeFacts, is_master: bool, expected: str) -> None:
    name, reason = socket_iface(facts, MASTER_IP, is_master)
    assert name == expected
    assert MASTER_IP in reason


def test_per_node_interface_names_reach_the_env() -> None:
    envs = {f.hostname: decide(f, is_master=f is MASTER).exports()
            for f in (MASTER, NODE1, NODE2)}
    assert {h: e["NCCL_SOCKET_IFNAME"] for h, e in envs.items()} == {
        "node0": "=ens1f0", "node1": "=eth0", "node2": "=enp3s0"}
    assert {h: e["GLOO_SOCKET_IFNAME"] for h, e in envs.items()} == {
        "node0": "ens1f0", "node1": "eth0", "node2": "enp3s0"}
    reason = decide(NODE1).get("NCCL_SOCKET_IFNAME")
    assert reason is not None and reason.reason == f"route to {MASTER_IP} via eth0"


@pytest.mark.parametrize("bad_route", [
    pytest.param(route(MASTER_IP, "lo", kind="local"), id="lo-local"),
    pytest.param(route(MASTER_IP, "docker0"), id="docker0"),
    pytest.param(route(MASTER_IP, None, error="no route"), id="none"),
])
def test_worker_socket_iface_never_lo_or_docker0(bad_route: Route) -> None:
    facts = node("node7", DOCKER0, iface("eth0", "10.0.0.7/24"),
                 routes={MASTER_IP: bad_route})
    with pytest.raises(PreflightFailed) as err:
        socket_iface(facts, MASTER_IP, False)
    assert err.value.host == "node7"


def test_master_must_own_the_master_address() -> None:
    with pytest.raises(PreflightFailed, match="not an address of this node"):
        socket_iface(NODE1, MASTER_IP, True)


def test_loopback_is_fine_for_a_single_node_job() -> None:
    decision = decide(node("solo"), is_master=True, nnodes=1, master_addr="127.0.0.1")
    assert decision.exports()["GLOO_SOCKET_IFNAME"] == "lo"
    with pytest.raises(PreflightFailed, match="lo"):
        decide(node("solo"), is_master=True, nnodes=2, master_addr="127.0.0.1")


def test_gateway_and_overlay_warnings() -> None:
    facts = node("node1", iface("tailscale0", "100.64.0.2/10"),
                 routes={MASTER_IP: route(MASTER_IP, "tailscale0", gateway="100.64.0.1")})
    decision = decide(facts)
    assert decision.socket_iface == "tailscale0"
    assert any("gateway 100.64.0.1" in w for w in decision.warnings)
    assert any("overlay" in w for w in decision.warnings)


def test_socket_family_pinned_when_the_interface_also_has_global_ipv6() -> None:
    facts = node("node1", iface("eth0", "198.18.0.12/24", "fd00::12/64", "fe80::1/64"),
                 routes={MASTER_IP: route(MASTER_IP, "eth0")})
    assert decide(facts).exports()["NCCL_SOCKET_FAMILY"] == "AF_INET"
    link_local_only = node("node1", iface("eth0", "198.18.0.12/24", "fe80::1/64"),
                           routes={MASTER_IP: route(MASTER_IP, "eth0")})
    assert "NCCL_SOCKET_FAMILY" not in decide(link_local_only).exports()


# --------------------------------------------------------------------------- precedence


def _with_site(*rows: SiteVar) -> NodeFacts:
    return node("node1", iface("eth0", "198.18.0.12/24"), site=rows,
                routes={MASTER_IP: route(MASTER_IP, "eth0")})


def test_site_config_wins_over_detection_and_is_not_exported() -> None:
    facts = _with_site(SiteVar("NCCL_SOCKET_IFNAME", "=bond0", "/etc/nccl.conf"))
    decision = decide(facts)
    var = decision.get("NCCL_SOCKET_IFNAME")
    assert var is not None
    assert (var.value, var.source, var.exported) == ("=bond0", "site", False)
    assert "/etc/nccl.conf" in var.reason
    assert "NCCL_SOCKET_IFNAME" not in decision.exports()
    assert decision.exports()["GLOO_SOCKET_IFNAME"] == "eth0"  # not a site key: still detected
    assert any("/etc/nccl.conf sets =bond0" in w for w in decision.warnings)


def test_user_env_wins_over_site_config() -> None:
    facts = _with_site(SiteVar("NCCL_SOCKET_IFNAME", "=bond0", "/etc/nccl.conf"))
    var = decide(facts, user={"NCCL_SOCKET_IFNAME": "=eth0"}).get("NCCL_SOCKET_IFNAME")
    assert var is not None
    assert (var.value, var.source, var.exported) == ("=eth0", "user", True)
    assert "forced over =bond0 (/etc/nccl.conf)" in var.reason


def test_the_winning_site_value_is_the_one_nccl_uses() -> None:
    facts = _with_site(SiteVar("NCCL_IB_TC", "106", "env"),
                       SiteVar("NCCL_IB_TC", "41", "/etc/nccl.conf"))
    var = decide(facts).get("NCCL_IB_TC")
    assert var is not None and (var.value, var.reason) == ("106", "already set by env")


def test_profile_beats_detection_and_loses_to_site() -> None:
    facts = _with_site(SiteVar("NCCL_IB_SL", "3", "/etc/nccl.conf"))
    decision = decide(facts, profile={"NCCL_IB_TC": "41", "NCCL_IB_SL": "0",
                                      "NCCL_SOCKET_IFNAME": "eth0"}, profile_name="oci-roce")
    tc, sl = decision.get("NCCL_IB_TC"), decision.get("NCCL_IB_SL")
    assert tc is not None and (tc.value, tc.source, tc.reason) == ("41", "profile", "oci-roce")
    assert sl is not None and (sl.value, sl.source) == ("3", "site")
    sock = decision.get("NCCL_SOCKET_IFNAME")
    assert sock is not None and (sock.value, sock.source) == ("eth0", "profile")
    assert not any("NCCL_SOCKET_IFNAME" in w for w in decision.warnings)  # same interface


def test_pythonunbuffered_always_and_user_can_override() -> None:
    var = decide(NODE1).get("PYTHONUNBUFFERED")
    assert var is not None and (var.value, var.source) == ("1", "dtrain")
    assert decide(NODE1, user={"PYTHONUNBUFFERED": "0"}).exports()["PYTHONUNBUFFERED"] == "0"


def test_no_auto_drops_a_detected_variable() -> None:
    decision = decide(NODE1, no_auto={"NCCL_SOCKET_IFNAME"})
    assert decision.get("NCCL_SOCKET_IFNAME") is None
    assert decision.get("GLOO_SOCKET_IFNAME") is not None


def test_env_is_sorted_and_sources_are_known() -> None:
    decision = decide(_with_site(SiteVar("NCCL_DEBUG", "WARN", "env")),
                      user={"FOO": "1"}, profile={"NCCL_IB_TC": "41"})
    names = [v.name for v in decision.env]
    assert names == sorted(names)
    assert {v.source for v in decision.env} == set(SOURCES)


@pytest.mark.parametrize(("user", "needle"), [
    pytest.param({"GLOO_SOCKET_IFNAME": "^lo,docker0"}, "exact", id="gloo-exclude-list"),
    pytest.param({"NCCL_SOCKET_IFNAME": "e"}, "too short", id="nccl-one-char"),
    pytest.param({"NCCL_PROTO": "LL128"}, "debugging knob", id="proto"),
])
def test_known_bad_values_warn(user: dict[str, str], needle: str) -> None:
    assert any(needle in w for w in decide(NODE1, user=user).warnings)


# --------------------------------------------------------------------------- RDMA in the env


def _roce(dev: str, netdev: str, gids: tuple[Gid, ...], *, state: str = "4: ACTIVE",
          driver: str = "mlx5_core") -> RdmaPort:
    return RdmaPort(dev, 1, state, "5: LinkUp", "Ethernet", "200 Gb/sec (4X HDR)", driver,
                    netdev, (netdev,), gids)


def _mapped(ip: str) -> str:
    a, b, c, d = (int(x) for x in ip.split("."))
    return f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"


BASIC = (Gid(0, FE80, "IB/RoCE v1", "ens2f0"), Gid(1, FE80, "RoCE v2", "ens2f0"),
         Gid(2, _mapped("10.200.2.12"), "IB/RoCE v1", "ens2f0"),
         Gid(3, _mapped("10.200.2.12"), "RoCE v2", "ens2f0"))
VLAN_FIRST = (Gid(0, FE80, "IB/RoCE v1", "ens2f0"), Gid(1, FE80, "RoCE v2", "ens2f0"),
              Gid(2, _mapped("192.168.0.5"), "RoCE v2", "ens2f0.100"),
              Gid(3, _mapped("10.200.2.12"), "RoCE v2", "ens2f0"))


def _rdma_node(*ports: RdmaPort, nccl: str | None = None,
               site: tuple[SiteVar, ...] = ()) -> NodeFacts:
    return node("node1", iface("eth0", "198.18.0.12/24"), iface("ens2f0", "10.200.2.12/24"),
                routes={MASTER_IP: route(MASTER_IP, "eth0")}, rdma=ports, nccl=nccl, site=site)


def test_roce_node_gets_hca_and_no_gid_index_when_nccl_agrees() -> None:
    decision = decide(_rdma_node(_roce("mlx5_0", "ens2f0", BASIC)))
    env = decision.exports()
    assert env["NCCL_IB_HCA"] == "=mlx5_0:1"
    assert not {"NCCL_IB_GID_INDEX", "NCCL_IB_ADDR_RANGE", "NCCL_IB_DISABLE"} & set(env)
    assert decision.errors == ()


def test_vlan_gid_first_sets_gid_index_for_unknown_nccl_and_addr_range_for_new() -> None:
    port = _roce("mlx5_0", "ens2f0", VLAN_FIRST)
    env = decide(_rdma_node(port)).exports()
    assert env["NCCL_IB_GID_INDEX"] == "3"
    new = decide(_rdma_node(port, nccl="2.21.5"))
    assert "NCCL_IB_GID_INDEX" not in new.exports()
    var = new.get("NCCL_IB_ADDR_RANGE")
    assert var is not None and var.value == "10.200.2.0/24" and "would pick 2" in var.reason


def test_no_rdma_no_ib_variables() -> None:
    assert not any(k.startswith("NCCL_IB_") for k in decide(NODE1).exports())


def test_efa_sets_nothing_ib() -> None:
    decision = decide(_rdma_node(_roce("rdmap16s27", "", (), driver="efa")))
    assert not any(k.startswith("NCCL_IB_") for k in decision.exports())
    assert any("EFA" in w for w in decision.warnings)


def test_rdma_present_but_all_down_disables_ib_with_a_warning() -> None:
    decision = decide(_rdma_node(_roce("mlx5_0", "ens2f0", BASIC, state="1: DOWN")))
    assert decision.exports()["NCCL_IB_DISABLE"] == "1"
    assert any("TCP" in w for w in decision.warnings)


def test_roce_port_without_an_address_is_a_blocking_error() -> None:
    port = _roce("mlx5_0", "ens2f0", BASIC[:2])
    assert decide(_rdma_node(port)).errors


def test_site_hca_is_kept_and_user_gid_index_is_checked() -> None:
    facts = _rdma_node(_roce("mlx5_0", "ens2f0", VLAN_FIRST),
                       site=(SiteVar("NCCL_IB_HCA", "mlx5", "/etc/nccl.conf"),))
    decision = decide(facts, user={"NCCL_IB_GID_INDEX": "2"})
    hca = decision.get("NCCL_IB_HCA")
    assert hca is not None and (hca.source, hca.exported) == ("site", False)
    assert decision.exports()["NCCL_IB_GID_INDEX"] == "2"
    assert any("GID 2" in w and "ens2f0.100" in w for w in decision.warnings)


def test_azure_topology_file_detected_once() -> None:
    one = node("n", iface("eth0", "198.18.0.12/24"), files=("/opt/microsoft/ndv5-topo.xml",),
               routes={MASTER_IP: route(MASTER_IP, "eth0")})
    assert decide(one).exports()["NCCL_TOPO_FILE"] == "/opt/microsoft/ndv5-topo.xml"
    both = node("n", iface("eth0", "198.18.0.12/24"), routes={MASTER_IP: route(MASTER_IP, "eth0")},
                files=("/opt/microsoft/ndv4-topo.xml", "/opt/microsoft/ndv5-topo.xml"))
    decision = decide(both)
    assert "NCCL_TOPO_FILE" not in decision.exports()
    assert any("topology files" in w for w in decision.warnings)


# --------------------------------------------------------------------------- profiles


@pytest.mark.parametrize("path", sorted(PROFILES.glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_profiles_load(path: Path) -> None:
    env = load_profile(path)
    assert all(isinstance(v, str) for v in env.values())
    assert "NCCL_IB_GID_INDEX" not in env and "NCCL_IB_HCA" not in env  # detected, not policy


def test_oci_profile_values() -> None:
    assert load_profile(PROFILES / "oci-roce.yaml") == {
        "NCCL_IB_TC": "41", "NCCL_IB_SL": "0", "NCCL_IB_TIMEOUT": "22"}


@pytest.mark.parametrize(("text", "needle"), [
    pytest.param("env:\n  NCCL_IB_TC: 41\n", None, id="ints-become-strings"),
    pytest.param("env:\n  NCCL_IB_DISABLE: yes\n", "string or a number", id="yaml-bool"),
    pytest.param("env:\n  NCCL_IB_TC:\n", "string or a number", id="empty-value"),
    pytest.param("envs:\n  A: 1\n", "unknown key", id="typo-top-level"),
    pytest.param("- A=1\n", "mapping", id="not-a-mapping"),
    pytest.param("env: [A]\n", "mapping", id="env-not-a-mapping"),
    pytest.param("env:\n  1BAD: x\n", "valid environment variable name", id="bad-name"),
    pytest.param("env: {a: [\n", "YAML", id="broken-yaml"),
])
def test_parse_profile(text: str, needle: str | None) -> None:
    if needle is None:
        assert parse_profile(text) == {"NCCL_IB_TC": "41"}
        return
    with pytest.raises(ConfigError, match=needle):
        parse_profile(text, "p.yaml")


def test_missing_profile_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_profile(tmp_path / "nope.yaml")


# --------------------------------------------------------------------------- purity


@pytest.mark.parametrize("module", ["netenv", "rdma", "facts"])
def test_decision_modules_do_no_io(module: str) -> None:
    src = (Path(netenv.__file__).parent / f"{module}.py").read_text()
    imported = set()
    for n in ast.walk(ast.parse(src)):
        if isinstance(n, ast.Import):
            imported |= {a.name.split(".")[0] for a in n.names}
        elif isinstance(n, ast.ImportFrom):
            imported.add((n.module or "").split(".")[0])
    assert not imported & {"asyncio", "logging", "subprocess", "socket", "os", "asyncssh",
                           "rich", "typer"}
