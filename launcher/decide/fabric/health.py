"""A node's health findings, tiered isolate / reset / monitor (pure; docs/fabric.md).

The pure half of the health gate (issue 36 item 3): from what a node reports (nvidia-smi's
query fields, the kernel log's Xid lines, two readings of the IB/RoCE port counters) to
findings, each with a tier, and the node's verdict (its worst tier), and the gate's
versioned document (dtrain.health/1). The collector is nodeside/health.py, the I/O
commands/health.py (`doctor --health`, `run --health-check`).

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
_XID = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F:.]+)\): (\d{1,9})(?!\d)")
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
                  # pending: the bad row is still mapped in until a reset; keep the node out
                  # of jobs until then (isolate; `dtrain nodes unfence` after the reset)
                  ("remapped_rows.pending", "isolate",
                   "row remapping pending ({v:g}): out until a GPU reset applies it"),
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


def _xid_counts(kernel_lines: Iterable[str]) -> dict[tuple[str, int], int]:
    seen: dict[tuple[str, int], int] = {}
    for line in kernel_lines:
        m = _XID.search(line)
        if m is not None and int(m.group(2)) in XIDS:
            key = (m.group(1), int(m.group(2)))
            seen[key] = seen.get(key, 0) + 1
    return seen


def new_lines(previous: Sequence[str], now: Sequence[str]) -> list[str]:
    """The lines of ``now`` not in ``previous`` (as multisets: the kernel log's timestamps
    make a repeated Xid a new line; after a reboot every line is new)."""
    left: dict[str, int] = {}
    for line in previous:
        left[line] = left.get(line, 0) + 1
    out = []
    for line in now:
        if left.get(line, 0) > 0:
            left[line] -= 1
        else:
            out.append(line)
    return out


# nvidia-smi -q: (section, key) -> the query field it answers (older drivers name the
# clocks section "Clocks Throttle Reasons" and the page line "Pending Page Blacklist")
_Q_FIELDS = {("Remapped Rows", "Pending"): "remapped_rows.pending",
             ("Remapped Rows", "Remapping Failure Occurred"): "remapped_rows.failure",
             ("Retired Pages", "Pending Page Blacklist"): "retired_pages.pending",
             ("Retired Pages", "Pending Page Retirement"): "retired_pages.pending",
             ("Clocks Event Reasons", "HW Slowdown"): "clocks_event_reasons.hw_slowdown",
             ("Clocks Throttle Reasons", "HW Slowdown"): "clocks_event_reasons.hw_slowdown",
             ("Temperature", "GPU Current Temp"): "temperature.gpu"}
_Q_GPU = re.compile(r"^GPU [0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d\s*$")


def q_to_csv(text: str) -> str:
    """``nvidia-smi -q``'s sections -> the rows ``gpu_findings`` reads (GPU_FIELDS order):
    the fallback when the query fields are refused (an older driver). Uncorrected volatile
    ECC is the sum of the Volatile section's "Uncorrectable" lines, or its "Double Bit"
    section's total (older drivers)."""
    gpus: list[dict[str, str]] = []
    stack: list[tuple[int, str]] = []
    for line in text.splitlines():
        if _Q_GPU.match(line):
            gpus.append({"index": str(len(gpus))})
            stack = []
            continue
        if not gpus or not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        key, colon, value = line.strip().partition(":")
        key, value = key.strip(), value.strip()
        if not colon or not value:  # a section heading
            stack.append((indent, key))
            continue
        sections = [name for _, name in stack]
        gpu = gpus[-1]
        # "ECC Errors > Volatile > DRAM Uncorrectable : 2" (Ampere's drivers and later), or
        # "ECC Errors > Volatile > Double Bit > ... Total : 2" (older drivers, Volta, Pascal:
        # the parts and their total; the total is counted)
        if "ECC Errors" in sections and (
                (sections[-1] == "Volatile" and "Uncorrectable" in key
                 and "Total" not in key)
                or (sections[-2:] == ["Volatile", "Double Bit"] and key == "Total")):
            n = _num(value)
            if n is not None:
                old = _num(gpu.get("ecc.errors.uncorrected.volatile.total", "0")) or 0.0
                gpu["ecc.errors.uncorrected.volatile.total"] = f"{old + n:g}"
            continue
        field = _Q_FIELDS.get((sections[-1], key)) if sections else None
        if field is not None:
            gpu[field] = value.split()[0] if field == "temperature.gpu" else value
    return "".join(", ".join(g.get(f, "[N/A]") for f in GPU_FIELDS) + "\n" for g in gpus)


