"""`dtrain doctor`: every preflight check on every node, as one table and one exit code.

Why a separate command: a 64-node job that dies at NCCL init after 10 minutes of scheduling
usually had a cause visible in seconds (a node without torch, an odd torch version, a port
that is DOWN, a firewall, memlock limited). The doctor shows *all* such causes at once, per
node, instead of the first one ``dtrain run`` trips over.

Shape (docs/doctor.md): the I/O lives in one place, ``gather`` (connect, probe, master-port
test); every check is a PURE function over ``NodeFacts`` returning ``CheckResult`` rows, so
each rule is tested without a network. ``fast_checks`` is the cheap subset ``dtrain run``
applies to the facts it probed anyway. Rule sources: /work/shared/notes/nccl-roce.md (c).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO, TypeVar

from launcher.errors import DtrainError, PreflightFailed
from launcher.facts import UNLIMITED, NodeFacts
from launcher.hostfile import fold
from launcher.models import Host
from launcher.netenv import SocketChoice, choose_master, pick_master_addr, socket_choice
from launcher.rdma import ETHERNET, HcaChoice, check_gid_index, plan_gids, select_hcas

DOCTOR_VERSION = 1  # bump when the JSON envelope changes incompatibly

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
STATUSES = (OK, WARN, FAIL, SKIP)

GIB = 1 << 30
SHM_MIN = GIB  # Docker's default /dev/shm is 64 MiB: NCCL's shm transport then fails
CLOCK_WARN_S = 1.0
NOFILE_MIN = 32768  # "open files >= 32K at scale" (NCCL opens sockets per peer and channel)
NOFILE_SCALE_NODES = 16  # below this many nodes the default 1024 is enough in practice
NCCL_STACK_FIXED = (2, 28)  # from 2.28 NCCL sizes its thread stacks itself
PEERMEM = "/sys/module/nvidia_peermem"

CHECKS = ("ssh", "python", "hostname", "torch", "nccl", "gpu", "master", "socket",
          "master_port", "mtu", "hca", "roce_gid", "memlock", "gpudirect", "shm", "limits",
          "clock")
FAST_CHECKS = ("python", "hostname", "torch", "shm", "memlock")

V = TypeVar("V", bound=Hashable)


@dataclass(frozen=True)
class CheckResult:
    """One cell of the node x check table; ``status`` is one of STATUSES."""

    host: str
    check: str
    status: str
    detail: str = ""

    @property
    def failed(self) -> bool:
        """A FAIL row: it blocks a launch."""
        return self.status == FAIL

    def to_json(self) -> dict[str, str]:
        """The row as it appears in ``--json``'s ``checks`` list."""
        return {"host": self.host, "check": self.check, "status": self.status,
                "detail": self.detail}


@dataclass(frozen=True)
class MasterPick:
    """Where rendezvous would go: node 0's address every worker reaches, or why none."""

    host: str
    addr: str | None  # None: no candidate reachable by every worker (see ``error``)
    reason: str = ""
    warning: str | None = None
    error: str | None = None
    candidates: tuple[str, ...] = ()

    @property
    def probe_addr(self) -> str | None:
        """The address to test sockets against: the choice, else the first candidate."""
        return self.addr or (self.candidates[0] if self.candidates else None)


@dataclass(frozen=True)
class PortProbe:
    """Raw outcome of the master-port test: the probe's JSON per node, or an error string."""

    addr: str
    port: int
    listen: Mapping[str, Any] | str
    connects: Mapping[str, Mapping[str, Any] | str] = field(default_factory=dict)


@dataclass(frozen=True)
class Gathered:
    """Everything the I/O phase learned: the only input of ``evaluate``."""

    hosts: tuple[Host, ...]
    connect_errors: Mapping[str, str] = field(default_factory=dict)
    probe_errors: Mapping[str, str] = field(default_factory=dict)
    facts: Mapping[str, NodeFacts] = field(default_factory=dict)
    timing: Mapping[str, tuple[float, float]] = field(default_factory=dict)  # (sent, received)
    master: MasterPick | None = None
    port: PortProbe | None = None


@dataclass(frozen=True)
class DoctorOptions:
    """What the doctor runs on the nodes and how long it waits."""

    python: str = "python3"
    setup: str | None = None
    master_addr: str | None = None
    master_port: int | None = None  # None: any free port (what `dtrain run` picks by default)
    fanout: int = 64
    probe_timeout: float = 30.0


