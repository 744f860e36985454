"""Doctor checks on each node's own facts: pure functions over ``NodeFacts``.

Every check returns ``CheckResult`` rows (one per node, or one for the set), so each rule is
unit-tested without a network. ``fast_checks`` is the cheap subset ``dtrain run`` applies in
preflight to the facts it probed anyway. The fabric checks (master, sockets, MTU, HCAs, GIDs,
the master port) are in ``fabric_checks``; the I/O and the table are in
``launcher.commands.doctor``. Rule sources: docs/doctor.md.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from launcher.decide.fabric.rdma import HcaChoice, select_hcas
from launcher.decide.outcome.startup import clock_offset
from launcher.decide.runplan.container import ContainerRequest
from launcher.decide.runplan.facts import UNLIMITED, NodeFacts
from launcher.decide.runplan.netenv import SocketChoice
from launcher.hosts.hostfile import fold
from launcher.models import Host

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
STATUSES = (OK, WARN, FAIL, SKIP)

GIB = 1 << 30
SHM_MIN = GIB  # Docker's default /dev/shm is 64 MiB: NCCL's shm transport then fails
CLOCK_WARN_S = 1.0
NOFILE_MIN = 32768  # "open files >= 32K at scale" (NCCL opens sockets per peer and channel)
NOFILE_SCALE_NODES = 16  # below this many nodes the default 1024 is enough in practice
NCCL_STACK_FIXED = (2, 28)  # from 2.28 NCCL sizes its thread stacks itself
PEERMEM = "/sys/module/nvidia_peermem"

CHECKS = ("ssh", "local", "setup", "python", "hostname", "torch", "nccl", "gpu", "master", "socket",
          "master_port", "mtu", "hca", "roce_gid", "memlock", "gpudirect", "shm", "limits",
          "clock", "image")
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

    @property
    def fix(self) -> str | None:
        """What to do about a FAIL or warn row (``check_fix``); None for ok and skip."""
        return check_fix(self.check) if self.status in (FAIL, WARN) else None

    def to_json(self) -> dict[str, str | None]:
        """The row as it appears in ``--json``'s ``doctor.checks`` list."""
        return {"host": self.host, "check": self.check, "status": self.status,
                "detail": self.detail, "fix": self.fix}


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


def unreachable_fence(workers: Sequence[str], failed: Sequence[str]) -> tuple[str, ...]:
    """The workers a restarting run fences when the master's port is unreachable from
    ``failed``: each on its own failed connect, but only while another worker reached the
    master. When none did, the master is the one end they share (a master that says it
    listens and does not, a firewall on node 0): no worker's own report is evidence against
    that worker, nor may theirs fence node 0 (docs/threat-model.md), so nobody is fenced and
    the run is refused as it is."""
    if not failed or all(w in failed for w in workers):
        return ()
    return tuple(w for w in workers if w in failed)


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
    setup: str | None = None  # --setup, when given
    setup_errors: Mapping[str, str] = field(default_factory=dict)  # why it failed, per node
    images: Mapping[str, ContainerRequest] = field(default_factory=dict)  # --image, per node


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



LOCAL_ROW = "runs locally as a subprocess; no ssh involved"


def check_ssh(hosts: Sequence[Host | str], connect_errors: Mapping[str, str]
              ) -> list[CheckResult]:
    """Reachable with key login: the transport's own message for each node that is not. A
    localhost entry (no user, no port) runs as a local process: its row is ``local``, not
    ``ssh ... connected`` (no sshd was asked)."""
    local = {h.label for h in hosts if isinstance(h, Host) and h.is_local}
    return [CheckResult(h, "ssh", FAIL, connect_errors[h]) if h in connect_errors
            else CheckResult(h, "local", OK, LOCAL_ROW) if h in local
            else CheckResult(h, "ssh", OK, "connected") for h in _labels(hosts)]


