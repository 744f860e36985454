"""Master address, socket interface and the per-node env decision (pure, from NodeFacts)."""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

import pytest

from launcher.decide.runplan import netenv
from launcher.decide.runplan.facts import Addr, Gid, Iface, NodeFacts, RdmaPort, Route, SiteVar
from launcher.decide.runplan.netenv import (
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


@pytest.mark.parametrize("module", ["runplan/netenv", "fabric/rdma", "runplan/facts"])
def test_decision_modules_do_no_io(module: str) -> None:
    src = (Path(netenv.__file__).parents[1] / f"{module}.py").read_text()
    imported = set()
    for n in ast.walk(ast.parse(src)):
        if isinstance(n, ast.Import):
            imported |= {a.name.split(".")[0] for a in n.names}
        elif isinstance(n, ast.ImportFrom):
            imported.add((n.module or "").split(".")[0])
    assert not imported & {"asyncio", "logging", "subprocess", "socket", "os", "asyncssh",
                           "rich", "typer"}


# --------------------------------------------------------------------------- whole output
# What --dry-run shows is every variable with its source and reason, the warnings and the
# errors with their hints: asserted whole here (a needle test lets a reason go wrong).


def _rows(decision: netenv.EnvDecision) -> list[tuple[str, str, str, str, bool]]:
    return [(v.name, v.value, v.source, v.reason, v.exported) for v in decision.env]


def _raised(fn: object, *args: object, **kw: object) -> tuple[str, str | None, str | None]:
    with pytest.raises(PreflightFailed) as err:
        fn(*args, **kw)  # type: ignore[operator]
    return err.value.message, err.value.host, err.value.hint


UNBUFFERED = ("PYTHONUNBUFFERED", "1", "dtrain", "live logs: no pty on the node", True)


def test_a_routed_overlay_worker_with_ipv6_whole_decision() -> None:
    facts = node("node1", iface("tailscale0", "100.64.0.2/10", "fd00::2/64"),
                 routes={MASTER_IP: route(MASTER_IP, "tailscale0", gateway="100.64.0.1")})
    decision = decide(facts)
    via = "route to 198.18.0.11 via tailscale0 (gateway 100.64.0.1)"
    assert _rows(decision) == [
        ("GLOO_SOCKET_IFNAME", "tailscale0", "detected", via, True),
        ("NCCL_SOCKET_FAMILY", "AF_INET", "detected",
         "master 198.18.0.11 is IPv4 and tailscale0 also has IPv6", True),
        ("NCCL_SOCKET_IFNAME", "=tailscale0", "detected", via, True),
        UNBUFFERED]
    assert decision.warnings == (
        "node1: 198.18.0.11 is reached through gateway 100.64.0.1 (routed, not on-link)",
        "node1: tailscale0 looks like a container/overlay interface")
    assert decision.errors == () and decision.socket_iface == "tailscale0"


def test_an_ipv6_master_pins_the_socket_family_to_ipv6() -> None:
    facts = node("node0", iface("eth0", "198.18.0.11/24", "fd00::11/64"))
    decision = decide(facts, is_master=True, master_addr="fd00::11")
    held = "holds master address fd00::11"
    assert _rows(decision) == [
        ("GLOO_SOCKET_IFNAME", "eth0", "detected", held, True),
        ("NCCL_SOCKET_FAMILY", "AF_INET6", "detected",
         "master fd00::11 is IPv6 and eth0 also has IPv4", True),
        ("NCCL_SOCKET_IFNAME", "=eth0", "detected", held, True),
        UNBUFFERED]
    v6_only = node("node0", iface("eth0", "fd00::11/64"))
    assert "NCCL_SOCKET_FAMILY" not in decide(v6_only, is_master=True,
                                              master_addr="fd00::11").exports()


def test_socket_errors_say_which_host_what_and_what_to_do() -> None:
    assert _raised(socket_iface, NODE1, MASTER_IP, True) == (
        "master address 198.18.0.11 is not an address of this node", "node1",
        "pass --master-addr with one of its addresses")
    unrouted = node("n7", iface("eth0", "10.0.0.7/24"),
                    routes={MASTER_IP: route(MASTER_IP, None, error="no route")})
    assert _raised(socket_iface, unrouted, MASTER_IP, False) == (
        "cannot reach master address 198.18.0.11: no route", "n7",
        "check the routes, or pass --master-addr")
    docker = node("n7", DOCKER0, routes={MASTER_IP: route(MASTER_IP, "docker0")})
    assert _raised(socket_iface, docker, MASTER_IP, False) == (
        "traffic to master 198.18.0.11 would use docker0", "n7",
        "pass --master-addr with an address on the cluster network")
    down = node("n7", iface("eth0", "10.0.0.7/24", operstate="down"),
                routes={MASTER_IP: route(MASTER_IP, "eth0")})
    # multi_node is the default: a down interface or docker0 is refused without saying so
    assert _raised(socket_iface, down, MASTER_IP, False) == (
        "eth0 (towards master 198.18.0.11) is down", "n7", None)
    assert socket_iface(down, MASTER_IP, False, multi_node=False)[0] == "eth0"
    assert socket_iface(docker, MASTER_IP, False, multi_node=False)[0] == "docker0"
    # a loopback-typed interface under another name is refused like lo
    loop = node("n7", iface("lo1", "10.0.0.7/24", kind=772),
                routes={MASTER_IP: route(MASTER_IP, "lo1")})
    assert _raised(socket_iface, loop, MASTER_IP, False)[0] == (
        "traffic to master 198.18.0.11 would use lo1")
    # a route with no device and no error is still no route
    nodev = node("n7", iface("eth0", "10.0.0.7/24"), routes={MASTER_IP: route(MASTER_IP, None)})
    assert _raised(socket_iface, nodev, MASTER_IP, False)[0] == (
        "cannot reach master address 198.18.0.11: no route")
    # a worker's socket choice keeps the route it used
    assert netenv.socket_choice(NODE1, MASTER_IP, False).route == NODE1.routes[MASTER_IP]


@pytest.mark.parametrize(("the_route", "problem"), [
    pytest.param(None, "not probed", id="none"),
    pytest.param(route(MASTER_IP, "eth0", error="boom"), "boom", id="error"),
    pytest.param(route(MASTER_IP, "lo", kind="local"), "the address is also local there",
                 id="local"),
    pytest.param(route(MASTER_IP, "lo"), "no route", id="lo"),
    pytest.param(route(MASTER_IP, None), "no route", id="no-dev"),
    pytest.param(route(MASTER_IP, "eth0", kind="broadcast"), "route type broadcast",
                 id="broadcast"),
    pytest.param(route(MASTER_IP, "eth0", kind=""), None, id="untyped-is-fine"),
    pytest.param(route(MASTER_IP, "eth0"), None, id="unicast"),
    pytest.param(route(MASTER_IP, "LO"), None, id="LO-is-a-name"),
])
def test_route_problem_each_case(the_route: Route | None, problem: str | None) -> None:
    assert netenv.route_problem(the_route) == problem


def test_unusable_master_addresses() -> None:
    facts = node("n", iface("eth0", "224.0.0.5/4", "0.0.0.0/8", "169.254.1.1/16",
                            "10.0.0.1/24"))
    assert pick_master_addr(facts) == ["10.0.0.1"]
    assert not netenv._usable_ipv4("fd00::1") and not netenv._usable_ipv4("x")


def test_choose_master_reasons_and_messages_whole() -> None:
    assert choose_master(["10.0.0.1"], {}) == netenv.MasterChoice(
        "10.0.0.1", "single node: the master's first usable address")
    assert choose_master([MASTER_IP], {"node1": NODE1.routes, "node2": NODE2.routes}) == \
        netenv.MasterChoice(MASTER_IP, "every worker (2) reaches it on-link")
    routed = {"node2": {MASTER_IP: route(MASTER_IP, "eth0", gateway="198.18.1.2")},
              "node1": {MASTER_IP: route(MASTER_IP, "eth0", gateway="198.18.1.1")}}
    assert choose_master([MASTER_IP], routed) == netenv.MasterChoice(
        MASTER_IP, "every worker reaches it, some through a gateway",
        warning="master address 198.18.0.11 is routed (L3): node1 via 198.18.1.1, "
                "node2 via 198.18.1.2")
    # the first routed candidate is kept; a later on-link one still wins over it
    both = {"node1": {MASTER_IP: route(MASTER_IP, "eth0", gateway="198.18.1.1"),
                      "10.1.0.11": route("10.1.0.11", "ens2")}}
    assert choose_master([MASTER_IP, "10.1.0.11"], both).addr == "10.1.0.11"
    routed2 = {"node1": {MASTER_IP: route(MASTER_IP, "eth0", gateway="198.18.1.1"),
                         "10.1.0.11": route("10.1.0.11", "ens2", gateway="10.1.0.1")}}
    assert choose_master([MASTER_IP, "10.1.0.11"], routed2).addr == MASTER_IP
    assert _raised(choose_master, [], {"node1": {}}) == (
        "the master node has no usable IPv4 address", None, "pass --master-addr")
    bad = {"node2": {MASTER_IP: route(MASTER_IP, "lo", kind="local")},
           "node1": {MASTER_IP: route(MASTER_IP, "eth0", kind="broadcast")}}
    assert _raised(choose_master, [MASTER_IP, "10.1.0.11"], bad) == (
        "no master address is reachable from every worker -- 198.18.0.11: node1 (route type "
        "broadcast), node2 (the address is also local there); 10.1.0.11: node1 (not probed), "
        "node2 (not probed)", None, "check the routes, or pass --master-addr")


def test_rdma_reasons_and_warnings_whole() -> None:
    good = _roce("mlx5_0", "ens2f0", BASIC)
    down = _roce("mlx5_1", "ens2f1", BASIC, state="1: DOWN")
    decision = decide(_rdma_node(good, down))
    assert decision.get("NCCL_IB_HCA") == netenv.EnvVar(
        "NCCL_IB_HCA", "=mlx5_0:1", "detected",
        "Ethernet ports ACTIVE/LinkUp at 200 Gb/sec (4X HDR); excluded mlx5_1:1: state 1: DOWN")
    assert decision.warnings == () and decision.errors == ()
    assert decision.hca is not None and decision.hca.hcas
    no_rate = decide(_rdma_node(RdmaPort(*(good.__dict__[k] if k != "rate" else None
                                           for k in good.__dataclass_fields__))))
    assert no_rate.get("NCCL_IB_HCA") == netenv.EnvVar(
        "NCCL_IB_HCA", "=mlx5_0:1", "detected", "Ethernet ports ACTIVE/LinkUp at ?")
    none = decide(_rdma_node(down))
    assert none.get("NCCL_IB_DISABLE") == netenv.EnvVar(
        "NCCL_IB_DISABLE", "1", "detected", "no usable RDMA port (mlx5_1:1: state 1: DOWN)")
    assert none.warnings == ("node1: RDMA devices present but none usable: NCCL will use TCP "
                             "sockets (mlx5_1:1: state 1: DOWN)",)
    efa = decide(_rdma_node(_roce("rdmap16s27", "", (), driver="efa")))
    assert efa.warnings == ("node1: AWS EFA found; dtrain sets no NCCL_IB_* (aws-ofi-nccl owns "
                            "the transport; see hostfiles/profiles/aws-efa.yaml)",)
    assert decide(_rdma_node(_roce("mlx5_0", "ens2f0", BASIC[:2]))).errors == (
        "mlx5_0:1: no RoCE v2 GID with a routable address on ens2f0; NCCL would fall "
        "back to index 0",)
    vlan = decide(_rdma_node(_roce("mlx5_0", "ens2f0", VLAN_FIRST))).get("NCCL_IB_GID_INDEX")
    assert vlan is not None and (vlan.source, vlan.exported) == ("detected", True)


def test_the_port_under_the_socket_interface_is_left_to_the_sockets() -> None:
    # the HCA whose netdev carries the bootstrap/socket traffic is the front-end NIC
    decision = decide(_rdma_node(_roce("mlx5_0", "ens2f0", BASIC),
                                 _roce("mlx5_1", "eth0", BASIC)))
    assert decision.exports()["NCCL_IB_HCA"] == "=mlx5_0:1"
    assert decision.hca is not None and [n for n, _ in decision.hca.excluded] == ["mlx5_1:1"]


def test_vendor_files_whole() -> None:
    one = node("n", iface("eth0", "198.18.0.12/24"), files=("/opt/microsoft/ndv5-topo.xml",),
               routes={MASTER_IP: route(MASTER_IP, "eth0")})
    assert decide(one).get("NCCL_TOPO_FILE") == netenv.EnvVar(
        "NCCL_TOPO_FILE", "/opt/microsoft/ndv5-topo.xml", "detected",
        "Azure ND VM: the VM shows a virtual PCI topology")
    assert decide(one).warnings == ()
    many = node("n", iface("eth0", "198.18.0.12/24"), routes={MASTER_IP: route(MASTER_IP, "eth0")},
                files=("/opt/microsoft/ndv4-topo.xml", "/opt/microsoft/ndv5-topo.xml",
                       "/usr/local/gib/scripts/set_nccl_env.sh"))
    assert decide(many).warnings == (
        "n: several Azure topology files (/opt/microsoft/ndv4-topo.xml, "
        "/opt/microsoft/ndv5-topo.xml); set NCCL_TOPO_FILE with --env or a profile",
        "n: GCP gIB found; its /usr/local/gib/scripts/set_nccl_env.sh must be sourced before "
        "launch (not done by dtrain)")


def test_merge_env_reasons_and_warnings_whole_and_secret_values_hidden() -> None:
    detected = [netenv.EnvVar("NCCL_SOCKET_IFNAME", "=eth0", "detected", "route"),
                netenv.EnvVar("WANDB_API_KEY", "k-det", "detected", "why"),
                netenv.EnvVar("A", "1", "detected", "r")]
    final, warnings = netenv.merge_env(
        detected, profile={"NCCL_SOCKET_IFNAME": "eth1", "WANDB_API_KEY": "k-prof", "A": "1"},
        site={}, user={})
    assert [(v.value, v.source, v.reason) for v in final.values()] == [
        ("eth1", "profile", "profile"), ("k-prof", "profile", "profile"),
        ("1", "profile", "profile")]
    assert warnings == ["NCCL_SOCKET_IFNAME: profile sets eth1; detection chose =eth0 (route)",
                        "WANDB_API_KEY: profile sets ***; detection chose *** (why)"]
    final, warnings = netenv.merge_env(
        detected, profile=None,
        site={"NCCL_SOCKET_IFNAME": ("=bond0", "/etc/nccl.conf"),
              "WANDB_API_KEY": ("k-site", "env")},
        user={"WANDB_API_KEY": "k-user", "A": "2", "NEW": "x"},
        dtrain=[netenv.EnvVar("A", "0", "dtrain", "d"), netenv.EnvVar("RUN", "r1", "dtrain", "id")])
    assert {k: (v.value, v.source, v.reason, v.exported) for k, v in final.items()} == {
        "NCCL_SOCKET_IFNAME": ("=bond0", "site", "already set by /etc/nccl.conf", False),
        "WANDB_API_KEY": ("k-user", "user", "--env; forced over *** (env)", True),
        "A": ("2", "user", "--env; overrides 1 from detected", True),
        "NEW": ("x", "user", "--env", True),
        "RUN": ("r1", "dtrain", "id", True)}
    assert warnings == [
        "NCCL_SOCKET_IFNAME: /etc/nccl.conf sets =bond0, which stays in effect; dtrain would "
        "use =eth0 (detected: route)",
        "WANDB_API_KEY: env sets ***, which stays in effect; dtrain would use *** "
        "(detected: why)"]
    # a user value over a profile's names the profile as what it overrode
    final, _ = netenv.merge_env([], profile={"B": "1"}, site={}, user={"B": "2"},
                                profile_name="oci")
    assert final["B"].reason == "--env; overrides 1 from profile"


@pytest.mark.parametrize(("user", "warnings"), [
    pytest.param({"GLOO_SOCKET_IFNAME": "^lo"}, [
        "node1: GLOO_SOCKET_IFNAME=^lo (user): Gloo takes exact interface names only; '^'/'=' "
        "make it fail to find an address"], id="gloo-caret"),
    pytest.param({"GLOO_SOCKET_IFNAME": "=eth0"}, [
        "node1: GLOO_SOCKET_IFNAME==eth0 (user): Gloo takes exact interface names only; "
        "'^'/'=' make it fail to find an address"], id="gloo-equals"),
    pytest.param({"NCCL_SOCKET_IFNAME": ""}, [
        "node1: NCCL_SOCKET_IFNAME='' is ignored by NCCL (too short)"], id="nccl-empty"),
    pytest.param({"NCCL_SOCKET_IFNAME": "e"}, [
        "node1: NCCL_SOCKET_IFNAME='e' is ignored by NCCL (too short)"], id="nccl-one"),
    pytest.param({"NCCL_SOCKET_IFNAME": "ab"}, [], id="nccl-two-is-fine"),
    pytest.param({"NCCL_P2P_DISABLE": "1", "NCCL_ALGO": "Ring"}, [
        "node1: NCCL_P2P_DISABLE=1 (user) is a debugging knob; do not keep it set in production",
        "node1: NCCL_ALGO=Ring (user) is a debugging knob; do not keep it set in production"],
        id="debug-knobs"),
    pytest.param({"NCCL_IB_GID_INDEX": "2"}, [], id="gid-without-rdma-unchecked"),
])
def test_lint_messages_whole(user: dict[str, str], warnings: list[str]) -> None:
    assert list(decide(NODE1, user=user).warnings) == warnings


def test_a_gid_index_from_a_profile_or_not_a_number_is_checked() -> None:
    facts = _rdma_node(_roce("mlx5_0", "ens2f0", VLAN_FIRST))
    assert decide(facts, user={"NCCL_IB_GID_INDEX": "x"}).warnings == (
        "node1: NCCL_IB_GID_INDEX=x (user): not an integer: 'x'",)
    assert decide(facts, profile={"NCCL_IB_GID_INDEX": "2"}).warnings[-1] == (
        "node1: NCCL_IB_GID_INDEX=2 (profile): mlx5_0:1: GID 2 (192.168.0.5) is on ens2f0.100; "
        "the backend address is GID 3 (10.200.2.12 on ens2f0)")
    assert decide(facts, user={"NCCL_IB_GID_INDEX": "3"}).warnings == ()


def test_dtrain_variables_first_as_given_then_the_rest_by_name() -> None:
    decision = decide(NODE1, user={"B": "1"},
                      dtrain=[netenv.EnvVar("Z_RANK", "0", "dtrain", "r"),
                              netenv.EnvVar("A_ID", "x", "dtrain", "i")])
    assert [v.name for v in decision.env] == [
        "Z_RANK", "A_ID", "B", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "PYTHONUNBUFFERED"]
    assert decide(NODE1, no_auto={"PYTHONUNBUFFERED"}).get("PYTHONUNBUFFERED") is None


@pytest.mark.parametrize(("text", "message", "hint"), [
    pytest.param("- A=1\n", "<profile>: a profile is a mapping with an 'env:' key", None,
                 id="list"),
    pytest.param("", "<profile>: a profile is a mapping with an 'env:' key", None, id="empty"),
    pytest.param("envs:\n  A: 1\nzed: 2\n", "<profile>: unknown key(s) envs, zed",
                 "allowed: name, description, env", id="unknown-keys"),
    pytest.param("env: [A]\n", "<profile>: env: must be a mapping of NAME: value", None,
                 id="env-list"),
    pytest.param("env:\n  1BAD: x\n",
                 "<profile>: env.1BAD: '1BAD' is not a valid environment variable name", None,
                 id="bad-name"),
    pytest.param("env:\n  1: x\n", "<profile>: env.1: not a name", None, id="int-name"),
    pytest.param("env:\n  A: yes\n", "<profile>: env.A: must be a string or a number",
                 'quote it, e.g. "1"', id="bool"),
    pytest.param("env:\n  A: [1]\n", "<profile>: env.A: must be a string or a number",
                 'quote it, e.g. "1"', id="list-value"),
    pytest.param('env:\n  A: "a\\0b"\n', "<profile>: env.A: the value contains a NUL byte",
                 None, id="nul"),
])
def test_profile_errors_whole(text: str, message: str, hint: str | None) -> None:
    with pytest.raises(ConfigError) as err:
        parse_profile(text)
    assert (err.value.message, err.value.hint) == (message, hint)


def test_profile_yaml_errors_name_the_file_and_good_profiles_parse() -> None:
    with pytest.raises(ConfigError) as err:
        parse_profile("env: {a: [\n", "p.yaml")
    assert err.value.message.startswith("p.yaml: not valid YAML: while parsing a flow node")
    assert parse_profile("name: x\ndescription: y\n") == {}
    assert parse_profile("env:\n") == {}
    assert parse_profile("env:\n  A: 1.5\n  B: s\n") == {"A": "1.5", "B": "s"}


def test_profile_files_that_cannot_be_read(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b'env:\n  A: "\xff"\n')
    cases = {tmp_path / "nope.yaml": "cannot read profile: No such file or directory",
             tmp_path: "cannot read profile: Is a directory",
             bad: "not UTF-8 text (invalid start byte)"}
    for path, message in cases.items():
        with pytest.raises(ConfigError) as err:
            load_profile(path)
        assert (err.value.message, err.value.hint) == (f"{path}: {message}", None)
    good = tmp_path / "good.yaml"
    good.write_text("env:\n  NCCL_IB_TC: 41\n", encoding="utf-8")
    assert load_profile(str(good)) == {"NCCL_IB_TC": "41"}


def test_second_round_survivors() -> None:
    # socket_choice refuses a down interface unless told the job is single-node
    down = node("n7", iface("eth0", "10.0.0.7/24", operstate="down"),
                routes={MASTER_IP: route(MASTER_IP, "eth0")})
    with pytest.raises(PreflightFailed, match="is down"):
        netenv.socket_choice(down, MASTER_IP, False)
    # every excluded port is listed, "; " between them
    two_down = decide(_rdma_node(_roce("mlx5_1", "ens2f1", BASIC, state="1: DOWN"),
                                 _roce("mlx5_2", "ens2f2", BASIC, state="1: DOWN")))
    assert two_down.get("NCCL_IB_DISABLE") == netenv.EnvVar(
        "NCCL_IB_DISABLE", "1", "detected",
        "no usable RDMA port (mlx5_1:1: state 1: DOWN; mlx5_2:1: state 1: DOWN)")
    # "=" (NCCL's exact-match marker) is ignored on either side, and only "="
    for detected, profile, warns in [("eth0", "=eth0", False), ("=eth0", "eth0", False),
                                     ("X1", "X1", False), ("eth0=", "eth0", True)]:
        _, warnings = netenv.merge_env([netenv.EnvVar("NCCL_SOCKET_IFNAME", detected,
                                                      "detected", "r")],
                                       profile={"NCCL_SOCKET_IFNAME": profile}, site={}, user={})
        assert bool(warnings) is warns, (detected, profile)
    # a bad GID index does not hide the other lint warnings
    facts = _rdma_node(_roce("mlx5_0", "ens2f0", VLAN_FIRST))
    warnings = decide(facts, user={"NCCL_IB_GID_INDEX": "x", "GLOO_SOCKET_IFNAME": "^lo"}).warnings
    assert [w.split(":")[1].split("=")[0].strip() for w in warnings] == [
        "GLOO_SOCKET_IFNAME", "NCCL_IB_GID_INDEX"]
    # the profile's default name in reasons
    assert decide(NODE1, profile={"NCCL_IB_TC": "41"}).get("NCCL_IB_TC") == netenv.EnvVar(
        "NCCL_IB_TC", "41", "profile", "profile")


def test_a_bad_profile_file_is_named_in_the_error(tmp_path: Path) -> None:
    bad = tmp_path / "site.yaml"
    bad.write_text("envs: {}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_profile(bad)
    assert err.value.message == f"{bad}: unknown key(s) envs"


def test_the_user_layer_orders_gpu_selection_then_hostfile_then_the_run_s_own() -> None:
    """Lowest first: --include's CUDA_VISIBLE_DEVICES < the hostfile's env < --env (and
    what hosts/envfile merged under it); each value says where it came from. The online
    and the offline plan both take it from here."""
    from launcher.decide.runplan.netenv import GPU_SELECTION, user_layer

    user, sources = user_layer([0, 1], [("CUDA_VISIBLE_DEVICES", "3"), ("A", "h"), ("B", "h")],
                               "h.txt:2", {"A": "cli"}, {"A": "--env"})
    assert user == {"CUDA_VISIBLE_DEVICES": "3", "A": "cli", "B": "h"}
    assert sources == {"CUDA_VISIBLE_DEVICES": "hostfile h.txt:2", "A": "--env",
                       "B": "hostfile h.txt:2"}
    user, sources = user_layer([2], [], None, {}, {})
    assert (user, sources) == ({"CUDA_VISIBLE_DEVICES": "2"},
                               {"CUDA_VISIBLE_DEVICES": GPU_SELECTION})
    assert user_layer(None, [("X", "1")], None, {}, {}) == ({"X": "1"}, {"X": "hostfile env:"})
