"""dtrain's health collector: what one node reports for the health gate (docs/fabric.md).

Shipped like the probe (nodeside/wire.py: the bootstrap runs it as __main__ with its spec,
JSON, in ``DTRAIN_SPEC``); standard library only, Python >= 3.8. It judges nothing: it
prints one JSON line of raw readings, ``decide/fabric/health.py`` turns them into findings.

Spec: ``{"interval": s, "dcgm": 0|1|2|3}``. Readings:

* ``gpu_csv``: ``nvidia-smi --query-gpu=<GPU_FIELDS> --format=csv,noheader,nounits``
  (None without nvidia-smi), ``gpu_q``: ``nvidia-smi -q`` (its text, capped);
* ``xid_lines``: the kernel log's ``NVRM: Xid`` lines (``dmesg``, ``$DTRAIN_KERNEL_LOG`` for a
  test file; none when not readable: ``kernel_log`` false);
* ``dcgm``: ``dcgmi diag -r N -j`` parsed, when asked and dcgmi exists;
* ``ports``: every ``/sys/class/infiniband/HCA/ports/P`` (``$DTRAIN_IB_SYSFS`` for a test
  tree): state, phys_state, rate and two readings of its error counters ``interval`` apart;
  for a RoCE port (a netdev under ``gid_attrs/ndevs``) also two readings of its PFC pause
  counters from ``ethtool -S`` (``pfc_before``/``pfc_after``, where ethtool exists);
* ``memlock`` (soft RLIMIT_MEMLOCK, -1 unlimited) and ``shm_bytes`` (/dev/shm's size).
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from typing import Any

# twin of launcher/decide/fabric/health.py GPU_FIELDS (tests/test_health.py checks they agree)
GPU_FIELDS = ("index", "ecc.errors.uncorrected.volatile.total", "remapped_rows.pending",
              "remapped_rows.failure", "retired_pages.pending",
              "clocks_event_reasons.hw_slowdown", "temperature.gpu")
# counters/ (IB port counters) and hw_counters/ (RoCE) read twice
COUNTERS = ("symbol_error", "link_downed", "port_rcv_errors", "link_error_recovery",
            "port_xmit_discards")
HW_COUNTERS = ("rx_pause", "out_of_buffer")
MAX_TEXT = 256 * 1024
# ethtool -S's pause counters (mlx5: rx_prio3_pause, tx_prio3_pause, rx_pause_ctrl_phy ...)
PAUSE = re.compile(r"^\s*((?:rx|tx)_(?:prio\d_)?pause(?:_ctrl_phy)?):\s*(\d+)\s*$")


def _run(argv: list[str], timeout: float) -> tuple[int | None, str]:
    """(exit status, stdout) of a command; (None, why) when it cannot run."""
    try:
        p = subprocess.run(argv, capture_output=True, timeout=timeout, text=True,
                           check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"{argv[0]}: {exc}"
    return p.returncode, (p.stdout or p.stderr)[:MAX_TEXT]


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _ib_root() -> str:
    return os.environ.get("DTRAIN_IB_SYSFS") or "/sys/class/infiniband"


def _ports() -> dict[str, str]:
    """{"mlx5_0:1": port directory}"""
    root = _ib_root()
    out: dict[str, str] = {}
    try:
        hcas = sorted(os.listdir(root))
    except OSError:
        return out
    for hca in hcas:
        try:
            ports = sorted(os.listdir(os.path.join(root, hca, "ports")))
        except OSError:
            continue
        for p in ports:
            out[f"{hca}:{p}"] = os.path.join(root, hca, "ports", p)
    return out


def _counters(path: str) -> dict[str, int]:
    out = {}
    for sub, names in (("counters", COUNTERS), ("hw_counters", HW_COUNTERS)):
        for name in names:
            text = _read(os.path.join(path, sub, name))
            if text is not None:
                try:
                    out[name] = int(text)
                except ValueError:
                    pass
    return out


def _netdev(path: str) -> str | None:
    """The netdev of a RoCE port (its first GID's, ``gid_attrs/ndevs/N``), None for IB."""
    try:
        names = sorted(os.listdir(os.path.join(path, "gid_attrs", "ndevs")),
                       key=lambda n: int(n) if n.isdigit() else 1 << 30)
    except OSError:
        return None
    for n in names:
        dev = _read(os.path.join(path, "gid_attrs", "ndevs", n))
        if dev and re.match(r"^[\w.:-]{1,15}$", dev):
            return dev
    return None


def pause_counters(text: str) -> dict[str, int]:
    """``ethtool -S`` output -> its PFC/global pause counters."""
    out = {}
    for line in text.splitlines():
        m = PAUSE.match(line)
        if m:
            out[m.group(1)] = int(m.group(2))
    return out


def _pauses(netdevs: dict[str, str]) -> dict[str, dict[str, int]]:
    """{port: pause counters} for the ports with a netdev, when ethtool is there."""
    if not netdevs or not shutil.which("ethtool"):
        return {}
    out = {}
    for port, dev in netdevs.items():
        status, text = _run(["ethtool", "-S", dev], 10)
        if status == 0:
            out[port] = pause_counters(text)
    return out


def dcgm(level: int, timeout: float) -> dict[str, Any]:
    if not shutil.which("dcgmi"):
        return {"available": False}
    status, text = _run(["dcgmi", "diag", "-r", str(level), "-j"], timeout)
    out: dict[str, Any] = {"available": True, "level": level, "status": status}
    try:
        out["json"] = json.loads(text)
    except ValueError:
        out["text"] = text[-4000:]
    return out


def collect(spec: dict[str, Any]) -> dict[str, Any]:
    interval = float(spec.get("interval", 1.0))
    ports = _ports()
    before = {name: _counters(path) for name, path in ports.items()}
    netdevs = {name: dev for name, path in ports.items() if (dev := _netdev(path))}
    pfc_before = _pauses(netdevs)
    started = time.monotonic()
    out: dict[str, Any] = {"ok": True, "host": os.uname()[1], "python": sys.version.split()[0]}
    if shutil.which("nvidia-smi"):
        status, text = _run(["nvidia-smi", "--query-gpu=" + ",".join(GPU_FIELDS),
                             "--format=csv,noheader,nounits"], 20)
        out["gpu_csv"] = text if status == 0 else None
        if status != 0:
            out["gpu_error"] = text.strip()[-500:]
        status, text = _run(["nvidia-smi", "-q"], 20)
        out["gpu_q"] = text if status == 0 else None
    else:
        out["gpu_csv"] = None
    # the kernel log: dmesg, or a test's file ($DTRAIN_KERNEL_LOG, as DTRAIN_IB_SYSFS)
    fake = os.environ.get("DTRAIN_KERNEL_LOG")
    if fake:
        got = _read(fake)
        status, text = (0, got) if got is not None else (None, "")
    else:
        status, text = _run(["dmesg"], 10)
    out["xid_lines"] = ([ln for ln in text.splitlines() if "NVRM: Xid" in ln][-200:]
                        if status == 0 else [])
    out["kernel_log"] = status == 0
    level = int(spec.get("dcgm") or 0)
    if level:
        out["dcgm"] = dcgm(level, {1: 120, 2: 600, 3: 3600}.get(level, 600))
    try:
        soft = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
        out["memlock"] = -1 if soft == resource.RLIM_INFINITY else soft
    except (OSError, ValueError):
        out["memlock"] = None
    try:
        st = os.statvfs("/dev/shm")
        out["shm_bytes"] = st.f_blocks * st.f_frsize
    except OSError:
        out["shm_bytes"] = None
    # the second reading: at least `interval` after the first
    time.sleep(max(0.0, interval - (time.monotonic() - started)))
    out["ports"] = {name: {"state": _read(os.path.join(path, "state")),
                           "phys_state": _read(os.path.join(path, "phys_state")),
                           "rate": _read(os.path.join(path, "rate")),
                           "before": before.get(name, {}), "after": _counters(path)}
                    for name, path in ports.items()}
    pfc_after = _pauses({p: d for p, d in netdevs.items() if p in pfc_before})
    for name, dev in netdevs.items():
        out["ports"][name]["netdev"] = dev
        if name in pfc_before and name in pfc_after:
            out["ports"][name]["pfc_before"] = pfc_before[name]
            out["ports"][name]["pfc_after"] = pfc_after[name]
    out["interval"] = interval
    return out


def main() -> None:
    raw = globals().get("DTRAIN_SPEC") or b"{}"
    try:
        spec = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
        out = collect(spec if isinstance(spec, dict) else {})
    except Exception as exc:  # the launcher reports it, naming the node
        out = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