def check_setup(setup: str | None, hosts: Sequence[Host | str],
                 facts_by_host: Mapping[str, NodeFacts],
                 setup_errors: Mapping[str, str]) -> list[CheckResult]:
    """--setup ran to status 0 before the probe (no rows without --setup).

    ``hosts`` are the reached nodes; a node whose probe answered ran the setup; one that
    failed for another reason (the interpreter) is left to the python row.
    """
    if not setup:
        return []
    out = []
    for h in _labels(hosts):
        if h in setup_errors:
            out.append(CheckResult(h, "setup", FAIL, setup_errors[h]))
        elif h in facts_by_host:
            out.append(CheckResult(h, "setup", OK, "ran (exit 0)"))
        else:
            out.append(CheckResult(h, "setup", SKIP, "not known: the node program did not "
                                                    "start (see python)"))
    return out


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
        if facts is None and probe_errors.get(h, "").startswith("--setup failed"):
            out.append(CheckResult(h, "python", SKIP, "not run: --setup failed"))
            continue
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
        offset = clock_offset(f.time, sent, received)
        slack = (received - sent) / 2
        if abs(offset) > CLOCK_WARN_S:
            way = "ahead of" if offset > 0 else "behind"
            out.append(CheckResult(h, "clock", WARN, f"{abs(offset):.1f} s {way} the launcher "
                                   "(chrony/NTP not running?)"))
        else:
            out.append(CheckResult(h, "clock", OK, f"offset {offset * 1000:+.0f} ms "
                                   f"(+/- {slack * 1000:.0f} ms)"))
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


def fold_by_message(items: Iterable[tuple[str, str]]) -> str:
    """``node[1-3]: same message; node4: other``: hosts with one message folded, groups
    in the order their first host came (give the items in hostfile order)."""
    groups: dict[str, list[str]] = {}
    for host, message in items:
        groups.setdefault(message, []).append(host)
    return "; ".join(f"{fold(hosts)}: {message}" for message, hosts in groups.items())


def failure_message(results: Iterable[CheckResult]) -> str | None:
    """One line listing every FAIL, hosts with the same failure folded (for a
    PreflightFailed), or None when nothing failed."""
    bad = failures(results)
    if not bad:
        return None
    return fold_by_message((r.host, f"{r.check}: {r.detail}") for r in bad)


# what to do when the nodes' python or torch is not the one the job needs
PYTHON_FIX = ("point dtrain at a Python that has torch on those nodes: --python "
              "/path/to/venv/bin/python, the hostfile's python=/path/to/python, or --setup "
              "'source /path/to/venv/bin/activate'")

# what to do about a failing (or warning) check: docs/doctor.md's table, one line each
FIXES = {
    "ssh": "make the node reachable and accept the key: `dtrain keys setup` (then "
           "`dtrain keys check`); --accept-new for a node never seen",
    "setup": "--setup must end with status 0 on every node: try it there by hand "
             "(dtrain exec), fix the path, or end an optional step with `|| true`",
    "python": PYTHON_FIX,
    "hostname": "give every machine its own hostname, and list each machine once",
    "torch": "install one torch build (version and +local tag) in every node's Python; "
             + PYTHON_FIX,
    "nccl": "install the same nvidia-nccl-cu* wheel on every node (reinstall torch from "
            "one index)",
    "gpu": "a node that should have GPUs needs its driver checked (nvidia-smi); keep the "
           "hostfile's slots= at most its GPU count",
    "master": "give node 0 an address every worker routes to, or pass --master-addr",
    "socket": "bring up the interface towards the master, or set NCCL_SOCKET_IFNAME / "
              "GLOO_SOCKET_IFNAME with --env",
    "master_port": "open the port between the nodes (firewall), or choose another with "
                   "--master-port",
    "mtu": "set one MTU on every node's interface (ip link set DEV mtu N)",
    "hca": "bring the RDMA ports up (ibstat, rdma link) so every node has the same set, or "
           "exclude the odd node",
    "roce_gid": "give each RoCE port an IPv4 RoCE v2 GID, or unset a wrong "
                "NCCL_IB_GID_INDEX",
    "memlock": "raise the locked-memory limit to unlimited (limits.conf memlock, "
               "LimitMEMLOCK=infinity for sshd)",
    "gpudirect": "load nvidia_peermem (modprobe nvidia_peermem), or use DMA-BUF",
    "shm": "enlarge /dev/shm (docker run --shm-size=8g, or remount it larger)",
    "limits": "set a finite stack limit (ulimit -s 8192) and nofile >= 32768 on the nodes",
    "clock": "synchronise the clocks (chrony or ntpd)",
    "image": "dtrain image push IMAGE -f HOSTS (docs/containers.md)",
}


def check_fix(check: str) -> str | None:
    """What to do when ``check`` fails or warns, or None for a check without advice."""
    return FIXES.get(check)


def failure_hint(results: Iterable[CheckResult]) -> str:
    """What to do about the FAIL rows: the python fix when python/torch failed."""
    if any(r.check in ("python", "torch") for r in failures(results)):
        return PYTHON_FIX
    return "`dtrain doctor` shows every check; --no-preflight skips these"


