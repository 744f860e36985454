"""`dtrain doctor`: each pure check on hand-built NodeFacts, then the command on the cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from launcher.commands import doctor
from launcher.commands.doctor import FAIL, OK, SKIP, WARN, CheckResult, Gathered, PortProbe
from launcher.decide.fabric import fabric_checks
from launcher.decide.fabric.checks import FIXES, MasterPick
from launcher.decide.runplan.facts import (
    UNLIMITED,
    Addr,
    Gid,
    Iface,
    NodeFacts,
    RdmaPort,
    Route,
    SiteVar,
)
from launcher.models import Host
from launcher.output.junit import to_junit
from launcher.output.report import to_json
from tests.reports import one_json_document, validate_json, validate_junit
from tests.util import assert_exit, dtrain, node_program

PROBE = node_program("probe")  # the bundle the nodes get
TREE = Path(__file__).parent / "data" / "sysfs" / "roce-vlan" / "infiniband"
GIB = 1 << 30
MASTER = "10.0.0.1"
FE80 = "fe80:0000:0000:0000:0ac0:ebff:fe3d:ca54"


# --------------------------------------------------------------------------- fixtures


def node(name: str, ip: str, *, ifname: str = "eth0", mtu: int = 1500,
         torch: str | None = "2.13.0+cu124", gpus: int = 8, memlock: int = UNLIMITED,
         shm: int | None = 32 * GIB, rdma: tuple[RdmaPort, ...] = (), t: float | None = 1000.0,
         route_dev: str | None = None, nccl: str | None = None) -> NodeFacts:
    """A healthy node on 10.0.0.0/24 whose route to MASTER leaves through ``ifname``."""
    ifaces = (Iface("lo", "unknown", 65536, 772, addrs=(Addr("inet", "127.0.0.1", 8),)),
              Iface(ifname, "up", mtu, 1, 1, addrs=(Addr("inet", ip, 24),)),
              Iface("docker0", "down", 1500, 1, 0, virtual=True, is_bridge=True,
                    addrs=(Addr("inet", "172.17.0.1", 16),)))
    if ip == MASTER:
        route = Route(MASTER, "lo", MASTER, None, "local", "ip")
    else:
        route = Route(MASTER, route_dev or ifname, ip, None, "unicast", "ip")
    return NodeFacts(hostname=name, python="3.11.7", python_executable="/opt/venv/bin/python",
                     torch_version=torch, nccl_version=nccl, interfaces=ifaces,
                     default_iface=ifname, routes={MASTER: route}, gpus=gpus,
                     gpu_driver="550.54" if gpus else None, rdma=rdma, shm_bytes=shm,
                     memlock=memlock, nofile=1048576, stack=8 << 20, time=t)


def cluster_facts(**overrides: NodeFacts) -> dict[str, NodeFacts]:
    """gpu1 (the master, 10.0.0.1) .. gpu3, healthy unless overridden."""
    facts = {"gpu1": node("gpu1", MASTER), "gpu2": node("gpu2", "10.0.0.2"),
             "gpu3": node("gpu3", "10.0.0.3")}
    facts.update(overrides)
    return facts


def by_host(rows: list[CheckResult], check: str | None = None) -> dict[str, CheckResult]:
    return {r.host: r for r in rows if check is None or r.check == check}


def ib_port(dev: str, *, state: str = "4: ACTIVE", rate: str = "400 Gb/sec (4X NDR)",
            link: str = "InfiniBand") -> RdmaPort:
    return RdmaPort(dev, 1, state, "5: LinkUp", link, rate, "mlx5_core", None, ())


def probe_rdma(ib_dir: Path) -> tuple[RdmaPort, ...]:
    """The probe's RDMA view of a fake /sys/class/infiniband (DTRAIN_IB_SYSFS), run for real."""
    env = {**os.environ, "DTRAIN_IB_SYSFS": str(ib_dir)}
    proc = subprocess.run([sys.executable, str(PROBE)], input='{"targets": []}\n', env=env,
                          capture_output=True, text=True, timeout=60, check=True)
    return NodeFacts.from_json(json.loads(proc.stdout)).rdma


def roce_node(name: str, ip: str, rdma: tuple[RdmaPort, ...], **kw: object) -> NodeFacts:
    """A node whose socket interface is eth0 and whose backend is ens2f0 (the tree's layout)."""
    base = node(name, ip, **kw)  # type: ignore[arg-type]
    backend = (Iface("ens2f0", "up", 9000, 1, 1, addrs=(Addr("inet", "10.200.2.10", 24),)),
               Iface("ens2f0.100", "up", 9000, 1, 1, virtual=True, lower=("ens2f0",),
                     addrs=(Addr("inet", "192.168.0.5", 24),)))
    return replace(base, interfaces=base.interfaces + backend, rdma=rdma)


# --------------------------------------------------------------------------- python, hostname


def test_localhost_is_local_not_ssh_connected(tmp_path: Path) -> None:
    """Issue 55 item 4: doctor printed `ssh localhost ok connected` with no sshd; localhost
    runs as a local process, and its row says so."""
    rows = doctor.check_ssh([Host("localhost"), Host("localhost", port=2222), Host("gpu1")],
                            {})
    assert [(r.host, r.check, r.status, r.detail) for r in rows] == [
        ("localhost", "local", OK, "runs locally as a subprocess; no ssh involved"),
        ("localhost:2222", "ssh", OK, "connected"), ("gpu1", "ssh", OK, "connected")]
    res = dtrain(["doctor", "-H", "localhost", "--no-color"])
    assert "connected" not in res.stdout + res.stderr
    assert any(line.split()[:3] == ["local", "localhost", "ok"]
               for line in res.stdout.splitlines()), res.stdout


def test_python_fails_naming_the_node_whose_probe_did_not_run() -> None:
    facts = cluster_facts()
    del facts["gpu2"]
    err = "probe failed: dtrain: /opt/venv/bin/python not found on this node"
    rows = by_host(doctor.check_python(facts, ["gpu1", "gpu2", "gpu3"], {"gpu2": err}))
    assert rows["gpu2"].status == FAIL and "not found" in rows["gpu2"].detail
    assert rows["gpu1"].status == OK and "3.11.7" in rows["gpu1"].detail


def test_setup_row_only_with_setup_and_its_failure_is_its_own() -> None:
    """Issue 24.9: a failed --setup is the setup row's FAIL; python is not run, not failed."""
    facts = cluster_facts()
    del facts["gpu2"]
    err = "--setup failed (exit 1): bash: /nonexist/bin/activate: No such file or directory"
    hosts = ["gpu1", "gpu2", "gpu3"]
    assert doctor.check_setup(None, hosts, facts, {}) == []
    rows = by_host(doctor.check_setup("source /nonexist/bin/activate", hosts, facts,
                                      {"gpu2": err}))
    assert rows["gpu2"].status == FAIL and rows["gpu2"].detail == err
    assert rows["gpu1"].status == OK and rows["gpu2"].fix
    python = by_host(doctor.check_python(facts, hosts, {"gpu2": err}))
    assert python["gpu2"].status == SKIP


def test_python_warns_when_probe_sections_failed() -> None:
    facts = {"gpu1": replace(node("gpu1", MASTER), errors={"rdma": "OSError: boom"})}
    row = doctor.check_python(facts, ["gpu1"])[0]
    assert row.status == WARN and "rdma: OSError: boom" in row.detail


def test_duplicate_hostnames_fail_naming_each_other() -> None:
    facts = cluster_facts(gpu3=node("GPU1", "10.0.0.3"))
    rows = by_host(doctor.check_hostnames(facts))
    assert rows["gpu1"].status == FAIL and "gpu3" in rows["gpu1"].detail
    assert rows["gpu3"].status == FAIL and "gpu1" in rows["gpu3"].detail
    assert rows["gpu2"] == CheckResult("gpu2", "hostname", OK, "gpu2")


# --------------------------------------------------------------------------- torch, nccl, gpu


def test_odd_torch_version_fails_naming_the_odd_node() -> None:
    facts = cluster_facts(gpu2=node("gpu2", "10.0.0.2", torch="2.12.1+cu124"))
    rows = by_host(doctor.check_torch(facts))
    assert rows["gpu2"].status == FAIL
    assert "2.12.1+cu124 here, 2.13.0+cu124 on gpu[1,3]" in rows["gpu2"].detail
    assert rows["gpu1"].status == rows["gpu3"].status == OK


def test_cpu_and_cuda_builds_of_one_version_differ() -> None:
    facts = cluster_facts(gpu3=node("gpu3", "10.0.0.3", torch="2.13.0+cpu"))
    assert by_host(doctor.check_torch(facts))["gpu3"].status == FAIL


def test_a_tie_goes_to_the_master_version() -> None:
    facts = {"gpu1": node("gpu1", MASTER), "gpu2": node("gpu2", "10.0.0.2", torch="2.12.0")}
    rows = by_host(doctor.check_torch(facts))
    assert rows["gpu1"].status == OK and rows["gpu2"].status == FAIL


def test_missing_torch_fails_on_that_node_only() -> None:
    facts = cluster_facts(gpu3=node("gpu3", "10.0.0.3", torch=None))
    rows = by_host(doctor.check_torch(facts))
    assert rows["gpu3"].status == FAIL
    assert rows["gpu3"].detail == "torch is not installed for /opt/venv/bin/python"
    assert rows["gpu1"].status == rows["gpu2"].status == OK


def test_nccl_versions_compared_only_when_known() -> None:
    assert {r.status for r in doctor.check_nccl(cluster_facts())} == {SKIP}
    facts = cluster_facts(gpu1=node("gpu1", MASTER, nccl="2.21.5"),
                          gpu2=node("gpu2", "10.0.0.2", nccl="2.21.5"),
                          gpu3=node("gpu3", "10.0.0.3", nccl="2.20.3"))
    rows = by_host(doctor.check_nccl(facts))
    assert rows["gpu3"].status == FAIL and "gpu[1-2]" in rows["gpu3"].detail
    assert rows["gpu1"].status == OK