# --------------------------------------------------------------------------- helpers


def _labels(hosts: Iterable[Host | str]) -> list[str]:
    return [h if isinstance(h, str) else h.label for h in hosts]


def _reference(values: Mapping[str, V]) -> V:
    """The majority value; a tie goes to the value seen first (node 0 comes first)."""
    counts = Counter(values.values())
    best = max(counts.values())
    return next(v for v in values.values() if counts[v] == best)


def _others(values: Mapping[str, V], want: V) -> str:
    return fold(h for h, v in values.items() if v == want)


def _size(n: int) -> str:
    for unit, scale in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}".replace(".0 ", " ")
    return f"{n} B"


def _limit(n: int | None) -> str:
    if n is None:
        return "unknown"
    return "unlimited" if n == UNLIMITED else _size(n)


def _hca(facts: NodeFacts, sock_if: str | None) -> HcaChoice:
    return select_hcas(facts.rdma, sock_if)


def _uses_rdma(hca: HcaChoice) -> bool:
    return bool(hca.hcas) or hca.efa


def _sock_if(sockets: Mapping[str, SocketChoice | str], host: str) -> str | None:
    sock = sockets.get(host)
    return sock.ifname if isinstance(sock, SocketChoice) else None


# --------------------------------------------------------------------------- reachability


def check_ssh(hosts: Sequence[Host | str], connect_errors: Mapping[str, str]
              ) -> list[CheckResult]:
    """Reachable with key login: the transport's own message for each node that is not."""
    return [CheckResult(h, "ssh", FAIL, connect_errors[h]) if h in connect_errors
            else CheckResult(h, "ssh", OK, "connected") for h in _labels(hosts)]


def check_python(facts_by_host: Mapping[str, NodeFacts], hosts: Sequence[Host | str],
                 probe_errors: Mapping[str, str] | None = None) -> list[CheckResult]:
    """The interpreter exists and ran the probe (a missing one exits 98, "not found").

    ``hosts`` are the nodes that should have facts (the caller leaves the unreachable ones
    to ``check_ssh``); one without facts failed here. Probe sections that raised are
    warnings: the rest of the facts are still good.
    """
    probe_errors = probe_errors or {}
    out = []
    for h in _labels(hosts):
        facts = facts_by_host.get(h)
        if facts is None:
            out.append(CheckResult(h, "python", FAIL, probe_errors.get(h, "not probed")))
            continue
        where = f" ({facts.python_executable})" if facts.python_executable else ""
        text = f"Python {facts.python or '?'}{where}"
        if facts.errors:
            bad = ", ".join(f"{k}: {v}" for k, v in sorted(facts.errors.items()))
            out.append(CheckResult(h, "python", WARN, f"{text}; probe sections failed: {bad}"))
        else:
            out.append(CheckResult(h, "python", OK, text))
    return out


def check_hostnames(facts_by_host: Mapping[str, NodeFacts]) -> list[CheckResult]:
    """Hostnames must be unique: two entries for one machine double its ranks and ports.

    Compared case-insensitively (DNS is). An empty hostname is a warning, not a failure.
    """
    by_name: dict[str, list[str]] = {}
    for h, f in facts_by_host.items():
        by_name.setdefault(f.hostname.lower(), []).append(h)
    out = []
    for h, f in facts_by_host.items():
        if not f.hostname:
            out.append(CheckResult(h, "hostname", WARN, "the node reported no hostname"))
            continue
        twins = [o for o in by_name[f.hostname.lower()] if o != h]
        if twins:
            out.append(CheckResult(h, "hostname", FAIL, f"{f.hostname} is also the hostname of "
                                   f"{fold(twins)}: the same machine listed twice?"))
        else:
            out.append(CheckResult(h, "hostname", OK, f.hostname))
    return out


# --------------------------------------------------------------------------- software