def xid_findings(kernel_lines: Iterable[str],
                 previous: Sequence[str] | None = None) -> list[Finding]:
    """Xid lines of the kernel log (``NVRM: Xid (PCI:0000:18:00): 79, ...``) -> findings,
    one per (device, Xid) with its count since boot; Xids of the application (13, 31, 43)
    are left out. ``previous``: the lines the last check saw on this node: each finding
    also says how many are new since then."""
    lines = list(kernel_lines)
    seen = _xid_counts(lines)
    fresh = _xid_counts(new_lines(previous, lines)) if previous is not None else None
    out = []
    for (pci, xid), n in sorted(seen.items()):
        tier, meaning = XIDS[xid]
        times = f" x{n}" if n > 1 else ""
        since = ""
        if fresh is not None:
            k = fresh.get((pci, xid), 0)
            since = f" ({k} new since the last check)" if k else " (none new since the last check)"
        out.append(Finding(tier, "xid", f"PCI:{pci}", f"Xid {xid} ({meaning}) on PCI:{pci}"
                                                       f"{times}{since}"))
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


# PFC pause frames between the gate's two readings (nothing of ours runs yet): the node asking
# the switch to pause (tx) means it cannot take what arrives; the switch asking the node
# (rx) beyond this many is congestion or a pause storm reaching it. Both: monitor.
PFC_RX_MIN = 100


def pfc_findings(ports: Mapping[str, Mapping[str, object]]) -> list[Finding]:
    """Each RoCE port's ``pfc_before``/``pfc_after`` (ethtool -S's pause counters) -> a
    monitor finding per counter that grew (tx at all, rx by ``PFC_RX_MIN`` or more)."""
    out = []
    for port in sorted(ports):
        v = ports[port]
        a, b = v.get("pfc_before"), v.get("pfc_after")
        if not isinstance(a, dict) or not isinstance(b, dict):
            continue
        dev = v.get("netdev")
        for name in sorted(b):
            x, y = a.get(name), b.get(name)
            if not isinstance(x, int) or not isinstance(y, int) or y <= x:
                continue
            if name.startswith("rx") and y - x < PFC_RX_MIN:
                continue
            who = ("the node paused the switch: it cannot take what arrives" if
                   name.startswith("tx") else "the switch paused the node: congestion or a "
                   "pause storm")
            out.append(Finding("monitor", "pfc", port, f"{port} ({dev}): {name} grew by "
                                                      f"{y - x} between two readings ({who})"))
    return out


def verdict(findings: Sequence[Finding]) -> str:
    """The node's tier: its worst finding's, or "ok"."""
    for tier in TIERS:
        if any(f.tier == tier for f in findings):
            return tier
    return "ok"


# --------------------------------------------------------------------------- the gate

SCHEMA = "dtrain.health/1"  # `doctor --health --json` (docs/fabric.md)
SHM_MIN = 1 << 30  # /dev/shm below 1 GiB: monitor (Docker's default 64 MiB breaks NCCL)
# the DCGM diag categories whose failure is the hardware (isolate); others: reset
DCGM_HARDWARE = ("hardware", "stress", "integration")


def dcgm_findings(doc: object, level: int) -> list[Finding]:
    """``dcgmi diag -r N -j`` -> a finding per failed (isolate in Hardware/Stress/
    Integration, else reset) or warned (monitor) test and GPU.

    DCGM 3.x: ``{"DCGM GPU Diagnostic": {"test_categories": [{"category", "tests": [{"name",
    "results": [{"gpu_ids", "status", "warnings"}]}]}]}}``. DCGM 4.x renamed the root
    ``"DCGM Diagnostic"``, names each result's GPU by ``entity_id`` (``entity_group``
    "GPU"; a non-GPU entity is named by its group) and sums the test up in
    ``test_summary.status``: a failed summary with no failed result still counts."""
    root: object = {}
    if isinstance(doc, dict):
        root = doc.get("DCGM GPU Diagnostic", doc.get("DCGM Diagnostic", doc))
    cats = root.get("test_categories") if isinstance(root, dict) else None
    out: list[Finding] = []
    for cat in cats if isinstance(cats, list) else []:
        if not isinstance(cat, dict):
            continue
        cname = str(cat.get("category", "?"))
        for test in cat.get("tests") or []:
            if not isinstance(test, dict):
                continue
            found = 0
            for res in test.get("results") or []:
                if not isinstance(res, dict):
                    continue
                finding = _dcgm_finding(cname, test, res, level)
                if finding is not None:
                    out.append(finding)
                    found += 1
            summary = test.get("test_summary")
            if not found and isinstance(summary, dict):
                finding = _dcgm_finding(cname, test, summary, level)
                if finding is not None:
                    out.append(finding)
    return out


