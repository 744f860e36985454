"""Launcher-side view of one node: the probe's JSON parsed into frozen dataclasses.

``NodeFacts.from_json`` is deliberately tolerant: an older probe, a container that hides part
of /sys or a reader that failed on the node leaves a field at its empty default instead of
failing the whole launch. Decisions (``netenv``, ``rdma``) only ever see these types.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from launcher.decide.runplan.container import ContainerFacts

UNLIMITED = -1  # RLIM_INFINITY as the probe writes it
LOOPBACK_TYPE = 772  # ARPHRD_LOOPBACK in /sys/class/net/*/type


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


def _int(value: Any, default: int | None = None) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: a node's Infinity
        return default


def _list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def _dict(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


@dataclass(frozen=True)
class Addr:
    """One address on an interface (``family`` is "inet" or "inet6")."""

    family: str
    addr: str
    prefixlen: int

    @property
    def network(self) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
        """The connected subnet, e.g. 10.0.0.0/24."""
        return ipaddress.ip_interface(f"{self.addr}/{self.prefixlen}").network

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Addr:
        """Parse one probe address row."""
        family = str(obj.get("family") or "")
        default_len = 32 if family == "inet" else 128
        return cls(family, str(obj.get("addr") or ""), _int(obj.get("prefixlen"), default_len) or 0)


@dataclass(frozen=True)
class Iface:
    """One network interface from /sys/class/net with its addresses."""

    name: str
    operstate: str | None = None
    mtu: int | None = None
    type: int | None = None
    carrier: int | None = None
    virtual: bool = False
    is_bridge: bool = False
    is_bond: bool = False
    lower: tuple[str, ...] = ()  # the interfaces under a VLAN/macvlan/bond
    addrs: tuple[Addr, ...] = ()
    speed: int | None = None  # Mb/s, /sys/class/net/IF/speed (-1 or None: unknown)

    @property
    def is_loopback(self) -> bool:
        """lo, by type or by name."""
        return self.type == LOOPBACK_TYPE or self.name == "lo"

    @property
    def is_up(self) -> bool:
        """operstate "up"; "unknown" counts for physical NICs whose driver does not report."""
        if self.operstate == "up":
            return True
        return self.operstate == "unknown" and not self.virtual and self.carrier == 1

    @property
    def ipv4(self) -> tuple[str, ...]:
        """The IPv4 addresses, in probe order."""
        return tuple(a.addr for a in self.addrs if a.family == "inet")

    @property
    def ipv6(self) -> tuple[str, ...]:
        """The IPv6 addresses, in probe order."""
        return tuple(a.addr for a in self.addrs if a.family == "inet6")

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Iface:
        """Parse one probe interface row."""
        return cls(
            name=str(obj.get("name") or ""),
            operstate=_str(obj.get("operstate")),
            mtu=_int(obj.get("mtu")),
            speed=_int(obj.get("speed")),
            type=_int(obj.get("type")),
            carrier=_int(obj.get("carrier")),
            virtual=bool(obj.get("virtual")),
            is_bridge=bool(obj.get("is_bridge")),
            is_bond=bool(obj.get("is_bond")),
            lower=tuple(str(x) for x in _list(obj.get("lower"))),
            addrs=tuple(Addr.from_json(a) for a in _list(obj.get("addrs"))
                        if isinstance(a, Mapping)),
        )


@dataclass(frozen=True)
class Route:
    """The kernel's route decision from one node towards one target address."""

    target: str
    dev: str | None = None
    src: str | None = None
    gateway: str | None = None
    type: str = "unicast"  # "local" when the target is an address of this node
    method: str | None = None  # "ip" (ip route get), "proc" (/proc/net/route), "udp"
    error: str | None = None

    @property
    def reachable(self) -> bool:
        """A usable route leaving this node (a local target does not count)."""
        return (self.error is None and self.dev not in (None, "lo")
                and self.type in ("unicast", ""))

    @classmethod
    def from_json(cls, target: str, obj: Mapping[str, Any]) -> Route:
        """Parse one probe route row."""
        return cls(
            target=target,
            dev=_str(obj.get("dev")),
            src=_str(obj.get("src")),
            gateway=_str(obj.get("gateway")),
            type=str(obj.get("type") or "unicast"),
            method=_str(obj.get("method")),
            error=_str(obj.get("error")),
        )


class SiteVar(NamedTuple):
    """A setting already in effect on the node: (key, value, source path or "env")."""

    key: str
    value: str
    source: str


@dataclass(frozen=True)
class OtherRun:
    """Another user's dtrain run on a node, from its process titles (nodeside/runscan.py):
    who, which run, since when; nothing else of it is ever read."""

    user: str
    run_id: str
    started: float | None = None

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> OtherRun:
        """Parse one row of the probe's ``others.runs``."""
        started = obj.get("started")
        return cls(str(obj.get("user") or obj.get("uid") or "?")[:64],
                   str(obj.get("run_id") or "?")[:128],
                   float(started) if isinstance(started, int | float) else None)


