"""The node probe: stdlib/3.8 contract, readers on fake sysfs trees, the three modes."""

from __future__ import annotations

import ast
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from launcher.decide.runplan.facts import (
    Addr,
    Gid,
    Iface,
    NodeFacts,
    RdmaPort,
    Route,
    SiteVar,
    parse_version,
)
from launcher.nodeside import probe, probenet
from tests.util import assert_exit, cannot_run, node_program

PROBE = node_program("probe")  # the bundle the nodes get
DATA = Path(__file__).parent / "data" / "sysfs"
ZERO = "0000:0000:0000:0000:0000:0000:0000:0000"
FE80 = "fe80:0000:0000:0000:0ac0:ebff:fe3d:ca54"


def mapped(ip: str) -> str:
    """The GID text of an IPv4-mapped address, as the kernel prints it (%pI6)."""
    a, b, c, d = (int(x) for x in ip.split("."))
    return f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"


GidRow = tuple[int, str, str | None, str | None]  # index, gid, type (None: EINVAL), ndev


def make_ib_device(base: Path, name: str, *, driver: str = "mlx5_core",
                   netdevs: Sequence[str] = ("ens1f0",), state: str = "4: ACTIVE",
                   phys_state: str = "5: LinkUp", link_layer: str = "Ethernet",
                   rate: str = "200 Gb/sec (4X HDR)", gids: Sequence[GidRow] = (),
                   table_len: int = 8) -> Path:
    """Write one /sys/class/infiniband/<name> device with port 1 under ``base``.

    Unpopulated GID slots read as zeros and their attributes fail, as in the kernel
    (EINVAL there; here a dangling symlink, ENOENT, which the probe must treat the same).
    """
    dev = base / name
    pci = base.parent / "devices" / name  # the PCI function, outside the class dir
    (pci / "net").mkdir(parents=True)
    for nd in netdevs:
        (pci / "net" / nd).mkdir()
        (pci / "net" / nd / "ifindex").write_text("2\n")
    drv = base.parent / "drivers" / driver
    drv.mkdir(parents=True, exist_ok=True)
    (pci / "driver").symlink_to(os.path.relpath(drv, pci))
    dev.mkdir(parents=True)
    (dev / "device").symlink_to(os.path.relpath(pci, dev))
    port = dev / "ports" / "1"
    for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
        (port / sub).mkdir(parents=True)
    for key, value in (("state", state), ("phys_state", phys_state),
                       ("link_layer", link_layer), ("rate", rate)):
        (port / key).write_text(value + "\n")
    rows = {g[0]: g for g in gids}
    for idx in range(max([table_len, *[i + 1 for i in rows]])):
        _, gid, kind, ndev = rows.get(idx, (idx, ZERO, None, None))
        (port / "gids" / str(idx)).write_text(gid + "\n")
        for sub, attr in (("types", kind), ("ndevs", ndev)):
            target = port / "gid_attrs" / sub / str(idx)
            if attr is None:
                target.symlink_to("does-not-exist")
            else:
                target.write_text(attr + "\n")
    return dev


def roce_basic_gids(ip: str = "10.0.0.5", ndev: str = "ens1f0") -> list[GidRow]:
    """The usual layout: fe80 v1, fe80 v2, IPv4 v1, IPv4 v2."""
    return [(0, FE80, "IB/RoCE v1", ndev), (1, FE80, "RoCE v2", ndev),
            (2, mapped(ip), "IB/RoCE v1", ndev), (3, mapped(ip), "RoCE v2", ndev)]


def make_net(root: Path, name: str, *, operstate: str = "up", mtu: int = 1500,
             kind: int = 1, virtual: bool = False, bridge: bool = False,
             lower: Sequence[str] = ()) -> None:
    """Write /sys/class/net/<name> as a link into /sys/devices, like the kernel does."""
    parent = "virtual/net" if virtual else "pci0000:00/0000:00:03.0/net"
    real = root / "sys/devices" / parent / name
    real.mkdir(parents=True)
    for key, value in (("operstate", operstate), ("mtu", mtu), ("type", kind), ("carrier", 1)):
        (real / key).write_text(f"{value}\n")
    if bridge:
        (real / "bridge").mkdir()
    for low in lower:
        (real / f"lower_{low}").symlink_to(f"../{low}")
    link = root / "sys/class/net" / name
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(real, link.parent))


def fake_system(root: Path, *, environ: dict[str, str] | None = None,
                addrs: dict[str, list[dict[str, Any]]] | None = None,
                sources: dict[str, str] | None = None) -> probenet.System:
    """A System on a fake tree: no iproute2, ioctl and UDP answers from tables."""
    addrs = addrs or {}

    def ipv4_of(name: str) -> list[dict[str, Any]]:
        return [a for a in addrs.get(name, []) if a["family"] == "inet"]

    return probenet.System(root=str(root), environ=environ or {}, ip="", ipv4_of=ipv4_of,
                        source_for=lambda t: (sources or {}).get(t), home="/home/u")


def run_probe(params: dict[str, Any], *, env: dict[str, str] | None = None,
              python: str = sys.executable) -> dict[str, Any]:
    """Run probe.py as the nodes do: a subprocess, params on stdin, JSON on stdout."""
    proc = subprocess.run([python, str(PROBE)], input=json.dumps(params) + "\n",
                          capture_output=True, text=True, timeout=30,
                          env={**os.environ, **(env or {})}, check=False)
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


# --------------------------------------------------------------------------- the contract


