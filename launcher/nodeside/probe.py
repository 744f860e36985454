"""dtrain node probe: this program RUNS ON THE NODES, not on the launcher machine.

It is shipped verbatim over the SSH channel and started as ``python3 -c BOOTSTRAP`` (the
bootstrap exec()s this source with ``__name__ == "__main__"``), or run directly as
``python3 probe.py < params``. It reads ONE JSON line of parameters from stdin and writes ONE
JSON object to stdout. Hence: standard library only, Python 3.8 syntax, no torch import (1-2 s).

Modes (``params["mode"]``):

* ``facts`` (default): everything the launcher needs to decide the network environment and run
  preflight checks -- interfaces and addresses, the route to each target, site NCCL config, the
  RDMA (InfiniBand / RoCE / EFA) tree with GID tables, GPUs, limits. See ``collect_facts``.
* ``listen``: bind+listen on ``addr:port``, print ``{"ok": true, "port": N}`` at once, accept and
  close connections until stdin reaches EOF (the launcher closes the channel).
* ``connect``: one TCP connect to ``addr:port``; print ``{"ok": bool, "error"?: str, "ms": float}``.

``facts`` with ``"stay": true`` (what `dtrain run` sends: one interpreter per node for the
whole preflight): after the facts the program stays, reads one JSON op a line from stdin
and answers each with one JSON line, until EOF: ``{"op": "routes", "targets"}`` → the route
to each (``{"ok", "routes"}``); ``{"op": "listen", "addr", "port"}`` → ``listen``'s answer,
and the port stays bound, its connections accepted and closed, until EOF or
``{"op": "unlisten"}`` (answered ``{"ok": true}`` once the port is closed: the launcher
starts the job without waiting for the probes' exits); ``{"op": "connect", ...}`` →
``connect``'s answer.
``{"op": "become", "workdir", "bootstrap"}``: the probe's process becomes the job's
supervisor (``become``: an exec, answered ``{"ok": true}`` just before it).

Every file is read through a ``root`` prefix and every command through an injectable runner
(``System``), so tests point the readers at fake sysfs trees instead of patching ``open``.
Unreadable files (EINVAL, ENOENT, EISDIR, any OSError) count as absent, never as errors: the
kernel answers EINVAL for unpopulated GID attributes and containers hide parts of /sys.
"""

from __future__ import annotations

import json
import os
import re
import socket
import struct
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: never evaluated, so 3.8 never sees list[str]
    from collections.abc import Callable, Iterable, Sequence
    from typing import TextIO

    Json = dict[str, Any]
    CmdResult = tuple[int, str, str] | None
    Runner = Callable[[list[str]], CmdResult]

PROBE_VERSION = 1
UNLIMITED = -1  # how RLIM_INFINITY is written in the JSON
SITE_PREFIXES = ("NCCL_", "GLOO_", "TORCH_NCCL_", "FI_")
EXTRA_FILES = (
    "/opt/microsoft/ndv4-topo.xml",
    "/opt/microsoft/ndv5-topo.xml",
    "/usr/local/gib/scripts/set_nccl_env.sh",
    "/opt/amazon/ofi-nccl",
    "/opt/aws-ofi-nccl",
    "/sys/module/nvidia_peermem",
)
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
# the environment the shell (after --setup) gave us, before site or anything else ran: what
# a supervisor started by that shell would get (``become``)
START_ENV = dict(os.environ)


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
            if k.startswith(SITE_PREFIXES)]
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


# --------------------------------------------------------------------------- the rest


# a wheel's dist-info directory: the normalized name and the version (what pip writes)
_DIST_INFO = re.compile(r"^(torch|nvidia_nccl_cu(\d+))-([^-]+)\.dist-info$")
_EGG_INFO = re.compile(r"^torch(-[^-]+)?\.egg-info$")


def _metadata_version(path: str) -> str | None:
    """The ``Version:`` header of a dist's METADATA/PKG-INFO (read up to the body)."""
    for name in ("METADATA", "PKG-INFO"):
        try:
            with open(os.path.join(path, name), encoding="utf-8", errors="replace") as f:
                for line in f:
                    if not line.strip():
                        break  # the headers end at the first blank line
                    if line.lower().startswith("version:"):
                        return line.split(":", 1)[1].strip() or None
        except OSError:
            continue
    return None


