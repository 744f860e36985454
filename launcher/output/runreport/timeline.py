"""The timeline as inline SVG: one lane per rank grouped by node (one per node past
``RANK_LANES_MAX`` ranks), attempts as bands, the root cause, hangs, fenced nodes and
stragglers as markers linked to their text. Drawn here, not in the browser, so it shows
without JavaScript and tests can read every bar's data (``data-*`` attributes).
"""

from __future__ import annotations

import math
import signal as _signal

from launcher.output.runreport.safe import ident, text
from launcher.output.runreport.summary import NodeLane, RankLane, RunSummary
from launcher.text.words import rank_ranges

WIDTH = 1000
LABEL_W = 150
RIGHT = 16
TOP = 30
RANK_H = 14
NODE_H = 20
ROLE_ORDER = ("root cause", "failed", "fenced", "unknown", "stopped", "running", "ok")


def signame(sig: int | None) -> str | None:
    if not sig:
        return None
    try:
        return _signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def how(lane: RankLane) -> str:
    """``exit 7``, ``SIGTERM``, ``running``: how a rank ended."""
    if lane.signal:
        return signame(lane.signal) or ""
    if lane.exit_code is not None:
        return f"exit {lane.exit_code}"
    return "running" if lane.role == "running" else "no exit report"


def nice_step(span: float, target: int = 8) -> float:
    """A tick interval (1, 2, 5 x 10^k seconds, or whole minutes/hours) for ~target ticks."""
    raw = max(span, 1e-3) / target
    for unit in (60.0, 3600.0):
        if raw >= unit:
            base = unit
            break
    else:
        base = 1.0
    mag = 10 ** math.floor(math.log10(raw / base)) if raw / base > 0 else 1
    for m in (1, 2, 5, 10):
        if m * mag * base >= raw:
            return float(m * mag * base)
    return float(10 * mag * base)