def test_gpus_warn_when_absent_and_fail_below_slots() -> None:
    facts = cluster_facts(gpu2=node("gpu2", "10.0.0.2", gpus=0),
                          gpu3=node("gpu3", "10.0.0.3", gpus=4))
    rows = by_host(doctor.check_gpus(facts, {"gpu1": 8, "gpu2": 2, "gpu3": 8}))
    assert rows["gpu1"].status == OK and "8 GPU(s), driver 550.54" in rows["gpu1"].detail
    assert rows["gpu2"].status == WARN and "CPU only" in rows["gpu2"].detail
    assert rows["gpu3"].status == FAIL and "slots=8" in rows["gpu3"].detail


def test_a_node_with_fewer_gpus_than_its_peers_warns() -> None:
    facts = cluster_facts(gpu3=node("gpu3", "10.0.0.3", gpus=7))
    row = by_host(doctor.check_gpus(facts))["gpu3"]
    assert row.status == WARN and "8 on gpu[1-2]" in row.detail


# --------------------------------------------------------------------------- network


def test_master_and_socket_interfaces_on_a_healthy_cluster() -> None:
    facts = cluster_facts(gpu3=node("gpu3", "10.0.0.3", ifname="ens1f0"))
    pick = doctor.pick_master(facts)
    assert pick is not None and pick.host == "gpu1" and pick.addr == MASTER
    assert doctor.check_master(pick)[0].status == OK
    rows = by_host(doctor.check_socket(facts, pick))
    assert {h: r.status for h, r in rows.items()} == {"gpu1": OK, "gpu2": OK, "gpu3": OK}
    assert rows["gpu3"].detail.startswith("ens1f0 (route to 10.0.0.1 via ens1f0")


def test_socket_toward_the_master_over_docker0_fails() -> None:
    facts = cluster_facts(gpu2=node("gpu2", "10.0.0.2", route_dev="docker0"))
    pick = doctor.pick_master(facts)
    rows = by_host(doctor.check_socket(facts, pick))
    assert rows["gpu2"].status == FAIL and "docker0" in rows["gpu2"].detail
    assert rows["gpu1"].status == OK


def test_unreachable_master_names_the_worker() -> None:
    bad = replace(node("gpu3", "10.0.0.3"),
                  routes={MASTER: Route(MASTER, None, None, None, "unreachable", "ip",
                                        "Network is unreachable")})
    facts = cluster_facts(gpu3=bad)
    pick = doctor.pick_master(facts)
    assert pick is not None and pick.addr is None
    master = doctor.check_master(pick)[0]
    assert master.status == FAIL and "gpu3 (Network is unreachable)" in master.detail
    rows = by_host(doctor.check_socket(facts, pick))
    assert rows["gpu3"].status == FAIL and rows["gpu2"].status == OK


def test_master_without_a_usable_address_fails() -> None:
    lo = Iface("lo", "unknown", 65536, 772, addrs=(Addr("inet", "127.0.0.1", 8),))
    lonely = replace(node("gpu1", MASTER), interfaces=(lo,))
    pick = doctor.pick_master(cluster_facts(gpu1=lonely))
    assert pick is not None and pick.addr is None and pick.candidates == ()
    assert doctor.check_master(pick)[0].status == FAIL
    rows = doctor.check_socket(cluster_facts(gpu1=lonely), pick)
    assert {r.status for r in rows} == {FAIL}


def test_mtu_mismatch_warns_on_the_odd_node() -> None:
    facts = cluster_facts(gpu2=node("gpu2", "10.0.0.2", mtu=9000))
    sockets = doctor.socket_choices(facts, doctor.pick_master(facts))
    rows = by_host(doctor.check_mtu(facts, sockets))
    assert rows["gpu2"].status == WARN
    assert rows["gpu2"].detail == "eth0 MTU 9000, 1500 on gpu[1,3]"
    assert rows["gpu1"].status == rows["gpu3"].status == OK


def test_master_port_rows_from_the_probe_answers() -> None:
    pick = doctor.pick_master(cluster_facts())
    probe_result = PortProbe(MASTER, 29500, {"ok": True, "port": 29500},
                             {"gpu2": {"ok": True, "ms": 0.4},
                              "gpu3": {"ok": False, "error": "timed out", "ms": 3000.0}})
    rows = by_host(doctor.check_master_port(probe_result, pick, ["gpu1", "gpu2", "gpu3"]))
    assert rows["gpu1"] == CheckResult("gpu1", "master_port", OK, "bound 10.0.0.1:29500")
    assert rows["gpu2"].status == OK
    assert rows["gpu3"].status == FAIL and "timed out" in rows["gpu3"].detail


def test_master_port_that_cannot_be_bound_fails_on_the_master() -> None:
    pick = doctor.pick_master(cluster_facts())
    bad = PortProbe(MASTER, 22, {"ok": False, "error": "OSError: [Errno 98] in use"})
    rows = by_host(doctor.check_master_port(bad, pick, ["gpu1", "gpu2", "gpu3"]))
    assert rows["gpu1"].status == FAIL and "in use" in rows["gpu1"].detail
    assert rows["gpu2"].status == SKIP


# --------------------------------------------------------------------------- RDMA


def test_hca_equal_ports_everywhere_are_ok() -> None:
    ports = (ib_port("mlx5_0"), ib_port("mlx5_1"), ib_port("mlx5_2", state="1: DOWN"))
    facts = {h: replace(f, rdma=ports) for h, f in cluster_facts().items()}
    rows = by_host(doctor.check_hca(facts))
    assert {r.status for r in rows.values()} == {OK}
    assert rows["gpu1"].detail.startswith("=mlx5_0:1,mlx5_1:1 (2 x InfiniBand at 400 Gb/s)")
    assert "mlx5_2:1: state 1: DOWN" in rows["gpu1"].detail


def test_hca_port_down_on_one_node_fails_naming_it() -> None:
    good = (ib_port("mlx5_0"), ib_port("mlx5_1"))
    facts = {h: replace(f, rdma=good) for h, f in cluster_facts().items()}
    facts["gpu2"] = replace(facts["gpu2"], rdma=(ib_port("mlx5_0"),
                                                 ib_port("mlx5_1", state="1: DOWN")))
    rows = by_host(doctor.check_hca(facts))
    assert rows["gpu2"].status == FAIL
    assert "1 x InfiniBand at 400 Gb/s here, 2 x InfiniBand at 400 Gb/s on gpu[1,3]" \
        in rows["gpu2"].detail
    assert rows["gpu1"].status == OK


def test_hca_rate_mismatch_and_missing_rdma_fail() -> None:
    facts = {h: replace(f, rdma=(ib_port("mlx5_0"),)) for h, f in cluster_facts().items()}
    facts["gpu2"] = replace(facts["gpu2"], rdma=(ib_port("mlx5_0", rate="200 Gb/sec"),))
    facts["gpu3"] = replace(facts["gpu3"], rdma=())
    facts["gpu4"] = replace(node("gpu4", "10.0.0.4"), rdma=(ib_port("mlx5_0"),))
    rows = by_host(doctor.check_hca(facts))
    assert rows["gpu2"].status == FAIL and "200 Gb/s here" in rows["gpu2"].detail
    assert rows["gpu3"].status == FAIL and "no RDMA devices" in rows["gpu3"].detail
    assert rows["gpu1"].status == rows["gpu4"].status == OK


def test_hca_one_rdma_node_among_socket_nodes_is_the_odd_one() -> None:
    facts = cluster_facts()
    facts["gpu3"] = replace(facts["gpu3"], rdma=(ib_port("mlx5_0"),))
    rows = by_host(doctor.check_hca(facts))
    assert rows["gpu3"].status == FAIL
    assert rows["gpu3"].detail == ("1 x InfiniBand at 400 Gb/s here, no usable RDMA port on "
                                   "gpu[1-2]")
    assert rows["gpu1"].status == SKIP


def test_hca_skipped_without_rdma_and_warned_when_none_usable() -> None:
    assert {r.status for r in doctor.check_hca(cluster_facts())} == {SKIP}
    down = (ib_port("mlx5_0", state="1: DOWN"),)
    facts = {h: replace(f, rdma=down) for h, f in cluster_facts().items()}
    row = doctor.check_hca(facts)[0]
    assert row.status == WARN and "none usable" in row.detail


def test_rdma_with_memlock_limited_fails() -> None:
    ports = probe_rdma(TREE)
    facts = {"gpu1": roce_node("gpu1", MASTER, ports),
             "gpu2": roce_node("gpu2", "10.0.0.2", ports, memlock=64 << 20),
             "gpu3": node("gpu3", "10.0.0.3", memlock=64 << 20)}
    rows = by_host(doctor.check_memlock(facts))
    assert rows["gpu1"].status == OK
    assert rows["gpu2"].status == FAIL and "64 MiB with RDMA ports" in rows["gpu2"].detail
    assert rows["gpu3"].status == SKIP and "no RDMA" in rows["gpu3"].detail


def test_roce_gid_from_the_checked_in_tree() -> None:
    ports = probe_rdma(TREE)
    facts = {"gpu1": roce_node("gpu1", MASTER, ports), "gpu2": roce_node("gpu2", "10.0.0.2", ports)}
    sockets = doctor.socket_choices(facts, doctor.pick_master(facts))
    hca = by_host(doctor.check_hca(facts, sockets))
    assert hca["gpu2"].status == OK and hca["gpu2"].detail.startswith("=mlx5_1:1 (1 x RoCE")
    assert "front-end NIC" in hca["gpu2"].detail or "below the fastest" in hca["gpu2"].detail
    rows = by_host(doctor.check_roce_gid(facts, sockets))
    assert rows["gpu2"].status == OK
    assert "backend GID 5 (10.200.2.10 on ens2f0)" in rows["gpu2"].detail


