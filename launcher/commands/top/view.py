"""What `dtrain top` shows: rows from a dtrain.top/1 document, sorted, filtered, folded.

Every view (the live screen, ``--once``, a piped stream) draws from the same document that
``--json`` prints, so what a script reads and what a person sees cannot drift apart.
Pure: no terminal, no sockets; ``screen.py`` puts the rich table on a terminal.
"""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from launcher.hosts.hostfile import fold
from launcher.job.events import number
from launcher.text.termsafe import inert

# (key, header, plain width); RUN_COLUMNS only when the view follows a run
COLUMNS = (("node", "NODE", 0), ("state", "STATE", 7), ("cpu", "CPU%", 4), ("load", "LOAD", 5),
           ("mem", "MEM", 11), ("net", "NET rx/tx", 13), ("gpus", "GPU", 3),
           ("util", "UTIL%", 11), ("gmem", "GMEM", 11), ("temp", "TEMP", 4),
           ("power", "POWER W", 9))
RUN_COLUMNS = (("ranks", "RANKS", 5), ("last", "LAST", 5), ("busy", "BUSY", 4))
NOTE = ("note", "NOTE", 0)
SORT_KEYS = ("node", "state", "cpu", "load", "mem", "net", "util", "gmem", "temp", "power",
             "last", "busy")
IDLE_UTIL_PCT = 5  # every GPU below this (and no ranks): the node is idle


@dataclass(frozen=True)
class ViewOptions:
    """How the rows are arranged (the keys change these in the live view)."""

    sort: str = "node"
    reverse: bool = False
    filter: str = ""
    fold: bool = False
    gpus: bool = False  # each node followed by one row per GPU (key g, --per-gpu)


@dataclass
class Row:
    """One line of the table: a node, or several folded ones."""

    hosts: list[str]
    cells: dict[str, str]
    keys: dict[str, float | str | None] = field(default_factory=dict)
    level: str = "ok"  # ok, warn (straggler, hot), bad (lost, unreachable)
    gpu_rows: list[Row] = field(default_factory=list)  # one per GPU, shown with opts.gpus


# -- number formatting -----------------------------------------------------------------------

def human(n: float | None, suffix: str = "") -> str:
    """1234567 -> '1.2M' (powers of 1024, one decimal below 10)."""
    if n is None:
        return "-"
    for unit in ("", "K", "M", "G", "T"):
        if abs(n) < 1024 or unit == "T":
            if unit == "":
                return f"{n:.0f}{suffix}"
            return f"{n:.1f}{unit}{suffix}" if abs(n) < 10 else f"{n:.0f}{unit}{suffix}"
        n /= 1024
    raise AssertionError("unreachable")


def _fmt(value: float | None, spec: str = ".0f") -> str:
    return "-" if value is None else format(value, spec)


def _sig(value: float | None, digits: int) -> float | None:
    """``value`` to ``digits`` significant digits (2712 -> 3000 with one)."""
    if value is None or value == 0:
        return value
    return float(f"{value:.{digits}g}")


def age_text(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    return f"{s // 3600}h"


def ranks_text(ranks: Sequence[int]) -> str:
    """[4, 5, 6, 9] -> '4-6,9'."""
    out: list[str] = []
    run: list[int] = []
    for r in sorted(ranks):
        if run and r == run[-1] + 1:
            run.append(r)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [r]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out) or "-"


# -- one node -------------------------------------------------------------------------------

