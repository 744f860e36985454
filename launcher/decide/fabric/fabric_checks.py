"""Doctor checks across nodes: master choice, socket interfaces, MTU, HCAs, RoCE GIDs and
the master-port test. Pure functions over ``NodeFacts`` (and the port probe's raw result).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from launcher.decide.fabric.checks import (
    FAIL,
    OK,
    SKIP,
    WARN,
    CheckResult,
    MasterPick,
    PortProbe,
    _hca,
    _others,
    _reference,
    _sock_if,
)
from launcher.decide.fabric.rdma import ETHERNET, HcaChoice, check_gid_index, plan_gids
from launcher.decide.runplan.facts import NodeFacts
from launcher.decide.runplan.netenv import (
    SocketChoice,
    choose_master,
    pick_master_addr,
    socket_choice,
)
from launcher.errors import PreflightFailed


def master_candidates(master: NodeFacts, master_addr: str | None, nnodes: int) -> list[str]:
    """The addresses to try for rendezvous, as `dtrain run` would (explicit one first)."""
    if master_addr:
        return [master_addr]
    if nnodes <= 1:
        return ["127.0.0.1"]
    return pick_master_addr(master)


def pick_master(facts_by_host: Mapping[str, NodeFacts], master_addr: str | None = None
                ) -> MasterPick | None:
    """Node 0 (the first probed host) and the address every worker can route to.

    Same rules as `dtrain run` (``netenv.choose_master``); a failure is kept, not raised,
    so every other check still runs. None when no node was probed.
    """
    if not facts_by_host:
        return None
    host, master = next(iter(facts_by_host.items()))
    candidates = master_candidates(master, master_addr, len(facts_by_host))
    if len(facts_by_host) == 1:
        return MasterPick(host, candidates[0], "single node", candidates=tuple(candidates))
    workers = {h: f.routes for h, f in facts_by_host.items() if h != host}
    try:
        choice = choose_master(candidates, workers)
    except PreflightFailed as exc:
        return MasterPick(host, None, error=exc.message, candidates=tuple(candidates))
    return MasterPick(host, choice.addr, choice.reason, choice.warning, None, tuple(candidates))


def check_master(pick: MasterPick | None) -> list[CheckResult]:
    """One row on node 0: the rendezvous address, or why no worker set can reach one."""
    if pick is None:
        return []
    if pick.addr is None:
        return [CheckResult(pick.host, "master", FAIL, pick.error or "no master address")]
    text = f"{pick.addr}: {pick.reason}"
    if pick.warning:
        return [CheckResult(pick.host, "master", WARN, f"{text}; {pick.warning}")]
    return [CheckResult(pick.host, "master", OK, text)]


def socket_choices(facts_by_host: Mapping[str, NodeFacts], pick: MasterPick | None
                   ) -> dict[str, SocketChoice | str]:
    """Each node's interface towards the master, or the reason it has none (a string)."""
    addr = pick.probe_addr if pick else None
    out: dict[str, SocketChoice | str] = {}
    for h, f in facts_by_host.items():
        if pick is None or addr is None:
            out[h] = "no master address to route to"
            continue
        try:
            out[h] = socket_choice(f, addr, h == pick.host, multi_node=len(facts_by_host) > 1)
        except PreflightFailed as exc:
            out[h] = exc.message
    return out


def check_socket(facts_by_host: Mapping[str, NodeFacts], pick: MasterPick | None,
                 sockets: Mapping[str, SocketChoice | str] | None = None) -> list[CheckResult]:
    """The interface toward the master exists and is not lo/docker0/down (nccl#1581 & co)."""
    sockets = socket_choices(facts_by_host, pick) if sockets is None else sockets
    out = []
    for h in facts_by_host:
        sock = sockets.get(h, "not decided")
        if isinstance(sock, str):
            out.append(CheckResult(h, "socket", FAIL, sock))
        elif sock.warnings:
            out.append(CheckResult(h, "socket", WARN,
                                   f"{sock.ifname} ({sock.reason}); " + "; ".join(sock.warnings)))
        else:
            out.append(CheckResult(h, "socket", OK, f"{sock.ifname} ({sock.reason})"))
    return out


def check_mtu(facts_by_host: Mapping[str, NodeFacts],
              sockets: Mapping[str, SocketChoice | str]) -> list[CheckResult]:
    """Same MTU on every node's socket interface: a mismatch stalls large transfers."""
    mtus: dict[str, int] = {}
    for h, f in facts_by_host.items():
        iface = f.iface(_sock_if(sockets, h))
        if iface is not None and iface.mtu is not None:
            mtus[h] = iface.mtu
    ref = _reference(mtus) if mtus else None
    out = []
    for h in facts_by_host:
        name = _sock_if(sockets, h)
        if h not in mtus:
            why = "no socket interface" if name is None else f"MTU of {name} unknown"
            out.append(CheckResult(h, "mtu", SKIP, why))
        elif mtus[h] != ref:
            out.append(CheckResult(h, "mtu", WARN, f"{name} MTU {mtus[h]}, {ref} on "
                                   f"{_others(mtus, ref)}"))
        else:
            out.append(CheckResult(h, "mtu", OK, f"{name} MTU {mtus[h]}"))
    return out


def _hca_signature(hca: HcaChoice) -> tuple[str, int, float] | None:
    if hca.efa:
        return ("EFA", 0, 0.0)
    if not hca.hcas:
        return None
    return (hca.link_layer or "?", len(hca.hcas), max(p.rate_gbps for p in hca.ports))


def _describe(sig: tuple[str, int, float] | None) -> str:
    if sig is None:
        return "no usable RDMA port"
    if sig[0] == "EFA":
        return "AWS EFA"
    kind = "RoCE" if sig[0] == ETHERNET else sig[0]
    return f"{sig[1]} x {kind} at {sig[2]:g} Gb/s"


