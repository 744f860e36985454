"""Pure RDMA decisions for one node: which HCA ports NCCL should use, and which RoCE GID.

Inputs are ``facts.RdmaPort`` rows (the probe's view of /sys/class/infiniband); outputs are
frozen results with the reasons a dry run shows. No I/O. Fabric *policy* (NCCL_IB_TC, SL,
TIMEOUT, QPS_PER_CONNECTION, ...) is never derived here: it is not visible from a host and
comes from ``--env``, site config or a profile.

The GID rules mirror NCCL's own code so that dtrain only speaks when NCCL would get it wrong:
``nccl_gid_index`` replays ``ncclIbGetGidIndex``/``ncclUpdateGidIndex`` (net_ib/connect.cc,
NCCL >= 2.21), which does not look at the GID's netdev -- a VLAN or macvlan address that sorts
first wins (nccl#890, #1427). Before 2.21 NCCL's default index was 0.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from launcher.decide.runplan.facts import Gid, Iface, RdmaPort

INFINIBAND = "InfiniBand"
ETHERNET = "Ethernet"
AF_INET = "AF_INET"
AF_INET6 = "AF_INET6"
NCCL_AUTO_GID = (2, 21)  # first NCCL that picks the RoCE GID itself
EFA_DRIVERS = frozenset({"efa"})

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class HcaChoice:
    """The ports NCCL_IB_HCA should name, and why every other port was left out."""

    hcas: tuple[str, ...] = ()  # sorted "dev:port"
    link_layer: str | None = None
    excluded: tuple[tuple[str, str], ...] = ()  # (dev:port, why)
    efa: bool = False  # AWS EFA: aws-ofi-nccl owns the transport, no NCCL_IB_* at all
    ports: tuple[RdmaPort, ...] = ()  # the kept ports, for the GID decision

    @property
    def env_value(self) -> str | None:
        """``=mlx5_0:1,mlx5_1:1`` (exact names: without ``=``, mlx5_1 matches mlx5_10)."""
        return "=" + ",".join(self.hcas) if self.hcas else None


@dataclass(frozen=True)
class GidChoice:
    """The GID dtrain wants on one RoCE port next to the one NCCL would pick."""

    want: int | None  # None: the port has no usable RoCE v2 GID (no IP on its netdev)
    nccl_default: int  # NCCL >= 2.21's automatic choice (ADDR_FAMILY=AF_INET, no range)
    reason: str
    family: str = AF_INET
    address: str | None = None  # the IP address behind ``want``

    @property
    def agrees(self) -> bool:
        """NCCL's own rule already lands on the wanted GID."""
        return self.want is not None and self.want == self.nccl_default


@dataclass(frozen=True)
class GidPlan:
    """Per-node GID variables: usually none at all."""

    env: tuple[tuple[str, str, str], ...] = ()  # (name, value, reason)
    notes: tuple[str, ...] = ()  # why nothing (or something) was set, per port
    warnings: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()


# --------------------------------------------------------------------------- HCA selection


def _exclusion(port: RdmaPort) -> str | None:
    if not port.active:
        return f"state {port.state or 'unknown'}"
    if not port.link_up:
        return f"phys_state {port.phys_state or 'unknown'}"
    if port.link_layer not in (INFINIBAND, ETHERNET):
        return f"link layer {port.link_layer or 'unknown'}"
    return None


def select_hcas(ports: Iterable[RdmaPort], sock_if: str | None = None) -> HcaChoice:
    """Pick the backend ports: ACTIVE+LinkUp, one link layer, not the front-end NIC, top rate.

    NCCL on its own takes every ACTIVE port, front-end NICs and mixed link layers included
    ("Attempted to connect incompatible devices"), which is why the choice is made explicit.
    """
    ports = list(ports)
    if any(p.driver in EFA_DRIVERS for p in ports):
        return HcaChoice(efa=True, excluded=tuple((p.name, "EFA: handled by aws-ofi-nccl")
                                                  for p in ports))
    excluded: list[tuple[str, str]] = []
    kept: list[RdmaPort] = []
    for p in ports:
        why = _exclusion(p)
        if why:
            excluded.append((p.name, why))
        else:
            kept.append(p)
    if any(p.link_layer == INFINIBAND for p in kept):
        excluded += [(p.name, "Ethernet (RoCE) port while InfiniBand ports exist: NCCL cannot mix "
                      "link layers") for p in kept if p.link_layer != INFINIBAND]
        kept = [p for p in kept if p.link_layer == INFINIBAND]
    roce_front = [p for p in kept if p.link_layer == ETHERNET and sock_if and p.netdev == sock_if]
    if roce_front and len(roce_front) < len(kept):
        excluded += [(p.name, f"front-end NIC: its netdev {sock_if} carries the socket traffic")
                     for p in roce_front]
        kept = [p for p in kept if p not in roce_front]
    if kept:
        top = max(p.rate_gbps for p in kept)
        excluded += [(p.name, f"rate {p.rate or '?'} below the fastest {top:g} Gb/sec")
                     for p in kept if p.rate_gbps < top]
        kept = [p for p in kept if p.rate_gbps == top]
    kept.sort(key=lambda p: p.name)
    return HcaChoice(
        hcas=tuple(p.name for p in kept),
        link_layer=kept[0].link_layer if kept else None,
        excluded=tuple(excluded),
        ports=tuple(kept),
    )


