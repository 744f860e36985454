"""Utilisation over time per node, from the archive's ``samples.jsonl`` (pure).

One record per node per sample, ``{"t", "host", ...}`` (docs/output-and-archive.md). The
reader is tolerant: every field is optional and a few spellings are accepted, so a record
with fields this version does not know still gives what it can, and one without samples
gives an empty list. Per node it derives:

    gpu_util   mean utilisation of the node's GPUs, %
    gpu_mem    memory used over memory total, all the node's GPUs, %
    cpu        CPU busy, %
    mem        host memory used, %
    nic        the NCCL/GLOO interface's receive + transmit rate, bytes/s
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from launcher.output.runreport.curves import Series, thin
from launcher.text.words import count

USAGE_POINTS = 720  # per node and metric (an hour at 5 s)
METRICS: tuple[tuple[str, str, str], ...] = (
    ("gpu_util", "GPU utilisation", "%"),
    ("gpu_mem", "GPU memory", "%"),
    ("cpu", "CPU busy", "%"),
    ("mem", "host memory", "%"),
    ("nic", "NIC rx + tx", "B/s"),
)


def _num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    f = float(value)
    return f if math.isfinite(f) else None


def _first(d: Mapping[str, Any], *names: str) -> float | None:
    for name in names:
        v = _num(d.get(name))
        if v is not None:
            return v
    return None


def _percent(value: object, used: tuple[str, ...], total: tuple[str, ...],
             pct: tuple[str, ...]) -> float | None:
    """A percentage from a number, or from a dict's percent field or used/total."""
    direct = _num(value)
    if direct is not None:
        return direct
    if not isinstance(value, Mapping):
        return None
    p = _first(value, *pct)
    if p is not None:
        return p
    u, t = _first(value, *used), _first(value, *total)
    return 100.0 * u / t if u is not None and t else None


def sample_values(rec: Mapping[str, Any]) -> dict[str, float]:
    """The metrics one sample record gives (those it has)."""
    out: dict[str, float] = {}
    gpus = rec.get("gpus")
    if isinstance(gpus, list):
        utils = [u for g in gpus if isinstance(g, Mapping)
                 for u in [_first(g, "util", "utilization", "gpu_util", "utilization_gpu",
                                  "util_pct")]
                 if u is not None]
        if utils:
            out["gpu_util"] = sum(utils) / len(utils)
        used = [(_first(g, "mem_used", "memory_used", "used_mib", "mem_used_mib"),
                 _first(g, "mem_total", "memory_total", "total_mib", "mem_total_mib"))
                for g in gpus if isinstance(g, Mapping)]
        pairs = [(u, t) for u, t in used if u is not None and t]
        if pairs:
            out["gpu_mem"] = 100.0 * sum(u for u, _ in pairs) / sum(t for _, t in pairs)
    cpu = _percent(rec.get("cpu"), ("used",), ("total",), ("busy", "util", "percent", "pct"))
    if cpu is None:
        cpu = _first(rec, "cpu_busy", "cpu_percent", "cpu_util", "cpu_pct")
    if cpu is not None:
        out["cpu"] = cpu
    mem = _percent(rec.get("mem"), ("used", "used_bytes", "used_kb", "used_mib"),
                   ("total", "total_bytes", "total_kb", "total_mib"), ("percent", "pct", "util"))
    if mem is None:  # dtrain's sampler: flat bytes (docs/output-and-archive.md)
        m_used, m_total = _first(rec, "mem_used"), _first(rec, "mem_total")
        mem = 100.0 * m_used / m_total if m_used is not None and m_total else None
    if mem is not None:
        out["mem"] = mem
    nic = rec.get("nic", rec.get("net"))  # "net": dtrain's sampler
    if isinstance(nic, list):  # one entry per interface
        rates = [sample_values({"nic": n}).get("nic") for n in nic]
        if any(r is not None for r in rates):
            out["nic"] = sum(r for r in rates if r is not None)
    elif isinstance(nic, Mapping):
        rx = _first(nic, "rx", "rx_bps", "rx_bytes_per_s", "rx_rate", "rx_Bps")
        tx = _first(nic, "tx", "tx_bps", "tx_bytes_per_s", "tx_rate", "tx_Bps")
        if rx is not None or tx is not None:
            out["nic"] = (rx or 0.0) + (tx or 0.0)
    else:
        rx, tx = _first(rec, "nic_rx", "rx"), _first(rec, "nic_tx", "tx")
        if rx is not None or tx is not None:
            out["nic"] = (rx or 0.0) + (tx or 0.0)
    return out


@dataclass
class UsageBuilder:
    """Fed one sample record at a time."""

    series: dict[str, dict[str, Series]] = field(default_factory=dict)  # metric -> host -> s
    records: int = 0

    def add(self, rec: Mapping[str, Any]) -> None:
        t, host = _num(rec.get("t")), rec.get("host")
        if t is None or not isinstance(host, str) or not host:
            return
        self.records += 1
        for name, value in sample_values(rec).items():
            s = self.series.setdefault(name, {}).setdefault(host, Series())
            s.t.append(t)
            s.step.append(None)
            s.v.append(value)


@dataclass(frozen=True)
class UsageChart:
    """One metric, one series per node (seconds since the run's start)."""

    name: str
    title: str
    unit: str
    hosts: dict[str, Series]