def node_row(node: Mapping[str, Any], *, coarse: bool = False) -> Row:
    """The cells of one node entry of a dtrain.top/1 document."""
    s = node.get("sample") or {}
    state = str(node.get("state", "?"))
    gpus = [g for g in s.get("gpus") or [] if isinstance(g, dict)]
    cpu = number(s.get("cpu_pct"))
    load = s.get("load") or [None]
    load1 = number(load[0]) if load else None
    mem_used, mem_total = number(s.get("mem_used")), number(s.get("mem_total"))
    net = s.get("net") or {}
    rx, tx = number(net.get("rx_bps")), number(net.get("tx_bps"))
    utils = [number(g.get("util_pct")) for g in gpus]
    gm_used = sum(number(g.get("mem_used_mib")) or 0 for g in gpus)
    gm_total = sum(number(g.get("mem_total_mib")) or 0 for g in gpus)
    temps = [t for t in (number(g.get("temp_c")) for g in gpus) if t is not None]
    power = [p for p in (number(g.get("power_w")) for g in gpus) if p is not None]
    plimit = [p for p in (number(g.get("power_limit_w")) for g in gpus) if p is not None]
    live = state == "ok"
    if coarse:  # folding compares these: near-equal nodes fold together
        cpu = None if cpu is None else round(cpu / 10) * 10
        load1 = None if load1 is None else float(round(load1))
        utils = [None if u is None else round(u / 10) * 10 for u in utils]
        rx, tx, mem_used = _sig(rx, 1), _sig(tx, 1), _sig(mem_used, 2)
        gm_used = _sig(gm_used, 2) or 0.0
    cells = {
        "node": inert(str(node.get("host", "?"))),
        "state": inert(state),
        "cpu": _fmt(cpu) if live else "-",
        "load": _fmt(load1, ".0f" if coarse else ".2f") if live else "-",
        "mem": f"{human(mem_used)}/{human(mem_total)}" if live and mem_total else "-",
        "net": (f"{human(rx)}/{human(tx)}" if live and (rx is not None or tx is not None)
                else "-"),
        "gpus": str(len(gpus)) if gpus else "-",
        "util": " ".join(_fmt(u) for u in utils) if live and gpus else "-",
        "gmem": (f"{gm_used / 1024:.1f}/{gm_total / 1024:.1f}G" if live and gm_total else "-"),
        "temp": _fmt(max(temps)) if live and temps else "-",
        "power": (f"{sum(power):.0f}/{sum(plimit):.0f}" if live and power and plimit else
                  _fmt(sum(power)) if live and power else "-"),
    }
    ranks = [int(r) for r in node.get("ranks") or []]
    info = node.get("rank_info") or {}
    ages = [number(v.get("age")) for v in info.values() if isinstance(v, dict)]
    busies = [number(v.get("busy")) for v in info.values() if isinstance(v, dict)]
    last = max((a for a in ages if a is not None), default=None)
    busy = max((b for b in busies if b is not None), default=None)
    cells["ranks"] = ranks_text(ranks) if ranks else "-"
    cells["last"] = age_text(last)
    cells["busy"] = _fmt(busy, ".1f" if coarse else ".2f")
    notes = []
    if node.get("straggler"):
        notes.append("STRAGGLER")
    if node.get("error") and state != "ok":
        notes.append(str(node["error"]))
    if s.get("gpu_error"):
        notes.append(str(s["gpu_error"]))
    if live and not ranks and gpus and all(u is not None and u < IDLE_UTIL_PCT for u in utils):
        notes.append("idle")
    cells["note"] = inert("; ".join(notes))  # a node's error text: no control reaches the screen
    good_utils = [u for u in utils if u is not None]
    keys: dict[str, float | str | None] = {
        "node": None, "state": state, "cpu": cpu, "load": load1, "mem": mem_used,
        "net": (rx or 0) + (tx or 0) if rx is not None or tx is not None else None,
        "util": sum(good_utils) / len(good_utils) if good_utils else None,
        "gmem": gm_used if gpus else None, "temp": max(temps) if temps else None,
        "power": sum(power) if power else None, "last": last, "busy": busy}
    level = "bad" if state in ("lost", "unreachable") else \
        "warn" if node.get("straggler") or s.get("gpu_error") else "ok"
    per_gpu = [_gpu_row(cells["node"], i, g) for i, g in enumerate(gpus)] if live else []
    return Row([cells["node"]], cells, keys, level, per_gpu)


def _gpu_row(host: str, i: int, g: Mapping[str, Any]) -> Row:
    """One GPU of a node as its own row (``node4 gpu1``): its utilisation, memory,
    temperature and power; the node's columns are blank."""
    used, total = number(g.get("mem_used_mib")), number(g.get("mem_total_mib"))
    power, limit = number(g.get("power_w")), number(g.get("power_limit_w"))
    index = g.get("index") if isinstance(g.get("index"), int) else i
    cells = {"node": f"{host} gpu{index}", "util": _fmt(number(g.get("util_pct"))),
             "gmem": f"{(used or 0) / 1024:.1f}/{total / 1024:.1f}G" if total else "-",
             "temp": _fmt(number(g.get("temp_c"))),
             "power": (f"{power:.0f}/{limit:.0f}" if power is not None and limit else
                       _fmt(power))}
    return Row([host], cells)


# -- the table ------------------------------------------------------------------------------

def matches(host: str, pattern: str) -> bool:
    """The filter: a glob (``node1*``), a substring, or a folded set (``node[1-4]``)."""
    if not pattern:
        return True
    if any(c in pattern for c in "*?"):
        return fnmatch.fnmatchcase(host, pattern)
    if "[" in pattern or "," in pattern:
        from ClusterShell.NodeSet import NodeSetException

        from launcher.hosts.entries import nodeset

        try:
            return host in nodeset(pattern)
        except NodeSetException:
            return pattern in host  # half-typed: a substring until it parses
    return pattern in host


def rows(doc: Mapping[str, Any], opts: ViewOptions) -> list[Row]:
    """The table's rows, in display order."""
    nodes = [n for n in doc.get("nodes") or [] if matches(str(n.get("host", "")), opts.filter)]
    out = [node_row(n, coarse=opts.fold) for n in nodes]
    if opts.fold:
        out = fold_rows(out)
    out = sort_rows(out, opts)
    if opts.gpus:  # each node's GPUs under it, a row each (a folded row stays one)
        expanded = []
        for row in out:
            util = row.keys.get("util")
            if len(row.hosts) == 1 and row.gpu_rows:
                if isinstance(util, float | int):  # the per-GPU values are below: the mean
                    row = replace(row, cells={**row.cells, "util": f"{util:.0f} avg"})
                expanded += [row, *row.gpu_rows]
            else:
                expanded.append(row)
        out = expanded
    return out