# --------------------------------------------------------------------------- GID rules


def _ip6(gid: Gid | None) -> ipaddress.IPv6Address | None:
    try:
        return ipaddress.IPv6Address(gid.gid) if gid else None
    except ValueError:
        return None


def _family(gid: Gid | None) -> str:
    ip = _ip6(gid)
    return AF_INET if ip is not None and ip.ipv4_mapped is not None else AF_INET6


def _valid(gid: Gid | None) -> bool:
    """NCCL's validGid: configured (not zero, not bare fe80::) and not fe80::/64."""
    ip = _ip6(gid)
    if ip is None:
        return False
    raw = ip.packed
    if raw[:4] == b"\xfe\x80\x00\x00" and raw[4:8] == b"\x00" * 4:
        return False  # link-local (bare fe80:: counts as unconfigured, also invalid)
    return raw != b"\x00" * 16


def _version(gid: Gid | None) -> int | None:
    text = (gid.type or "").strip() if gid else ""
    if text.startswith(("IB/RoCE v1", "RoCE v1")):
        return 1
    return 2 if text.startswith("RoCE v2") else None  # unreadable (EINVAL): no version


def _in_range(gid: Gid | None, family: str, addr_range: Network | None) -> bool:
    if addr_range is None:
        return True
    ip = _ip6(gid)
    if ip is None:
        return False
    if family == AF_INET:
        last = ipaddress.IPv4Address(ip.packed[12:])
        return isinstance(addr_range, ipaddress.IPv4Network) and last in addr_range
    return isinstance(addr_range, ipaddress.IPv6Network) and ip in addr_range


def nccl_gid_index(gids: Sequence[Gid], *, family: str = AF_INET,
                   addr_range: Network | str | None = None, roce_version: int = 2) -> int:
    """The GID index NCCL >= 2.21 picks on a RoCE port (ncclIbGetGidIndex, replayed).

    Start at 0 and walk the table: a candidate of the wanted family, in range, replaces a
    current GID of the other family; a valid one of the wanted RoCE version replaces a current
    GID of another version (or an invalid one). Missing rows are zero GIDs.
    """
    rng = addr_range
    if isinstance(rng, str):
        rng = ipaddress.ip_network(rng, strict=False)
    table = {g.index: g for g in gids}
    cur = 0
    for cand in range(1, max(table, default=0) + 1):
        g, c = table.get(cand), table.get(cur)
        match = _in_range(g, family, rng)
        if _family(g) != _family(c) and _family(g) == family and match:
            cur = cand
        elif _family(g) == family and _valid(g) and match:
            if (_version(c) != _version(g) or not _valid(c)) and _version(g) == roce_version:
                cur = cand
    return cur


def _ndev_ok(gid: Gid, netdev: str | None, children: Collection[str]) -> bool:
    if not gid.ndev or not netdev:
        return False
    return gid.ndev == netdev or gid.ndev.startswith(netdev + ".") or gid.ndev in children


def _backend_ipv4(gid: Gid, subnets: Sequence[Network] | None) -> str | None:
    ip = _ip6(gid)
    v4 = ip.ipv4_mapped if ip is not None else None
    if v4 is None or v4.is_link_local or v4.is_unspecified:
        return None
    if subnets is not None and not any(v4 in n for n in subnets):
        return None
    return str(v4)