def test_roce_port_without_an_ipv4_gid_fails(tmp_path: Path) -> None:
    from tests.test_probe import make_ib_device

    make_ib_device(tmp_path / "ib", "mlx5_0", netdevs=("ens2f0",),
                   gids=[(0, FE80, "IB/RoCE v1", "ens2f0"), (1, FE80, "RoCE v2", "ens2f0")])
    facts = {"gpu1": roce_node("gpu1", MASTER, probe_rdma(tmp_path / "ib"))}
    row = doctor.check_roce_gid(facts)[0]
    assert row.status == FAIL and "no RoCE v2 GID with a routable address" in row.detail


def test_a_wrong_site_gid_index_fails_and_a_right_one_warns() -> None:
    ports = probe_rdma(TREE)
    base = roce_node("gpu1", MASTER, ports)
    wrong = replace(base, site_env=(SiteVar("NCCL_IB_GID_INDEX", "3", "/etc/nccl.conf"),))
    row = doctor.check_roce_gid({"gpu1": wrong}, {})[0]
    assert row.status == FAIL and "NCCL_IB_GID_INDEX=3 (/etc/nccl.conf)" in row.detail
    right = replace(base, site_env=(SiteVar("NCCL_IB_GID_INDEX", "5", "env"),))
    row = doctor.check_roce_gid({"gpu1": right}, {})[0]
    assert row.status == WARN and "should not need it" in row.detail


def test_gpudirect_warns_without_peermem() -> None:
    ports = (ib_port("mlx5_0"),)
    facts = {"gpu1": replace(node("gpu1", MASTER), rdma=ports),
             "gpu2": replace(node("gpu2", "10.0.0.2"), rdma=ports,
                             files=("/sys/module/nvidia_peermem",)),
             "gpu3": node("gpu3", "10.0.0.3")}
    rows = by_host(doctor.check_gpudirect(facts))
    assert rows["gpu1"].status == WARN and rows["gpu2"].status == OK
    assert rows["gpu3"].status == SKIP


# --------------------------------------------------------------------------- limits, clock


def test_small_shm_warns() -> None:
    facts = cluster_facts(gpu2=node("gpu2", "10.0.0.2", shm=64 << 20),
                          gpu3=node("gpu3", "10.0.0.3", shm=None))
    rows = by_host(doctor.check_shm(facts))
    assert rows["gpu1"].status == OK
    assert rows["gpu2"].status == WARN and "64 MiB" in rows["gpu2"].detail
    assert rows["gpu3"].status == WARN


def test_unlimited_stack_warns() -> None:
    facts = {"gpu1": replace(node("gpu1", MASTER), stack=UNLIMITED)}
    row = doctor.check_limits(facts)[0]
    assert row.status == WARN and "stack unlimited" in row.detail
    newer = {"gpu1": replace(facts["gpu1"], nccl_version="2.28.3")}
    assert doctor.check_limits(newer)[0].status == OK


def test_clock_skew_beyond_the_rtt_window_warns() -> None:
    facts = cluster_facts(gpu2=node("gpu2", "10.0.0.2", t=1003.5),
                          gpu3=node("gpu3", "10.0.0.3", t=None))
    timing = {"gpu1": (999.9, 1000.1), "gpu2": (999.9, 1000.2), "gpu3": (999.9, 1000.1)}
    rows = by_host(doctor.check_clock(facts, timing))
    assert rows["gpu1"].status == OK and rows["gpu1"].detail.startswith("offset +0 ms")
    assert rows["gpu2"].status == WARN and "3.3 s ahead of" in rows["gpu2"].detail
    assert rows["gpu3"].status == SKIP


# --------------------------------------------------------------------------- composition


def test_fast_checks_subset_and_order() -> None:
    facts = cluster_facts(gpu2=node("gpu2", "10.0.0.2", torch="2.12.0"),
                          gpu3=node("gpu3", "10.0.0.3", shm=1 << 20))
    hosts = [Host("gpu1"), Host("gpu2"), Host("gpu3"), Host("gpu4")]
    rows = doctor.fast_checks(facts, hosts)
    assert {r.check for r in rows} == set(doctor.FAST_CHECKS)
    assert [r.host for r in rows if r.check == "python"] == ["gpu1", "gpu2", "gpu3", "gpu4"]
    bad = {(r.host, r.check) for r in doctor.failures(rows)}
    assert bad == {("gpu4", "python"), ("gpu2", "torch")}
    assert by_host(rows, "shm")["gpu3"].status == WARN
    message = doctor.failure_message(rows)
    assert message is not None and "gpu2: torch: torch 2.12.0 here" in message
    assert doctor.failure_message(doctor.fast_checks(cluster_facts(), ["gpu1"])) is None


def test_evaluate_orders_rows_check_by_check_and_skips_unreached_nodes() -> None:
    hosts = tuple(Host(h) for h in ("gpu1", "gpu2", "gpu3", "gpu4"))
    facts = cluster_facts()
    del facts["gpu3"]
    g = Gathered(hosts, connect_errors={"gpu4": "timed out connecting after 2 s"},
                 probe_errors={"gpu3": "probe failed: dtrain: python3 not found"},
                 facts=facts, timing=dict.fromkeys(facts, (999.9, 1000.1)),
                 master=doctor.pick_master(facts),
                 port=PortProbe(MASTER, 29500, {"ok": True, "port": 29500},
                                {"gpu2": {"ok": True, "ms": 1.0}}))
    rows = doctor.evaluate(g)
    checks = list(dict.fromkeys(r.check for r in rows))
    assert checks == [c for c in doctor.CHECKS if c in checks]
    assert by_host(rows, "ssh")["gpu4"].status == FAIL
    assert "gpu4" not in by_host(rows, "python")
    assert by_host(rows, "python")["gpu3"].status == FAIL
    assert {r.host for r in rows if r.check == "torch"} == {"gpu1", "gpu2"}
    assert doctor.exit_code(rows) == 255


# --------------------------------------------------------------------------- every row whole
# Each check on one set of nodes that reaches every branch, compared row by row (host,
# check, status, detail): the words a user reads are the check's output, so a changed word,
# a dropped clause or a wrong threshold fails here (issue #25, mutation score).


def rows_of(rows: list[CheckResult]) -> list[tuple[str, str, str, str]]:
    return [(r.host, r.check, r.status, r.detail) for r in rows]


def test_ssh_and_setup_rows_whole() -> None:
    hosts = [Host("gpu1"), "gpu2", Host("gpu3", user="u")]
    assert rows_of(doctor.check_ssh(hosts, {"gpu2": "timed out connecting after 2 s"})) == [
        ("gpu1", "ssh", OK, "connected"),
        ("gpu2", "ssh", FAIL, "timed out connecting after 2 s"),
        ("gpu3", "ssh", OK, "connected")]
    facts = cluster_facts()
    del facts["gpu2"]
    assert doctor.check_setup("", ["gpu1"], facts, {}) == []
    rows = doctor.check_setup("source venv/bin/activate", [Host("gpu1"), "gpu2", "gpu3", "gpu4"],
                              facts, {"gpu4": "--setup failed (exit 3)"})
    assert rows_of(rows) == [
        ("gpu1", "setup", OK, "ran (exit 0)"),
        ("gpu2", "setup", SKIP, "not known: the node program did not start (see python)"),
        ("gpu3", "setup", OK, "ran (exit 0)"),
        ("gpu4", "setup", FAIL, "--setup failed (exit 3)")]


def test_python_rows_whole() -> None:
    facts = {"a": replace(node("a", MASTER), python=None, python_executable=None),
             "c": replace(node("c", "10.0.0.3"), errors={"rdma": "OSError: x", "gpu": "boom"}),
             "d": node("d", "10.0.0.4")}
    rows = doctor.check_python(facts, ["b0", "a", "b1", "b2", "c", "d"],
                               {"b0": "--setup failed (exit 1)", "b2": "probe failed: x"})
    assert rows_of(rows) == [
        ("b0", "python", SKIP, "not run: --setup failed"),
        ("a", "python", OK, "Python ?"),
        ("b1", "python", FAIL, "not probed"),
        ("b2", "python", FAIL, "probe failed: x"),
        ("c", "python", WARN, "Python 3.11.7 (/opt/venv/bin/python); probe sections failed: "
                              "gpu: boom, rdma: OSError: x"),
        ("d", "python", OK, "Python 3.11.7 (/opt/venv/bin/python)")]
    # a node without facts and without an error is "not probed" also with no error map
    assert rows_of(doctor.check_python({}, ["b"])) == [("b", "python", FAIL, "not probed")]


def test_hostname_rows_whole() -> None:
    facts = {"a": node("", MASTER), "b": node("Gpu", "10.0.0.2"), "c": node("gpu", "10.0.0.3"),
             "d": node("GPU", "10.0.0.4"), "e": node("e", "10.0.0.5")}
    assert rows_of(doctor.check_hostnames(facts)) == [
        ("a", "hostname", WARN, "the node reported no hostname"),
        ("b", "hostname", FAIL, "Gpu is also the hostname of c,d: the same machine listed twice?"),
        ("c", "hostname", FAIL, "gpu is also the hostname of b,d: the same machine listed twice?"),
        ("d", "hostname", FAIL, "GPU is also the hostname of b,c: the same machine listed twice?"),
        ("e", "hostname", OK, "e")]


