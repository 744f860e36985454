"""NCCL's own account of the fabric it used, read from its INFO lines (pure; docs/fabric.md).

dtrain asks NCCL for its INIT and NET lines in per-process files on each node
(``NCCL_DEBUG_FILE``; never when the user set ``NCCL_DEBUG`` themselves), the node's supervisor
ships the lines that matter, and this module turns them into one account per rank:

* ``parse_lines``: NCCL's lines (``HOST:PID:TID [DEV] NCCL INFO ...``, ``... file.cc:N NCCL
  WARN ...``, the bare ``NCCL version 2.21.5+cuda12.4``) -> a ``RankAccount``: the version,
  the network NCCL chose (``Using network IB``), the HCAs it opened (``NET/IB : Using
  [0]mlx5_0:1/RoCE``) or that it found none, its socket interfaces, the GID index, GPUDirect,
  the transports of its channels (``via NET/IB/0/GDRDMA``, ``via NET/Socket/1``,
  ``via P2P/IPC``), the variables it took from the environment, whether init completed, its
  WARN lines;
* ``transport``: ``gdr`` / ``rdma`` / ``socket`` / ``plugin`` / ``none`` (no network seen);
* ``summarize``: every rank's account + the plan -> the one line the launcher prints, the
  warnings (ranks on TCP, named by node and rank range), the differences from what the plan
  decided (HCA, GID, socket interface), and ``refusal`` under ``--require-fabric``.

The formats are NCCL 2.18-2.27's (src/debug.cc, transport/net_ib, net_socket, transport.cc);
tests/data/nccl/ keeps real logs pasted in public issues.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from launcher.text.words import rank_ranges

REQUIRE = ("rdma", "gdr", "any")
MAX_WARNS = 20  # WARN lines kept per rank (folded by text)

# host:pid:tid [dev] [file.cc:N ]NCCL INFO|WARN message
_LINE = re.compile(r"^(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>[^\]]*)\] "
                   r"(?:(?P<where>\S+:\d+) )?NCCL (?P<level>INFO|WARN)\s?(?P<msg>.*)$")
_VERSION = re.compile(r"NCCL version (\d+\.\d+\.\d+)(?:\+(\S+))?")
_IB_DEV = re.compile(r"\[\d+\]([\w.\-]+):(\d+)/(IB|RoCE)")
_SOCK_IF = re.compile(r"\[\d+\]([^\s:<]+):")
_OOB = re.compile(r"OOB ([^\s:<]+):")
_CHANNEL = re.compile(r"Channel \S+ : (\d{1,9})\[[^\]]*\] -> (\d{1,9})\[[^\]]*\]"
                      r"(?: \[(send|receive)\])? via (\S+)")
_ENV = re.compile(r"^(NCCL_\w+) set by environment to (.*?)\.?$")
_INIT = re.compile(r"\brank (\d{1,9}) nranks (\d{1,9})\b.*Init COMPLETE")
_GID = re.compile(r"\bGID (\d{1,9}) \(")
_GDR_ON = re.compile(r"GPU Direct RDMA Enabled")
_GDR_OFF = re.compile(r"GPU Direct RDMA Disabled")


@dataclass
class RankAccount:
    """What NCCL said about the fabric in one process (one dtrain rank)."""

    version: str | None = None
    network: str | None = None  # "IB", "Socket", a plugin's name ("AWS Libfabric")
    ib_devices: list[str] = field(default_factory=list)  # "mlx5_0:1/RoCE"
    ib_none: bool = False  # "NET/IB : No device found."
    socket_ifs: list[str] = field(default_factory=list)  # NET/Socket's interfaces
    oob_if: str | None = None  # NET/IB's out-of-band (socket) interface
    bootstrap_if: str | None = None
    gid: int | None = None  # the GID index NCCL used (NET/IB connect lines, or the env)
    gdr: bool | None = None  # GPU Direct RDMA enabled (True), disabled (False), unsaid
    net_channels: set[str] = field(default_factory=set)  # "IB/GDRDMA", "IB", "Socket", ...
    intra: set[str] = field(default_factory=set)  # "P2P", "SHM", ...
    env: dict[str, str] = field(default_factory=dict)  # NCCL_* NCCL took from the env
    init_complete: bool = False
    nranks: int | None = None
    warns: list[str] = field(default_factory=list)
    lines: int = 0  # NCCL lines read

    def json(self) -> dict[str, Any]:
        return {"version": self.version, "network": self.network,
                "transport": transport(self), "ib_devices": list(self.ib_devices),
                "ib_none": self.ib_none, "socket_ifs": list(self.socket_ifs),
                "gid": self.gid, "gdr": self.gdr, "channels": sorted(self.net_channels),
                "intra": sorted(self.intra), "init_complete": self.init_complete,
                "warns": list(self.warns)}


def parse_line(line: str) -> tuple[str, str] | None:
    """(level, message) of one NCCL line, or None for anything else. The bare version line
    (NCCL prints it without the prefix) is ("VERSION", line)."""
    line = line.rstrip("\r\n")
    m = _LINE.match(line)
    if m is not None:
        return m.group("level"), m.group("msg").strip()
    if line.startswith("NCCL version "):
        return "VERSION", line
    return None


def _channel_kind(via: str) -> tuple[str, str]:
    """("net", "IB/GDRDMA") / ("net", "Socket") / ("intra", "P2P") from ``NET/IB/0/GDRDMA``."""
    parts = via.split("/")
    if parts[0] == "NET" and len(parts) >= 2:
        name = parts[1]
        if name.startswith("IB"):  # IB, IBext, IBext_v8 (the SHARP plugin): RDMA verbs
            name = "IB"
        return "net", name + ("/GDRDMA" if "GDRDMA" in parts[2:] else "")
    return "intra", parts[0]


def feed(acc: RankAccount, lines: Iterable[str]) -> RankAccount:
    """Add NCCL's lines to an account (the lines may come in several batches)."""
    for raw in lines:
        parsed = parse_line(raw)
        if parsed is None:
            continue
        level, msg = parsed
        acc.lines += 1
        if level == "WARN":
            text = msg[:300]
            if text not in acc.warns and len(acc.warns) < MAX_WARNS:
                acc.warns.append(text)
            continue
        if (v := _VERSION.search(msg)) is not None:
            acc.version = acc.version or v.group(1)
            continue
        if msg.startswith("NET/IB"):
            if "No device found" in msg:
                acc.ib_none = True
            elif " : Using " in msg or ": Using " in msg:
                acc.ib_devices = [f"{d}:{p}/{ll}" for d, p, ll in _IB_DEV.findall(msg)] \
                    or acc.ib_devices
                if (o := _OOB.search(msg)) is not None:
                    acc.oob_if = o.group(1)
            if (g := _GID.search(msg)) is not None and acc.gid is None:
                acc.gid = int(g.group(1))
        elif msg.startswith("NET/Socket") and "Using" in msg:
            acc.socket_ifs = _SOCK_IF.findall(msg) or acc.socket_ifs
        elif msg.startswith("Bootstrap") and "Using" in msg:
            if (b := re.search(r"Using \[?\d*\]?([^\s:<]+):", msg)) is not None:
                acc.bootstrap_if = b.group(1)
        elif msg.startswith("Using network "):
            acc.network = msg[len("Using network "):].strip()
        if (c := _CHANNEL.search(msg)) is not None:
            where, kind = _channel_kind(c.group(4))
            (acc.net_channels if where == "net" else acc.intra).add(kind)
        elif (e := _ENV.match(msg)) is not None:
            acc.env[e.group(1)] = e.group(2)
            if e.group(1) == "NCCL_IB_GID_INDEX" and acc.gid is None:
                try:
                    acc.gid = int(e.group(2))
                except ValueError:
                    pass
        elif (i := _INIT.search(msg)) is not None:
            acc.init_complete = True
            acc.nranks = max(acc.nranks or 0, int(i.group(2)))
        elif _GDR_ON.search(msg):
            acc.gdr = True if acc.gdr is None else acc.gdr
        elif _GDR_OFF.search(msg) and "HCA" in msg and not msg.startswith("NET/Socket"):
            acc.gdr = False
    return acc