def roce_gid(port: RdmaPort, *, children: Collection[str] = (),
             subnets: Sequence[Network] | None = None) -> GidChoice:
    """The lowest RoCE v2, IPv4-mapped, routable GID bound to the port's netdev (or a child).

    GIDs on the netdev itself beat those on its VLAN/macvlan children (``netdev.<vid>`` or
    listed in ``children``); ``subnets``, when the coordinator knows them, restricts the choice
    to the backend subnets every node shares. Falls back to a global IPv6 GID (then NCCL needs
    ADDR_FAMILY=AF_INET6); ``want`` is None when the port has no routable GID at all.
    """
    nccl = nccl_gid_index(port.gids)
    v2 = [g for g in sorted(port.gids, key=lambda g: g.index)
          if _version(g) == 2 and _ndev_ok(g, port.netdev, children)]
    # The netdev's own address first: a VLAN/macvlan child often carries a management or
    # container network (nccl#890); children win only when the netdev itself has no address.
    v2.sort(key=lambda g: g.ndev != port.netdev)
    for g in v2:
        ip = _backend_ipv4(g, subnets)
        if ip:
            return GidChoice(g.index, nccl, _gid_reason(port, g, ip, nccl), AF_INET, ip)
    for g in v2:
        ip6 = _ip6(g)
        if (ip6 is not None and ip6.ipv4_mapped is None and _valid(g)
                and not (ip6.is_multicast or ip6.is_loopback or ip6.is_link_local)):
            reason = f"{port.name}: only IPv6 GIDs; index {g.index} ({ip6}) on {g.ndev}"
            pick = nccl_gid_index(port.gids, family=AF_INET6)
            if pick != g.index:  # say so, as for IPv4: the override's reason quotes it
                other = next((o for o in port.gids if o.index == pick), None)
                what = f"{_ip6(other)} on {other.ndev or '?'}" if other else "a link-local GID"
                reason += f"; NCCL 2.21+ would pick {pick} ({what})"
            return GidChoice(g.index, pick, reason, AF_INET6, str(ip6))
    reason = (f"{port.name}: no RoCE v2 GID with a routable address on {port.netdev or '?'}; "
              f"NCCL would fall back to index {nccl}")
    return GidChoice(None, nccl, reason)


def _gid_reason(port: RdmaPort, gid: Gid, ip: str, nccl: int) -> str:
    # the interface that holds the address: the port's netdev or a VLAN/macvlan child of it
    base = f"{port.name}: backend GID {gid.index} ({ip} on {gid.ndev})"
    if gid.index == nccl:
        return base + "; NCCL 2.21+ picks the same"
    other = next((g for g in port.gids if g.index == nccl), None)
    what = f"{other.ipv4 or other.gid} on {other.ndev or '?'}" if other else "a link-local GID"
    return base + f"; NCCL 2.21+ would pick {nccl} ({what})"


def children_of(netdev: str | None, ifaces: Iterable[Iface]) -> tuple[str, ...]:
    """VLAN/macvlan interfaces stacked on ``netdev`` (their ``lower_*`` link names it)."""
    if not netdev:
        return ()
    return tuple(i.name for i in ifaces if netdev in i.lower)


def check_gid_index(ports: Iterable[RdmaPort], index: int) -> list[str]:
    """Why a user/profile NCCL_IB_GID_INDEX is wrong on this node's RoCE ports ([] if fine)."""
    problems = []
    for p in ports:
        if p.link_layer != ETHERNET:
            continue
        g = next((g for g in p.gids if g.index == index), None)
        if g is None:
            problems.append(f"{p.name}: GID index {index} is empty")
        elif _version(g) != 2:
            problems.append(f"{p.name}: GID {index} is {g.type or 'of unknown type'}, not RoCE v2")
        elif _backend_ipv4(g, None) is None:
            problems.append(f"{p.name}: GID {index} ({g.gid}) is not a routable IPv4 address")
        elif not _ndev_ok(g, p.netdev, ()):
            problems.append(f"{p.name}: GID {index} belongs to {g.ndev}, not {p.netdev}")
        elif g.ndev != p.netdev:
            want = roce_gid(p)
            if want.want is not None and want.want != index:
                problems.append(f"{p.name}: GID {index} ({g.ipv4}) is on {g.ndev}; the backend "
                                f"address is GID {want.want} ({want.address} on {p.netdev})")
    return problems


# --------------------------------------------------------------------------- per-node plan


def _network_of(ip: str, ifaces: Iterable[Iface]) -> Network:
    for iface in ifaces:
        for a in iface.addrs:
            if a.addr == ip:
                return a.network
    return ipaddress.ip_network(ip)