def fold_rows(rows_: Sequence[Row]) -> list[Row]:
    """Rows whose (coarse) cells are all equal become one: ``node[1-60]  ...  idle``."""
    groups: dict[tuple[tuple[str, str], ...], Row] = {}
    for row in rows_:
        sig = tuple((k, v) for k, v in row.cells.items() if k != "node")
        if sig in groups:
            groups[sig].hosts.extend(row.hosts)
        else:
            groups[sig] = replace(row, hosts=list(row.hosts), cells=dict(row.cells))
    out = list(groups.values())
    for row in out:
        if len(row.hosts) > 1:
            row.cells["node"] = f"{fold(row.hosts)} ({len(row.hosts)})"
    return out


def sort_rows(rows_: list[Row], opts: ViewOptions) -> list[Row]:
    if opts.sort == "node":
        return list(reversed(rows_)) if opts.reverse else rows_
    order = {"bad": 0, "warn": 1, "ok": 2}

    def key(row: Row) -> tuple[int, float | str]:
        v = row.keys.get(opts.sort)
        if opts.sort == "state":
            return (0, f"{order.get(row.level, 3)}{v}")
        if v is None or isinstance(v, str):
            return (1, 0.0)  # no value: always last
        return (0, -float(v))  # numbers: the largest first

    ranked = sorted(rows_, key=key)
    return list(reversed(ranked)) if opts.reverse else ranked


def columns(doc: Mapping[str, Any]) -> list[tuple[str, str, int]]:
    cols = list(COLUMNS)
    if doc.get("run"):
        cols += RUN_COLUMNS
    return [*cols, NOTE]


def header_lines(doc: Mapping[str, Any], opts: ViewOptions, *, shown: int) -> list[str]:
    """The lines above the table: the time and node counts, then the run (if any)."""
    nodes = doc.get("nodes") or []
    counts: dict[str, int] = {}
    for n in nodes:
        counts[str(n.get("state"))] = counts.get(str(n.get("state")), 0) + 1
    states = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    t = doc.get("t")
    clock = time.strftime("%H:%M:%S", time.localtime(t)) if isinstance(t, (int, float)) else ""
    arrange = [f"sort {opts.sort}{' (reversed)' if opts.reverse else ''}"]
    if opts.filter:
        arrange.append(f"filter {opts.filter!r}: {shown} shown")
    if opts.fold:
        arrange.append("folded")
    if opts.gpus:
        arrange.append("a row per GPU")
    lines = [f"dtrain top  {clock}  {len(nodes)} node{'s' if len(nodes) != 1 else ''}: "
             f"{states}  every {doc.get('interval', 0):g} s  {'  '.join(arrange)}"]
    run = doc.get("run")
    if run:
        rate = run.get("step_rate")
        step = run.get("step")
        parts = [f"run {run.get('run_id')}", str(run.get("state") or "?")]
        if run.get("attempt") is not None:
            parts.append(f"attempt {run['attempt']}")
        parts.append(f"world size {run.get('world_size')}")
        if rate is not None:
            parts.append(f"{rate:.2f} steps/s" + (f" (step {step})" if step is not None else ""))
        else:
            parts.append("no progress lines yet" if run.get("progress") else "no step rate")
        lines.append("  ".join(parts))
    for s in doc.get("stragglers") or []:
        if s.get("cleared") is None:
            ranks = s.get("ranks") or []
            lines.append(f"straggler: {s.get('host')} (rank{'s' if len(ranks) > 1 else ''} "
                         f"{ranks_text(ranks)})"
                         f" busy {s.get('busy'):.2f} against {s.get('others'):.2f} on the "
                         f"other nodes, flagged {_clock(s.get('flagged'))}")
    return lines


def _clock(t: object) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) if isinstance(t, (int, float)) else "?"


def plain(doc: Mapping[str, Any], opts: ViewOptions = ViewOptions()) -> str:
    """The whole view as plain text (``--once``, a pipe): aligned columns, no colour."""
    table = rows(doc, opts)
    cols = columns(doc)
    widths = {k: max([len(h)] + [len(r.cells.get(k, "")) for r in table]) for k, h, _ in cols}
    out = header_lines(doc, opts, shown=sum(len(r.hosts) for r in table))
    out.append("  ".join(h.ljust(widths[k]) for k, h, _ in cols).rstrip())
    for r in table:
        out.append("  ".join(r.cells.get(k, "").ljust(widths[k]) for k, _, _ in cols).rstrip())
    return "\n".join(out) + "\n"