def charts(builder: UsageBuilder, t0: float, points: int = USAGE_POINTS) -> list[UsageChart]:
    out = []
    for name, title, unit in METRICS:
        by_host = builder.series.get(name)
        if not by_host:
            continue
        if max(len(s.t) for s in by_host.values()) < 2:
            continue  # one point is no line: an empty frame would say nothing
        hosts = {}
        for host, s in by_host.items():
            order = sorted(range(len(s.t)), key=s.t.__getitem__)
            shifted = Series([round(s.t[i] - t0, 3) for i in order], [None] * len(order),
                             [round(s.v[i], 3) for i in order])
            hosts[host] = thin(shifted, points)
        out.append(UsageChart(name, title, unit, hosts))
    return out


def why_none(meta: Mapping[str, Any], records: int, span: float) -> str:
    """Why the page draws no utilisation chart (said in its place)."""
    samples = meta.get("samples")
    interval = _num(samples.get("interval")) if isinstance(samples, Mapping) else None
    took = f"{span:.0f} s" if span < 120 else f"{span / 60:.0f} min"
    if records:
        every = f", one every {interval:g} s" if interval else ""
        return (f"{records} utilisation sample{'s' if records != 1 else ''} in this archive"
                f"{every}: too few to draw a line (a chart needs two samples of a node; the "
                f"run took {took})")
    if interval is None:
        return ("no utilisation samples in this archive: sampling was off "
                "(--sample-interval 0), or the run is older than sampling")
    errors = samples.get("errors") if isinstance(samples, Mapping) else None
    if isinstance(errors, Mapping) and errors:
        bad = ", ".join(f"{h}: {e}" for h, e in list(errors.items())[:4])
        return f"no utilisation samples: sampling failed ({bad})"
    if span < interval:
        return (f"no utilisation samples: the run took {took}, less than one "
                f"--sample-interval ({interval:g} s); set a shorter one to sample short runs")
    return "no utilisation samples in this archive"


NODE_SERIES_MAX = 32  # more nodes than this: the page draws their spread, not every node
SPREAD_POINTS = 360  # buckets of the spread's min / median / max
OUTLIERS = 4  # the nodes farthest from the others, drawn beside the spread


def page_usage(usage: list[dict[str, Any]], stragglers: list[str]) -> list[dict[str, Any]]:
    """The page's utilisation charts (``document``'s ``usage``): as they are up to
    NODE_SERIES_MAX nodes; beyond, each chart draws the nodes' spread (per time bucket the
    minimum, median and maximum of the nodes' means in it), the stragglers, and the
    OUTLIERS nodes whose mean is farthest from the median node's, and says so
    (``summary``). 512 lines are no picture, and aligning 512 series sampled at their own
    instants makes a table of nodes × every instant in the browser (seconds, gigabytes).
    ``dtrain report --json`` keeps every node."""
    out = []
    for chart in usage:
        hosts: dict[str, dict[str, Any]] = chart["hosts"]
        if len(hosts) <= NODE_SERIES_MAX:
            out.append(chart)
            continue
        spread = _spread(hosts)
        means = {h: sum(s["v"]) / len(s["v"]) for h, s in hosts.items() if s["v"]}
        middle = _median(list(means.values())) if means else 0.0
        picked = [h for h in stragglers if h in hosts]
        picked += sorted((h for h in means if h not in picked),
                         key=lambda h: (-abs(means[h] - middle), h))[:OUTLIERS]
        drawn = {**spread, **{h: hosts[h] for h in picked}}
        note = (f"{len(hosts)} nodes: their minimum, median and maximum per "
                f"{_bucket_words(hosts)}, and the {count(len(picked), 'node')} "
                f"farthest from the median (every node in `dtrain report --json`)")
        out.append({**chart, "hosts": drawn, "summary": note})
    return out


def _median(values: list[float]) -> float:
    values = sorted(values)
    n = len(values)
    return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2


def _bounds(hosts: Mapping[str, Mapping[str, Any]]) -> tuple[float, float]:
    ts = [t for s in hosts.values() for t in s["t"]]
    return (min(ts), max(ts)) if ts else (0.0, 0.0)


def _spread(hosts: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """min / median / max across nodes per time bucket (each node's mean in the bucket)."""
    lo, hi = _bounds(hosts)
    width = (hi - lo) / SPREAD_POINTS or 1.0
    per_bucket: dict[int, list[float]] = {}
    for s in hosts.values():
        sums: dict[int, list[float]] = {}
        for t, v in zip(s["t"], s["v"], strict=False):
            if v is None:
                continue
            b = min(SPREAD_POINTS - 1, int((t - lo) / width))
            acc = sums.setdefault(b, [0.0, 0.0])
            acc[0] += v
            acc[1] += 1
        for b, (total, n) in sums.items():
            per_bucket.setdefault(b, []).append(total / n)
    xs = sorted(per_bucket)
    t = [round(lo + (b + 0.5) * width, 3) for b in xs]
    pick: dict[str, Callable[[list[float]], float]] = {"min": min, "median": _median,
                                                        "max": max}
    return {f"{name} of {len(hosts)} nodes": {"t": t, "v": [round(f(per_bucket[b]), 3)
                                                             for b in xs]}
            for name, f in pick.items()}


def _bucket_words(hosts: Mapping[str, Mapping[str, Any]]) -> str:
    lo, hi = _bounds(hosts)
    width = (hi - lo) / SPREAD_POINTS
    return f"{width:.3g} s" if width else "instant"