def read_packages(path: list[str] | None = None) -> Json:
    """torch and NCCL wheel versions from dist metadata, without importing torch, and
    without importlib.metadata either (its import is ~15-35 ms of every node's probe): the
    first ``torch-*.dist-info`` (or a develop install's ``torch.egg-info``) on sys.path, in
    sys.path order, as ``importlib.metadata.version("torch")`` finds it."""
    out: Json = {"torch": None, "nccl": None, "nccl_dist": None}
    for d in sys.path if path is None else path:
        for name in listdir(d or "."):
            m = _DIST_INFO.match(name)
            if m is None:
                if out["torch"] is None and _EGG_INFO.match(name):
                    out["torch"] = _metadata_version(os.path.join(d or ".", name))
                continue
            if m.group(1) == "torch":
                if out["torch"] is None:
                    out["torch"] = (_metadata_version(os.path.join(d or ".", name))
                                    or m.group(3))
            elif out["nccl"] is None:
                out["nccl"], out["nccl_dist"] = m.group(3), "nvidia-nccl-cu" + m.group(2)
    return out


def _pth_paths(sitedir: str, name: str, known_paths: Any) -> Any:
    """site.addpackage without its import lines: the directories a .pth file names."""
    import site

    if known_paths is None:  # as site's own: None means "the paths on sys.path now"
        return site.addpackage(sitedir, name, known_paths)
    try:
        with open(os.path.join(sitedir, name)) as f:
            lines = f.read().splitlines()
    except (OSError, ValueError):
        return known_paths
    for line in lines:
        if line.startswith("#") or not line.strip() or line.startswith(("import ", "import\t")):
            continue
        path, case = site.makepath(sitedir, line.rstrip())
        if case not in known_paths and os.path.exists(path):
            sys.path.append(path)
            known_paths.add(case)
    return known_paths


def load_site(full: bool) -> bool:
    """sys.path as the job's interpreter has it, for a probe started with -S (site not run).

    site's .pth files run code (their import lines: editable installs' finders, setuptools'
    distutils hack, ...): ~50 ms of every node's probe, and read_packages only needs the
    directories. ``full`` (a module entry, which importlib's finders look up, an editable
    install's finder too) runs site as the interpreter would; otherwise site runs with the
    .pth files' import lines skipped. False when site had run already (no -S).
    """
    if not sys.flags.no_site:
        return False
    import site

    if full:
        site.main()
        return True
    saved = site.addpackage
    site.addpackage = _pth_paths  # type: ignore[assignment]
    try:
        site.main()
    finally:
        site.addpackage = saved
    return True


def read_gpus(sys_: System) -> Json:
    """GPU count from the driver's proc tree (else /dev/nvidiaN) and the driver version."""
    gpus = listdir(sys_.path("/proc/driver/nvidia/gpus"))
    count = len(gpus) or len([n for n in listdir(sys_.path("/dev"))
                              if re.match(r"^nvidia\d+$", n)])
    version = read_text(sys_.path("/proc/driver/nvidia/version")) or ""
    m = re.search(r"Kernel Module\s+(?:for \S+\s+)?([\d.]+)", version)
    return {"count": count, "driver": m.group(1) if m else None}


def read_limits() -> Json:
    """Soft RLIMIT_MEMLOCK/NOFILE/STACK (-1 = unlimited): NCCL IB needs unlimited memlock."""
    try:
        import resource
    except ImportError:
        return {}
    out = {}
    for key, res in (("memlock", "RLIMIT_MEMLOCK"), ("nofile", "RLIMIT_NOFILE"),
                     ("stack", "RLIMIT_STACK")):
        soft = resource.getrlimit(getattr(resource, res))[0]
        out[key] = UNLIMITED if soft == resource.RLIM_INFINITY else soft
    return out


def read_shm(sys_: System) -> int | None:
    """Size of /dev/shm in bytes (Docker's default 64 MiB breaks NCCL), or None."""
    try:
        st = os.statvfs(sys_.path("/dev/shm"))
    except OSError:
        return None
    return st.f_frsize * st.f_blocks


