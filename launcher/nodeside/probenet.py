"""The probe's readers of a node's network: interfaces and addresses, routes, the site's
NCCL settings, the RDMA devices and their GID tables. THIS RUNS ON THE NODES.

Part of the probe program (launcher/nodeside/wire.py ``PROGRAMS``): shipped with probe.py as
one source. Standard library only, Python 3.8 syntax. Every file is read through a ``root``
prefix and every command through an injectable runner (``System``), so tests point the
readers at fake sysfs trees instead of patching ``open``.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: never evaluated, so 3.8 never sees list[str]
    from collections.abc import Callable, Iterable, Sequence

    Json = dict[str, Any]
    CmdResult = tuple[int, str, str] | None
    Runner = Callable[[list[str]], CmdResult]

SITE_PREFIXES = ("NCCL_", "GLOO_", "TORCH_NCCL_", "FI_")
# not settings: NVIDIA's CUDA and NGC images set NCCL_VERSION=2.28.3-1, the record of the NCCL
# package they installed (seen on an H200 whose torch loads its own NCCL 2.28.9,
# docs/gpu-check.md); NCCL never reads it
NOT_SETTINGS = ("NCCL_VERSION",)
EXTRA_FILES = (
    "/opt/microsoft/ndv4-topo.xml",
    "/opt/microsoft/ndv5-topo.xml",
    "/usr/local/gib/scripts/set_nccl_env.sh",
    "/opt/amazon/ofi-nccl",
    "/opt/aws-ofi-nccl",
    "/sys/module/nvidia_peermem",
)
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


# --------------------------------------------------------------------------- plumbing


def run_command(argv: list[str], timeout: float = 3.0) -> CmdResult:
    """Run a helper command; None when it does not exist, else (rc, stdout, stderr)."""
    try:
        proc = subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, text=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.returncode, proc.stdout, proc.stderr


def find_ip(root: str = "/") -> str | None:
    """Locate iproute2's ``ip``: non-login SSH shells often lack /usr/sbin in PATH."""
    if root != "/":
        return None  # a fake tree: the real ip would describe the wrong machine
    dirs = os.environ.get("PATH", "").split(os.pathsep) + ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
    for d in dirs:
        cand = os.path.join(d or ".", "ip")
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def ioctl_ipv4(name: str) -> list[Json]:
    """IPv4 address+prefix of one interface via SIOCGIFADDR/SIOCGIFNETMASK (no iproute2)."""
    try:
        import fcntl

        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    except (ImportError, OSError):
        return []
    try:
        req = struct.pack("256s", name.encode()[:15])
        addr = socket.inet_ntoa(fcntl.ioctl(sock.fileno(), 0x8915, req)[20:24])
        mask = socket.inet_ntoa(fcntl.ioctl(sock.fileno(), 0x891B, req)[20:24])
    except OSError:
        return []
    finally:
        sock.close()
    prefix = bin(struct.unpack("!I", socket.inet_aton(mask))[0]).count("1")
    return [{"family": "inet", "addr": addr, "prefixlen": prefix, "scope": None}]


def udp_source(target: str) -> str | None:
    """The source address the kernel would use towards ``target`` (UDP connect sends nothing)."""
    family = socket.AF_INET6 if ":" in target else socket.AF_INET
    try:
        sock = socket.socket(family, socket.SOCK_DGRAM)
    except OSError:
        return None
    try:
        sock.connect((target, 9))
        return str(sock.getsockname()[0])
    except OSError:
        return None
    finally:
        sock.close()


class System:
    """Where the readers look: a root prefix, an environment and the few live lookups.

    Tests replace ``root`` with a fake tree and the callables with fakes; production uses
    the real machine.
    """

    def __init__(self, root: str = "/", environ: dict[str, str] | None = None,
                 run: Runner = run_command, ip: str | None = None,
                 ipv4_of: Callable[[str], list[Json]] = ioctl_ipv4,
                 source_for: Callable[[str], str | None] = udp_source,
                 home: str | None = None) -> None:
        self.root = root
        self.environ = dict(os.environ if environ is None else environ)
        self.run = run
        self.ip = find_ip(root) if ip is None else (ip or None)
        self.ipv4_of = ipv4_of
        self.source_for = source_for
        if home is None:
            home = self.environ.get("HOME") or os.path.expanduser("~")
        self.home = home

    def path(self, *parts: str) -> str:
        """``root`` joined with an absolute node path."""
        return os.path.join(self.root, *[p.lstrip("/") for p in parts])

    def ip_json(self, *args: str) -> Any:
        """``ip -j ARGS`` parsed, or None (no iproute2, too old for -j, or the lookup failed)."""
        if not self.ip:
            return None
        res = self.run([self.ip, "-j"] + list(args))
        if res is None or res[0] != 0:
            return None
        try:
            return json.loads(res[1] or "null")
        except ValueError:
            return None