def fmt_t(seconds: float) -> str:
    """``45s``, ``2m30s``, ``1h05m``."""
    s = int(round(seconds))
    if abs(seconds) < 10 and seconds != int(seconds):
        return f"{seconds:.1f}s"
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s" if s % 60 else f"{s // 60}m"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _aggregate(node: NodeLane) -> RankLane | None:
    """One lane for a whole node: earliest start, latest end, the worst role."""
    if not node.ranks:
        return None
    starts = [r.start for r in node.ranks if r.start is not None]
    ends = [r.end for r in node.ranks if r.end is not None]
    worst = min(node.ranks, key=lambda r: ROLE_ORDER.index(r.role)
                if r.role in ROLE_ORDER else 2)
    return RankLane(rank=-1, host=node.host, start=min(starts) if starts else None,
                    end=max(ends) if ends else None,
                    approx=any(r.approx for r in node.ranks), exit_code=worst.exit_code,
                    signal=worst.signal, role=worst.role,
                    lines=sum(r.lines for r in node.ranks))


def svg(s: RunSummary) -> str:
    span = max(s.span, *(r.end or 0.0 for n in s.nodes for r in n.ranks), 1e-3)
    x0, x1 = LABEL_W, WIDTH - RIGHT

    def x(t: float) -> float:
        return round(x0 + (x1 - x0) * max(0.0, min(t, span)) / span, 1)

    rows: list[str] = []
    y = TOP
    lane_y: dict[tuple[str, int], float] = {}
    for node in s.nodes:
        badges = []
        if node.straggler:
            badges.append(("straggler", node.straggler))
        for n, why in node.fenced:
            badges.append(("fenced", f"fenced after attempt {n}: {why}"))
        if node.lost:
            badges.append(("lost", node.error or "lost"))
        title = f"{node.host}" + (f" (node {node.node_rank})" if node.node_rank is not None
                                  else "")
        rows.append(f'<g class="node" data-host="{text(node.host)}">'
                    f'<rect class="nodebg" x="0" y="{y}" width="{WIDTH}" height="{NODE_H}"/>'
                    f'<text class="nodelabel" x="6" y="{y + 14}">{text(title)}</text>')
        if node.start is not None and node.end is not None:
            how_node = signame(node.signal) or (f"exit {node.exit_code}"
                                                if node.exit_code is not None else "")
            rows.append(f'<rect class="nodebar" x="{x(node.start)}" y="{y + 8}" '
                        f'width="{max(1.0, x(node.end) - x(node.start)):.1f}" height="4">'
                        f'<title>{text(node.host)}: the node program (torchrun) ran '
                        f'{fmt_t(node.end - node.start)}, {text(how_node)}</title></rect>')
        bx = 14 + 7.3 * len(title)  # after the node's name (12px monospace)
        for kind, why in badges:
            w = 8 + 6.2 * len(kind)
            rows.append(f'<g class="badge b-{kind}"><title>{text(why)}</title>'
                        f'<rect x="{bx}" y="{y + 3}" width="{w:.0f}" height="14" rx="7"/>'
                        f'<text x="{bx + w / 2:.0f}" y="{y + 14}">{kind}</text></g>')
            bx += w + 6
        rows.append("</g>")
        y += NODE_H
        lanes = [a for a in [_aggregate(node)] if a] if s.per_node_lanes else list(node.ranks)
        for lane in lanes:
            label = (f"r{rank_ranges(r.rank for r in node.ranks)}" if lane.rank < 0
                     else f"r{lane.rank}")
            lane_y[(node.host, lane.rank)] = y
            rows.append(_bar(lane, label, y, x, node))
            for a in s.attempts[:-1]:  # earlier attempts: a thin bar where the node took part
                if a.start is not None and a.end is not None and (
                        not a.hosts or node.host in a.hosts):
                    code = f"exit {a.exit_code}" if a.exit_code is not None else "?"
                    rows.append(f'<rect class="prev" data-attempt="{a.n}" x="{x(a.start)}" '
                                f'y="{y + 5}" width="{max(2.0, x(a.end) - x(a.start)):.1f}" '
                                f'height="{RANK_H - 10}"><title>attempt {a.n}: '
                                f'{text(code)}</title></rect>')
            y += RANK_H
        if not lanes:
            rows.append(f'<text class="none" x="{x0}" y="{y + 11}">no ranks recorded</text>')
            y += RANK_H
    height = y + 8
    back: list[str] = []
    for i, a in enumerate(s.attempts):
        if a.start is None:
            continue
        end = a.end if a.end is not None else span
        code = f"exit {a.exit_code}" if a.exit_code is not None else "running"
        tip = f"attempt {a.n}: {code}" + (f" ({a.outcome or a.cause})"
                                          if a.outcome or a.cause else "")
        back.append(f'<g class="attempt a{i % 2}" data-attempt="{a.n}"><title>{text(tip)}'
                    f'</title><rect x="{x(a.start)}" y="{TOP - 12}" '
                    f'width="{max(1.0, x(end) - x(a.start)):.1f}" height="{height - TOP + 4}"/>'
                    f'<text x="{x(a.start) + 4}" y="{TOP - 2}">attempt {a.n} · {text(code)}'
                    f'</text></g>')
    marks: list[str] = []
    for e in s.events:
        ex = x(e.t)
        ly = lane_y.get((e.host or "", e.rank if e.rank is not None and not s.per_node_lanes
                         else -1))
        if ly is None and e.host:
            ly = next((v for (h, _), v in lane_y.items() if h == e.host), None)
        body = (f'<line x1="{ex}" y1="{TOP - 4}" x2="{ex}" y2="{height - 6}"/>' +
                (f'<path d="M{ex} {ly + 1}l6 6-6 6-6-6z"/>' if ly is not None else ""))
        mark = (f'<g class="ev ev-{ident(e.kind)}" data-kind="{text(e.kind)}" '
                f'data-t="{e.t:.3f}"><title>{text(e.label)} (at {fmt_t(e.t)})</title>{body}</g>')
        if e.href:
            mark = f'<a href="{text(e.href)}">{mark}</a>'
        marks.append(mark)
    step = nice_step(span)
    ticks = []
    k = 0
    while k * step <= span + 1e-9 and k < 200:
        tx = x(k * step)
        ticks.append(f'<line class="grid" x1="{tx}" y1="{TOP}" x2="{tx}" y2="{height - 6}"/>'
                     f'<text class="tick" x="{tx}" y="{TOP - 16}">{fmt_t(k * step)}</text>')
        k += 1
    return (f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" role="img" '
            f'viewBox="0 0 {WIDTH} {height}" width="100%" data-span="{span:.3f}" '
            f'aria-label="timeline: one lane per {"node" if s.per_node_lanes else "rank"}">'
            + "".join(back) + "".join(ticks) + "".join(rows) + "".join(marks) + "</svg>")


def _bar(lane: RankLane, label: str, y: float, x: object, node: NodeLane) -> str:
    assert callable(x)
    role = lane.role
    where = f"rank {lane.rank} on {node.host}" if lane.rank >= 0 else \
        f"{node.host}, ranks {label[1:]}"
    tip = f"{where}: {how(lane)}"
    if lane.start is not None and lane.end is not None:
        tip += f" after {fmt_t(lane.end - lane.start)}"
    tip += f" ({role}; {lane.lines} lines)" + (" [times from the output]" if lane.approx else "")
    out = [f'<g class="lane r-{ident(role)}" data-host="{text(node.host)}" '
           f'data-rank="{lane.rank}" data-role="{text(role)}" '
           f'data-start="{"" if lane.start is None else f"{lane.start:.3f}"}" '
           f'data-end="{"" if lane.end is None else f"{lane.end:.3f}"}">'
           f'<title>{text(tip)}</title>'
           f'<text class="lanelabel" x="{LABEL_W - 8}" y="{y + 10.5}">{text(label)}</text>']
    if lane.start is not None:
        x_a = x(lane.start)
        x_b = x(lane.end) if lane.end is not None else x(10**12)
        w = max(2.0, x_b - x_a)
        out.append(f'<rect class="bar" x="{x_a}" y="{y + 2}" width="{w:.1f}" '
                   f'height="{RANK_H - 4}" rx="2"/>')
        end_text = how(lane)
        if w > 8 * len(end_text) + 8:
            out.append(f'<text class="endlabel" x="{x_a + w - 4:.1f}" y="{y + 10.5}">'
                       f'{text(end_text)}</text>')
        elif x_a + w + 8 * len(end_text) + 8 < WIDTH:
            out.append(f'<text class="endlabel out" x="{x_a + w + 4:.1f}" y="{y + 10.5}">'
                       f'{text(end_text)}</text>')
        else:
            out.append(f'<text class="endlabel before" x="{x_a - 4:.1f}" y="{y + 10.5}">'
                       f'{text(end_text)}</text>')
    out.append("</g>")
    return "".join(out)
