"""A node's health findings, tiered isolate / reset / monitor (pure; docs/fabric.md).

The pure half of the health gate (issue 36 item 3): from what a node reports (nvidia-smi's
query fields, the kernel log's Xid lines, two readings of the IB/RoCE port counters) to
findings, each with a tier, and the node's verdict (its worst tier). Not yet wired to
`doctor --health` / `run --health-check`: docs/fabric.md says what is missing.

Tiers (the health-check suites' vocabulary): ``isolate`` (the hardware: keep the node out,
feed the lemon list), ``reset`` (a GPU reset or reboot clears it), ``monitor`` (watch it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

TIERS = ("isolate", "reset", "monitor")
# nvidia-smi --query-gpu= fields, in this order (--format=csv,noheader,nounits)
GPU_FIELDS = ("index", "ecc.errors.uncorrected.volatile.total", "remapped_rows.pending",
              "remapped_rows.failure", "retired_pages.pending",
              "clocks_event_reasons.hw_slowdown", "temperature.gpu")
HOT_C = 90  # temperature.gpu at or above: monitor
# Xid -> (tier, meaning) (NVIDIA's Xid catalogue; 13, 31, 43 are usually the application)
XIDS = {48: ("reset", "double-bit ECC error"), 63: ("reset", "row remapping pending"),
        64: ("isolate", "row remapping failed"), 74: ("reset", "NVLink error"),
        79: ("isolate", "GPU fallen off the bus"), 92: ("monitor", "high single-bit ECC rate"),
        94: ("reset", "contained ECC error"), 95: ("isolate", "uncontained ECC error"),
        119: ("reset", "GSP timeout"), 120: ("reset", "GSP error")}
_XID = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F:.]+)\): (\d+)")
# IB/RoCE port counters whose growth between two readings matters, and its tier
COUNTERS = {"link_downed": "reset", "symbol_error": "monitor", "port_rcv_errors": "monitor",
            "link_error_recovery": "monitor", "port_xmit_discards": "monitor",
            "rx_pause": "monitor"}


@dataclass(frozen=True)
class Finding:
    tier: str  # isolate, reset, monitor
    what: str  # gpu, xid, port
    where: str  # "GPU 3", "PCI:0000:18:00", "mlx5_0:1"
    message: str


def _num(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def gpu_findings(csv_text: str) -> list[Finding]:
    """``nvidia-smi --query-gpu=<GPU_FIELDS> --format=csv,noheader,nounits`` -> findings."""
    out: list[Finding] = []
    for line in csv_text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(GPU_FIELDS):
            continue
        row = dict(zip(GPU_FIELDS, cells, strict=True))
        gpu = f"GPU {row['index']}"
        checks = (("ecc.errors.uncorrected.volatile.total", "reset",
                   "uncorrected ECC errors (volatile): {v:g}"),
                  ("remapped_rows.failure", "isolate", "row remapping failed ({v:g})"),
                  ("remapped_rows.pending", "reset",
                   "row remapping pending ({v:g}): a GPU reset applies it"),
                  ("retired_pages.pending", "reset", "page retirement pending ({v:g})"))
        for field, tier, text in checks:
            v = _num(row[field])
            if v is None and row[field].lower() in ("yes", "active"):
                v = 1.0
            if v:
                out.append(Finding(tier, "gpu", gpu, f"{gpu}: {text.format(v=v)}"))
        if row["clocks_event_reasons.hw_slowdown"].lower() == "active":
            out.append(Finding("monitor", "gpu", gpu, f"{gpu}: hardware slowdown active"))
        temp = _num(row["temperature.gpu"])
        if temp is not None and temp >= HOT_C:
            out.append(Finding("monitor", "gpu", gpu, f"{gpu}: {temp:g} C (>= {HOT_C} C)"))
    return out


def xid_findings(kernel_lines: Iterable[str]) -> list[Finding]:
    """Xid lines of the kernel log (``NVRM: Xid (PCI:0000:18:00): 79, ...``) -> findings,
    one per (device, Xid) with its count; Xids of the application (13, 31, 43) are left out."""
    seen: dict[tuple[str, int], int] = {}
    for line in kernel_lines:
        m = _XID.search(line)
        if m is not None and int(m.group(2)) in XIDS:
            key = (m.group(1), int(m.group(2)))
            seen[key] = seen.get(key, 0) + 1
    out = []
    for (pci, xid), n in sorted(seen.items()):
        tier, meaning = XIDS[xid]
        times = f" x{n}" if n > 1 else ""
        out.append(Finding(tier, "xid", f"PCI:{pci}", f"Xid {xid} ({meaning}) on PCI:{pci}"
                                                       f"{times}"))
    return out


def port_findings(before: Mapping[str, Mapping[str, int]],
                  after: Mapping[str, Mapping[str, int]],
                  states: Mapping[str, str] | None = None) -> list[Finding]:
    """Two readings of each port's counters (``{"mlx5_0:1": {"symbol_error": 0, ...}}``)
    -> a finding per counter that grew; a port not ACTIVE (``states``: "4: ACTIVE") is
    isolate."""
    out = []
    for port, state in sorted((states or {}).items()):
        if not state.startswith("4:"):
            out.append(Finding("isolate", "port", port, f"{port}: port state {state!r}"))
    for port in sorted(after):
        for name, tier in COUNTERS.items():
            a, b = before.get(port, {}).get(name), after[port].get(name)
            if a is not None and b is not None and b > a:
                out.append(Finding(tier, "port", port, f"{port}: {name} grew by {b - a} "
                                                       f"({a} -> {b})"))
    return out


def verdict(findings: Sequence[Finding]) -> str:
    """The node's tier: its worst finding's, or "ok"."""
    for tier in TIERS:
        if any(f.tier == tier for f in findings):
            return tier
    return "ok"
