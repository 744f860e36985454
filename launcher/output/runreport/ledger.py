"""The report's goodput section (docs/goodput.md): one band per cause on the run's time axis
and the ledger as a table (per attempt and in total); with --compare, the two ledgers side by
side. It draws meta.json's ``goodput`` object (decide/outcome/goodput.py made it); nothing is
computed here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from launcher.output.runreport.safe import text
from launcher.output.runreport.summary import RunSummary
from launcher.output.runreport.timeline import LABEL_W, RIGHT, WIDTH, fmt_t

CAUSES = ("startup", "productive", "lost", "checkpoint_save", "checkpoint_restore", "hang",
          "detection", "restart", "backoff", "winddown")
LABELS = {"startup": "start-up", "productive": "productive", "lost": "lost (steps redone)",
          "checkpoint_save": "checkpoint save", "checkpoint_restore": "checkpoint restore",
          "hang": "hang", "detection": "detection", "restart": "restart (stopping)",
          "backoff": "back-off", "winddown": "wind-down"}
COLOURS = {"startup": "#9aa5b1", "productive": "#2e9e4f", "lost": "#d9822b",
           "checkpoint_save": "#3b7dd8", "checkpoint_restore": "#7b5fc7", "hang": "#c23030",
           "detection": "#e0a800", "restart": "#a8323e", "backoff": "#6b6b6b",
           "winddown": "#b5b5b5"}
BAND_H = 14
# where start-up went (decide/outcome/startup.py's PARTS, and the time a missing instant left
# unsplit)
PARTS = ("connect_probe", "agent_start", "rendezvous", "rank_start", "script", "unsplit")
PART_LABELS = {"connect_probe": "connect, probe", "agent_start": "torchrun agent start",
               "rendezvous": "rendezvous", "rank_start": "rank process start",
               "script": "script to first progress", "unsplit": "unsplit (an instant missing)"}
MAX_NODE_ROWS = 16


def _secs(v: object) -> str:
    return "not measured" if v is None else fmt_t(float(v)) if isinstance(v, int | float) \
        else "-"


def percent(v: object) -> str:
    return "not measured" if not isinstance(v, int | float) else f"{float(v) * 100:.1f}%"


def bands_svg(g: Mapping[str, Any], t0: float, span: float) -> str:
    """One row per cause that took time: its segments on the run's time axis."""
    segs = [s for s in g.get("segments") or [] if isinstance(s, list) and len(s) == 4]
    span = max(span, *(float(s[1]) - t0 for s in segs), 1e-3) if segs else max(span, 1e-3)
    x0, x1 = LABEL_W, WIDTH - RIGHT

    def x(t: float) -> float:
        return round(x0 + (x1 - x0) * max(0.0, min(t - t0, span)) / span, 1)

    rows, y = [], 4
    for cause in CAUSES:
        mine = [s for s in segs if s[2] == cause]
        if not mine:
            continue
        rows.append(f'<text class="nodelabel" x="6" y="{y + 11}">{text(LABELS[cause])}</text>')
        for a, b, _, n in mine:
            rows.append(f'<rect class="gp-band" data-cause="{cause}" x="{x(a)}" y="{y}" '
                        f'width="{max(1.0, x(b) - x(a)):.1f}" height="{BAND_H - 4}" '
                        f'fill="{COLOURS[cause]}"><title>{text(LABELS[cause])}, attempt {n}: '
                        f'{fmt_t(b - a)} (from +{fmt_t(a - t0)})</title></rect>')
        y += BAND_H
    return (f'<svg class="goodput-bands" viewBox="0 0 {WIDTH} {y + 4}" width="100%" '
            f'role="img" aria-label="where the time went, per cause">{"".join(rows)}</svg>')


def table(g: Mapping[str, Any]) -> str:
    attempts = [a for a in g.get("attempts") or [] if isinstance(a, Mapping)]
    total = g.get("seconds") if isinstance(g.get("seconds"), Mapping) else {}
    assert isinstance(total, Mapping)
    head = "".join(f"<th>attempt {text(a.get('n'))}</th>" for a in attempts) \
        if len(attempts) > 1 else ""
    rows = []
    for cause in CAUSES:
        cells = "".join(f"<td>{_secs((a.get('seconds') or {}).get(cause))}</td>"
                        for a in attempts) if len(attempts) > 1 else ""
        rows.append(f'<tr data-cause="{cause}"><th><svg class="gp-key" width="10" height="10">'
                    f'<rect width="10" height="10" fill="{COLOURS[cause]}"/></svg> '
                    f'{text(LABELS[cause])}</th>{cells}'
                    f'<td>{_secs(total.get(cause))}</td></tr>')
    foot = "".join(f"<td>{percent(a.get('goodput'))}</td>" for a in attempts) \
        if len(attempts) > 1 else ""
    rows.append(f'<tr class="gp-total"><th>goodput</th>{foot}'
                f'<td>{percent(g.get("goodput"))}</td></tr>')
    return (f'<table class="cmp ledger"><thead><tr><th>cause</th>{head}<th>run</th></tr>'
            f'</thead><tbody>{"".join(rows)}</tbody></table>')