def check_torch(facts_by_host: Mapping[str, NodeFacts]) -> list[CheckResult]:
    """torch installed for the job's interpreter, with one version everywhere.

    Different torch builds (2.12 vs 2.13, +cpu vs +cu124) disagree on the c10d wire format
    and the NCCL they bundle; the failure shows up as a hang or a cryptic error at init.
    The version comes from the dist metadata, so nothing imports torch on the nodes.
    """
    present = {h: f.torch_version for h, f in facts_by_host.items() if f.torch_version}
    ref = _reference(present) if present else None
    out = []
    for h, f in facts_by_host.items():
        v = f.torch_version
        if not v:
            exe = f.python_executable or "the node's python"
            out.append(CheckResult(h, "torch", FAIL, f"torch is not installed for {exe}"))
        elif v != ref:
            out.append(CheckResult(h, "torch", FAIL, f"torch {v} here, {ref} on "
                                   f"{_others(present, ref)}: install one version everywhere"))
        else:
            out.append(CheckResult(h, "torch", OK, f"torch {v}"))
    return out


def check_nccl(facts_by_host: Mapping[str, NodeFacts]) -> list[CheckResult]:
    """One NCCL version everywhere ("The NCCL version needs to match", nccl#286).

    Known only from the nvidia-nccl-cu* wheel; without one (CPU torch, a system NCCL)
    there is nothing to compare and the row is skipped.
    """
    known = {h: f.nccl_version for h, f in facts_by_host.items() if f.nccl_version}
    if not known:
        return [CheckResult(h, "nccl", SKIP, "no nvidia-nccl wheel") for h in facts_by_host]
    ref = _reference(known)
    out = []
    for h, f in facts_by_host.items():
        v = f.nccl_version
        if not v:
            out.append(CheckResult(h, "nccl", WARN, f"no nvidia-nccl wheel here; {ref} on "
                                   f"{_others(known, ref)}"))
        elif v != ref:
            out.append(CheckResult(h, "nccl", FAIL, f"NCCL {v} here, {ref} on "
                                   f"{_others(known, ref)}"))
        else:
            out.append(CheckResult(h, "nccl", OK, f"NCCL {v}"))
    return out


def check_gpus(facts_by_host: Mapping[str, NodeFacts],
               slots: Mapping[str, int | None] | None = None) -> list[CheckResult]:
    """GPUs visible, at least as many as the hostfile's slots; same count and driver.

    No GPU at all is only a warning: CPU jobs with the gloo backend are legitimate. A node
    that shows fewer GPUs than its peers often lost one (fell off the bus, Xid 79).
    """
    slots = slots or {}
    counts = {h: f.gpus for h, f in facts_by_host.items()}
    ref_count = _reference(counts) if counts else 0
    drivers = {h: f.gpu_driver for h, f in facts_by_host.items() if f.gpu_driver}
    ref_driver = _reference(drivers) if drivers else None
    out = []
    for h, f in facts_by_host.items():
        want = slots.get(h)
        if f.gpus == 0:
            out.append(CheckResult(h, "gpu", WARN, "no GPU visible: CPU only (gloo backend)"))
            continue
        text = f"{f.gpus} GPU(s)" + (f", driver {f.gpu_driver}" if f.gpu_driver else "")
        if want is not None and want > f.gpus:
            out.append(CheckResult(h, "gpu", FAIL, f"{text}, but slots={want}"))
        elif f.gpus != ref_count:
            out.append(CheckResult(h, "gpu", WARN, f"{text}; {ref_count} on "
                                   f"{_others(counts, ref_count)}"))
        elif f.gpu_driver and f.gpu_driver != ref_driver:
            out.append(CheckResult(h, "gpu", WARN, f"{text}; driver {ref_driver} on "
                                   f"{_others(drivers, ref_driver)}"))
        else:
            out.append(CheckResult(h, "gpu", OK, text))
    return out


# --------------------------------------------------------------------------- network


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


def check_memlock(facts_by_host: Mapping[str, NodeFacts]) -> list[CheckResult]:
    """Max locked memory must be unlimited where RDMA is used (NCCL registers buffers).

    Without usable RDMA ports the limit does not matter: the row says so (skip).
    """
    out = []
    for h, f in facts_by_host.items():
        text = f"max locked memory {_limit(f.memlock)}"
        if not _uses_rdma(_hca(f, None)):
            status = OK if f.memlock == UNLIMITED else SKIP
            out.append(CheckResult(h, "memlock", status, text + (
                "" if status == OK else " (no RDMA in use: not needed)")))
        elif f.memlock == UNLIMITED:
            out.append(CheckResult(h, "memlock", OK, text))
        elif f.memlock is None:
            out.append(CheckResult(h, "memlock", WARN, text + " with RDMA ports"))
        else:
            out.append(CheckResult(h, "memlock", FAIL, text + " with RDMA ports: NCCL needs "
                                   "unlimited (limits.conf memlock, systemd LimitMEMLOCK, "
                                   "sshd UsePAM)"))
    return out