def read_text(path: str) -> str | None:
    """A sysfs/proc file stripped, or None when it cannot be read (absent, EINVAL, a dir...)."""
    try:
        with open(path, "rb") as fh:
            return fh.read().decode("utf-8", "replace").strip()
    except OSError:
        return None


def read_int(path: str) -> int | None:
    """An integer file, or None."""
    text = read_text(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def listdir(path: str) -> list[str]:
    """Sorted directory entries, or [] when the directory cannot be listed."""
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _numeric_key(name: str) -> tuple[int, int | str]:
    return (0, int(name)) if name.isdigit() else (1, name)


# --------------------------------------------------------------------------- interfaces


def read_interfaces(sys_: System) -> list[Json]:
    """/sys/class/net/*: state, MTU, type, virtual/bridge/bond and lower (VLAN parent) links."""
    base = sys_.path("/sys/class/net")
    virtual_root = os.path.realpath(sys_.path("/sys/devices/virtual")) + os.sep
    out = []
    for name in listdir(base):
        d = os.path.join(base, name)
        out.append({
            "name": name,
            "operstate": read_text(os.path.join(d, "operstate")),
            "mtu": read_int(os.path.join(d, "mtu")),
            "speed": read_int(os.path.join(d, "speed")),  # Mb/s (docs/fabric.md: line rate)
            "type": read_int(os.path.join(d, "type")),
            "carrier": read_int(os.path.join(d, "carrier")),
            "virtual": os.path.realpath(d).startswith(virtual_root),
            "is_bridge": os.path.isdir(os.path.join(d, "bridge")),
            "is_bond": os.path.isdir(os.path.join(d, "bonding")),
            "lower": [e[len("lower_"):] for e in listdir(d) if e.startswith("lower_")],
            "addrs": [],
        })
    return out


def parse_ip_addr(data: Any) -> dict[str, list[Json]]:
    """``ip -j addr`` -> {ifname: [addr, ...]}."""
    out: dict[str, list[Json]] = {}
    for entry in data or []:
        rows = out.setdefault(entry.get("ifname", ""), [])
        for info in entry.get("addr_info") or []:
            if info.get("family") in ("inet", "inet6") and info.get("local"):
                rows.append({"family": info["family"], "addr": info["local"],
                             "prefixlen": info.get("prefixlen"), "scope": info.get("scope")})
    return out


def parse_if_inet6(text: str | None) -> dict[str, list[Json]]:
    """/proc/net/if_inet6 -> {ifname: [inet6 addr, ...]}."""
    scopes = {"00": "global", "20": "link", "10": "host", "40": "site"}
    out: dict[str, list[Json]] = {}
    for line in (text or "").splitlines():
        f = line.split()
        if len(f) < 6 or len(f[0]) != 32:
            continue
        packed = bytes.fromhex(f[0])
        out.setdefault(f[5], []).append({
            "family": "inet6", "addr": socket.inet_ntop(socket.AF_INET6, packed),
            "prefixlen": int(f[2], 16), "scope": scopes.get(f[3], f[3])})
    return out


def read_addresses(sys_: System, names: Iterable[str]
                   ) -> tuple[dict[str, list[Json]], str]:
    """Addresses per interface: ``ip -j addr``, else ioctl (IPv4) + /proc/net/if_inet6."""
    data = sys_.ip_json("addr")
    if data is not None:
        return parse_ip_addr(data), "ip"
    out = {name: list(sys_.ipv4_of(name)) for name in names}
    for name, rows in parse_if_inet6(read_text(sys_.path("/proc/net/if_inet6"))).items():
        out.setdefault(name, []).extend(rows)
    return out, "ioctl"


def _hex_ipv4(text: str) -> str:
    return socket.inet_ntoa(struct.pack("<I", int(text, 16)))


def parse_proc_route(text: str | None) -> list[Json]:
    """/proc/net/route -> [{dev, dst, prefixlen, gateway, metric, flags}] (little-endian hex)."""
    rows = []
    for line in (text or "").splitlines()[1:]:
        f = line.split()
        if len(f) < 8:
            continue
        try:
            rows.append({
                "dev": f[0], "dst": _hex_ipv4(f[1]), "gateway": _hex_ipv4(f[2]),
                "flags": int(f[3], 16), "metric": int(f[6]),
                "prefixlen": bin(int(f[7], 16)).count("1"),
            })
        except ValueError:
            continue
    return rows


def default_iface(sys_: System, proc_routes: Sequence[Json]) -> str | None:
    """The interface of the IPv4 default route with the lowest metric (None when absent)."""
    defaults = [r for r in proc_routes if r["prefixlen"] == 0 and r["flags"] & 1]
    if defaults:
        return str(min(defaults, key=lambda r: r["metric"])["dev"])
    data = sys_.ip_json("route", "show", "default")
    for entry in data or []:
        if entry.get("dev"):
            return str(entry["dev"])
    return None


def _in_prefix(ip: str, net: str, prefixlen: int) -> bool:
    if prefixlen == 0:
        return True
    a: int = struct.unpack("!I", socket.inet_aton(ip))[0]
    b: int = struct.unpack("!I", socket.inet_aton(net))[0]
    shift = 32 - prefixlen
    return (a >> shift) == (b >> shift)


def owner_of(ip: str, interfaces: Iterable[Json]) -> str | None:
    """The interface holding address ``ip`` (None when no interface has it)."""
    for iface in interfaces:
        for a in iface["addrs"]:
            if a["addr"] == ip:
                return str(iface["name"])
    return None


def route_via_ip(sys_: System, target: str, interfaces: Sequence[Json]) -> Json | None:
    """The kernel's own answer (policy rules included); None when ``ip`` cannot tell."""
    if not sys_.ip:
        return None
    res = sys_.run([sys_.ip, "-j", "route", "get", target])
    if res is None:
        return None
    rc, out, err = res
    if rc != 0:
        if "RTNETLINK" in err or "unreachable" in err.lower():
            return {"dev": None, "src": None, "gateway": None, "type": "unreachable",
                    "method": "ip", "error": err.strip() or "no route"}
        return None  # iproute2 too old for -j, or an odd failure: use the fallback
    try:
        entry = (json.loads(out) or [{}])[0]
    except (ValueError, IndexError, TypeError):
        return None
    route = {"dev": entry.get("dev"), "src": entry.get("prefsrc"),
             "gateway": entry.get("gateway"), "type": entry.get("type") or "unicast",
             "method": "ip"}
    if route["type"] == "local":
        route["dev"] = owner_of(target, interfaces) or route["dev"]
        route["src"] = target
    return route


def route_fallback(sys_: System, target: str, interfaces: Sequence[Json],
                   proc_routes: Sequence[Json]) -> Json:
    """Without iproute2: local address, else longest prefix in /proc/net/route (IPv4)."""
    owner = owner_of(target, interfaces)
    if owner:
        return {"dev": owner, "src": target, "gateway": None, "type": "local", "method": "proc"}
    src = sys_.source_for(target)
    if ":" in target:  # no IPv6 table parser: the source address names the interface
        return {"dev": owner_of(src, interfaces) if src else None, "src": src, "gateway": None,
                "type": "unicast" if src else "unreachable", "method": "udp",
                "error": None if src else "no route"}
    best = None
    for r in proc_routes:
        if r["flags"] & 1 and _in_prefix(target, r["dst"], r["prefixlen"]):
            rank = (r["prefixlen"], -r["metric"])
            if best is None or rank > (best["prefixlen"], -best["metric"]):
                best = r
    if best is None or best["flags"] & 0x200:  # RTF_REJECT
        return {"dev": None, "src": src, "gateway": None, "type": "unreachable",
                "method": "proc", "error": "no route"}
    gateway = best["gateway"] if best["flags"] & 2 and best["gateway"] != "0.0.0.0" else None
    return {"dev": best["dev"], "src": src, "gateway": gateway, "type": "unicast", "method": "proc"}


def read_routes(sys_: System, targets: Iterable[Any] | None, interfaces: Sequence[Json],
                proc_routes: Sequence[Json]) -> dict[str, Json]:
    """Route decision {dev, src, gateway, type, method, error?} for each target address."""
    out = {}
    for target in targets or []:
        target = str(target)
        try:
            socket.inet_pton(socket.AF_INET6 if ":" in target else socket.AF_INET, target)
        except OSError:
            out[target] = {"dev": None, "src": None, "gateway": None, "type": "invalid",
                           "method": None, "error": "not an IP address"}
            continue
        out[target] = (route_via_ip(sys_, target, interfaces)
                       or route_fallback(sys_, target, interfaces, proc_routes))
    return out


# --------------------------------------------------------------------------- site config


def parse_nccl_conf(text: str | None, source: str) -> list[Json]:
    """NCCL's KEY=VALUE file format: ``#`` comment lines, blank lines and junk skipped."""
    rows = []
    for line in (text or "").splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        if key.strip():
            rows.append({"key": key.strip(), "value": value.strip(), "source": source})
    return rows


def read_site_env(sys_: System) -> list[Json]:
    """Site NCCL settings, highest precedence first: environment, user file, /etc/nccl.conf.

    NCCL loads the files with setenv(..., overwrite=0): the environment beats the user file
    ($NCCL_CONF_FILE or ~/.nccl.conf), which beats /etc/nccl.conf.
    """
    rows = [{"key": k, "value": v, "source": "env"} for k, v in sorted(sys_.environ.items())
            if k.startswith(SITE_PREFIXES) and k not in NOT_SETTINGS]
    conf = sys_.environ.get("NCCL_CONF_FILE")
    user_file = conf if conf else os.path.join(sys_.home, ".nccl.conf")
    user_path = user_file if sys_.root == "/" else sys_.path(user_file)
    rows += parse_nccl_conf(read_text(user_path), user_file)
    rows += parse_nccl_conf(read_text(sys_.path("/etc/nccl.conf")), "/etc/nccl.conf")
    return rows


# --------------------------------------------------------------------------- RDMA


def ib_dir(sys_: System) -> str:
    """/sys/class/infiniband, or $DTRAIN_IB_SYSFS (a test tree) when set."""
    return sys_.environ.get("DTRAIN_IB_SYSFS") or sys_.path("/sys/class/infiniband")


def read_gids(port_dir: str) -> list[Json]:
    """GID rows (index, gid, type, ndev); all-zero and unreadable GIDs are skipped."""
    rows = []
    for idx in sorted(listdir(os.path.join(port_dir, "gids")), key=_numeric_key):
        if not idx.isdigit():
            continue
        gid = read_text(os.path.join(port_dir, "gids", idx))
        if not gid or gid == ZERO_GID:
            continue
        rows.append({
            "index": int(idx), "gid": gid,
            "type": read_text(os.path.join(port_dir, "gid_attrs", "types", idx)),
            "ndev": read_text(os.path.join(port_dir, "gid_attrs", "ndevs", idx)),
        })
    return rows


def read_rdma(base: str) -> list[Json]:
    """Every RDMA device and port under ``base`` (the /sys/class/infiniband layout)."""
    devices = []
    for dev in listdir(base):
        d = os.path.join(base, dev)
        driver_link = os.path.join(d, "device", "driver")
        driver = None
        if os.path.lexists(driver_link):
            driver = os.path.basename(os.path.realpath(driver_link))
        netdevs = listdir(os.path.join(d, "device", "net"))
        ports = []
        for p in sorted(listdir(os.path.join(d, "ports")), key=_numeric_key):
            pd = os.path.join(d, "ports", p)
            gids = read_gids(pd)
            ndev0 = read_text(os.path.join(pd, "gid_attrs", "ndevs", "0"))
            ports.append({
                "port": int(p) if p.isdigit() else p,
                "state": read_text(os.path.join(pd, "state")),
                "phys_state": read_text(os.path.join(pd, "phys_state")),
                "link_layer": read_text(os.path.join(pd, "link_layer")),
                "rate": read_text(os.path.join(pd, "rate")),
                # ibdev2netdev's rule for RoCE: the ndev of GID 0; else the PCI function's netdev.
                "netdev": ndev0 or (netdevs[0] if len(netdevs) == 1 else None),
                "gids": gids,
            })
        devices.append({"name": dev, "driver": driver, "netdevs": netdevs, "ports": ports})
    return devices