def _covering(nets: Sequence[Network]) -> Network:
    net = nets[0]
    while not all(n.subnet_of(net) for n in nets if n.version == net.version):  # type: ignore[arg-type]
        net = net.supernet()
    return net


def plan_gids(ports: Sequence[RdmaPort], *, nccl_version: tuple[int, ...] | None = None,
              ifaces: Sequence[Iface] = (), subnets: Sequence[Network] | None = None) -> GidPlan:
    """NCCL_IB_GID_INDEX / NCCL_IB_ADDR_RANGE / NCCL_IB_ADDR_FAMILY for the kept RoCE ports.

    Usually nothing: NCCL >= 2.21 (or an unknown version, as in current torch wheels) picks
    the same GID. Where it would not: ADDR_RANGE on a known NCCL >= 2.21 (verified to make
    NCCL's rule land on the wanted GID), else one GID_INDEX when every port agrees. NCCL older
    than 2.21 defaults to index 0, so it gets GID_INDEX whenever the wanted index is not 0.
    """
    roce = [p for p in ports if p.link_layer == ETHERNET]
    if not roce:
        return GidPlan()
    choices = [(p, roce_gid(p, children=children_of(p.netdev, ifaces), subnets=subnets))
               for p in roce]
    errors = tuple(c.reason for _, c in choices if c.want is None)
    notes = tuple(c.reason for _, c in choices if c.want is not None)
    good = [(p, c) for p, c in choices if c.want is not None]
    if not good:
        return GidPlan(notes=notes, errors=errors)
    families = {c.family for _, c in good}
    if len(families) > 1:
        return GidPlan(notes=notes, errors=errors + (
            "RoCE ports mix IPv4 and IPv6-only GIDs: NCCL_IB_ADDR_FAMILY cannot serve both",))
    family = families.pop()
    old = nccl_version is not None and nccl_version < NCCL_AUTO_GID
    env: list[tuple[str, str, str]] = []
    if family == AF_INET6 and not old:
        env.append(("NCCL_IB_ADDR_FAMILY", AF_INET6, "RoCE ports have only IPv6 GIDs"))
    wants = {c.want for _, c in good}
    if old:
        if wants == {0}:
            return GidPlan(notes=notes, errors=errors)
        if len(wants) == 1:
            env.append(("NCCL_IB_GID_INDEX", str(wants.pop()),
                        f"NCCL {_v(nccl_version)} < 2.21 defaults to GID 0; " + "; ".join(notes)))
            return GidPlan(tuple(env), notes, (), errors)
        return GidPlan(tuple(env), notes, (), errors + (
            "ports need different GID indices and NCCL < 2.21 takes one NCCL_IB_GID_INDEX: "
            "upgrade NCCL to 2.21 or later",))
    rule = {p.name: nccl_gid_index(p.gids, family=family) for p, _ in good}
    if all(rule[p.name] == c.want for p, c in good):
        return GidPlan(tuple(env), notes, (), errors)
    return _override(good, env, notes, errors, family, ifaces, known_new=nccl_version is not None)


def _override(good: Sequence[tuple[RdmaPort, GidChoice]], env: list[tuple[str, str, str]],
              notes: tuple[str, ...], errors: tuple[str, ...], family: str,
              ifaces: Sequence[Iface], *, known_new: bool) -> GidPlan:
    """NCCL's rule misses the backend GID on some port: steer it, preferring ADDR_RANGE."""
    wants = {c.want for _, c in good}
    why = "; ".join(n for n in notes if "would pick" in n)
    if known_new:
        rng = _covering([_network_of(c.address or "", ifaces) for _, c in good])
        if all(nccl_gid_index(p.gids, family=family, addr_range=rng) == c.want for p, c in good):
            env.append(("NCCL_IB_ADDR_RANGE", str(rng), why))
            return GidPlan(tuple(env), notes, (), errors)
    if len(wants) == 1:
        if not known_new:
            why += "; NCCL version unknown: an index works on every version, ADDR_RANGE does not"
        env.append(("NCCL_IB_GID_INDEX", str(wants.pop()), why))
        return GidPlan(tuple(env), notes, (), errors)
    return GidPlan(tuple(env), notes, (), errors + (
        f"NCCL's GID choice misses the backend address ({why}) and no single "
        "NCCL_IB_GID_INDEX or NCCL_IB_ADDR_RANGE fixes every port; set them with --env",))


def _v(version: tuple[int, ...] | None) -> str:
    return ".".join(map(str, version)) if version else "?"