def test_torch_and_nccl_rows_whole() -> None:
    nowhere = {"a": replace(node("a", MASTER, torch=None), python_executable=None),
               "b": node("b", "10.0.0.2", torch=None)}
    assert rows_of(doctor.check_torch(nowhere)) == [
        ("a", "torch", FAIL, "torch is not installed for the node's python"),
        ("b", "torch", FAIL, "torch is not installed for /opt/venv/bin/python")]
    facts = {"a": node("a", MASTER, torch="2.12.0"), "b": node("b", "10.0.0.2"),
             "c": node("c", "10.0.0.3"), "d": node("d", "10.0.0.4", torch=None)}
    assert rows_of(doctor.check_torch(facts)) == [
        ("a", "torch", FAIL, "torch 2.12.0 here, 2.13.0+cu124 on b,c: install one version "
                             "everywhere"),
        ("b", "torch", OK, "torch 2.13.0+cu124"),
        ("c", "torch", OK, "torch 2.13.0+cu124"),
        ("d", "torch", FAIL, "torch is not installed for /opt/venv/bin/python")]
    assert rows_of(doctor.check_nccl(cluster_facts(gpu1=node("gpu1", MASTER)))) == [
        (h, "nccl", SKIP, "no nvidia-nccl wheel") for h in ("gpu1", "gpu2", "gpu3")]
    facts = {"a": node("a", MASTER), "b": node("b", "10.0.0.2", nccl="2.21.5"),
             "c": node("c", "10.0.0.3", nccl="2.21.5"), "d": node("d", "10.0.0.4", nccl="2.20.3")}
    assert rows_of(doctor.check_nccl(facts)) == [
        ("a", "nccl", WARN, "no nvidia-nccl wheel here; 2.21.5 on b,c"),
        ("b", "nccl", OK, "NCCL 2.21.5"),
        ("c", "nccl", OK, "NCCL 2.21.5"),
        ("d", "nccl", FAIL, "NCCL 2.20.3 here, 2.21.5 on b,c")]


def test_gpu_rows_whole() -> None:
    assert doctor.check_gpus({}) == []
    no_driver = {"a": replace(node("a", MASTER), gpu_driver=None),
                 "b": replace(node("b", "10.0.0.2", gpus=4), gpu_driver=None)}
    assert rows_of(doctor.check_gpus(no_driver, {"a": 8})) == [
        ("a", "gpu", OK, "8 GPU(s)"), ("b", "gpu", WARN, "4 GPU(s); 8 on a")]
    facts = {"a": node("a", MASTER), "b": node("b", "10.0.0.2", gpus=0),
             "c": node("c", "10.0.0.3", gpus=4),
             "d": replace(node("d", "10.0.0.4"), gpu_driver="535.1"),
             "e": node("e", "10.0.0.5", gpus=4), "f": node("f", "10.0.0.6"),
             "g": replace(node("g", "10.0.0.7"), gpu_driver=None)}
    rows = doctor.check_gpus(facts, {"a": 8, "b": 1, "c": 2, "e": 5})
    assert rows_of(rows) == [
        ("a", "gpu", OK, "8 GPU(s), driver 550.54"),  # slots == GPUs is enough
        ("b", "gpu", WARN, "no GPU visible: CPU only (gloo backend)"),
        ("c", "gpu", WARN, "4 GPU(s), driver 550.54; 8 on a,d,f,g"),
        ("d", "gpu", WARN, "8 GPU(s), driver 535.1; driver 550.54 on a,c,e,f"),
        ("e", "gpu", FAIL, "4 GPU(s), driver 550.54, but slots=5"),
        ("f", "gpu", OK, "8 GPU(s), driver 550.54"),
        ("g", "gpu", OK, "8 GPU(s)")]