def parse_lines(lines: Iterable[str]) -> RankAccount:
    return feed(RankAccount(), lines)


def transport(acc: RankAccount) -> str:
    """How this rank's traffic between nodes went: the channels it opened first, else the
    network NCCL chose. ``gdr``: RDMA with GPUDirect; ``rdma``: RDMA through host memory;
    ``socket``: TCP; ``plugin``: another net plugin; ``none``: NCCL named no network."""
    if acc.net_channels:
        names = {c.split("/")[0] for c in acc.net_channels}
        if "Socket" in names:
            return "socket"
        if names == {"IB"}:
            return "gdr" if all(c.endswith("/GDRDMA") for c in acc.net_channels) else "rdma"
        return "plugin"
    if acc.network is None:
        return "none"
    if acc.network == "Socket":
        return "socket"
    if acc.network.startswith("IB"):
        return "gdr" if acc.gdr else "rdma"
    return "plugin"


def meets(kind: str, require: str) -> bool:
    """Whether a rank's transport meets ``--require-fabric``."""
    if require == "gdr":
        return kind == "gdr"
    if require == "rdma":
        return kind in ("gdr", "rdma", "plugin")
    return kind != "none"


def settled(acc: RankAccount, require: str | None) -> bool:
    """Enough is known to judge this rank: NCCL chose its network (a Socket choice is final
    at once), or its init completed."""
    if acc.network == "Socket" or acc.net_channels:
        return True
    if require == "gdr":
        return acc.init_complete
    return acc.network is not None or acc.init_complete