def section(s: RunSummary) -> str:
    g = s.goodput
    if not isinstance(g, Mapping):
        return ('<section id="goodput"><h2>Goodput</h2><p class="empty">no ledger (an '
                'archive from before dtrain recorded one)</p></section>')
    notes = "".join(f'<p class="dim">{text(n)}</p>' for n in g.get("notes") or []
                    if isinstance(n, str))
    return (f'<section id="goodput"><h2>Goodput: {percent(g.get("goodput"))} of '
            f'{fmt_t(float(g.get("wall_s") or 0.0))}</h2>'
            f'{bands_svg(g, s.header.started or 0.0, s.span)}{table(g)}{notes}'
            f'{startup_table(g)}{step_times(g)}</section>')


def startup_table(g: Mapping[str, Any]) -> str:
    """Where start-up went: the parts per attempt (its reference rank's node) and for the
    run, then each attempt's nodes, the slowest start-up first (at most 16 rows)."""
    attempts = [a for a in g.get("attempts") or [] if isinstance(a, Mapping)]
    splits = [a.get("startup_split") if isinstance(a.get("startup_split"), Mapping) else None
              for a in attempts]
    run = g.get("startup_split")
    if not isinstance(run, Mapping) or not any(splits):
        return ""
    many = len(attempts) > 1
    head = "".join(f"<th>attempt {text(a.get('n'))} ({text(sp.get('node')) if sp else '-'})"
                   "</th>" for a, sp in zip(attempts, splits, strict=True)) if many else ""
    rows = []
    for part in PARTS:
        cells = "".join(f"<td>{_secs(sp['seconds'].get(part)) if sp else '-'}</td>"
                        for sp in splits) if many else ""
        rows.append(f'<tr data-part="{part}"><th>{text(PART_LABELS[part])}</th>{cells}'
                    f'<td>{_secs(run.get(part))}</td></tr>')
    node = f" ({text(splits[0].get('node'))})" if not many and splits[0] else ""
    out = [f'<h3>Where start-up went</h3><table class="cmp ledger startup-split"><thead><tr>'
           f'<th>part</th>{head}<th>run{node}</th></tr></thead><tbody>{"".join(rows)}'
           f'</tbody></table>']
    for a, sp in zip(attempts, splits, strict=True):
        nodes = sp.get("nodes") if sp else None
        if not isinstance(nodes, Mapping) or len(nodes) < 2:
            continue
        order = sorted(nodes.items(), key=lambda kv: -sum(
            float(v) for k, v in kv[1].items() if k != "script" and isinstance(v, int | float)))
        body = "".join(f'<tr><th>{text(h)}</th>' + "".join(
            f"<td>{_secs(p.get(part))}</td>" for part in PARTS) + "</tr>"
            for h, p in order[:MAX_NODE_ROWS] if isinstance(p, Mapping))
        cols = "".join(f"<th>{text(PART_LABELS[p])}</th>" for p in PARTS)
        out.append(f'<p class="dim">attempt {text(a.get("n"))}, per node (the longest '
                   f'before the script first):</p><table class="cmp startup-nodes"><thead>'
                   f'<tr><th>node</th>{cols}</tr></thead><tbody>{body}</tbody></table>')
    return "".join(out)


def step_times(g: Mapping[str, Any]) -> str:
    """Seconds per step per node (its slowest rank), slowest first."""
    st = g.get("step_time")
    nodes = st.get("nodes") if isinstance(st, Mapping) else None
    if not isinstance(nodes, Mapping) or not nodes:
        return ""
    pairs = sorted(((str(h), float(v)) for h, v in nodes.items()
                    if isinstance(v, int | float)), key=lambda p: -p[1])[:16]
    cells = ", ".join(f"{text(h)} {v:.3g} s" for h, v in pairs)
    return f'<p class="dim step-time">seconds per step, per node (slowest first): {cells}</p>'


def compare(runs: Sequence[RunSummary]) -> str:
    """--compare: the two ledgers side by side (run totals)."""
    a, b = (r.goodput if isinstance(r.goodput, Mapping) else {} for r in runs)
    ta = a.get("seconds") if isinstance(a.get("seconds"), Mapping) else {}
    tb = b.get("seconds") if isinstance(b.get("seconds"), Mapping) else {}
    assert isinstance(ta, Mapping) and isinstance(tb, Mapping)
    rows = [f'<tr data-cause="{c}"><th>{text(LABELS[c])}</th><td>{_secs(ta.get(c))}</td>'
            f'<td>{_secs(tb.get(c))}</td></tr>' for c in CAUSES]
    rows.append(f'<tr class="gp-total"><th>goodput</th><td>{percent(a.get("goodput"))}</td>'
                f'<td>{percent(b.get("goodput"))}</td></tr>')
    return ('<section id="goodput"><h2>Goodput, A and B</h2><table class="cmp ledger"><thead>'
            '<tr><th>cause</th><th>A</th><th>B</th></tr></thead><tbody>'
            f'{"".join(rows)}</tbody></table></section>')