def read_user() -> Json:
    """uid, user name and home directory of the probing account."""
    uid = os.getuid()
    try:
        import pwd

        pw = pwd.getpwuid(uid)
        # the home '~' means on this node: $HOME first, as the shell and expanduser do
        return {"uid": uid, "user": pw.pw_name, "home": os.environ.get("HOME") or pw.pw_dir}
    except (ImportError, KeyError):
        return {"uid": uid, "user": os.environ.get("USER"), "home": os.path.expanduser("~")}


def read_workdir(path: str) -> Json:
    """Whether the job's working directory exists, is a directory, may be entered and read
    (a 0700 directory of another user exists but is "permission denied", not empty), and is
    writable."""
    full = os.path.expanduser(path)
    is_dir = os.path.isdir(full)
    return {"path": path, "exists": os.path.exists(full), "is_dir": is_dir,
            "accessible": is_dir and os.access(full, os.R_OK | os.X_OK),
            "writable": os.access(full, os.W_OK)}


def read_entry(workdir: str, entry: Json) -> Json:
    """Whether the job's script (a path, relative to the working directory) or module exists.

    A module is looked up as ``python -m`` will: the working directory first, then sys.path
    (this is the job's interpreter, after --setup). Nothing is imported: the top-level name
    goes through importlib's finders (an editable install's finder too), the rest of a
    dotted name through the package directories found.
    """
    base = os.path.expanduser(workdir or ".")
    name = str(entry.get("name") or "")
    if not entry.get("module"):
        path = os.path.join(base, os.path.expanduser(name))
        found = os.path.isfile(path)
        # not found because a directory on the way may not be searched, or found but not
        # readable: "permission denied", not "not found"
        denied = (not found and _denied_on_the_way(path)) or (
            found and not os.access(path, os.R_OK))
        return {"name": name, "module": False, "found": found, "path": path,
                "denied": denied}
    import importlib.machinery
    import importlib.util

    parts = name.split(".")
    sys.path.insert(0, base)
    try:
        spec = importlib.util.find_spec(parts[0])
    except (ImportError, ValueError):
        spec = None
    finally:
        sys.path.remove(base)
    for i in range(1, len(parts)):
        locations = spec.submodule_search_locations if spec is not None else None
        if locations is None:
            spec = None
            break
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[:i + 1]),
                                                        list(locations))
    return {"name": name, "module": True, "found": spec is not None}


def _denied_on_the_way(path: str) -> bool:
    """A directory above ``path`` exists but may not be searched by this user."""
    parent = os.path.dirname(os.path.abspath(path))
    while parent and not os.path.isdir(parent):
        up = os.path.dirname(parent)
        if up == parent:
            return False
        parent = up
    return bool(parent) and not os.access(parent, os.X_OK)


def _section(errors: dict[str, str], name: str, fn: Callable[[], Any], default: Any) -> Any:
    """One reader failing must not cost the launcher all the other facts."""
    try:
        return fn()
    except Exception as exc:  # a probe bug or an exotic node: report, carry on
        errors[name] = f"{type(exc).__name__}: {exc}"
        return default


def collect_facts(params: Json, sys_: System | None = None) -> Json:
    """The ``facts`` mode: one JSON-ready dict describing this node."""
    sys_ = sys_ or System()
    errors: dict[str, str] = {}
    out = {"probe_version": PROBE_VERSION, "mode": "facts", "ok": True,
           "hostname": socket.gethostname(), "time": time.time()}
    out.update(_section(errors, "user", read_user, {}))
    out["python"] = {"version": "{}.{}.{}".format(*sys.version_info[:3]),
                     "executable": sys.executable, "implementation": sys.implementation.name}
    entry = params.get("entry")
    _section(errors, "site", lambda: load_site(bool(entry and entry.get("module"))), False)
    if params.get("python_check", True):
        out["packages"] = _section(errors, "packages", read_packages, {})
    ifaces = _section(errors, "interfaces", lambda: read_interfaces(sys_), [])
    addrs, method = _section(errors, "addresses",
                             lambda: read_addresses(sys_, [i["name"] for i in ifaces]), ({}, None))
    for iface in ifaces:
        iface["addrs"] = addrs.get(iface["name"], [])
    out["interfaces"], out["addr_method"] = ifaces, method
    proc_routes = _section(errors, "proc_route",
                           lambda: parse_proc_route(read_text(sys_.path("/proc/net/route"))), [])
    out["default_iface"] = _section(errors, "default_iface",
                                    lambda: default_iface(sys_, proc_routes), None)
    out["routes"] = _section(errors, "routes", lambda: read_routes(
        sys_, params.get("targets"), ifaces, proc_routes), {})
    out["site_env"] = _section(errors, "site_env", lambda: read_site_env(sys_), [])
    out["gpus"] = _section(errors, "gpus", lambda: read_gpus(sys_), {"count": 0})
    base = ib_dir(sys_)
    out["rdma"] = {"dir": base, "devices": _section(errors, "rdma", lambda: read_rdma(base), [])}
    out["shm_bytes"] = _section(errors, "shm", lambda: read_shm(sys_), None)
    out["limits"] = _section(errors, "limits", read_limits, {})
    out["files"] = [f for f in EXTRA_FILES if os.path.exists(sys_.path(f))]
    try:
        out["netns"] = os.readlink(sys_.path("/proc/self/ns/net"))
    except OSError:
        out["netns"] = None
    if params.get("workdir"):
        out["workdir"] = _section(errors, "workdir", lambda: read_workdir(params["workdir"]), None)
    if params.get("entry"):
        out["entry"] = _section(errors, "entry", lambda: read_entry(
            params.get("workdir") or ".", params["entry"]), None)
    if params.get("container"):
        out["container"] = _section(errors, "container",
                                    lambda: read_container(params["container"]), None)
    out["errors"] = errors
    return out