@dataclass(frozen=True)
class FabricSummary:
    line: str  # the one line after init
    warnings: tuple[str, ...]  # WARNING: ranks 8-15 (node2) use NET/Socket (TCP): ...
    differences: tuple[str, ...]  # NCCL's choice against the plan's
    refusal: str | None  # --require-fabric: why the run is refused (None: it is not)
    per_rank: dict[str, dict[str, Any]]
    version: str | None

    def json(self) -> dict[str, Any]:
        return {"version": self.version, "line": self.line, "warnings": list(self.warnings),
                "differences": list(self.differences), "refusal": self.refusal,
                "ranks": self.per_rank}


def ranges(ranks: Sequence[int]) -> str:
    """``[8, 9, 10, 12]`` -> ``8-10,12`` (output/fold's folding, the same everywhere)."""
    return rank_ranges(ranks)


def _why_socket(acc: RankAccount) -> str:
    if acc.ib_none:
        return "NET/IB found no device"
    for name in ("NCCL_IB_DISABLE", "NCCL_NET"):
        if name in acc.env:
            return f"{name}={acc.env[name]} (set by environment)"
    if acc.network == "Socket":
        return "NCCL chose the Socket network"
    return "its channels between nodes go over NET/Socket"


def _hcas(devices: Iterable[str]) -> list[str]:
    return sorted({d.split("/")[0] for d in devices})


def _plan_hcas(value: str) -> list[str]:
    """``=mlx5_0:1,mlx5_1:1`` -> ["mlx5_0:1", "mlx5_1:1"] (ports default to 1)."""
    if not value or value.startswith("^"):
        return []
    out = []
    for item in value.lstrip("=").split(","):
        parts = item.strip().split(":")
        if parts[0]:
            out.append(f"{parts[0]}:{parts[1] if len(parts) > 1 and parts[1] else '1'}")
    return sorted(out)


def compare(host: str, acc: RankAccount, env: Mapping[str, str]) -> list[str]:
    """Where NCCL's choice on this host differs from the plan's variables (``env``: the
    NCCL_* the plan gave that node, decided and site values)."""
    out: list[str] = []
    want_hca = _plan_hcas(env.get("NCCL_IB_HCA", ""))
    kind = transport(acc)
    if want_hca and kind == "socket":
        out.append(f"{host}: the plan chose RDMA ({', '.join(want_hca)}), NCCL uses NET/Socket")
    elif want_hca and acc.ib_devices and _hcas(acc.ib_devices) != want_hca:
        out.append(f"{host}: NCCL opened {', '.join(_hcas(acc.ib_devices))}, the plan chose "
                   f"{', '.join(want_hca)}")
    if env.get("NCCL_IB_DISABLE") == "1" and kind in ("rdma", "gdr"):
        out.append(f"{host}: the plan disabled IB (NCCL_IB_DISABLE=1), NCCL uses RDMA")
    gid = env.get("NCCL_IB_GID_INDEX")
    if gid is not None and acc.gid is not None and str(acc.gid) != gid.strip():
        out.append(f"{host}: NCCL uses GID {acc.gid}, the plan chose {gid}")
    sock = env.get("NCCL_SOCKET_IFNAME", "").lstrip("=")
    used = acc.socket_ifs or ([acc.oob_if] if acc.oob_if else []) \
        or ([acc.bootstrap_if] if acc.bootstrap_if else [])
    if sock and not sock.startswith("^") and used and \
            not any(u == sock or (not env.get("NCCL_SOCKET_IFNAME", "").startswith("=")
                                  and u.startswith(sock)) for u in used):
        out.append(f"{host}: NCCL's socket interface is {', '.join(used)}, the plan chose "
                   f"{sock}")
    return out