@dataclass(frozen=True)
class Gid:
    """One populated row of a port's GID table."""

    index: int
    gid: str
    type: str | None = None  # "IB/RoCE v1", "RoCE v2"; None when unreadable (EINVAL)
    ndev: str | None = None

    @property
    def is_roce_v2(self) -> bool:
        """Type "RoCE v2" (UDP-encapsulated, routable)."""
        return (self.type or "").strip().lower() == "roce v2"

    @property
    def ipv4(self) -> str | None:
        """The IPv4 address of an IPv4-mapped GID (::ffff:a.b.c.d), else None."""
        try:
            ip = ipaddress.IPv6Address(self.gid)
        except ValueError:
            return None
        return str(ip.ipv4_mapped) if ip.ipv4_mapped is not None else None

    @property
    def is_link_local(self) -> bool:
        """fe80::/10, which NCCL treats as invalid (it is not routed)."""
        try:
            return ipaddress.IPv6Address(self.gid).is_link_local
        except ValueError:
            return False

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Gid:
        """Parse one probe GID row."""
        return cls(_int(obj.get("index"), 0) or 0, str(obj.get("gid") or ""),
                   _str(obj.get("type")), _str(obj.get("ndev")))


@dataclass(frozen=True)
class RdmaPort:
    """One port of one RDMA device (/sys/class/infiniband/<device>/ports/<port>)."""

    device: str
    port: int
    state: str | None = None  # "4: ACTIVE"
    phys_state: str | None = None  # "5: LinkUp"
    link_layer: str | None = None  # "InfiniBand" or "Ethernet" (RoCE)
    rate: str | None = None  # "400 Gb/sec (4X NDR)"
    driver: str | None = None  # mlx5_core, efa, bnxt_re, ...
    netdev: str | None = None
    netdevs: tuple[str, ...] = ()
    gids: tuple[Gid, ...] = ()

    @property
    def name(self) -> str:
        """``dev:port``, the NCCL_IB_HCA spelling."""
        return f"{self.device}:{self.port}"

    @property
    def active(self) -> bool:
        """Port state 4 (ACTIVE)."""
        return (self.state or "").startswith("4:")

    @property
    def link_up(self) -> bool:
        """Physical state 5 (LinkUp)."""
        return (self.phys_state or "").startswith("5:")

    @property
    def rate_gbps(self) -> float:
        """The leading number of ``rate`` (0 when unknown)."""
        try:
            return float((self.rate or "0").split()[0])
        except (ValueError, IndexError):
            return 0.0