def check_shm(facts_by_host: Mapping[str, NodeFacts]) -> list[CheckResult]:
    """/dev/shm at least 1 GiB: NCCL's intra-node shared-memory buffers live there."""
    out = []
    for h, f in facts_by_host.items():
        if f.shm_bytes is None:
            out.append(CheckResult(h, "shm", WARN, "/dev/shm size unknown (not mounted?)"))
        elif f.shm_bytes < SHM_MIN:
            out.append(CheckResult(h, "shm", WARN, f"/dev/shm is {_size(f.shm_bytes)} (< 1 GiB): "
                                   "NCCL may fail (docker run --shm-size / --ipc=host)"))
        else:
            out.append(CheckResult(h, "shm", OK, f"/dev/shm {_size(f.shm_bytes)}"))
    return out


def check_limits(facts_by_host: Mapping[str, NodeFacts]) -> list[CheckResult]:
    """Open files enough at scale; stack NOT unlimited (glibc then gives threads 2 MB)."""
    nnodes = len(facts_by_host)
    out = []
    for h, f in facts_by_host.items():
        text = f"nofile {f.nofile if f.nofile not in (None, UNLIMITED) else _limit(f.nofile)}" \
               f", stack {_limit(f.stack)}"
        problems = []
        if f.stack == UNLIMITED and (f.nccl_tuple is None or f.nccl_tuple < NCCL_STACK_FIXED):
            problems.append("stack unlimited: NCCL < 2.28 threads get only 2 MB (ulimit -s 8192)")
        if (nnodes >= NOFILE_SCALE_NODES and f.nofile is not None and f.nofile != UNLIMITED
                and f.nofile < NOFILE_MIN):
            problems.append(f"nofile below {NOFILE_MIN} for {nnodes} nodes")
        out.append(CheckResult(h, "limits", WARN if problems else OK,
                               "; ".join([text, *problems])))
    return out


def check_gpudirect(facts_by_host: Mapping[str, NodeFacts],
                    sockets: Mapping[str, SocketChoice | str] | None = None
                    ) -> list[CheckResult]:
    """GPUs + IB/RoCE without nvidia_peermem: NCCL copies through host memory (or needs
    DMA-BUF, which the probe cannot see): a warning, never a failure."""
    sockets = sockets or {}
    out = []
    for h, f in facts_by_host.items():
        hca = _hca(f, _sock_if(sockets, h))
        if f.gpus == 0 or not hca.hcas or hca.efa:
            out.append(CheckResult(h, "gpudirect", SKIP, "needs GPUs and IB/RoCE ports"))
        elif PEERMEM in f.files:
            out.append(CheckResult(h, "gpudirect", OK, "nvidia_peermem loaded"))
        else:
            out.append(CheckResult(h, "gpudirect", WARN, "nvidia_peermem not loaded: GPUDirect "
                                   "RDMA only with DMA-BUF (modprobe nvidia_peermem)"))
    return out


def check_clock(facts_by_host: Mapping[str, NodeFacts],
                timing: Mapping[str, tuple[float, float]]) -> list[CheckResult]:
    """Clock offset against the launcher, warn above 1 s (log correlation, flight recorder).

    The node read its clock somewhere between the launcher's send and receive times, so the
    offset is measured against that window: only what lies outside it counts (RTT-corrected,
    conservatively).
    """
    out = []
    for h, f in facts_by_host.items():
        window = timing.get(h)
        if f.time is None or window is None:
            out.append(CheckResult(h, "clock", SKIP, "no timestamp"))
            continue
        sent, received = window
        offset = 0.0 if sent <= f.time <= received else (
            f.time - received if f.time > received else f.time - sent)
        slack = (received - sent) / 2
        if abs(offset) > CLOCK_WARN_S:
            way = "ahead of" if offset > 0 else "behind"
            out.append(CheckResult(h, "clock", WARN, f"{abs(offset):.1f} s {way} the launcher "
                                   "(chrony/NTP not running?)"))
        else:
            out.append(CheckResult(h, "clock", OK, f"offset {offset * 1000:+.0f} ms "
                                   f"(+/- {slack * 1000:.0f} ms)"))
    return out


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