def summarize(accounts: Mapping[int, RankAccount], hosts: Mapping[int, str],
              plan_env: Mapping[str, Mapping[str, str]], *, require: str | None = None,
              multi_node: bool = True, partial: bool = False) -> FabricSummary:
    """Every rank's account (``accounts``: rank -> account; ``hosts``: rank -> host label of
    every planned rank; ``plan_env``: host -> its NCCL_* variables) -> the summary.
    ``partial``: more accounts may come (a rank without one is not named missing)."""
    version = next((a.version for a in accounts.values() if a.version), None)
    head = f"NCCL {version}" if version else "NCCL"
    kinds = {r: transport(a) for r, a in accounts.items()}
    missing = [] if partial else sorted(r for r in hosts if r not in accounts)
    warnings: list[str] = []
    by_host_kind: dict[tuple[str, str], list[int]] = {}
    for r, k in sorted(kinds.items()):
        by_host_kind.setdefault((hosts.get(r, "?"), k), []).append(r)
    for (host, k), ranks_ in sorted(by_host_kind.items(), key=lambda kv: kv[1][0]):
        if k == "socket" and multi_node:
            why = _why_socket(accounts[ranks_[0]])
            warnings.append(f"WARNING: {_ranks_word(ranks_)} ({host}) "
                            f"{_verb(ranks_, 'use')} NET/Socket (TCP): "
                            f"{why}")
    if missing and accounts:
        warnings.append(f"WARNING: no NCCL account from {_ranks_word(missing)} "
                        f"({', '.join(sorted({hosts[r] for r in missing}))})")
    differences: list[str] = []
    seen: set[str] = set()
    for r, a in sorted(accounts.items()):
        host = hosts.get(r, "?")
        for d in compare(host, a, plan_env.get(host, {})):
            if d not in seen:
                seen.add(d)
                differences.append(d)
    refusal = None
    if require is not None:
        bad = sorted(r for r, k in kinds.items() if not meets(k, require))
        if require == "any":
            bad = sorted(set(bad) | set(missing))
        if bad:
            hosts_bad = sorted({hosts.get(r, "?") for r in bad})
            got = sorted({kinds.get(r, "no account") for r in bad})
            refusal = (f"--require-fabric {require}: {_ranks_word(bad)} "
                       f"({', '.join(hosts_bad)}) {_verb(bad, 'use')} {', '.join(got)}")
    line = head + ": " + _line_body(accounts, kinds, multi_node)
    if partial and len(accounts) < len(hosts):
        line += f" ({len(accounts)} of {len(hosts)} ranks so far)"
    per_rank = {str(r): dict(a.json(), host=hosts.get(r)) for r, a in sorted(accounts.items())}
    return FabricSummary(line, tuple(warnings), tuple(differences), refusal, per_rank, version)


def _verb(ranks: Sequence[int], verb: str) -> str:
    return verb + "s" if len(ranks) == 1 else verb


def _ranks_word(ranks: Sequence[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranges(ranks)}"


def _line_body(accounts: Mapping[int, RankAccount], kinds: Mapping[int, str],
               multi_node: bool) -> str:
    if not accounts:
        return "no account from any rank"
    values = set(kinds.values())
    intra = sorted({i for a in accounts.values() for i in a.intra})
    tail = f"; intra-node {'/'.join(intra)}" if intra else ""
    if values <= {"gdr", "rdma"}:
        devs = sorted({d for a in accounts.values() for d in a.ib_devices})
        layers = sorted({d.split("/")[1] for d in devs if "/" in d}) or ["IB/RoCE"]
        details = _hcas(devs)
        names = [d.split(":")[0] for d in details]
        details = names if all(d.endswith(":1") for d in details) else details
        gids = sorted({a.gid for a in accounts.values() if a.gid is not None})
        if gids:
            details.append("GID " + "/".join(str(g) for g in gids))
        if values == {"gdr"}:
            details.append("GPUDirect")
        elif "gdr" in values:
            details.append("GPUDirect on some ranks")
        detail = f" ({', '.join(details)})" if details else ""
        return f"{'/'.join(layers)} on every rank{detail}{tail}"
    if values == {"socket"}:
        ifs = sorted({i for a in accounts.values() for i in a.socket_ifs})
        where = f" ({', '.join(ifs)})" if ifs else ""
        return f"NET/Socket (TCP) on every rank{where}{tail}" if multi_node else \
            f"one node, NET/Socket{where} unused between nodes{tail}"
    if values == {"plugin"}:
        nets = sorted({a.network or "?" for a in accounts.values()})
        return f"net plugin {', '.join(nets)} on every rank{tail}"
    if values == {"none"}:
        return f"no network named{tail}"
    counts: dict[str, int] = {}
    for k in kinds.values():
        counts[k] = counts.get(k, 0) + 1
    mix = ", ".join(f"{n} {_KIND_WORD[k]}" for k, n in sorted(counts.items()))
    return f"mixed: {mix}{tail}"


_KIND_WORD = {"gdr": "RDMA+GPUDirect", "rdma": "RDMA", "socket": "NET/Socket (TCP)",
              "plugin": "net plugin", "none": "no network"}


# -- what the node program keeps (nodeside/nodeevidence.py filters with the same words) ---
KEEP_WORDS = ("NCCL version", "NET/IB", "NET/Socket", "Using network", " via ",
              "set by environment", "Init COMPLETE", "GPU Direct RDMA", "NCCL WARN",
              "Bootstrap")


def wants_account(env_names: Iterable[str]) -> bool:
    """dtrain asks NCCL for its account unless the user (or the site) set NCCL_DEBUG or
    NCCL_DEBUG_FILE: theirs is never overridden."""
    names = set(env_names)
    return not ({"NCCL_DEBUG", "NCCL_DEBUG_FILE"} & names)