def test_probe_is_stdlib_only_and_parses_as_python38() -> None:
    tree = ast.parse(PROBE.read_text(), feature_version=(3, 8))
    assert ast.get_docstring(tree) and "RUNS ON THE NODES" in (ast.get_docstring(tree) or "")
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative import in a node-side program"
            names.add((node.module or "").split(".")[0])
    names.discard("__future__")
    assert names <= sys.stdlib_module_names, names - sys.stdlib_module_names


def test_probe_runs_when_execed_by_a_bootstrap() -> None:
    boot = ("import sys; src = open(sys.argv[1]).read(); "
            "exec(compile(src, '<probe>', 'exec'), {'__name__': '__main__'})")
    proc = subprocess.run([sys.executable, "-c", boot, str(PROBE)],
                          input='{"mode": "facts", "python_check": false}\n',
                          capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["mode"] == "facts"


@pytest.mark.parametrize("as_spec", [False, True], ids=["params-on-stdin", "params-as-spec"])
def test_probe_through_the_wire_bootstrap(as_spec: bool) -> None:
    from launcher.nodeside import wire

    params = {"mode": "facts", "python_check": False, "targets": ["127.0.0.1"]}
    source = wire.program_source("probe")
    stdin = (wire.payload(source, params) if as_spec
             else wire.payload(source) + json.dumps(params).encode() + b"\n")
    proc = subprocess.run([sys.executable, "-u", "-c", wire.BOOTSTRAP], input=stdin,
                          capture_output=True, timeout=30, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["routes"]["127.0.0.1"]["type"] == "local"


def _python38() -> str | None:
    for cand in ("python3.8", os.path.expanduser("~/.pyenv/versions/3.8.18/bin/python3")):
        path: str | None = shutil.which(cand) or (cand if os.path.isfile(cand) else None)
        if path and subprocess.run([path, "-c", "pass"], capture_output=True,
                                   check=False).returncode == 0:
            return path
    return None


def test_probe_runs_on_python38(tmp_path: Path) -> None:
    python = _python38()
    if python is None:
        cannot_run("no Python 3.8 interpreter here (scripts/test installs one)")
    make_ib_device(tmp_path / "ib", "mlx5_0", gids=roce_basic_gids())
    out = run_probe({"targets": ["127.0.0.1"]}, env={"DTRAIN_IB_SYSFS": str(tmp_path / "ib")},
                    python=python)
    assert out["python"]["version"].startswith("3.8.")
    assert out["rdma"]["devices"][0]["ports"][0]["gids"][3]["type"] == "RoCE v2"
    assert out["errors"] == {}


def test_bad_params_answer_json_and_exit_2() -> None:
    proc = subprocess.run([sys.executable, str(PROBE)], input="[1, 2]\n", capture_output=True,
                          text=True, timeout=30, check=False)
    assert_exit(proc, 2)
    assert json.loads(proc.stdout)["ok"] is False


# --------------------------------------------------------------------------- facts mode


def test_facts_against_the_real_machine_parse_into_nodefacts(tmp_path: Path) -> None:
    out = run_probe({"targets": ["127.0.0.1"], "workdir": str(tmp_path)})
    assert set(out) >= {"probe_version", "hostname", "python", "packages", "interfaces",
                        "default_iface", "routes", "site_env", "gpus", "rdma", "shm_bytes",
                        "limits", "time", "workdir", "uid", "user", "errors"}
    assert out["errors"] == {}
    facts = NodeFacts.from_json(out)
    assert facts.iface("lo") is not None and facts.iface("lo").is_loopback  # type: ignore[union-attr]
    assert facts.routes["127.0.0.1"].type == "local"
    assert facts.routes["127.0.0.1"].dev == "lo"
    assert facts.workdir_ok is True
    assert facts.python == "{}.{}.{}".format(*sys.version_info[:3])


def test_site_env_from_files_and_environment(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/nccl.conf").write_text(
        "# admin settings\nNCCL_IB_TC=41\nNCCL_SOCKET_IFNAME = =bond0\n\njunk line\n")
    (tmp_path / "home/u").mkdir(parents=True)
    (tmp_path / "home/u/.nccl.conf").write_text("NCCL_IB_TC=106\n")
    sys_ = fake_system(tmp_path, environ={"NCCL_DEBUG": "WARN", "PATH": "/bin",
                                          "FI_PROVIDER": "efa", "TORCH_NCCL_X": "1",
                                          "NCCL_VERSION": "2.28.3-1"})  # an image's record
    rows = probenet.read_site_env(sys_)
    assert [(r["key"], r["value"], r["source"]) for r in rows] == [
        ("FI_PROVIDER", "efa", "env"),
        ("NCCL_DEBUG", "WARN", "env"),
        ("TORCH_NCCL_X", "1", "env"),
        ("NCCL_IB_TC", "106", "/home/u/.nccl.conf"),
        ("NCCL_IB_TC", "41", "/etc/nccl.conf"),
        ("NCCL_SOCKET_IFNAME", "=bond0", "/etc/nccl.conf"),
    ]
    facts = NodeFacts.from_json({"site_env": rows})
    assert facts.site_value("NCCL_IB_TC") == ("NCCL_IB_TC", "106", "/home/u/.nccl.conf")


def test_nccl_conf_file_replaces_the_user_file(tmp_path: Path) -> None:
    (tmp_path / "home/u").mkdir(parents=True)
    (tmp_path / "home/u/.nccl.conf").write_text("NCCL_IB_TC=106\n")
    (tmp_path / "site.conf").write_text("NCCL_IB_SL=3\n")
    sys_ = fake_system(tmp_path, environ={"NCCL_CONF_FILE": "/site.conf"})
    keys = [(r["key"], r["source"]) for r in probenet.read_site_env(sys_)]
    assert keys == [("NCCL_CONF_FILE", "env"), ("NCCL_IB_SL", "/site.conf")]


def _fake_node(root: Path) -> dict[str, list[dict[str, Any]]]:
    make_net(root, "lo", operstate="unknown", kind=772, virtual=True, mtu=65536)
    make_net(root, "ens1f0", mtu=9000)
    make_net(root, "ens1f0.100", virtual=True, lower=["ens1f0"])
    make_net(root, "docker0", operstate="down", virtual=True, bridge=True)
    (root / "proc/net").mkdir(parents=True)
    (root / "proc/net/route").write_text(
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
        "ens1f0\t00000000\t0100000A\t0003\t0\t0\t100\t00000000\t0\t0\t0\n"
        "ens1f0\t0000000A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
        "ens1f0.100\t0000A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
        "docker0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n")
    (root / "proc/net/if_inet6").write_text(
        "fe800000000000000ac0ebfffe3dca54 02 40 20 80   ens1f0\n"
        "00000000000000000000000000000001 01 80 10 80       lo\n")
    (root / "proc/driver/nvidia/gpus/0000:17:00.0").mkdir(parents=True)
    (root / "proc/driver/nvidia/gpus/0000:3d:00.0").mkdir(parents=True)
    (root / "proc/driver/nvidia/version").write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 2024\n")
    make_ib_device(root / "sys/class/infiniband", "mlx5_0", gids=roce_basic_gids())
    return {"lo": [{"family": "inet", "addr": "127.0.0.1", "prefixlen": 8, "scope": None}],
            "ens1f0": [{"family": "inet", "addr": "10.0.0.5", "prefixlen": 24, "scope": None}],
            "ens1f0.100": [{"family": "inet", "addr": "192.168.0.5", "prefixlen": 24,
                            "scope": None}],
            "docker0": [{"family": "inet", "addr": "172.17.0.1", "prefixlen": 16,
                         "scope": None}]}


def test_collect_facts_on_a_fake_tree_without_iproute2(tmp_path: Path) -> None:
    addrs = _fake_node(tmp_path)
    sys_ = fake_system(tmp_path, addrs=addrs, sources={"10.0.0.9": "10.0.0.5",
                                                       "8.8.8.8": "10.0.0.5"})
    out = probe.collect_facts({"targets": ["10.0.0.9", "10.0.0.5", "192.168.0.7", "8.8.8.8",
                                           "fd00::1", "not-an-ip"], "python_check": False},
                              sys_)
    assert out["errors"] == {}
    assert out["addr_method"] == "ioctl"
    facts = NodeFacts.from_json(out)
    ens = facts.iface("ens1f0")
    assert ens is not None and ens.mtu == 9000 and not ens.virtual
    assert ens.ipv4 == ("10.0.0.5",) and ens.ipv6 == ("fe80::ac0:ebff:fe3d:ca54",)
    vlan = facts.iface("ens1f0.100")
    assert vlan is not None and vlan.virtual and vlan.lower == ("ens1f0",)
    docker = facts.iface("docker0")
    assert docker is not None and docker.is_bridge and not docker.is_up
    assert facts.default_iface == "ens1f0"
    r = facts.routes
    assert (r["10.0.0.9"].dev, r["10.0.0.9"].src, r["10.0.0.9"].gateway) == (
        "ens1f0", "10.0.0.5", None)
    assert (r["10.0.0.5"].type, r["10.0.0.5"].dev) == ("local", "ens1f0")
    assert r["192.168.0.7"].dev == "ens1f0.100"  # the /24 beats the default route
    assert (r["8.8.8.8"].dev, r["8.8.8.8"].gateway) == ("ens1f0", "10.0.0.1")
    assert r["fd00::1"].type == "unreachable" and not r["fd00::1"].reachable
    assert r["not-an-ip"].error == "not an IP address"
    assert (facts.gpus, facts.gpu_driver) == (2, "550.54.15")
    assert [p.name for p in facts.rdma] == ["mlx5_0:1"]


def test_ip_route_get_local_answer_names_the_owning_interface(tmp_path: Path) -> None:
    ip_addr = [{"ifname": "lo", "addr_info": [{"family": "inet", "local": "127.0.0.1",
                                               "prefixlen": 8}]},
               {"ifname": "eth0", "addr_info": [{"family": "inet", "local": "198.18.0.11",
                                                 "prefixlen": 24, "scope": "global"}]}]
    answers = {
        ("addr",): (0, json.dumps(ip_addr), ""),
        ("route", "get", "198.18.0.11"): (0, json.dumps(
            [{"type": "local", "dst": "198.18.0.11", "dev": "lo", "prefsrc": "198.18.0.11"}]),
            ""),
        ("route", "get", "198.18.0.12"): (0, json.dumps(
            [{"dst": "198.18.0.12", "dev": "eth0", "prefsrc": "198.18.0.11"}]), ""),
        ("route", "get", "203.0.113.1"): (2, "", "RTNETLINK answers: Network is unreachable\n"),
    }

    def run(argv: list[str]) -> tuple[int, str, str]:
        assert argv[:2] == ["/fake/ip", "-j"]
        return answers[tuple(argv[2:])]

    make_net(tmp_path, "eth0")
    sys_ = probenet.System(root=str(tmp_path), environ={}, run=run, ip="/fake/ip", home="/h")
    out = probe.collect_facts({"targets": ["198.18.0.11", "198.18.0.12", "203.0.113.1"],
                               "python_check": False}, sys_)
    assert out["addr_method"] == "ip"
    routes = NodeFacts.from_json(out).routes
    assert (routes["198.18.0.11"].type, routes["198.18.0.11"].dev) == ("local", "eth0")
    assert routes["198.18.0.12"].reachable and routes["198.18.0.12"].src == "198.18.0.11"
    assert routes["203.0.113.1"].error and "unreachable" in routes["203.0.113.1"].error


# --------------------------------------------------------------------------- RDMA tree


def test_gid_table_skips_zero_rows_and_unreadable_attributes_are_absent(tmp_path: Path) -> None:
    gids = roce_basic_gids()
    gids[3] = (3, gids[3][1], None, "ens1f0")  # type read fails (EINVAL in a container)
    dev = make_ib_device(tmp_path, "mlx5_0", gids=gids)
    (dev / "ports/1/gid_attrs/ndevs/2").unlink()
    (dev / "ports/1/gid_attrs/ndevs/2").mkdir()  # EISDIR: another OSError, same answer
    rows = probenet.read_gids(str(dev / "ports/1"))
    assert [(g["index"], g["type"], g["ndev"]) for g in rows] == [
        (0, "IB/RoCE v1", "ens1f0"), (1, "RoCE v2", "ens1f0"), (2, "IB/RoCE v1", None),
        (3, None, "ens1f0")]


def test_rdma_devices_driver_netdevs_and_ports(tmp_path: Path) -> None:
    make_ib_device(tmp_path, "mlx5_1", netdevs=("ens2f0",), state="1: DOWN",
                   phys_state="3: Disabled", gids=roce_basic_gids(ndev="ens2f0"))
    make_ib_device(tmp_path, "efa_0", driver="efa", netdevs=(), link_layer="Unspecified")
    devices = probenet.read_rdma(str(tmp_path))
    assert [(d["name"], d["driver"], d["netdevs"]) for d in devices] == [
        ("efa_0", "efa", []), ("mlx5_1", "mlx5_core", ["ens2f0"])]
    port = devices[1]["ports"][0]
    assert (port["port"], port["state"], port["phys_state"], port["netdev"]) == (
        1, "1: DOWN", "3: Disabled", "ens2f0")


def test_checked_in_tree_through_the_subprocess() -> None:
    out = run_probe({"python_check": False},
                    env={"DTRAIN_IB_SYSFS": str(DATA / "roce-vlan" / "infiniband")})
    facts = NodeFacts.from_json(out)
    assert out["rdma"]["dir"].endswith("roce-vlan/infiniband")
    by_name = {p.name: p for p in facts.rdma}
    assert set(by_name) == {"mlx5_0:1", "mlx5_1:1", "mlx5_2:1"}
    assert by_name["mlx5_1:1"].netdev == "ens2f0"
    assert by_name["mlx5_2:1"].state == "1: DOWN"
    types = {g.index: g.type for g in by_name["mlx5_1:1"].gids}
    assert types[6] is None  # a dangling attribute link: absent, not an error
    assert out["errors"] == {}


# --------------------------------------------------------------------------- listen / connect


def _start_listener(port: int = 0) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    proc = subprocess.Popen([sys.executable, str(PROBE)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps({"mode": "listen", "addr": "127.0.0.1", "port": port}) + "\n")
    proc.stdin.flush()
    return proc, json.loads(proc.stdout.readline())


def test_listen_then_connect_then_stdin_eof_ends_the_listener() -> None:
    listener, hello = _start_listener()
    try:
        assert hello["ok"] is True and hello["port"] > 0
        for _ in range(2):  # accepted and closed, still listening
            out = run_probe({"mode": "connect", "addr": "127.0.0.1", "port": hello["port"],
                             "timeout": 2})
            assert out["ok"] is True and out["ms"] >= 0
    finally:
        assert listener.stdin is not None
        listener.stdin.close()
    assert listener.wait(timeout=10) == 0


def test_listen_on_a_busy_port_reports_the_error() -> None:
    listener, hello = _start_listener()
    try:
        second, answer = _start_listener(hello["port"])
        assert answer["ok"] is False and "Address already in use" in answer["error"]
        assert second.wait(timeout=10) == 0
    finally:
        assert listener.stdin is not None
        listener.stdin.close()
        listener.wait(timeout=10)


def test_connect_to_a_closed_port_fails_fast() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        out = run_probe({"mode": "connect", "addr": "127.0.0.1", "port": port, "timeout": 2})
    assert out["ok"] is False and "Refused" in out["error"] and out["ms"] < 2000


def _dist(root: Path, dirname: str, version: str | None, meta: str = "METADATA") -> None:
    d = root / dirname
    d.mkdir(parents=True)
    head = f"Metadata-Version: 2.1\nName: torch\n{f'Version: {version}' if version else ''}\n"
    (d / meta).write_text(head + "\nVersion: 9.9.9 (the body, not a header)\n")


def test_packages_are_read_as_importlib_metadata_reads_them(tmp_path: Path) -> None:
    """The probe finds torch's version without importing importlib.metadata (~15-35 ms of
    every probe): the same answer as ``metadata.version("torch")`` on the same path, the
    first directory on the path winning, the METADATA header over the directory's name, a
    develop install's egg-info, and none at all."""
    from importlib import metadata

    first, second, egg, empty = (tmp_path / n for n in ("first", "second", "egg", "empty"))
    _dist(first, "torch-2.4.0.dist-info", "2.4.0+cu121")
    _dist(first, "nvidia_nccl_cu12-2.21.5.dist-info", "2.21.5")
    _dist(second, "torch-2.1.0.dist-info", "2.1.0")
    _dist(egg, "torch.egg-info", "2.6.0a0+git", meta="PKG-INFO")
    empty.mkdir()
    cases = [[str(second), str(first)], [str(first), str(second)], [str(egg)], [str(empty)],
             [str(tmp_path / "missing"), str(second)]]
    for path in cases:
        # what metadata.version("torch") answers when sys.path is ``path``
        want = next((d.version for d in metadata.distributions(name="torch", path=path)), None)
        assert probe.read_packages(path)["torch"] == want, path
    assert probe.read_packages([str(first)])["nccl"] == "2.21.5"
    assert probe.read_packages([str(first)])["nccl_dist"] == "nvidia-nccl-cu12"
    real = probe.read_packages()["torch"]
    try:
        assert real == metadata.version("torch")
    except metadata.PackageNotFoundError:
        assert real is None


# --------------------------------------------------------------------------- NodeFacts, whole
# The launcher's side of the probe's answer (decide/runplan/facts.py): every field parsed from a
# full
# answer, every malformed field left at its default, and the properties the decisions read.


FULL_ANSWER: dict[str, Any] = {
    "hostname": "gpu7", "python": {"version": "3.11.7", "executable": "/opt/venv/bin/python"},
    "packages": {"torch": "2.13.0+cu124", "nccl": "2.21.5"},
    "interfaces": [
        {"name": "lo", "operstate": "unknown", "mtu": 65536, "type": 772, "carrier": 1,
         "addrs": [{"family": "inet", "addr": "127.0.0.1", "prefixlen": 8}]},
        {"name": "bond0.7", "operstate": "up", "mtu": "9000", "speed": 20000, "type": 1,
         "carrier": 1,
         "virtual": True, "is_bridge": False, "is_bond": True, "lower": ["ens1", "ens2"],
         "addrs": [{"family": "inet", "addr": "10.0.0.7", "prefixlen": 24},
                   {"family": "inet6", "addr": "fd00::7", "prefixlen": 64}]},
        "not a row"],
    "default_iface": "bond0.7",
    "routes": {"10.0.0.1": {"dev": "bond0.7", "src": "10.0.0.7", "gateway": "10.0.0.254",
                            "type": "", "method": "ip"},
               "10.9.9.9": {"error": "Network is unreachable", "type": "unreachable"}},
    "site_env": [{"key": "NCCL_DEBUG", "value": "INFO", "source": "env"},
                 {"key": "NCCL_DEBUG", "value": "WARN", "source": "/etc/nccl.conf"},
                 {"key": "NCCL_IB_HCA"}, "not a row"],
    "gpus": {"count": "8", "driver": "550.54"},
    "rdma": {"devices": [
        {"name": "mlx5_0", "driver": "mlx5_core", "netdevs": ["ens2f0"],
         "ports": [{"port": 1, "state": "4: ACTIVE", "phys_state": "5: LinkUp",
                    "link_layer": "Ethernet", "rate": "400 Gb/sec (4X NDR)", "netdev": "ens2f0",
                    "gids": [{"index": 3, "gid": "::ffff:10.200.2.10", "type": "RoCE v2",
                              "ndev": "ens2f0"}, {"gid": "fe80::1"}, "not a row"]},
                   "not a port", {"state": "1: DOWN"}]},
        "not a device", {"ports": [{"port": 2}]}]},
    "shm_bytes": 1 << 30, "limits": {"memlock": -1, "nofile": "1048576", "stack": 8388608},
    "time": 1700000000, "workdir": {"is_dir": True, "accessible": False},
    "entry": {"found": True, "denied": True}, "uid": 1000, "user": "me", "home": "/home/me",
    "files": ["/sys/module/nvidia_peermem"], "netns": "ns1", "errors": {"gpus": "boom"},
}


def test_a_full_probe_answer_parses_into_every_field() -> None:
    facts = NodeFacts.from_json(FULL_ANSWER)
    assert facts == NodeFacts(
        hostname="gpu7", python="3.11.7", python_executable="/opt/venv/bin/python",
        torch_version="2.13.0+cu124", nccl_version="2.21.5",
        interfaces=(Iface("lo", "unknown", 65536, 772, 1, addrs=(Addr("inet", "127.0.0.1", 8),)),
                    Iface("bond0.7", "up", 9000, 1, 1, virtual=True, is_bond=True,
                          lower=("ens1", "ens2"), addrs=(Addr("inet", "10.0.0.7", 24),
                                                        Addr("inet6", "fd00::7", 64)),
                          speed=20000)),
        default_iface="bond0.7",
        routes={"10.0.0.1": Route("10.0.0.1", "bond0.7", "10.0.0.7", "10.0.0.254", "unicast",
                                  "ip"),
                "10.9.9.9": Route("10.9.9.9", type="unreachable",
                                  error="Network is unreachable")},
        site_env=(SiteVar("NCCL_DEBUG", "INFO", "env"),
                  SiteVar("NCCL_DEBUG", "WARN", "/etc/nccl.conf"), SiteVar("NCCL_IB_HCA", "", "")),
        gpus=8, gpu_driver="550.54",
        rdma=(RdmaPort("mlx5_0", 1, "4: ACTIVE", "5: LinkUp", "Ethernet", "400 Gb/sec (4X NDR)",
                       "mlx5_core", "ens2f0", ("ens2f0",),
                       (Gid(3, "::ffff:10.200.2.10", "RoCE v2", "ens2f0"), Gid(0, "fe80::1"))),
              RdmaPort("mlx5_0", 1, "1: DOWN", driver="mlx5_core", netdevs=("ens2f0",)),
              RdmaPort("", 2)),
        shm_bytes=1 << 30, memlock=-1, nofile=1048576, stack=8388608, time=1700000000.0,
        workdir_ok=True, workdir_denied=True, entry_ok=True, entry_denied=True, uid=1000,
        user="me", home="/home/me", files=("/sys/module/nvidia_peermem",), netns="ns1",
        errors={"gpus": "boom"})
    assert facts.nccl_tuple == (2, 21, 5)
    assert facts.site_value("NCCL_DEBUG") == SiteVar("NCCL_DEBUG", "INFO", "env")
    assert facts.site_value("NCCL_SOCKET_IFNAME") is None
    assert facts.effective_site_env() == {"NCCL_DEBUG": SiteVar("NCCL_DEBUG", "INFO", "env"),
                                          "NCCL_IB_HCA": SiteVar("NCCL_IB_HCA", "", "")}
    assert facts.iface("bond0.7") is facts.interfaces[1] and facts.iface("eth9") is None
    assert facts.owner_of("fd00::7") is facts.interfaces[1] and facts.owner_of("10.0.0.8") is None
    assert facts.interfaces[1].ipv4 == ("10.0.0.7",)
    assert facts.interfaces[1].ipv6 == ("fd00::7",)
    assert str(facts.interfaces[1].addrs[1].network) == "fd00::/64"


def test_malformed_answers_leave_every_field_at_its_default() -> None:
    assert NodeFacts.from_json("not a mapping") == NodeFacts()  # type: ignore[arg-type]
    bad: dict[str, Any] = {
        "hostname": None, "python": "3.11", "packages": [], "interfaces": {"lo": {}},
        "routes": [], "site_env": {}, "gpus": {"count": "eight"}, "rdma": {"devices": {}},
        "shm_bytes": "big", "limits": {"memlock": "unlimited", "nofile": None},
        "time": "noon", "workdir": "yes", "entry": True, "uid": "root", "files": "x",
        "errors": ["boom"]}
    assert NodeFacts.from_json(bad) == NodeFacts()
    assert NodeFacts.from_json({"time": 1.5, "workdir": {"is_dir": True},
                                "entry": {"found": False}}) == NodeFacts(
        time=1.5, workdir_ok=True, workdir_denied=False, entry_ok=False, entry_denied=False)
    # a denied workdir only counts when it is a directory; a denial must be exactly False/True
    odd = NodeFacts.from_json({"workdir": {"is_dir": False, "accessible": False},
                               "entry": {"found": True, "denied": "yes"}})
    assert (odd.workdir_ok, odd.workdir_denied, odd.entry_ok, odd.entry_denied) == (
        False, False, True, False)
    rows = NodeFacts.from_json({"interfaces": [{"addrs": [{"family": "inet"}, {"family": "inet6",
                                                           "prefixlen": "x"}, {}]}],
                                "rdma": {"devices": [{"ports": [{"port": 0, "gids": [
                                    {"index": "x"}]}]}]}})
    assert rows.interfaces[0].name == "" and rows.interfaces[0].addrs == (
        Addr("inet", "", 32), Addr("inet6", "", 128), Addr("", "", 128))
    assert rows.rdma[0].port == 1 and rows.rdma[0].gids == (Gid(0, ""),)
    assert Addr.from_json({"family": "inet", "addr": "0.0.0.0", "prefixlen": 0}) == Addr(
        "inet", "0.0.0.0", 0)


def test_the_properties_decisions_read() -> None:
    assert Iface("lo").is_loopback and Iface("x", type=772).is_loopback
    assert not Iface("eth0", type=1).is_loopback
    assert Iface("e", "up", virtual=True).is_up
    assert Iface("e", "unknown", carrier=1).is_up
    assert not Iface("e", "unknown", carrier=1, virtual=True).is_up
    assert not Iface("e", "unknown", carrier=0).is_up and not Iface("e", "down", carrier=1).is_up
    assert Route("t", "eth0").reachable and Route("t", "eth0", type="").reachable
    for unreachable in (Route("t"), Route("t", "lo"), Route("t", "eth0", type="local"),
                        Route("t", "eth0", error="x")):
        assert not unreachable.reachable
    assert Gid(0, "x", " RoCE V2 ").is_roce_v2 and not Gid(0, "x", "IB/RoCE v1").is_roce_v2
    assert not Gid(0, "x").is_roce_v2
    assert Gid(0, "0000:0000:0000:0000:0000:ffff:0ac8:020a").ipv4 == "10.200.2.10"
    assert Gid(0, "fd00::1").ipv4 is None and Gid(0, "nonsense").ipv4 is None
    assert Gid(0, "fe80::1").is_link_local and not Gid(0, "fd00::1").is_link_local
    assert not Gid(0, "nonsense").is_link_local
    port = RdmaPort("mlx5_0", 2, "4: ACTIVE", "5: LinkUp", rate="400 Gb/sec (4X NDR)")
    assert (port.name, port.active, port.link_up, port.rate_gbps) == ("mlx5_0:2", True, True,
                                                                      400.0)
    assert not RdmaPort("d", 1, "1: DOWN", "3: Disabled").active
    assert not RdmaPort("d", 1, "1: DOWN", "3: Disabled").link_up
    assert not RdmaPort("d", 1).active and not RdmaPort("d", 1).link_up
    for rate in (None, "", "fast", "x Gb/sec"):
        assert RdmaPort("d", 1, rate=rate).rate_gbps == 0.0
    assert RdmaPort("d", 1, rate="12.5 Gb/sec").rate_gbps == 12.5
    assert parse_version("2.21.5") == (2, 21, 5)
    assert parse_version("2.13.0+cpu") == (2, 13, 0)
    assert parse_version("2.21.5+cuda12.4") == (2, 21, 5)  # the local tag is not read
    assert parse_version("2.21rc1") == (2, 21)
    assert parse_version("2.x.1") == (2,)
    for none in (None, "", "x", "+2.1"):
        assert parse_version(none) is None


# ---------------------------------------------------------------------- site (probe under -S)

SYS_PATH = "import json, sys; print(json.dumps(sys.path[1:]))"  # [0]: the script's directory


def _probe_site(full: bool, tmp_path: Path) -> list[str]:
    """sys.path of a `python -S` that ran the probe's load_site(full)."""
    code = (f"import json, sys; sys.path.insert(0, {str(PROBE.parent)!r}); import probe; "
            f"sys.path.pop(0); assert probe.load_site({full}); print(json.dumps(sys.path[1:]))")
    proc = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                          timeout=30, check=True, cwd=tmp_path)
    return list(json.loads(proc.stdout))


def test_load_site_gives_the_path_site_gives(tmp_path: Path) -> None:
    """The facts probe starts with -S (remote_command no_site) and runs site itself: full,
    the very sys.path a plain interpreter has; paths only (no .pth import lines), the same
    less the entries those import lines add (an editable install's path hook)."""
    plain = json.loads(subprocess.run([sys.executable, "-c", SYS_PATH], capture_output=True,
                                      text=True, timeout=30, check=True, cwd=tmp_path).stdout)
    assert _probe_site(True, tmp_path) == plain
    lean = _probe_site(False, tmp_path)
    assert lean == [p for p in plain if os.path.isabs(p)]  # only hooks' names are left out
    assert any("site-packages" in p for p in lean)
    assert probe.load_site(False) is False  # site already ran (no -S): nothing done


def test_pth_paths_adds_directories_and_skips_import_lines(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    (tmp_path / "lib").mkdir()
    marker = tmp_path / "ran"
    (tmp_path / "x.pth").write_text(f"# a comment\n\nlib\nmissing\nimport os; open("
                                    f"{str(marker)!r}, 'w')\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    known: set[str] = set()
    assert probe._pth_paths(str(tmp_path), "x.pth", known) is known
    assert sys.path[-1] == str(tmp_path / "lib")
    assert str(tmp_path / "missing") not in sys.path
    assert not marker.exists()
    assert probe._pth_paths(str(tmp_path), "absent.pth", known) is known


def test_facts_probe_starts_without_site_and_reads_the_packages_site_would() -> None:
    """Through the real bootstrap with remote_command's flags: the packages (torch, read
    from dist-info on sys.path) are the ones a plain interpreter's site path has."""
    from launcher.nodeside import wire

    cmd = wire.remote_command(sys.executable, no_site=True)
    assert f"{shlex.quote(sys.executable)} -u -S -c " in cmd
    params = {"mode": "facts", "targets": ["127.0.0.1"]}
    stdin = wire.payload(wire.program_source("probe"), params)
    proc = subprocess.run(["sh", "-c", cmd], input=stdin, capture_output=True, timeout=30,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert "site" not in out["errors"]
    assert out["packages"] == probe.read_packages()


# --------------------------------------------------------------------------- the parsers
# (issue #25: each survivor of scripts/mutate probe is a case here)

def test_gid_rows_come_in_numeric_order_and_stray_names_are_skipped(tmp_path: Path) -> None:
    gids = tmp_path / "port" / "gids"
    gids.mkdir(parents=True)
    for idx in (0, 2, 10, 11, 1):
        (gids / str(idx)).write_text(f"fe80:0000:0000:0000:0000:0000:0000:00{idx:02d}\n")
    (gids / "README").write_text("not a gid\n")
    rows = probenet.read_gids(str(tmp_path / "port"))
    assert [g["index"] for g in rows] == [0, 1, 2, 10, 11]


def test_ip_addr_json_keeps_each_interface_s_inet_and_inet6_addresses() -> None:
    data = [
        {"ifname": "lo", "addr_info": [
            {"family": "inet", "local": "127.0.0.1", "prefixlen": 8, "scope": "host"}]},
        {"ifname": "eth0", "addr_info": [
            {"family": "inet", "local": "198.18.0.11", "prefixlen": 24, "scope": "global"},
            {"family": "inet6", "local": "fe80::1", "prefixlen": 64, "scope": "link"},
            {"family": "link", "local": "aa:bb"},  # not an IP family: skipped
            {"family": "inet"}]},  # no address: skipped
        {"ifname": "eth1", "addr_info": None},  # an interface without addresses
        {"addr_info": [{"family": "inet", "local": "10.0.0.1"}]},  # no name
    ]
    assert probenet.parse_ip_addr(data) == {
        "lo": [{"family": "inet", "addr": "127.0.0.1", "prefixlen": 8, "scope": "host"}],
        "eth0": [
            {"family": "inet", "addr": "198.18.0.11", "prefixlen": 24, "scope": "global"},
            {"family": "inet6", "addr": "fe80::1", "prefixlen": 64, "scope": "link"}],
        "eth1": [],
        "": [{"family": "inet", "addr": "10.0.0.1", "prefixlen": None, "scope": None}],
    }
    assert probenet.parse_ip_addr(None) == {}


def test_if_inet6_gives_address_prefix_and_scope_by_name() -> None:
    """/proc/net/if_inet6: address, ifindex, prefix length (hex), scope (hex), flags, name."""
    text = (
        "00000000000000000000000000000001 01 80 10 80       lo\n"
        "garbage\n"  # a short line: skipped, the rest still read
        "fe800000000000000000000000000001 02 40 20 80     eth0\n"
        "20010db8000000000000000000000011 02 30 00 00     eth0\n"
        "fec00000000000000000000000000001 03 40 40 00     eth1\n"
        "fd000000000000000000000000000001 03 7f 05 00     eth1\n"  # a scope without a name
        "fd0000000000000000000000000001 03 40 00 00 00    eth9\n"  # 30 hex digits: skipped
    )
    assert probenet.parse_if_inet6(text) == {
        "lo": [{"family": "inet6", "addr": "::1", "prefixlen": 128, "scope": "host"}],
        "eth0": [{"family": "inet6", "addr": "fe80::1", "prefixlen": 64, "scope": "link"},
                 {"family": "inet6", "addr": "2001:db8::11", "prefixlen": 48,
                  "scope": "global"}],
        "eth1": [{"family": "inet6", "addr": "fec0::1", "prefixlen": 64, "scope": "site"},
                 {"family": "inet6", "addr": "fd00::1", "prefixlen": 127, "scope": "05"}],
    }
    assert probenet.parse_if_inet6(None) == {}


ROUTE_HEADER = "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT\n"


def test_proc_route_reads_little_endian_hex_with_the_high_bit_set() -> None:
    text = ROUTE_HEADER + (
        "eth0\t00000000\tFE0012C6\t0003\t0\t0\t100\t00000000\t0\t0\t0\n"  # via 198.18.0.254
        "eth0\t000012C6\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"  # 198.18.0.0/24
        "short\tline\n"  # skipped, the rest still read
        "eth1\tZZZZZZZZ\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n"  # not hex: skipped
        "eth1\t0000A8C0\t00000000\t0011\t0\t0\t7\t0000FFFF\n"  # 192.168.0.0/16: 8 fields do
    )
    assert probenet.parse_proc_route(text) == [
        {"dev": "eth0", "dst": "0.0.0.0", "gateway": "198.18.0.254", "flags": 3,
         "metric": 100, "prefixlen": 0},
        {"dev": "eth0", "dst": "198.18.0.0", "gateway": "0.0.0.0", "flags": 1, "metric": 0,
         "prefixlen": 24},
        {"dev": "eth1", "dst": "192.168.0.0", "gateway": "0.0.0.0", "flags": 0x11,
         "metric": 7, "prefixlen": 16},
    ]
    assert probenet.parse_proc_route(None) == []


def test_in_prefix_compares_only_the_prefix_bits() -> None:
    assert probenet._in_prefix("198.18.0.11", "0.0.0.0", 0)
    assert probenet._in_prefix("198.18.0.11", "198.18.0.0", 24)
    assert not probenet._in_prefix("198.18.1.11", "198.18.0.0", 24)
    assert probenet._in_prefix("10.0.0.1", "10.0.0.1", 32)
    assert not probenet._in_prefix("10.0.0.1", "10.0.0.0", 32)  # a host route is that host only
    assert probenet._in_prefix("10.0.0.1", "10.0.0.0", 31)
    assert not probenet._in_prefix("200.0.0.1", "10.0.0.0", 1)
    assert probenet._in_prefix("100.0.0.1", "10.0.0.0", 1)


def test_nccl_conf_skips_commented_out_settings() -> None:
    text = ("# NCCL_DEBUG=INFO\n#NCCL_IB_HCA=mlx5\n\n  NCCL_SOCKET_IFNAME = eth0 \njunk\n"
            "=novalue\nNCCL_A=x=y\n")
    assert probenet.parse_nccl_conf(text, "/etc/nccl.conf") == [
        {"key": "NCCL_SOCKET_IFNAME", "value": "eth0", "source": "/etc/nccl.conf"},
        {"key": "NCCL_A", "value": "x=y", "source": "/etc/nccl.conf"},
    ]
    assert probenet.parse_nccl_conf(None, "x") == []


def test_a_node_s_infinity_in_its_facts_reads_as_absent() -> None:
    """JSON from a node may say Infinity (Python's json reads it): int() of it raised
    OverflowError, a traceback instead of a fact left out (found by the fuzz run)."""
    from launcher.decide.runplan.facts import NodeFacts

    raw = json.loads('{"uid": Infinity, "shm_bytes": -Infinity, "limits": {"memlock": NaN},'
                     ' "gpus": {"count": Infinity}}')
    facts = NodeFacts.from_json(raw)
    assert (facts.uid, facts.shm_bytes, facts.memlock, facts.gpus) == (None, None, None, 0)


# --------------------------------------------------------------------------- NVLink fabric

def test_the_nvlink_fabric_is_asked_only_on_an_imex_machine(tmp_path: Path) -> None:
    """nvidia-smi's fabric fields of GPU 0, only where IMEX marks a multi-node NVLink machine
    (elsewhere nvidia-smi is never started); an older driver refusing the fields: None."""
    asked: list[list[str]] = []
    answer = (0, "Completed, Success, 6A130F54-FAAA-4B8F-847F-BE44AB70F917, 32766\n", "")

    def run(argv: list[str]) -> tuple[int, str, str]:
        asked.append(argv)
        return answer

    sys_ = probenet.System(root=str(tmp_path), environ={}, run=run, ip="", home="/h")
    assert probe.read_fabric(sys_) is None and asked == []
    (tmp_path / "dev" / "nvidia-caps-imex-channels").mkdir(parents=True)
    fabric = probe.read_fabric(sys_)
    assert fabric == {"state": "Completed", "status": "Success",
                      "cluster_uuid": "6A130F54-FAAA-4B8F-847F-BE44AB70F917",
                      "clique_id": "32766"}
    assert asked == [["nvidia-smi", "--query-gpu=" + probe.FABRIC_FIELDS,
                      "--format=csv,noheader", "-i", "0"]]
    facts = NodeFacts.from_json({"fabric": fabric})
    assert facts.fabric["clique_id"] == "32766"
    answer = (2, "", 'Field "fabric.state" is not a valid field to query.\n')
    assert probe.read_fabric(sys_) is None