# --------------------------------------------------------------------------- composition


def fast_checks(facts_by_host: Mapping[str, NodeFacts], hosts: Sequence[Host | str]
                ) -> list[CheckResult]:
    """The cheap subset `dtrain run` applies to the facts it probed anyway (no extra I/O).

    python ran, hostnames unique, torch present with one version, /dev/shm, memlock with
    RDMA. ``hosts`` gives the order (node 0 first) and names hosts missing from the facts.
    """
    order = _labels(hosts)
    ordered = {h: facts_by_host[h] for h in order if h in facts_by_host}
    ordered.update({h: f for h, f in facts_by_host.items() if h not in ordered})
    return (check_python(ordered, order) + check_hostnames(ordered) + check_torch(ordered)
            + check_shm(ordered) + check_memlock(ordered))


def failures(results: Iterable[CheckResult]) -> list[CheckResult]:
    """The FAIL rows."""
    return [r for r in results if r.failed]


def failure_message(results: Iterable[CheckResult]) -> str | None:
    """One line listing every FAIL (for a PreflightFailed), or None when nothing failed."""
    bad = failures(results)
    if not bad:
        return None
    return "; ".join(f"{r.host}: {r.check}: {r.detail}" for r in bad)


def evaluate(g: Gathered) -> list[CheckResult]:
    """Every check over what ``gather`` learned, ordered check by check, node 0 first."""
    labels = [h.label for h in g.hosts]
    facts = {h: g.facts[h] for h in labels if h in g.facts}
    pick = g.master
    sockets = socket_choices(facts, pick)
    slots = {h.label: h.slots for h in g.hosts}
    rows = (check_ssh(labels, g.connect_errors)
            + check_python(facts, [h for h in labels if h not in g.connect_errors],
                           g.probe_errors)
            + check_hostnames(facts) + check_torch(facts) + check_nccl(facts)
            + check_gpus(facts, slots) + check_master(pick) + check_socket(facts, pick, sockets)
            + check_master_port(g.port, pick, facts) + check_mtu(facts, sockets)
            + check_hca(facts, sockets) + check_roce_gid(facts, sockets)
            + check_memlock(facts) + check_gpudirect(facts, sockets) + check_shm(facts)
            + check_limits(facts) + check_clock(facts, g.timing))
    return rows


def exit_code(results: Sequence[CheckResult], *, strict: bool = False) -> int:
    """255 if a node was unreachable (as exec/run), 1 on any FAIL (or warn with --strict)."""
    if any(r.check == "ssh" and r.failed for r in results):
        return 255
    bad = {FAIL, WARN} if strict else {FAIL}
    return 1 if any(r.status in bad for r in results) else 0


def envelope(results: Sequence[CheckResult], code: int) -> dict[str, Any]:
    """The versioned ``--json`` document."""
    return {"doctor_version": DOCTOR_VERSION, "ok": code == 0,
            "checks": [r.to_json() for r in results]}


# --------------------------------------------------------------------------- I/O


async def _start_probe(conn: Any, params: Mapping[str, Any], opts: DoctorOptions) -> Any:
    """Start the probe and hand it its params; tolerate a command that already exited.

    When the interpreter is missing the remote shell exits 98 before reading stdin, so the
    write may find the channel closed: that is not the error to report, its stderr is
    (``read_json_line`` reads it once stdout turns out empty).
    """
    from launcher import wire

    python = conn.host.python or opts.python
    proc = await conn.start(wire.remote_command(python, setup=opts.setup))
    body = json.dumps(dict(params)).encode() + b"\n"
    with contextlib.suppress(ConnectionError):
        await proc.write(wire.payload(wire.program_source("probe")) + body)
    return proc


async def _probe(conn: Any, params: Mapping[str, Any], opts: DoctorOptions) -> dict[str, Any]:
    """Run the probe in one mode to completion: its JSON answer, or a DtrainError."""
    from launcher.remote import read_json_line

    try:
        async with asyncio.timeout(opts.probe_timeout):
            proc = await _start_probe(conn, params, opts)
            try:
                proc.write_eof()
                return await read_json_line(proc, conn.host.label, "probe")
            finally:
                proc.abort()
    except TimeoutError:
        raise PreflightFailed(f"the probe did not answer within {opts.probe_timeout:g} s",
                              host=conn.host.label) from None


