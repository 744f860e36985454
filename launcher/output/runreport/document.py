"""The ``dtrain report --json`` document (``dtrain.report/1``, schemas/report.schema.json).

The same data the page draws: the header, per node and rank how it ran, attempts, hangs,
stragglers, the curves and utilisation series (thinned exactly as drawn), and the tails.
Times in series and lanes are seconds since the run's start; ``started`` is Unix time.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from launcher.output.runreport.curves import Series
from launcher.output.runreport.digest import Line
from launcher.output.runreport.summary import RunSummary

SCHEMA = "dtrain.report/1"


def _series(s: Series, *, step: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {"t": s.t, "v": s.v}
    if step:
        out["step"] = s.step
    return out


def _line(line: Line) -> dict[str, Any]:
    return {"t": round(line.t, 3), "host": line.host, "rank": line.rank,
            "stream": line.stream, "line": line.text, "attempt": line.attempt}


def run_json(s: RunSummary) -> dict[str, Any]:
    """One run's part of the document."""
    h = s.header
    return {
        "run_id": h.run_id, "command": h.command, "hosts": h.hosts, "nodes": h.nodes,
        "world_size": h.world_size,
        "started": datetime.fromtimestamp(h.started, UTC).isoformat(timespec="milliseconds")
        if h.started else None,
        "started_ts": h.started, "duration": round(h.duration, 3) if h.duration else h.duration,
        "attempts": h.attempts, "exit_code": h.exit_code, "outcome": h.outcome,
        "root_cause": h.root_cause, "advice": h.advice, "state": h.state,
        "dtrain_version": h.dtrain_version,
        "failing": {"rank": s.failing[0], "host": s.failing[1],
                    "stderr_tail": [_line(x) for x in s.failing_tail]},
        "lanes": "node" if s.per_node_lanes else "rank",
        "node_lanes": [{
            "host": n.host, "node_rank": n.node_rank, "exit_code": n.exit_code,
            "signal": n.signal, "error": n.error, "lost": n.lost,
            "fenced": [{"attempt": a, "reason": why} for a, why in n.fenced],
            "straggler": n.straggler, "start": n.start, "end": n.end,
            "ranks": [asdict(r) for r in n.ranks],
        } for n in s.nodes],
        "attempt_list": [asdict(a) for a in s.attempts],
        "hangs": [asdict(x) for x in s.hangs],
        "events": [asdict(e) for e in s.events],
        "stragglers": list(s.stragglers),
        "curves": [{
            "name": c.name, "x_is_step": c.x_is_step, "points": c.points,
            "thinned": c.thinned,
            "mean": {str(a): _series(m) for a, m in c.mean.items()},
            "ranks": [{"rank": r, "attempt": a, **_series(ser)}
                      for (r, a), ser in c.ranks.items()],
            **({"spread": {str(a): {k: _series(x) for k, x in e.items()}
                           for a, e in c.spread.items()},
                "outliers": [{"rank": r, "attempt": a, **_series(ser)}
                             for (r, a), ser in c.outliers.items()]} if c.spread else {}),
        } for c in s.curves],
        "curves_left_out": list(s.curves_left_out),
        "usage": [{
            "name": u.name, "title": u.title, "unit": u.unit,
            "hosts": {host: _series(ser, step=False) for host, ser in u.hosts.items()},
        } for u in s.usage],
        "node_tails": {host: [_line(x) for x in lines] for host, lines in s.node_tails.items()},
        "notes": [_line(x) for x in s.notes],
        "stacks": {dump: [{"rank": f.rank, "file": f.name, "anchor": f.anchor}
                          for f in files] for dump, files in s.stacks.items()},
        "counts": {"lines": s.lines, "bad_records": s.bad_records, "samples": s.samples},
        "span": round(s.span, 3),
        "goodput": s.goodput,
        "fabric": list(s.fabric),
    }


def _plain(v: Any) -> Any:
    """Tuples (from dataclasses) as lists, so the document is what json.loads would give."""
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return v


def document(runs: list[RunSummary]) -> dict[str, Any]:
    """The whole document: one run, or two for ``--compare``."""
    from launcher import __version__

    doc: dict[str, Any] = {"schema": SCHEMA, "dtrain_version": __version__,
                           "runs": [_plain(run_json(s)) for s in runs]}
    if len(runs) == 2:
        a, b = runs
        da, db = a.header.duration, b.header.duration
        doc["compare"] = {
            "duration_delta": round(db - da, 3) if da is not None and db is not None else None,
            "duration_ratio": round(db / da, 4) if da and db is not None else None,
            "common_curves": sorted({c.name for c in a.curves} & {c.name for c in b.curves}),
        }
    return doc