@dataclass(frozen=True)
class NodeFacts:
    """Everything the probe learned about one node."""

    hostname: str = ""
    python: str | None = None
    python_executable: str | None = None
    torch_version: str | None = None
    nccl_version: str | None = None  # from the nvidia-nccl-cu* wheel; None when unknown
    interfaces: tuple[Iface, ...] = ()
    default_iface: str | None = None
    routes: Mapping[str, Route] = field(default_factory=dict)
    site_env: tuple[SiteVar, ...] = ()  # highest precedence first: env, user file, /etc
    gpus: int = 0
    gpu_driver: str | None = None
    rdma: tuple[RdmaPort, ...] = ()
    shm_bytes: int | None = None
    memlock: int | None = None  # UNLIMITED (-1) or bytes
    nofile: int | None = None
    stack: int | None = None
    time: float | None = None
    workdir_ok: bool | None = None  # None: no workdir asked about
    workdir_denied: bool = False  # it exists, but this user may not enter or read it
    entry_ok: bool | None = None  # the script/module exists; None: not asked (or unknown)
    entry_denied: bool = False  # the script is there (or may be) but this user may not read it
    uid: int | None = None
    user: str | None = None
    home: str | None = None  # what '~' means on the node ($HOME, else the passwd entry)
    files: tuple[str, ...] = ()  # vendor files present (Azure topology, GCP gIB, ...)
    netns: str | None = None
    errors: Mapping[str, str] = field(default_factory=dict)  # probe sections that failed
    container: ContainerFacts | None = None  # --image: the node's runtime and image
    # nvidia-smi's NVLink fabric on an IMEX machine (nodeside/probe.read_fabric), raw text:
    # state, status, cluster_uuid, clique_id; empty elsewhere
    # (decide/runplan/placement.nvlink_domain)
    fabric: Mapping[str, str] = field(default_factory=dict)
    # other users' dtrain runs on the node (decide/runplan/sharing.py); ``others_hidden``: /proc's
    # hidepid option there, when it hides them; ``others_seen``: False with an old probe
    others: tuple[OtherRun, ...] = ()
    others_hidden: str | None = None
    others_seen: bool = False

    def iface(self, name: str | None) -> Iface | None:
        """The interface called ``name``, if the probe saw it."""
        return next((i for i in self.interfaces if i.name == name), None)

    def owner_of(self, ip: str) -> Iface | None:
        """The interface holding address ``ip``."""
        return next((i for i in self.interfaces if any(a.addr == ip for a in i.addrs)), None)

    def site_value(self, key: str) -> SiteVar | None:
        """The site setting NCCL would actually use for ``key`` (env > user file > /etc)."""
        return next((s for s in self.site_env if s.key == key), None)

    def effective_site_env(self) -> dict[str, SiteVar]:
        """One winning SiteVar per key."""
        out: dict[str, SiteVar] = {}
        for s in self.site_env:
            out.setdefault(s.key, s)
        return out

    @property
    def nccl_tuple(self) -> tuple[int, ...] | None:
        """``nccl_version`` as integers, e.g. (2, 21, 5)."""
        return parse_version(self.nccl_version)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> NodeFacts:
        """Parse the probe's ``facts`` output; missing or malformed fields take defaults."""
        obj = _dict(obj)
        py, pkgs = _dict(obj.get("python")), _dict(obj.get("packages"))
        gpus, limits, workdir = _dict(obj.get("gpus")), _dict(obj.get("limits")), obj.get("workdir")
        others = _dict(obj.get("others"))
        return cls(
            hostname=str(obj.get("hostname") or ""),
            python=_str(py.get("version")),
            python_executable=_str(py.get("executable")),
            torch_version=_str(pkgs.get("torch")),
            nccl_version=_str(pkgs.get("nccl")),
            interfaces=tuple(Iface.from_json(i) for i in _list(obj.get("interfaces"))
                             if isinstance(i, Mapping)),
            default_iface=_str(obj.get("default_iface")),
            routes={str(k): Route.from_json(str(k), _dict(v))
                    for k, v in _dict(obj.get("routes")).items()},
            site_env=tuple(SiteVar(str(s.get("key")), str(s.get("value", "")),
                                   str(s.get("source", "")))
                           for s in _list(obj.get("site_env")) if isinstance(s, Mapping)),
            gpus=_int(gpus.get("count"), 0) or 0,
            gpu_driver=_str(gpus.get("driver")),
            rdma=_rdma_ports(_dict(obj.get("rdma"))),
            shm_bytes=_int(obj.get("shm_bytes")),
            memlock=_int(limits.get("memlock")),
            nofile=_int(limits.get("nofile")),
            stack=_int(limits.get("stack")),
            time=float(obj["time"]) if isinstance(obj.get("time"), int | float) else None,
            workdir_ok=(bool(workdir.get("is_dir")) if isinstance(workdir, Mapping) else None),
            workdir_denied=(isinstance(workdir, Mapping) and bool(workdir.get("is_dir"))
                            and workdir.get("accessible") is False),
            entry_ok=(bool(entry.get("found")) if isinstance(entry := obj.get("entry"), Mapping)
                      else None),
            entry_denied=isinstance(entry, Mapping) and entry.get("denied") is True,
            uid=_int(obj.get("uid")),
            user=_str(obj.get("user")),
            home=_str(obj.get("home")),
            files=tuple(str(f) for f in _list(obj.get("files"))),
            netns=_str(obj.get("netns")),
            errors={str(k): str(v) for k, v in _dict(obj.get("errors")).items()},
            container=ContainerFacts.from_json(obj.get("container")),
            fabric={k: str(v)[:80] for k, v in _dict(obj.get("fabric")).items()
                    if k in ("state", "status", "cluster_uuid", "clique_id")},
            others=tuple(OtherRun.from_json(r) for r in _list(others.get("runs"))
                         if isinstance(r, Mapping)),
            others_hidden=_str(others.get("hidden")),
            others_seen=isinstance(obj.get("others"), Mapping),
        )


def _rdma_ports(rdma: Mapping[str, Any]) -> tuple[RdmaPort, ...]:
    ports = []
    for dev in _list(rdma.get("devices")):
        if not isinstance(dev, Mapping):
            continue
        netdevs = tuple(str(n) for n in _list(dev.get("netdevs")))
        for p in _list(dev.get("ports")):
            if not isinstance(p, Mapping):
                continue
            ports.append(RdmaPort(
                device=str(dev.get("name") or ""),
                port=_int(p.get("port"), 1) or 1,
                state=_str(p.get("state")),
                phys_state=_str(p.get("phys_state")),
                link_layer=_str(p.get("link_layer")),
                rate=_str(p.get("rate")),
                driver=_str(dev.get("driver")),
                netdev=_str(p.get("netdev")),
                netdevs=netdevs,
                gids=tuple(Gid.from_json(g) for g in _list(p.get("gids"))
                           if isinstance(g, Mapping)),
            ))
    return tuple(ports)


def parse_version(text: str | None) -> tuple[int, ...] | None:
    """"2.21.5" -> (2, 21, 5); "2.13.0+cpu" -> (2, 13, 0); None when unparsable."""
    parts = []
    for piece in (text or "").split("+")[0].split("."):
        digits = re.match(r"\d+", piece)
        if not digits:
            break
        parts.append(int(digits.group()))
    return tuple(parts) or None
