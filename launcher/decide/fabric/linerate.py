"""The fabric's line rate from the probe, and busbw judged against it (pure; docs/fabric.md).

A node's rate is what the plan has it use between nodes: the HCA ports it kept for NCCL
(``NCCL_IB_HCA``: the sum of their sysfs ``rate``, "400 Gb/sec (4X NDR)"), else its socket
interface's ``/sys/class/net/IF/speed`` (Mb/s). The fabric's rate is the slowest node's: an
all-reduce's bus bandwidth between nodes cannot beat the per-node NIC total, and at a
healthy fabric reaches 80-95 % of it (nccl-tests on >= 2 nodes; the shared fabric-health
notes). Below ``fraction`` (0.8 by default) the smoke fails and gives the numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from launcher.decide.runplan.facts import NodeFacts

DEFAULT_LINE_FRACTION = 0.8


@dataclass(frozen=True)
class LineRate:
    """One node's rate between nodes, in GB/s (bytes), and how it was found."""

    host: str
    gbytes: float | None
    how: str  # "2 x 400 Gb/sec (mlx5_0:1, mlx5_1:1)", "eth0 10000 Mb/s", "unknown: ..."


def _hcas(value: str) -> list[str]:
    if not value or value.startswith("^"):
        return []
    out = []
    for item in value.lstrip("=").split(","):
        parts = item.strip().split(":")
        if parts[0]:
            out.append(f"{parts[0]}:{parts[1] if len(parts) > 1 and parts[1] else '1'}")
    return out


def node_rate(host: str, facts: NodeFacts, env: Mapping[str, str]) -> LineRate:
    """``env``: the NCCL_* / GLOO_* variables the plan gave this node."""
    wanted = _hcas(env.get("NCCL_IB_HCA", ""))
    if wanted and env.get("NCCL_IB_DISABLE") != "1":
        ports = [p for p in facts.rdma if p.name in wanted and p.rate_gbps > 0]
        if ports:
            gbit = sum(p.rate_gbps for p in ports)
            rates = sorted({p.rate_gbps for p in ports})
            each = "/".join(f"{r:g}" for r in rates)
            return LineRate(host, gbit / 8, f"{len(ports)} x {each} Gb/s "
                                             f"({', '.join(p.name for p in ports)})")
    ifname = (env.get("NCCL_SOCKET_IFNAME") or env.get("GLOO_SOCKET_IFNAME") or "").lstrip("=")
    iface = facts.iface(ifname) if ifname and "," not in ifname else None
    if iface is not None and iface.speed and iface.speed > 0:
        return LineRate(host, iface.speed / 8000, f"{iface.name} {iface.speed} Mb/s")
    return LineRate(host, None, f"unknown ({ifname or 'no interface'} reports no speed)")


def fabric_rate(rates: Mapping[str, LineRate]) -> LineRate | None:
    """The slowest node's rate (None: some node's is unknown, or no node)."""
    if not rates or any(r.gbytes is None for r in rates.values()):
        return None
    return min(rates.values(), key=lambda r: r.gbytes or 0.0)


def below_line(busbw: float, rate: LineRate, fraction: float) -> str | None:
    """The failure's text when ``busbw`` (GB/s) is under ``fraction`` of the line rate."""
    if rate.gbytes is None or fraction <= 0 or busbw >= fraction * rate.gbytes:
        return None
    return (f"all-reduce busbw {busbw:.3g} GB/s is {busbw / rate.gbytes:.0%} of the line rate "
            f"{rate.gbytes:.3g} GB/s ({rate.host}: {rate.how}); under --line-fraction "
            f"{fraction:g}")