def _why(exc: BaseException) -> str:
    if isinstance(exc, DtrainError):
        return f"{exc.message} ({exc.hint})" if exc.hint else exc.message
    return f"{type(exc).__name__}: {exc}"


async def _probe_all(conns: Mapping[str, Any], targets: Sequence[str], opts: DoctorOptions,
                     facts: dict[str, NodeFacts], errors: dict[str, str],
                     timing: dict[str, tuple[float, float]]) -> None:
    params = {"mode": "facts", "targets": list(targets)}

    async def one(label: str, conn: Any) -> None:
        sent = time.time()
        try:
            raw = await _probe(conn, params, opts)
        except (DtrainError, OSError, TimeoutError) as exc:
            errors[label] = _why(exc)
            return
        timing.setdefault(label, (sent, time.time()))
        if raw.get("ok") is False:
            errors[label] = f"probe failed: {raw.get('error')}"
            return
        facts[label] = NodeFacts.from_json(raw)

    async with asyncio.TaskGroup() as tg:
        for label, conn in conns.items():
            tg.create_task(one(label, conn), name=f"doctor-probe:{label}")


async def _port_test(conns: Mapping[str, Any], pick: MasterPick, port: int,
                     opts: DoctorOptions) -> PortProbe:
    """Listen on node 0 with the probe's ``listen`` mode, connect from every other node."""
    from launcher.remote import read_json_line

    addr = pick.probe_addr or "127.0.0.1"
    proc = None
    try:
        async with asyncio.timeout(opts.probe_timeout):
            proc = await _start_probe(conns[pick.host], {"mode": "listen", "addr": addr,
                                                         "port": port}, opts)
            listen = await read_json_line(proc, pick.host, "master port check")
            if not listen.get("ok"):
                return PortProbe(addr, port, listen)
            port = int(listen["port"])
            connects: dict[str, Mapping[str, Any] | str] = {}

            async def one(label: str, conn: Any) -> None:
                try:
                    connects[label] = await _probe(conn, {"mode": "connect", "addr": addr,
                                                          "port": port, "timeout": 3}, opts)
                except (DtrainError, OSError, TimeoutError) as exc:
                    connects[label] = _why(exc)

            async with asyncio.TaskGroup() as tg:
                for label, conn in conns.items():
                    if label != pick.host:
                        tg.create_task(one(label, conn))
            return PortProbe(addr, port, listen, connects)
    except (DtrainError, OSError, TimeoutError) as exc:
        return PortProbe(addr, port, _why(exc))
    finally:
        if proc is not None:
            with contextlib.suppress(Exception):
                proc.write_eof()
            proc.abort()


async def gather_with(transport: Any, hosts: Sequence[Host], opts: DoctorOptions,
                      connect_timeout: float) -> Gathered:
    """Connect, probe (twice when the workers need routes to more master candidates),
    choose the master, test its port. Every per-node failure becomes data, never raises."""
    from launcher.orchestrate import connect_all

    conns, connect_errors = await connect_all(transport, hosts, fanout=opts.fanout,
                                              timeout=connect_timeout)
    try:
        ordered = {h.label: conns[h.label] for h in hosts if h.label in conns}
        facts: dict[str, NodeFacts] = {}
        probe_errors: dict[str, str] = {}
        timing: dict[str, tuple[float, float]] = {}
        first = next(iter(ordered.values()), None)
        guess = [opts.master_addr] if opts.master_addr else (
            [first.peer_addr] if first is not None and first.peer_addr else [])
        await _probe_all(ordered, [a for a in guess if a], opts, facts, probe_errors, timing)
        probed = {h: facts[h] for h in ordered if h in facts}
        pick = None
        if probed:
            master_host = next(iter(probed))
            wanted = master_candidates(probed[master_host], opts.master_addr, len(probed))
            lacking = {h: ordered[h] for h, f in probed.items() if h != master_host
                       and any(c not in f.routes for c in wanted)}
            if lacking:
                more: dict[str, NodeFacts] = {}
                await _probe_all(lacking, wanted, opts, more, probe_errors, timing)
                for h, f in more.items():
                    probed[h] = f
            pick = pick_master(probed, opts.master_addr)
        port = None
        if pick is not None and pick.probe_addr is not None:
            port = await _port_test({h: ordered[h] for h in probed}, pick,
                                    opts.master_port or 0, opts)
        return Gathered(tuple(hosts), connect_errors, probe_errors, probed, timing, pick, port)
    finally:
        for conn in conns.values():
            with contextlib.suppress(Exception):
                await conn.aclose()