def _dcgm_finding(cname: str, test: Mapping[str, object], res: Mapping[str, object],
                  level: int) -> Finding | None:
    """One result (or a 4.x test summary) of a DCGM test as a finding, None when it passed."""
    status = str(res.get("status", "")).lower()
    if status not in ("fail", "warn"):
        return None
    tier = ("monitor" if status == "warn" else
            "isolate" if cname.lower() in DCGM_HARDWARE else "reset")
    if "gpu_ids" in res:
        where = f"GPU {res.get('gpu_ids')}"
    elif "entity_id" in res:
        group = str(res.get("entity_group") or "GPU")
        where = f"{'GPU' if group.upper() == 'GPU' else group} {res.get('entity_id')}"
    else:
        where = "GPU ?"  # a 4.x summary: which GPU is in the results it did not give
    warn = res.get("warnings") or []
    text = "; ".join(str(w.get("warning", w) if isinstance(w, dict) else w)
                     for w in warn)[:300] if isinstance(warn, list) else ""
    return Finding(tier, "dcgm", where, f"dcgmi diag -r {level}: {cname}/{test.get('name')} "
                                        f"{status.upper()} on {where}"
                   + (f": {text}" if text else ""))


def node_findings(raw: Mapping[str, object],
                  previous_xids: Sequence[str] | None = None) -> list[Finding]:
    """The collector's JSON line (nodeside/health.py) -> every finding of the node
    (``previous_xids``: the Xid lines the last check kept for it)."""
    out: list[Finding] = []
    csv = raw.get("gpu_csv")
    if isinstance(csv, str):
        out += gpu_findings(csv)
    elif raw.get("gpu_error"):  # nvidia-smi there, the query refused (an older driver)
        q = raw.get("gpu_q")
        if isinstance(q, str) and (rows := q_to_csv(q)):
            out += gpu_findings(rows)  # -q's sections answer the same questions
        else:
            out.append(Finding("monitor", "gpu", "nvidia-smi", "nvidia-smi --query-gpu "
                               f"failed: {str(raw['gpu_error'])[-200:]}"))
    xids = raw.get("xid_lines")
    if isinstance(xids, list):
        out += xid_findings((str(x) for x in xids), previous_xids)
    dcgm = raw.get("dcgm")
    if isinstance(dcgm, dict) and dcgm.get("available"):
        if "json" in dcgm:
            out += dcgm_findings(dcgm["json"], int(dcgm.get("level") or 0))
        else:
            out.append(Finding("monitor", "dcgm", "dcgmi", "dcgmi diag gave no JSON: "
                               f"{str(dcgm.get('text', ''))[-200:]}"))
    ports = raw.get("ports")
    if isinstance(ports, dict):
        before = {p: v.get("before") or {} for p, v in ports.items() if isinstance(v, dict)}
        after = {p: v.get("after") or {} for p, v in ports.items() if isinstance(v, dict)}
        states = {p: str(v.get("state")) for p, v in ports.items()
                  if isinstance(v, dict) and v.get("state")}
        out += port_findings(before, after, states)
        out += pfc_findings({p: v for p, v in ports.items() if isinstance(v, dict)})
    memlock = raw.get("memlock")
    if isinstance(memlock, int) and memlock != -1 and ports:
        out.append(Finding("monitor", "limits", "memlock",
                           f"memlock {memlock} bytes, not unlimited (RDMA needs it)"))
    shm = raw.get("shm_bytes")
    if isinstance(shm, int) and shm < SHM_MIN:
        out.append(Finding("monitor", "limits", "/dev/shm",
                           f"/dev/shm is {shm >> 20} MiB (< {SHM_MIN >> 20} MiB)"))
    return out


def node_json(host: str, findings: Sequence[Finding], raw: Mapping[str, object] | None,
              error: str | None = None) -> dict[str, object]:
    """One node's entry in the dtrain.health/1 document."""
    ports = raw.get("ports") if raw else None
    return {"host": host, "verdict": "unreachable" if error else verdict(findings),
            "error": error,
            "findings": [{"tier": f.tier, "what": f.what, "where": f.where,
                          "message": f.message} for f in findings],
            "gpus": bool(raw and isinstance(raw.get("gpu_csv"), str)),
            "dcgm": bool(raw and isinstance(d := raw.get("dcgm"), dict) and d.get("available")),
            "ports": sorted(ports) if isinstance(ports, dict) else [],
            "kernel_log": bool(raw and raw.get("kernel_log"))}


def document(nodes: Sequence[Mapping[str, object]], elapsed_s: float) -> dict[str, object]:
    """``dtrain.health/1``: every node's verdict and findings."""
    counts = {t: sum(1 for n in nodes if n["verdict"] == t)
              for t in (*TIERS, "ok", "unreachable")}
    return {"schema": SCHEMA, "nodes": list(nodes), "counts": counts,
            "isolated": [n["host"] for n in nodes if n["verdict"] == "isolate"],
            "elapsed_s": round(elapsed_s, 3)}


def isolate_reason(findings: Sequence[Finding]) -> str:
    """The lemon record's why: the isolate findings, joined."""
    return "health gate: " + "; ".join(f.message for f in findings if f.tier == "isolate")