CONTAINER_RUNTIMES = ("podman", "docker", "enroot", "apptainer")  # decide/container.py's
def in_image(op: Json) -> Json:
    """``{"op": "in_image", "argv", "input", "timeout"}``: the probe run inside the image
    (the runtime's command decided by the launcher, decide/container.py), so the plan's
    facts are the container's: its facts JSON, or why it gave none."""
    argv = op.get("argv")
    steps = [c for c in (op.get("prepare") or []) if isinstance(c, list)]
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv) or not argv \
            or not all(isinstance(a, str) for c in steps for a in c):
        return {"ok": False, "error": "bad in_image op"}
    for step in steps:  # enroot: create the container from the image first
        try:
            subprocess.run(step, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=600, check=False)
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        done = subprocess.run(argv, input=str(op.get("input") or "").encode(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              timeout=float(op.get("timeout") or 120))
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        return {"ok": False, "error": f"{argv[0]}: {exc}"}
    for line in done.stdout.decode("utf-8", "replace").splitlines():
        if line.lstrip().startswith("{"):
            try:
                facts = json.loads(line)
            except ValueError:
                continue
            if isinstance(facts, dict):
                return {"ok": True, "facts": facts}
    err = done.stderr.decode("utf-8", "replace").strip().splitlines()
    return {"ok": False, "error": "the probe inside the image gave no answer (exit %d): %s"
            % (done.returncode, " / ".join(err[-3:]) or "no output")}


def read_container(req: Json) -> Json:
    """``--image``: which runtime this node has (the one asked for, else the first found),
    its version, and whether the image is there with which id (docker/podman: the image id,
    which ``save``/``load`` keep; enroot/apptainer: the image file exists)."""
    import shutil  # --image only: the probe's usual start stays lean

    asked = req.get("runtime")
    order = [asked] if asked else list(req.get("runtimes") or CONTAINER_RUNTIMES)
    for name in order:
        path = shutil.which(str(name))
        if path:
            break
    else:
        return {"runtime": None, "error": "no container runtime (%s) on PATH" % ", ".join(
            str(n) for n in order)}

    def run(argv: list[str]) -> tuple[int, str]:
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, timeout=60)
        except (OSError, subprocess.SubprocessError) as exc:
            return -1, str(exc)
        return done.returncode, (done.stdout or done.stderr).decode("utf-8", "replace")

    out: Json = {"runtime": name, "path": path, "image_present": False, "image_id": None}
    code, text = run([path, "version" if name == "enroot" else "--version"])
    m = re.search(r"(\d+\.\d+[\w.+~-]*)", text) if code == 0 else None
    out["version"] = m.group(1) if m else None
    image = str(req.get("image") or "")
    if name in ("podman", "docker"):
        out["rootless"] = name == "podman" and os.geteuid() != 0
        code, text = run([path, "image", "inspect", "--format", "{{.Id}}", image])
        ident = text.strip().splitlines()[0].strip() if code == 0 and text.strip() else ""
        if ident:
            out["image_present"] = True
            out["image_id"] = ident if ":" in ident else "sha256:" + ident
    else:
        out["image_present"] = os.path.isfile(os.path.expanduser(image))
    return out