async def gather(hosts: Sequence[Host], opts: DoctorOptions, settings: Any) -> Gathered:
    """``gather_with`` over dtrain's normal transport (SSH, local for localhost)."""
    from launcher.transports import AutoTransport

    async with AutoTransport(settings) as transport:
        return await gather_with(transport, hosts, opts, settings.connect_timeout)


# --------------------------------------------------------------------------- rendering

LABELS = {OK: "ok", WARN: "warn", FAIL: "FAIL", SKIP: "skip"}
STYLES = {OK: "green", WARN: "yellow", FAIL: "bold red", SKIP: "dim"}


def render_plain(results: Sequence[CheckResult], stream: TextIO) -> None:
    """Aligned columns for pipes and CI logs: check, host, status, detail."""
    if not results:
        return
    cw = max(len(r.check) for r in results)
    hw = max(len(r.host) for r in results)
    for r in results:
        line = f"{r.check:<{cw}}  {r.host:<{hw}}  {LABELS[r.status]:<4}  {r.detail}"
        stream.write(line.rstrip() + "\n")
    stream.flush()


def render_rich(results: Sequence[CheckResult], title: str) -> None:
    """The terminal table (rich imported here: `dtrain --help` stays fast)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for column in ("check", "host", "status", "detail"):
        table.add_column(column, overflow="fold")
    previous = None
    for r in results:
        table.add_row(r.check if r.check != previous else "", escape(r.host),
                      f"[{STYLES[r.status]}]{LABELS[r.status]}[/]", escape(r.detail))
        previous = r.check
    Console().print(table)


def summary(results: Sequence[CheckResult], nhosts: int) -> str:
    """`3 node(s), 51 checks: 45 ok, 3 warn, 0 FAIL, 3 skip`."""
    counts = Counter(r.status for r in results)
    parts = ", ".join(f"{counts.get(s, 0)} {LABELS[s]}" for s in STATUSES)
    return f"{nhosts} node(s), {len(results)} checks: {parts}"


def report(results: Sequence[CheckResult], nhosts: int, *, as_json: bool, strict: bool = False,
           stream: TextIO | None = None, color: bool | None = None) -> int:
    """Print the table (or JSON) and return the exit code."""
    from launcher import render

    stream = stream or sys.stdout
    code = exit_code(results, strict=strict)
    if as_json:
        stream.write(json.dumps(envelope(results, code), indent=2) + "\n")
        stream.flush()
    else:
        use_rich = color if color is not None else (
            not os.environ.get("NO_COLOR") and stream.isatty())
        if use_rich and stream is sys.stdout:
            render_rich(results, "dtrain doctor")
        else:
            render_plain(results, stream)
    render.note(summary(results, nhosts) + ("" if code == 0 else f"; exit {code}"))
    return code


def run_doctor(hosts: Sequence[Host], opts: DoctorOptions, settings: Any, *,
               as_json: bool = False, strict: bool = False, color: bool | None = None) -> int:
    """The whole command: gather, evaluate, report."""
    gathered = asyncio.run(gather(hosts, opts, settings))
    return report(evaluate(gathered), len(hosts), as_json=as_json, strict=strict, color=color)


__all__ = [
    "CHECKS", "DOCTOR_VERSION", "FAIL", "FAST_CHECKS", "OK", "SKIP", "WARN", "CheckResult",
    "DoctorOptions", "Gathered", "MasterPick", "PortProbe", "check_clock", "check_gpudirect",
    "check_gpus", "check_hca", "check_hostnames", "check_limits", "check_master",
    "check_master_port", "check_memlock", "check_mtu", "check_nccl", "check_python",
    "check_roce_gid", "check_shm", "check_socket", "check_ssh", "check_torch", "envelope",
    "evaluate", "exit_code", "failure_message", "failures", "fast_checks", "gather",
    "gather_with", "pick_master", "report", "run_doctor", "socket_choices", "summary",
]