def check_hca(facts_by_host: Mapping[str, NodeFacts],
              sockets: Mapping[str, SocketChoice | str] | None = None) -> list[CheckResult]:
    """Backend ports ACTIVE/LinkUp, with the same count, link layer and rate on every node.

    NCCL uses as many rails as the weakest node allows and cannot mix IB with sockets or
    InfiniBand with RoCE; a node with a port DOWN silently halves the bandwidth of the job.
    """
    sockets = sockets or {}
    hcas = {h: _hca(f, _sock_if(sockets, h)) for h, f in facts_by_host.items()}
    sigs = {h: _hca_signature(c) for h, c in hcas.items()}
    ref = _reference(sigs) if sigs else None
    out = []
    for h, f in facts_by_host.items():
        hca, sig = hcas[h], sigs[h]
        skipped = "; ".join(f"{n}: {why}" for n, why in hca.excluded)
        if sig != ref:
            mine = "no RDMA devices" if not f.rdma else _describe(sig) + (
                f" ({skipped})" if sig is None and skipped else "")
            out.append(CheckResult(h, "hca", FAIL, f"{mine} here, {_describe(ref)} on "
                                   f"{_others(sigs, ref)}"))
        elif not f.rdma:
            out.append(CheckResult(h, "hca", SKIP, "no RDMA devices: NCCL uses TCP sockets"))
        elif sig is None:
            out.append(CheckResult(h, "hca", WARN, f"RDMA devices present but none usable "
                                   f"({skipped}): NCCL uses TCP sockets"))
        elif hca.efa:
            out.append(CheckResult(h, "hca", OK, "AWS EFA (aws-ofi-nccl owns the transport)"))
        else:
            text = f"{hca.env_value} ({_describe(sig)})"
            out.append(CheckResult(h, "hca", OK,
                                   text + (f"; excluded {skipped}" if skipped else "")))
    return out


def check_roce_gid(facts_by_host: Mapping[str, NodeFacts],
                   sockets: Mapping[str, SocketChoice | str] | None = None) -> list[CheckResult]:
    """Every kept RoCE port has a RoCE v2 IPv4 GID on its netdev; a set GID index is right.

    Without such a GID (no IP on the backend netdev) NCCL falls back to a link-local or
    v1 GID and the job hangs at the first all-reduce. A user/site ``NCCL_IB_GID_INDEX`` is
    checked against the tables and, even when right, flagged: NCCL 2.21+ picks it itself.
    """
    sockets = sockets or {}
    out = []
    for h, f in facts_by_host.items():
        hca = _hca(f, _sock_if(sockets, h))
        roce = [p for p in hca.ports if p.link_layer == ETHERNET]
        if not roce:
            out.append(CheckResult(h, "roce_gid", SKIP, "no RoCE ports in use"))
            continue
        plan = plan_gids(roce, nccl_version=f.nccl_tuple, ifaces=f.interfaces)
        set_by = f.site_value("NCCL_IB_GID_INDEX")
        problems = list(plan.errors)
        warnings = list(plan.warnings)
        if set_by is not None:
            try:
                bad = check_gid_index(roce, int(set_by.value))
            except ValueError:
                bad = [f"not an integer: {set_by.value!r}"]
            problems += [f"NCCL_IB_GID_INDEX={set_by.value} ({set_by.source}): {p}" for p in bad]
            if not bad:
                warnings.append(f"NCCL_IB_GID_INDEX={set_by.value} set by {set_by.source}: "
                                "NCCL 2.21+ should not need it")
        if problems:
            out.append(CheckResult(h, "roce_gid", FAIL, "; ".join(problems)))
            continue
        text = "; ".join(plan.notes)
        if plan.env:
            text += "; dtrain sets " + ", ".join(f"{n}={v}" for n, v, _ in plan.env)
        if warnings:
            out.append(CheckResult(h, "roce_gid", WARN, "; ".join(warnings) + f" ({text})"))
        else:
            out.append(CheckResult(h, "roce_gid", OK, text))
    return out


# --------------------------------------------------------------------------- limits


def check_master_port(probe: PortProbe | None, pick: MasterPick | None,
                      hosts: Iterable[str]) -> list[CheckResult]:
    """Node 0 binds the port; every other node connects to it (firewalls, wrong subnet)."""
    hosts = list(hosts)
    if probe is None:
        why = "no master address" if pick is None or pick.probe_addr is None else "not tested"
        return [CheckResult(h, "master_port", SKIP, why) for h in hosts]
    target = f"{probe.addr}:{probe.port}" if probe.port else probe.addr
    master = pick.host if pick else (hosts[0] if hosts else "")
    out = []
    listen = probe.listen
    if isinstance(listen, str) or not listen.get("ok"):
        err = listen if isinstance(listen, str) else listen.get("error")
        out.append(CheckResult(master, "master_port", FAIL, f"cannot bind {target}: {err}"))
        out += [CheckResult(h, "master_port", SKIP, "master port not bound")
                for h in hosts if h != master]
        return out
    out.append(CheckResult(master, "master_port", OK, f"bound {target}"))
    for h in hosts:
        if h == master:
            continue
        got = probe.connects.get(h, "not tested")
        if isinstance(got, str):
            out.append(CheckResult(h, "master_port", FAIL, f"{target}: {got}"))
        elif got.get("ok"):
            out.append(CheckResult(h, "master_port", OK,
                                   f"reached {target} in {float(got.get('ms') or 0):.1f} ms"))
        else:
            out.append(CheckResult(h, "master_port", FAIL,
                                   f"cannot connect to {target}: {got.get('error')}"))
    return out