# --------------------------------------------------------------------------- sockets


def _emit(obj: Json, stream: TextIO | None = None) -> None:
    stream = stream or sys.stdout
    stream.write(json.dumps(obj) + "\n")
    stream.flush()


def bind_listen(params: Json) -> tuple[socket.socket | None, Json]:
    """Bind+listen on ``addr:port`` (port 0: any free one); (the socket, the answer)."""
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(
            params.get("addr") or "0.0.0.0", int(params.get("port") or 0),
            0, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)[0]
        srv = socket.socket(family, kind, proto)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(sockaddr)
        srv.listen(64)
    except (OSError, ValueError) as exc:
        return None, {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return srv, {"ok": True, "port": srv.getsockname()[1]}


def listen(params: Json, stdin_fd: int = 0, stream: TextIO | None = None) -> int:
    """Bind+listen, report the port, accept and close until stdin EOF."""
    import select

    srv, answer = bind_listen(params)
    _emit(answer, stream)
    if srv is None:
        return 0
    try:
        while True:
            ready, _, _ = select.select([srv.fileno(), stdin_fd], [], [])
            if srv.fileno() in ready:
                try:
                    srv.accept()[0].close()
                except OSError:
                    pass
            if stdin_fd in ready and not os.read(stdin_fd, 4096):
                return 0
    finally:
        srv.close()


def connect(params: Json, stream: TextIO | None = None) -> int:
    """One TCP connect; how long it took or why it failed."""
    start = time.monotonic()
    try:
        sock = socket.create_connection((params["addr"], int(params["port"])),
                                        timeout=float(params.get("timeout") or 2.0))
        sock.close()
        result: Json = {"ok": True}
    except (OSError, ValueError) as exc:
        detail = getattr(exc, "strerror", None) or exc
        reason = ("timed out" if isinstance(exc, socket.timeout)
                  else f"{type(exc).__name__}: {detail}")
        result = {"ok": False, "error": reason}
    result["ms"] = round((time.monotonic() - start) * 1000.0, 3)
    _emit(result, stream)
    return 0


def routes_to(targets: Iterable[Any] | None, sys_: System | None = None) -> Json:
    """The route from this node to each target (what ``facts`` reports as ``routes``)."""
    sys_ = sys_ or System()
    ifaces = read_interfaces(sys_)
    addrs, _ = read_addresses(sys_, [i["name"] for i in ifaces])
    for iface in ifaces:
        iface["addrs"] = addrs.get(iface["name"], [])
    proc_routes = parse_proc_route(read_text(sys_.path("/proc/net/route")))
    return read_routes(sys_, targets, ifaces, proc_routes)


def become(op: Json, rest: bytes, stream: TextIO | None = None) -> Json:
    """The ``become`` op: this process turns into the job's supervisor interpreter, an exec
    of ``python -u -I -S -c BOOTSTRAP`` (the op's) in the working directory, with the
    environment this probe started with (the shell's, after --setup) and PWD/OLDPWD as the
    shell's ``cd`` sets them: what a supervisor started by that shell line gets, without a
    new channel, shell and --setup (issue 26). Answers ``{"ok": true}`` just before the
    exec (the launcher then sends the supervisor's payload); an error answer and the probe
    stays otherwise. Never returns when it worked."""
    boot = op.get("bootstrap")
    if not isinstance(boot, str) or not sys.executable or rest:
        return {"ok": False, "error": "become: no bootstrap, no sys.executable, or input "
                                      "after the op"}
    env = dict(START_ENV)
    workdir = op.get("workdir")
    if workdir:
        old = env.get("PWD") or os.getcwd()
        path = os.path.expanduser(str(workdir))
        logical = os.path.normpath(os.path.join(old, path))
        try:
            os.chdir(path)
        except OSError as exc:
            return {"ok": False, "error": f"become: cd {workdir}: {exc}"}
        env["OLDPWD"], env["PWD"] = old, logical
    argv = [sys.executable, "-u", "-I", "-S", "-c", boot]
    _emit({"ok": True}, stream)
    try:
        os.execve(sys.executable, argv, env)
    except OSError as exc:  # the answer is out: fail as a supervisor that did not start
        sys.stderr.write(f"dtrain: cannot start the supervisor ({sys.executable}): {exc}\n")
        os._exit(127)
    return {}  # not reached


def stay(stdin_fd: int = 0, stream: TextIO | None = None, sys_: System | None = None) -> int:
    """After the facts: one JSON op a line until EOF (routes, listen, connect; see the
    module's docstring). A bound listen socket accepts (and closes) while we wait."""
    import select

    srv: socket.socket | None = None
    buf = b""
    try:
        while True:
            fds = [stdin_fd] + ([srv.fileno()] if srv is not None else [])
            ready = select.select(fds, [], [])[0]
            if srv is not None and srv.fileno() in ready:
                try:
                    srv.accept()[0].close()
                except OSError:
                    pass
            if stdin_fd not in ready:
                continue
            data = os.read(stdin_fd, 65536)
            if not data:
                return 0
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if not line.strip():
                    continue
                try:
                    op = json.loads(line)
                    kind = op.get("op")
                except (ValueError, AttributeError) as exc:
                    _emit({"ok": False, "error": f"bad op: {exc}"}, stream)
                    continue
                if kind == "routes":
                    _emit({"ok": True, "routes": routes_to(op.get("targets"), sys_)}, stream)
                elif kind == "listen" and srv is None:
                    srv, answer = bind_listen(op)
                    _emit(answer, stream)
                elif kind == "connect":
                    connect(op, stream)
                elif kind == "become":
                    if srv is not None:
                        srv.close()
                        srv = None
                    _emit(become(op, buf, stream), stream)
                elif kind == "in_image":
                    _emit(in_image(op), stream)
                elif kind == "unlisten":  # the port is free once this is answered
                    if srv is not None:
                        srv.close()
                        srv = None
                    _emit({"ok": True}, stream)
                else:
                    _emit({"ok": False, "error": f"unexpected op {kind!r}"}, stream)
    finally:
        if srv is not None:
            srv.close()


def set_title(title: str, comm: str) -> None:
    """What a node's admin sees of this process: ``comm`` (15 bytes: top, ps -e) and
    ``title`` as its command line (ps -ef, ps aux). The title is written over the argv area
    that /proc/PID/cmdline reads, as setproctitle(3) does: the title, a NUL, and a last
    byte that is not NUL, which makes the kernel read up to the first NUL. Through /proc
    files; best effort, never raises. A copy of supervisor.set_title (one file each:
    tests/test_node_processes.py checks that the copies are the same)."""
    try:
        with open("/proc/self/comm", "wb", 0) as f:
            f.write(comm.encode("utf-8", "replace")[:15])
    except OSError:
        pass
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        fields = stat[stat.rfind(b")") + 2:].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (Linux >= 3.5)
        size = end - start
        if size < 2:
            return
        data = title.encode("utf-8", "replace")[:size - 1] + b"\0"
        if len(data) < size:
            data += b"\0" * (size - len(data) - 1) + b" "
        fd = os.open("/proc/self/mem", os.O_RDWR)
        try:
            os.pwrite(fd, data, start)
        finally:
            os.close(fd)
    except (OSError, ValueError, IndexError):
        pass


def main() -> int:
    """Read one JSON line of parameters, run the mode, write one JSON object."""
    spec = globals().get("DTRAIN_SPEC")  # the bootstrap may hand the params over directly
    line = spec.decode() if isinstance(spec, bytes) else sys.stdin.readline()
    try:
        params = json.loads(line) if line.strip() else {}
        if not isinstance(params, dict):
            raise ValueError("parameters must be a JSON object")
    except ValueError as exc:
        _emit({"ok": False, "error": f"bad parameters: {exc}"})
        return 2
    mode = params.get("mode", "facts")
    if globals().get("DTRAIN_SOURCE") is not None:  # shipped (not imported by a test)
        set_title(f"dtrain probe {mode} {os.uname().nodename}", "dtrain-probe")
    if mode == "facts":
        _emit(collect_facts(params))
        return stay() if params.get("stay") else 0
    if mode == "listen":
        return listen(params)
    if mode == "connect":
        return connect(params)
    _emit({"ok": False, "error": f"unknown mode {mode!r}"})
    return 2


if __name__ == "__main__":
    sys.exit(main())