def test_memlock_shm_and_sizes_whole() -> None:
    ib = (ib_port("mlx5_0"),)
    facts = {"a": node("a", MASTER), "b": node("b", "10.0.0.2", memlock=64 << 10),
             "c": node("c", "10.0.0.3", rdma=ib),
             "d": replace(node("d", "10.0.0.4", rdma=ib), memlock=None),
             "e": node("e", "10.0.0.5", rdma=ib, memlock=8 * GIB + GIB // 2),
             "f": replace(node("f", "10.0.0.6"), memlock=None),
             "g": node("g", "10.0.0.7", memlock=1023), "h": node("h", "10.0.0.8", memlock=1024),
             "i": node("i", "10.0.0.9", memlock=1 << 20)}
    assert rows_of(doctor.check_memlock(facts)) == [
        ("a", "memlock", OK, "max locked memory unlimited"),
        ("b", "memlock", SKIP, "max locked memory 64 KiB (no RDMA in use: not needed)"),
        ("c", "memlock", OK, "max locked memory unlimited"),
        ("d", "memlock", WARN, "max locked memory unknown with RDMA ports"),
        ("e", "memlock", FAIL, "max locked memory 8.5 GiB with RDMA ports: NCCL needs unlimited "
                               "(limits.conf memlock, systemd LimitMEMLOCK, sshd UsePAM)"),
        ("f", "memlock", SKIP, "max locked memory unknown (no RDMA in use: not needed)"),
        ("g", "memlock", SKIP, "max locked memory 1023 B (no RDMA in use: not needed)"),
        ("h", "memlock", SKIP, "max locked memory 1 KiB (no RDMA in use: not needed)"),
        ("i", "memlock", SKIP, "max locked memory 1 MiB (no RDMA in use: not needed)")]
    facts = {"a": node("a", MASTER, shm=None), "b": node("b", "10.0.0.2", shm=GIB),
             "c": node("c", "10.0.0.3", shm=GIB - (1 << 20)),
             "d": node("d", "10.0.0.4", shm=3 * GIB // 2), "e": node("e", "10.0.0.5", shm=1536)}
    tip = "(< 1 GiB): NCCL may fail (docker run --shm-size / --ipc=host)"
    assert rows_of(doctor.check_shm(facts)) == [
        ("a", "shm", WARN, "/dev/shm size unknown (not mounted?)"),
        ("b", "shm", OK, "/dev/shm 1 GiB"),
        ("c", "shm", WARN, f"/dev/shm is 1023 MiB {tip}"),
        ("d", "shm", OK, "/dev/shm 1.5 GiB"),
        ("e", "shm", WARN, f"/dev/shm is 1.5 KiB {tip}")]


def test_limit_rows_whole_and_the_node_count_that_asks_for_more_files() -> None:
    facts = {f"n{i}": node(f"n{i}", f"10.0.0.{i + 1}") for i in range(16)}
    facts["n0"] = replace(facts["n0"], stack=UNLIMITED, nofile=32767)
    facts["n1"] = replace(facts["n1"], stack=UNLIMITED, nccl_version="2.27.7", nofile=32768)
    facts["n2"] = replace(facts["n2"], stack=UNLIMITED, nccl_version="2.28.3", nofile=None)
    facts["n3"] = replace(facts["n3"], stack=None, nofile=UNLIMITED)
    facts["n5"] = replace(facts["n5"], stack=UNLIMITED, nccl_version="2.28")
    stack = "stack unlimited: NCCL < 2.28 threads get only 2 MB (ulimit -s 8192)"
    assert rows_of(doctor.check_limits(facts)[:6]) == [
        ("n0", "limits", WARN, f"nofile 32767, stack unlimited; {stack}; nofile below 32768 "
                               "for 16 nodes"),
        ("n1", "limits", WARN, f"nofile 32768, stack unlimited; {stack}"),
        ("n2", "limits", OK, "nofile unknown, stack unlimited"),
        ("n3", "limits", OK, "nofile unlimited, stack unknown"),
        ("n4", "limits", OK, "nofile 1048576, stack 8 MiB"),
        ("n5", "limits", OK, "nofile 1048576, stack unlimited")]  # 2.28 itself is fixed
    fifteen = dict(list(facts.items())[:15])
    assert rows_of(doctor.check_limits(fifteen)[:1]) == [
        ("n0", "limits", WARN, f"nofile 32767, stack unlimited; {stack}")]


def test_gpudirect_rows_whole() -> None:
    ib = (ib_port("mlx5_0"),)
    efa = (RdmaPort("rdmap0", 1, "4: ACTIVE", "5: LinkUp", "Ethernet", "100 Gb/sec", "efa"),)
    peermem = ("/sys/module/nvidia_peermem",)
    facts = {"a": node("a", MASTER, rdma=ib, gpus=1),
             "b": replace(node("b", "10.0.0.2", rdma=ib, gpus=1), files=peermem),
             "c": replace(node("c", "10.0.0.3", rdma=ib, gpus=0), files=peermem),
             "d": replace(node("d", "10.0.0.4", rdma=efa), files=peermem),
             "e": node("e", "10.0.0.5")}
    assert rows_of(doctor.check_gpudirect(facts)) == [
        ("a", "gpudirect", WARN, "nvidia_peermem not loaded: GPUDirect RDMA only with DMA-BUF "
                                 "(modprobe nvidia_peermem)"),
        ("b", "gpudirect", OK, "nvidia_peermem loaded"),
        ("c", "gpudirect", SKIP, "needs GPUs and IB/RoCE ports"),
        ("d", "gpudirect", SKIP, "needs GPUs and IB/RoCE ports"),
        ("e", "gpudirect", SKIP, "needs GPUs and IB/RoCE ports")]


def test_clock_rows_whole_at_the_edges_of_the_window() -> None:
    """The window is [999, 1001]; only what lies outside it counts, warn above 1.0 s."""
    facts = {"a": node("a", MASTER, t=1002.0), "b": node("b", "10.0.0.2", t=997.5),
             "c": node("c", "10.0.0.3", t=1002.5), "d": node("d", "10.0.0.4", t=998.0),
             "e": node("e", "10.0.0.5", t=None), "f": node("f", "10.0.0.6", t=999.0),
             "g": node("g", "10.0.0.7")}
    rows = doctor.check_clock(facts, dict.fromkeys("abcdef", (999.0, 1001.0)))
    assert rows_of(rows) == [
        ("a", "clock", OK, "offset +1000 ms (+/- 1000 ms)"),
        ("b", "clock", WARN, "1.5 s behind the launcher (chrony/NTP not running?)"),
        ("c", "clock", WARN, "1.5 s ahead of the launcher (chrony/NTP not running?)"),
        ("d", "clock", OK, "offset -1000 ms (+/- 1000 ms)"),
        ("e", "clock", SKIP, "no timestamp"),  # no timestamp from the node
        ("f", "clock", OK, "offset +0 ms (+/- 1000 ms)"),
        ("g", "clock", SKIP, "no timestamp")]  # no timing for the node


def test_fast_checks_keep_nodes_missing_from_the_host_list_and_the_hint_names_the_fix() -> None:
    facts = cluster_facts(gpu3=node("gpu3", "10.0.0.3", torch="2.12.0"))
    rows = doctor.fast_checks(facts, ["gpu2", "gpu1"])
    assert [r.host for r in rows if r.check == "python"] == ["gpu2", "gpu1"]
    assert [r.host for r in rows if r.check == "torch"] == ["gpu2", "gpu1", "gpu3"]
    assert doctor.failure_message(rows) == ("gpu3: torch: torch 2.12.0 here, 2.13.0+cu124 on "
                                            "gpu[1-2]: install one version everywhere")
    from launcher.decide.fabric.checks import PYTHON_FIX, failure_hint
    assert failure_hint(rows) == PYTHON_FIX
    python = [CheckResult("gpu1", "python", FAIL, "not probed")]
    assert failure_hint(python) == PYTHON_FIX
    other = [CheckResult("gpu1", "shm", FAIL, "x"), CheckResult("gpu2", "python", WARN, "y")]
    assert failure_hint(other) == "`dtrain doctor` shows every check; --no-preflight skips these"
    assert PYTHON_FIX == ("point dtrain at a Python that has torch on those nodes: --python "
                          "/path/to/venv/bin/python, the hostfile's python=/path/to/python, or "
                          "--setup 'source /path/to/venv/bin/activate'")


def test_master_candidates_and_pick_whole() -> None:
    master = node("gpu1", MASTER)
    assert fabric_checks.master_candidates(master, "10.9.9.9", 3) == ["10.9.9.9"]
    assert fabric_checks.master_candidates(master, None, 1) == ["127.0.0.1"]
    assert fabric_checks.master_candidates(master, None, 2) == [MASTER]
    assert doctor.pick_master({}) is None
    one = {"gpu1": master}
    assert doctor.pick_master(one) == MasterPick("gpu1", "127.0.0.1", "single node",
                                                 candidates=("127.0.0.1",))
    assert doctor.pick_master(one, MASTER) == MasterPick("gpu1", MASTER, "single node",
                                                         candidates=(MASTER,))
    two = {"gpu1": master, "gpu2": node("gpu2", "10.0.0.2")}
    assert doctor.pick_master(two) == MasterPick(
        "gpu1", MASTER, "every worker (1) reaches it on-link", candidates=(MASTER,))
    routed = replace(node("gpu2", "10.0.0.2"),
                     routes={MASTER: Route(MASTER, "eth0", "10.0.0.2", "10.0.0.254", "unicast",
                                           "ip")})
    facts = {"gpu1": master, "gpu2": routed}
    pick = doctor.pick_master(facts)
    assert pick == MasterPick("gpu1", MASTER, "every worker reaches it, some through a gateway",
                              "master address 10.0.0.1 is routed (L3): gpu2 via 10.0.0.254",
                              None, (MASTER,))
    assert rows_of(doctor.check_master(pick)) == [
        ("gpu1", "master", WARN, "10.0.0.1: every worker reaches it, some through a gateway; "
                                 "master address 10.0.0.1 is routed (L3): gpu2 via 10.0.0.254")]
    assert rows_of(doctor.check_master(doctor.pick_master(two))) == [
        ("gpu1", "master", OK, "10.0.0.1: every worker (1) reaches it on-link")]
    assert rows_of(doctor.check_master(MasterPick("gpu1", None))) == [
        ("gpu1", "master", FAIL, "no master address")]
    assert doctor.check_master(None) == []
    assert rows_of(doctor.check_socket(facts, pick)) == [
        ("gpu1", "socket", OK, "eth0 (holds master address 10.0.0.1)"),
        ("gpu2", "socket", WARN, "eth0 (route to 10.0.0.1 via eth0 (gateway 10.0.0.254)); gpu2: "
                                 "10.0.0.1 is reached through gateway 10.0.0.254 (routed, not "
                                 "on-link)")]


def test_socket_rows_whole_without_a_master_and_for_one_node() -> None:
    # one node: the master is 127.0.0.1 on lo, which is fine when nothing leaves the node
    one = {"gpu1": node("gpu1", MASTER)}
    assert rows_of(doctor.check_socket(one, doctor.pick_master(one))) == [
        ("gpu1", "socket", OK, "lo (holds master address 127.0.0.1)")]
    facts = cluster_facts()
    nowhere = [(h, "socket", FAIL, "no master address to route to") for h in facts]
    assert rows_of(doctor.check_socket(facts, None)) == nowhere
    assert rows_of(doctor.check_socket(facts, MasterPick("gpu1", None, error="x"))) == nowhere
    # no choice, but a candidate: the sockets are tested against it
    first = MasterPick("gpu1", None, error="x", candidates=(MASTER,))
    assert rows_of(doctor.check_socket(facts, first)) == [
        ("gpu1", "socket", OK, "eth0 (holds master address 10.0.0.1)"),
        ("gpu2", "socket", OK, "eth0 (route to 10.0.0.1 via eth0)"),
        ("gpu3", "socket", OK, "eth0 (route to 10.0.0.1 via eth0)")]
    given = doctor.check_socket(facts, doctor.pick_master(facts), {"gpu1": "boom"})
    assert rows_of(given) == [("gpu1", "socket", FAIL, "boom"),
                              ("gpu2", "socket", FAIL, "not decided"),
                              ("gpu3", "socket", FAIL, "not decided")]


def test_mtu_rows_whole() -> None:
    facts = cluster_facts(gpu4=node("gpu4", "10.0.0.4", mtu=9000),
                          gpu5=node("gpu5", "10.0.0.5"))
    facts["gpu3"] = replace(facts["gpu3"], interfaces=tuple(
        replace(i, mtu=None) if i.name == "eth0" else i for i in facts["gpu3"].interfaces))
    sockets = doctor.socket_choices(facts, doctor.pick_master(facts))
    sockets["gpu5"] = "no route"
    assert rows_of(doctor.check_mtu(facts, sockets)) == [
        ("gpu1", "mtu", OK, "eth0 MTU 1500"), ("gpu2", "mtu", OK, "eth0 MTU 1500"),
        ("gpu3", "mtu", SKIP, "MTU of eth0 unknown"),
        ("gpu4", "mtu", WARN, "eth0 MTU 9000, 1500 on gpu[1-2]"),
        ("gpu5", "mtu", SKIP, "no socket interface")]
    assert doctor.check_mtu({}, {}) == []
    alone = {"gpu3": facts["gpu3"]}
    assert rows_of(doctor.check_mtu(alone, {"gpu3": sockets["gpu3"]})) == [
        ("gpu3", "mtu", SKIP, "MTU of eth0 unknown")]


def _roce(dev: str, netdev: str, gids: tuple[Gid, ...] = ()) -> RdmaPort:
    return RdmaPort(dev, 1, "4: ACTIVE", "5: LinkUp", "Ethernet", "100 Gb/sec (4X EDR)",
                    "mlx5_core", netdev, (netdev,), gids)


def test_hca_rows_whole_efa_and_the_front_end_nic() -> None:
    efa = (RdmaPort("rdmap0", 1, "4: ACTIVE", "5: LinkUp", "Ethernet", "100 Gb/sec", "efa"),)
    facts = {"a": node("a", MASTER, rdma=efa), "b": node("b", "10.0.0.2", rdma=efa),
             "c": node("c", "10.0.0.3", rdma=(ib_port("mlx5_0"),)),
             "d": node("d", "10.0.0.4", rdma=(ib_port("mlx5_0", state="1: DOWN"),)),
             "e": node("e", "10.0.0.5")}
    assert rows_of(doctor.check_hca(facts)) == [
        ("a", "hca", OK, "AWS EFA (aws-ofi-nccl owns the transport)"),
        ("b", "hca", OK, "AWS EFA (aws-ofi-nccl owns the transport)"),
        ("c", "hca", FAIL, "1 x InfiniBand at 400 Gb/s here, AWS EFA on a,b"),
        ("d", "hca", FAIL, "no usable RDMA port (mlx5_0:1: state 1: DOWN) here, AWS EFA on a,b"),
        ("e", "hca", FAIL, "no RDMA devices here, AWS EFA on a,b")]
    assert doctor.check_hca({}) == []
    # two RoCE ports at one rate, one of them under the socket interface: that one is left to
    # the sockets, but only when the socket choice is known
    two = (_roce("mlx5_0", "eth0"), _roce("mlx5_1", "ens2f0"))
    facts = {"a": node("a", MASTER, rdma=two), "b": node("b", "10.0.0.2", rdma=two)}
    sockets = doctor.socket_choices(facts, doctor.pick_master(facts))
    front = ("=mlx5_1:1 (1 x RoCE at 100 Gb/s); excluded mlx5_0:1: front-end NIC: its netdev "
             "eth0 carries the socket traffic")
    assert rows_of(doctor.check_hca(facts, sockets)) == [("a", "hca", OK, front),
                                                         ("b", "hca", OK, front)]
    both = "=mlx5_0:1,mlx5_1:1 (2 x RoCE at 100 Gb/s)"
    assert rows_of(doctor.check_hca(facts)) == [("a", "hca", OK, both), ("b", "hca", OK, both)]


def test_roce_gid_rows_whole() -> None:
    v4 = "0000:0000:0000:0000:0000:ffff:0ac8:020a"
    good = _roce("mlx5_1", "ens2f0", (Gid(0, FE80, "IB/RoCE v1", "ens2f0"),
                                      Gid(1, FE80, "RoCE v2", "ens2f0"),
                                      Gid(2, v4, "IB/RoCE v1", "ens2f0"),
                                      Gid(3, v4, "RoCE v2", "ens2f0")))
    bad = replace(good, gids=good.gids[:2])
    facts = {"a": roce_node("a", MASTER, (good,)),
             "b": replace(roce_node("b", "10.0.0.2", (bad,)),
                          site_env=(SiteVar("NCCL_IB_GID_INDEX", "x", "env"),)),
             "c": roce_node("c", "10.0.0.3", (good,), nccl="2.18.1"),
             "d": replace(roce_node("d", "10.0.0.4", (good,)),
                          site_env=(SiteVar("NCCL_IB_GID_INDEX", "3", "/etc/nccl.conf"),)),
             "e": roce_node("e", "10.0.0.5", (bad,)), "f": node("f", "10.0.0.6"),
             "g": roce_node("g", "10.0.0.7", (good,))}
    note = "mlx5_1:1: backend GID 3 (10.200.2.10 on ens2f0); NCCL 2.21+ picks the same"
    none = ("mlx5_1:1: no RoCE v2 GID with a routable address on ens2f0; NCCL would fall back "
            "to index 0")
    assert rows_of(doctor.check_roce_gid(facts)) == [
        ("a", "roce_gid", OK, note),
        ("b", "roce_gid", FAIL, f"{none}; NCCL_IB_GID_INDEX=x (env): not an integer: 'x'"),
        ("c", "roce_gid", OK, f"{note}; dtrain sets NCCL_IB_GID_INDEX=3"),  # NCCL < 2.21
        ("d", "roce_gid", WARN, "NCCL_IB_GID_INDEX=3 set by /etc/nccl.conf: NCCL 2.21+ should "
                                f"not need it ({note})"),
        ("e", "roce_gid", FAIL, none),
        ("f", "roce_gid", SKIP, "no RoCE ports in use"),
        ("g", "roce_gid", OK, note)]
    # the checked-in tree: NCCL's own rule would take the VLAN child's GID; a known NCCL >= 2.21
    # gets the backend subnet as ADDR_RANGE (the node's interfaces give its prefix), an unknown
    # one the index
    ports = probe_rdma(TREE)
    tree = {"a": roce_node("a", MASTER, ports),
            "b": roce_node("b", "10.0.0.2", ports, nccl="2.21.5"),
            "c": replace(roce_node("c", "10.0.0.3", ports, nccl="2.21.5"),
                         interfaces=node("c", "10.0.0.3").interfaces)}
    note = ("mlx5_1:1: backend GID 5 (10.200.2.10 on ens2f0); NCCL 2.21+ would pick 3 "
            "(192.168.0.5 on ens2f0.100)")
    assert rows_of(doctor.check_roce_gid(tree)) == [
        ("a", "roce_gid", OK, f"{note}; dtrain sets NCCL_IB_GID_INDEX=5"),
        ("b", "roce_gid", OK, f"{note}; dtrain sets NCCL_IB_ADDR_RANGE=10.200.2.0/24"),
        ("c", "roce_gid", OK, f"{note}; dtrain sets NCCL_IB_ADDR_RANGE=10.200.2.10/32")]


def test_master_port_rows_whole() -> None:
    pick = doctor.pick_master(cluster_facts())
    two = ["gpu1", "gpu2"]

    def skipped(why: str) -> list[tuple[str, str, str, str]]:
        return [(h, "master_port", SKIP, why) for h in two]

    assert rows_of(doctor.check_master_port(None, None, two)) == skipped("no master address")
    assert rows_of(doctor.check_master_port(None, MasterPick("gpu1", None), two)) == \
        skipped("no master address")
    candidate = MasterPick("gpu1", None, candidates=(MASTER,))
    assert rows_of(doctor.check_master_port(None, candidate, two)) == skipped("not tested")
    assert rows_of(doctor.check_master_port(None, pick, two)) == skipped("not tested")
    lost = PortProbe(MASTER, 0, "ssh: channel closed")
    assert rows_of(doctor.check_master_port(lost, pick, ["gpu1", "gpu2", "gpu3"])) == [
        ("gpu1", "master_port", FAIL, "cannot bind 10.0.0.1: ssh: channel closed"),
        ("gpu2", "master_port", SKIP, "master port not bound"),
        ("gpu3", "master_port", SKIP, "master port not bound")]
    # without a pick the master is the first host
    in_use = PortProbe(MASTER, 29500, {"ok": False, "error": "OSError: in use"})
    assert rows_of(doctor.check_master_port(in_use, None, ["gpu2", "gpu1"])) == [
        ("gpu2", "master_port", FAIL, "cannot bind 10.0.0.1:29500: OSError: in use"),
        ("gpu1", "master_port", SKIP, "master port not bound")]
    probe_result = PortProbe(MASTER, 29500, {"ok": True},
                             {"gpu2": {"ok": True, "ms": None}, "gpu3": {"ok": True, "ms": 12.345},
                              "gpu5": "probe failed: x",
                              "gpu6": {"ok": False, "error": "ECONNREFUSED"}})
    hosts = ["gpu1", "gpu2", "gpu3", "gpu4", "gpu5", "gpu6"]
    assert rows_of(doctor.check_master_port(probe_result, pick, hosts)) == [
        ("gpu1", "master_port", OK, "bound 10.0.0.1:29500"),
        ("gpu2", "master_port", OK, "reached 10.0.0.1:29500 in 0.0 ms"),
        ("gpu3", "master_port", OK, "reached 10.0.0.1:29500 in 12.3 ms"),
        ("gpu4", "master_port", FAIL, "10.0.0.1:29500: not tested"),
        ("gpu5", "master_port", FAIL, "10.0.0.1:29500: probe failed: x"),
        ("gpu6", "master_port", FAIL, "cannot connect to 10.0.0.1:29500: ECONNREFUSED")]


def test_fabric_rows_whole_second_round() -> None:
    """The survivors of the first mutation run of fabric_checks (docs/testing.md)."""
    unreachable = replace(node("gpu3", "10.0.0.3"), routes={MASTER: Route(
        MASTER, None, None, None, "unreachable", "ip", "Network is unreachable")})
    assert doctor.pick_master(cluster_facts(gpu3=unreachable)) == MasterPick(
        "gpu1", None, error="no master address is reachable from every worker -- 10.0.0.1: "
        "gpu3 (Network is unreachable)", candidates=(MASTER,))
    # two nodes are a multi-node job: an interface that is down fails
    down = node("gpu2", "10.0.0.2")
    down = replace(down, interfaces=tuple(replace(i, operstate="down") if i.name == "eth0"
                                          else i for i in down.interfaces))
    facts = {"gpu1": node("gpu1", MASTER), "gpu2": down}
    assert rows_of(doctor.check_socket(facts, doctor.pick_master(facts)))[1:] == [
        ("gpu2", "socket", FAIL, "eth0 (towards master 10.0.0.1) is down")]
    # every warning of a socket choice, joined
    vpn = replace(node("gpu2", "10.0.0.2", ifname="wg0"), routes={MASTER: Route(
        MASTER, "wg0", "10.0.0.2", "10.0.0.254", "unicast", "ip")})
    facts = {"gpu1": node("gpu1", MASTER), "gpu2": vpn}
    assert rows_of(doctor.check_socket(facts, doctor.pick_master(facts)))[1:] == [
        ("gpu2", "socket", WARN, "wg0 (route to 10.0.0.1 via wg0 (gateway 10.0.0.254)); gpu2: "
                                 "10.0.0.1 is reached through gateway 10.0.0.254 (routed, not "
                                 "on-link); gpu2: wg0 looks like a container/overlay interface")]
    # ports present, none usable: every reason, joined
    down_ports = (ib_port("mlx5_0", state="1: DOWN"),
                  RdmaPort("mlx5_1", 1, "4: ACTIVE", "2: Polling", "InfiniBand", "400 Gb/sec",
                           "mlx5_core"))
    facts = {"a": node("a", MASTER, rdma=down_ports), "b": node("b", "10.0.0.2"),
             "c": node("c", "10.0.0.3", rdma=down_ports)}
    assert rows_of(doctor.check_hca(facts)) == [
        ("a", "hca", WARN, "RDMA devices present but none usable (mlx5_0:1: state 1: DOWN; "
                           "mlx5_1:1: phys_state 2: Polling): NCCL uses TCP sockets"),
        ("b", "hca", SKIP, "no RDMA devices: NCCL uses TCP sockets"),
        ("c", "hca", WARN, "RDMA devices present but none usable (mlx5_0:1: state 1: DOWN; "
                           "mlx5_1:1: phys_state 2: Polling): NCCL uses TCP sockets")]
    # the master port's row is on the pick's host, wherever it is in the host list
    pick = doctor.pick_master(cluster_facts())
    bound = PortProbe(MASTER, 29500, {"ok": True}, {"gpu2": {"ok": True, "ms": 1.0}})
    assert rows_of(doctor.check_master_port(bound, pick, ["gpu2", "gpu1"])) == [
        ("gpu1", "master_port", OK, "bound 10.0.0.1:29500"),
        ("gpu2", "master_port", OK, "reached 10.0.0.1:29500 in 1.0 ms")]


def test_roce_gid_notes_of_every_port_and_the_front_end_port_left_to_the_sockets() -> None:
    v4 = "0000:0000:0000:0000:0000:ffff:0ac8:020a"
    eth0 = "0000:0000:0000:0000:0000:ffff:0a00:0001"
    front = _roce("mlx5_0", "eth0", (Gid(0, FE80, "IB/RoCE v1", "eth0"),
                                     Gid(1, FE80, "RoCE v2", "eth0"),
                                     Gid(2, eth0, "RoCE v2", "eth0")))
    back = _roce("mlx5_1", "ens2f0", (Gid(0, FE80, "IB/RoCE v1", "ens2f0"),
                                      Gid(1, FE80, "RoCE v2", "ens2f0"),
                                      Gid(2, v4, "IB/RoCE v1", "ens2f0"),
                                      Gid(3, v4, "RoCE v2", "ens2f0")))
    facts = {"gpu1": roce_node("gpu1", MASTER, (front, back)),
             "gpu2": roce_node("gpu2", "10.0.0.2", (front, back))}
    sockets = doctor.socket_choices(facts, doctor.pick_master(facts))
    backend = "mlx5_1:1: backend GID 3 (10.200.2.10 on ens2f0); NCCL 2.21+ picks the same"
    assert rows_of(doctor.check_roce_gid(facts, sockets)) == [
        (h, "roce_gid", OK, backend) for h in facts]
    both = f"mlx5_0:1: backend GID 2 (10.0.0.1 on eth0); NCCL 2.21+ picks the same; {backend}"
    assert rows_of(doctor.check_roce_gid(facts)) == [(h, "roce_gid", OK, both) for h in facts]
    # an IPv6-only port, NCCL version unknown: the family and the index, both named
    v6 = _roce("mlx5_0", "ens2f0", (Gid(0, FE80, "IB/RoCE v1", "ens2f0"),
                                    Gid(1, FE80, "RoCE v2", "ens2f0"),
                                    Gid(2, "fd01:0000:0000:0000:0000:0000:0000:0009", "RoCE v2",
                                        "docker0"),
                                    Gid(3, "fd00:0000:0000:0000:0000:0000:0000:0005", "RoCE v2",
                                        "ens2f0")))
    assert rows_of(doctor.check_roce_gid({"a": roce_node("a", MASTER, (v6,))})) == [
        ("a", "roce_gid", OK, "mlx5_0:1: only IPv6 GIDs; index 3 (fd00::5) on ens2f0; NCCL 2.21+ "
                              "would pick 2 (fd01::9 on docker0); dtrain sets "
                              "NCCL_IB_ADDR_FAMILY=AF_INET6, NCCL_IB_GID_INDEX=3")]


def test_exit_code_and_json_document() -> None:
    warn = [CheckResult("a", "shm", WARN, "small"), CheckResult("a", "torch", OK, "2.13")]
    assert doctor.exit_code(warn) == 0 and doctor.exit_code(warn, strict=True) == 1
    failed = [*warn, CheckResult("b", "torch", FAIL, "missing")]
    assert doctor.exit_code(failed) == 1
    doc = to_json(doctor.doctor_report(failed, ["a", "b"], started=1000.0, ended=1001.5,
                                       timing={"a": (1000.1, 1000.4)}))
    validate_json(doc, "doctor")
    assert doc["schema"] == "dtrain.doctor/1" and doc["outcome"] == "failed"
    assert doc["exit_code"] == 1 and doc["duration"] == 1.5
    assert doc["doctor"]["checks"] == [
        {"host": "a", "check": "shm", "status": "warn", "detail": "small",
         "fix": FIXES["shm"]},
        {"host": "a", "check": "torch", "status": "ok", "detail": "2.13", "fix": None},
        {"host": "b", "check": "torch", "status": "fail", "detail": "missing",
         "fix": FIXES["torch"]}]
    assert doc["doctor"]["counts"] == {"ok": 1, "warn": 1, "fail": 1, "skip": 0}
    nodes = {n["host"]: n for n in doc["nodes"]}
    assert nodes["a"]["status"] == "passed" and nodes["a"]["duration"] == 0.3
    assert nodes["b"]["status"] == "failed" and nodes["b"]["message"] == "torch: missing"
    assert nodes["b"]["details"]["checks"] == [
        {"name": "torch", "status": "fail", "message": "missing", "fix": FIXES["torch"]}]
    assert doc["root_cause"] == {"kind": "check", "host": "b", "rank": None, "exit_code": 1,
                                 "check": "torch", "summary": "b: torch: missing",
                                 "fix": FIXES["torch"]}
    strict = to_json(doctor.doctor_report(warn, ["a"], started=1.0, ended=2.0, strict=True))
    validate_json(strict, "doctor")
    assert strict["exit_code"] == 1 and strict["nodes"][0]["status"] == "failed"
    assert strict["root_cause"]["check"] == "shm"


def test_unreachable_node_is_an_error_and_the_root_cause() -> None:
    rows = [CheckResult("a", "ssh", OK, "connected"), CheckResult("a", "torch", FAIL, "old"),
            CheckResult("b", "ssh", FAIL, "timed out connecting")]
    rep = doctor.doctor_report(rows, ["a", "b"], started=1.0, ended=2.0)
    doc = to_json(rep)
    validate_json(doc, "doctor")
    assert doc["exit_code"] == 255
    assert {n["host"]: n["status"] for n in doc["nodes"]} == {"a": "failed", "b": "error"}
    assert doc["root_cause"]["kind"] == "unreachable" and doc["root_cause"]["host"] == "b"
    assert doc["root_cause"]["summary"] == "a: torch: old; b: ssh: timed out connecting"


def test_junit_has_one_case_per_node_and_check() -> None:
    rows = [CheckResult("a", "ssh", OK, "connected"), CheckResult("a", "shm", WARN, "small"),
            CheckResult("a", "hca", SKIP, "no RDMA"), CheckResult("a", "torch", FAIL, "old"),
            CheckResult("b", "ssh", FAIL, "timed out connecting")]
    rep = doctor.doctor_report(rows, ["a", "b"], started=1.0, ended=2.0)
    root = validate_junit(to_junit(rep, doctor.junit_cases(rows), node_cases=False))
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert list(cases) == ["a ssh", "a shm", "a hca", "a torch", "b ssh"]
    assert {c.get("classname") for c in cases.values()} == {"dtrain.doctor"}
    suite = root.find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"),
            suite.get("skipped")) == ("5", "1", "1", "1")
    failure = cases["a torch"].find("failure")
    assert failure.get("message") == "a: torch: old" and f"fix: {FIXES['torch']}" in failure.text
    assert cases["b ssh"].find("error").get("message") == "b: ssh: timed out connecting"
    assert len(cases["a shm"]) == 0  # a warning passes...
    strict = doctor.junit_cases(rows, strict=True)
    assert next(c for c in strict if c.name == "a shm").status == "failed"  # ...unless --strict


def test_plain_rendering_is_aligned(tmp_path: Path) -> None:
    rows = [CheckResult("node1", "torch", OK, "torch 2.13.0"),
            CheckResult("node10", "torch", FAIL, "torch is not installed")]
    out = tmp_path / "out.txt"
    with out.open("w") as fh:
        doctor.render_plain(rows, fh, per_node=True)
    assert out.read_text().splitlines() == ["torch  node1   ok    torch 2.13.0",
                                            "torch  node10  FAIL  torch is not installed"]


def test_doctor_on_localhost_without_ssh(tmp_path: Path) -> None:
    """localhost runs the probe as a subprocess: the whole command, no cluster needed."""
    junit = tmp_path / "doctor.xml"
    res = dtrain(["doctor", "-H", "localhost", "--python", sys.executable, "--json",
                  "--junit", str(junit)], timeout=120, env={**os.environ, "NO_COLOR": "1"})
    doc = one_json_document(res.stdout)
    validate_json(doc, "doctor")
    assert res.returncode == doc["exit_code"] == (0 if doc["outcome"] == "ok" else 1), res.stderr
    rows = {(c["host"], c["check"]): c for c in doc["doctor"]["checks"]}
    assert rows[("localhost", "local")]["status"] == OK  # no sshd: issue 55 item 4
    assert ("localhost", "ssh") not in rows
    assert rows[("localhost", "python")]["status"] == OK
    assert rows[("localhost", "master_port")]["detail"].startswith("bound 127.0.0.1:")
    assert "master_port  localhost  ok" in res.stderr  # the table went to stderr
    cases = {c.get("name") for c in validate_junit(junit.read_text()).iter("testcase")}
    assert {"localhost local", "localhost torch", "localhost clock"} <= cases


def test_doctor_colour_follows_the_shared_rule() -> None:
    """FORCE_COLOR colours a pipe (the rich table), NO_COLOR wins over it."""
    base = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    args = ["doctor", "-H", "localhost", "--python", sys.executable]
    forced = dtrain(args, timeout=120, env={**base, "FORCE_COLOR": "1"})
    assert "\x1b[" in forced.stdout and "┃" in forced.stdout, forced.stdout
    plain = dtrain(args, timeout=120, env={**base, "FORCE_COLOR": "1", "NO_COLOR": "1"})
    assert "\x1b[" not in plain.stdout and "master_port  localhost" in plain.stdout


# --------------------------------------------------------------------------- on the cluster


def _doctor(cluster, *args: str):  # type: ignore[no-untyped-def]
    return dtrain(["doctor", "--python", cluster.python, "--no-color", "--per-node", *args],
                  env=cluster.client_env(), timeout=120)


def _rows(stdout: str, check: str) -> dict[str, str]:
    """host -> the whole plain-text line for one check."""
    out = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] == check:
            out[parts[1]] = line
    return out


def _python_without_torch(cluster) -> str:  # type: ignore[no-untyped-def]
    """/usr/bin/python3 on Debian (no torch); else a fresh venv in the shared dir."""
    probe_cmd = "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is not None)"
    for cand in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.isfile(cand) and subprocess.run([cand, "-c", probe_cmd],
                                                   capture_output=True).returncode == 0:
            return cand
    venv = Path(cluster.shared_dir) / "doctor-no-torch"
    if not (venv / "bin" / "python").exists():
        subprocess.run([cluster.python, "-m", "venv", "--without-pip", str(venv)], check=True)
    return str(venv / "bin" / "python")


@pytest.mark.ssh
def test_four_nodes_fold_to_one_row_per_check_and_result(cluster) -> None:  # type: ignore[no-untyped-def]
    """Issue 40.4: 65 rows for 4 nodes before; now a row per check and result, failures
    first; --per-node as before; --json unchanged (every node's check)."""
    args = ["doctor", "-H", "node[1-4]", "--python", cluster.python, "--no-color"]
    res = dtrain(args, env=cluster.client_env(), timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    checks = {ln.split()[0] for ln in lines}
    assert len(lines) <= len(checks) + 2, res.stdout  # ~one row per check
    assert any(ln.split()[:3] == ["ssh", "node[1-4]", "ok"] for ln in lines), res.stdout
    assert "4 nodes, " in res.stderr
    per_node = dtrain([*args, "--per-node"], env=cluster.client_env(), timeout=120)
    assert len(per_node.stdout.splitlines()) >= 4 * (len(checks) - 1), per_node.stdout
    doc = one_json_document(dtrain([*args, "--json"], env=cluster.client_env(),
                                   timeout=120).stdout)
    validate_json(doc, "doctor")
    assert {c["host"] for c in doc["doctor"]["checks"] if c["check"] == "ssh"} == {
        "node1", "node2", "node3", "node4"}


@pytest.mark.ssh
def test_healthy_cluster_passes(cluster) -> None:  # type: ignore[no-untyped-def]
    res = _doctor(cluster, "-H", "node[1-3]")
    assert res.returncode == 0, res.stdout + res.stderr
    for check in ("ssh", "python", "torch", "socket", "master_port"):
        rows = _rows(res.stdout, check)
        assert set(rows) == {"node1", "node2", "node3"}, (check, res.stdout)
        assert all(" FAIL " not in line for line in rows.values())
    assert "eth0 (route to 198.18.0.11 via eth0)" in _rows(res.stdout, "socket")["node2"]
    assert "3 nodes, " in res.stderr


@pytest.mark.ssh
def test_healthy_cluster_json(cluster) -> None:  # type: ignore[no-untyped-def]
    res = _doctor(cluster, "-H", "node[1-3]", "--json")
    assert res.returncode == 0, res.stderr
    doc = one_json_document(res.stdout)
    validate_json(doc, "doctor")
    assert doc["outcome"] == "ok" and doc["root_cause"] is None
    assert [n["host"] for n in doc["nodes"]] == ["node1", "node2", "node3"]
    assert all(n["status"] == "passed" for n in doc["nodes"])
    assert {c["host"] for c in doc["doctor"]["checks"]} == {"node1", "node2", "node3"}
    assert all(c["status"] in ("ok", "warn", "skip") for c in doc["doctor"]["checks"])


@pytest.mark.ssh
def test_json_and_junit_name_the_unreachable_node(cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    junit = tmp_path / "doctor.xml"
    res = dtrain(["doctor", "--python", cluster.python, "-H", "node[1-2],198.18.0.9",
                  "--connect-timeout", "2", "--json", "--junit", str(junit)],
                 env=cluster.client_env(GITHUB_ACTIONS="true"), timeout=120)
    assert_exit(res, 255)
    doc = one_json_document(res.stdout)
    validate_json(doc, "doctor")
    assert doc["exit_code"] == 255 and doc["outcome"] == "failed"
    status = {n["host"]: n["status"] for n in doc["nodes"]}
    assert status == {"node1": "passed", "node2": "passed", "198.18.0.9": "error"}
    bad = next(n for n in doc["nodes"] if n["host"] == "198.18.0.9")
    assert bad["details"]["checks"][0]["name"] == "ssh"
    assert bad["details"]["checks"][0]["status"] == "fail"
    assert bad["details"]["checks"][0]["fix"] and "timed out" in bad["message"]
    assert doc["root_cause"]["host"] == "198.18.0.9"
    assert doc["root_cause"]["kind"] == "unreachable"
    assert "::error title=dtrain%3A host 198.18.0.9::dtrain doctor: ssh: " in res.stderr
    assert "node1::" not in res.stderr  # only the failed node is annotated
    root = validate_junit(junit.read_text())
    cases = {c.get("name"): c for c in root.iter("testcase")}
    error = cases["198.18.0.9 ssh"].find("error")
    assert error is not None and "198.18.0.9" in error.get("message")
    assert "fix: " in error.text
    assert cases["node2 torch"].find("failure") is None and "node2 master_port" in cases


@pytest.mark.ssh
def test_node_whose_python_lacks_torch_fails(cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    python = _python_without_torch(cluster)
    hostfile = tmp_path / "hosts.txt"
    hostfile.write_text(f"node1\nnode2 python={python}\nnode3\n")
    res = _doctor(cluster, "-f", str(hostfile))
    assert_exit(res, 1)
    torch_rows = _rows(res.stdout, "torch")
    assert " FAIL " in torch_rows["node2"] and "torch is not installed" in torch_rows["node2"]
    assert " ok " in torch_rows["node1"] and " ok " in torch_rows["node3"]


@pytest.mark.ssh
def test_missing_interpreter_fails_naming_the_node(cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    hostfile = tmp_path / "hosts.yaml"
    hostfile.write_text("hosts:\n  - host: node1\n  - host: node3\n"
                        "    python: /nonexistent/bin/python\n")
    res = _doctor(cluster, "-f", str(hostfile))
    assert_exit(res, 1)
    line = _rows(res.stdout, "python")["node3"]
    assert " FAIL " in line and "not found" in line


@pytest.mark.ssh
def test_unreachable_node_fails_by_name(cluster) -> None:  # type: ignore[no-untyped-def]
    res = _doctor(cluster, "-H", "node1,node2,dtuser@198.18.0.200", "--connect-timeout", "2")
    assert_exit(res, 255)
    line = _rows(res.stdout, "ssh")["198.18.0.200"]
    assert " FAIL " in line and "timed out" in line
    assert " ok " in _rows(res.stdout, "torch")["node2"]


@pytest.mark.ssh
def test_same_machine_twice_fails_hostname(cluster) -> None:  # type: ignore[no-untyped-def]
    res = _doctor(cluster, "-H", "node1,alt1,node2")
    assert_exit(res, 1)
    rows = _rows(res.stdout, "hostname")
    assert " FAIL " in rows["alt1"] and "node1" in rows["alt1"]
    assert " ok " in rows["node2"]


@pytest.mark.ssh
def test_master_port_in_use_fails_on_the_master(cluster) -> None:  # type: ignore[no-untyped-def]
    res = _doctor(cluster, "-H", "node[1-2]", "--master-port", "2222")  # node1's second sshd
    assert_exit(res, 1)
    rows = _rows(res.stdout, "master_port")
    assert " FAIL " in rows["node1"] and "198.18.0.11:2222" in rows["node1"]
    assert " skip " in rows["node2"]


def test_table_rows_fold_from_16_nodes_failures_first() -> None:
    """Issue 24.8: identical rows folded by hostlist, FAIL then warn then the rest; below
    16 nodes one row per node and check, as before; --failures keeps FAIL and warn."""
    from launcher.commands.doctor.report import table_rows

    hosts = [f"gpu{k:02d}" for k in range(1, 21)]
    rows = [CheckResult(h, "ssh", OK, "connected") for h in hosts]
    rows += [CheckResult(h, "torch", FAIL if h == "gpu07" else OK,
                         "torch is not installed" if h == "gpu07" else "torch 2.5.1")
             for h in hosts]
    rows += [CheckResult(h, "clock", WARN if h == "gpu03" else OK, f"offset +{i} ms")
             for i, h in enumerate(hosts)]
    table = table_rows(rows, len(hosts))
    assert table[:2] == [("torch", "gpu07", FAIL, "torch is not installed"),
                         ("clock", "gpu03", WARN, "offset +2 ms")]
    assert ("ssh", "gpu[01-20]", OK, "connected") in table
    assert ("torch", "gpu[01-06,08-20]", OK, "torch 2.5.1") in table
    assert ("clock", "gpu[01-02,04-20]", OK,
            "offset +0 ms; 18 other values (--per-node has each node's)") in table
    assert len(table) == 5
    assert [r[2] for r in table_rows(rows, len(hosts), failures_only=True)] == [FAIL, WARN]
    assert len(table_rows(rows, len(hosts), per_node=True)) == 60  # --per-node


def test_table_rows_fold_at_every_node_count() -> None:
    """Issue 40.4: 4 nodes fold too (``node[1-4] ok ...``), failures first; --per-node gives
    one row per node and check."""
    from launcher.commands.doctor.report import table_rows

    hosts = ["node1", "node2", "node3", "node4"]
    rows = [CheckResult(h, "ssh", OK, "connected") for h in hosts]
    rows += [CheckResult(h, "hostname", OK, h) for h in hosts]
    rows += [CheckResult(h, "torch", FAIL if h == "node3" else OK,
                         "torch is not installed" if h == "node3" else "torch 2.5.1")
             for h in hosts]
    table = table_rows(rows, len(hosts))
    assert table == [("torch", "node3", FAIL, "torch is not installed"),
                     ("ssh", "node[1-4]", OK, "connected"),
                     ("hostname", "node[1-4]", OK,
                      "node1; 3 other values (--per-node has each node's)"),
                     ("torch", "node[1-2,4]", OK, "torch 2.5.1")]
    assert len(table_rows(rows, len(hosts), per_node=True)) == 12
    assert len(table_rows(rows[:2], 2)) == 1  # even 2 nodes
