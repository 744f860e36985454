"""The report page: one self-contained HTML file (docs/report.md).

Everything is inline: the CSS, uPlot (vendored in assets/, MIT, its licence in the page's
footer), the page's own script and the data. A Content-Security-Policy admits no network
at all and runs only the page's own scripts (by their hashes), so even a line that escaped
escaping could neither fetch anything nor run. Every node-derived text goes through
``safe.text`` (or ``safe.clean_data`` for the embedded data).
"""

from __future__ import annotations

import base64
import hashlib
from datetime import UTC, datetime
from functools import cache
from importlib import resources

from launcher.output.runreport import document, ledger, safe, timeline
from launcher.output.runreport.digest import Line
from launcher.output.runreport.safe import text
from launcher.output.runreport.summary import RunSummary, StackFile
from launcher.output.runreport.timeline import fmt_t, how
from launcher.output.runreport.usage import page_usage
from launcher.text.words import count

NODE_TAILS_OPEN = 4  # nodes whose last lines are unfolded at first


@cache
def asset(name: str) -> str:
    return resources.files("launcher.output.runreport").joinpath("assets", name).read_text(
        encoding="utf-8")


def _sha(body: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(body.encode()).digest()).decode() + "'"


def _when(t: float | None) -> str:
    if not t:
        return "-"
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _dur(d: float | None) -> str:
    return fmt_t(d) if d is not None else "-"


def _status(s: RunSummary) -> tuple[str, str]:
    h = s.header
    if h.state != "finished":
        return "run", h.state
    if h.exit_code == 0:
        return "ok", "exit 0"
    return "bad", f"exit {h.exit_code}" if h.exit_code is not None else "no exit code"


def header_html(s: RunSummary, label: str = "") -> str:
    h = s.header
    cls, pill = _status(s)
    facts = [
        ("command", f'<code class="cmd">{text(h.command) or "-"}</code>'),
        ("hosts", f"{text(h.hosts) or '-'} <span class=dim>({count(h.nodes, 'node')})</span>"),
        ("world size", str(h.world_size) if h.world_size is not None else "-"),
        ("duration", _dur(h.duration)),
        ("attempts", str(h.attempts) + "".join(
            f'<br><span class="dim">attempt {a.n}: {text(a.outcome)}</span>'
            for a in s.attempts[:-1] if a.outcome)),
        ("exit code", str(h.exit_code) if h.exit_code is not None else "-"),
        ("started", _when(h.started)),
        ("output", f"{s.lines:,} lines" + (f", {s.samples:,} samples" if s.samples else "")),
    ]
    if s.fabric:  # NCCL's own account of the fabric (docs/fabric.md)
        facts.append(("fabric", f'<span id="fabric">{text(s.fabric[0])}</span>' + "".join(
            f'<br><span class="warn">{text(w)}</span>' for w in s.fabric[1:])))
    rows = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts)
    tag = f'<span class="runtag">{text(label)}</span>' if label else ""
    return (f'<header class="run {cls}"><div class="title">{tag}<h1>{text(h.run_id)}</h1>'
            f'<span class="pill {cls}">{text(pill)}</span></div>'
            f'<p class="cause" id="root-cause">{text(h.root_cause) or "&nbsp;"}</p>'
            + (f'<p class="advice">next: {text(h.advice)}</p>' if h.advice else "")
            + f'<dl class="facts">{rows}</dl></header>')


def _log(lines: tuple[Line, ...] | list[Line], t0: float, *, who: bool = True) -> str:
    items = []
    for ln in lines:
        tag = f"r{ln.rank}" if ln.rank is not None else (ln.host or "dtrain")
        if ln.stream == "dtrain":
            tag = "dtrain"
        attempt = f" a{ln.attempt}" if ln.attempt > 1 else ""
        items.append(f'<li class="s-{safe.ident(ln.stream)}" title="{_when(ln.t)}{attempt}">'
                     f'<span class="ts">+{fmt_t(max(0.0, ln.t - t0))}</span>'
                     + (f'<span class="who">{text(tag)}</span>' if who else "")
                     + f'<span class="tx">{text(ln.text)}</span></li>')
    return f'<ol class="log">{"".join(items)}</ol>' if items else \
        '<p class="empty">no lines</p>'


def logs_html(s: RunSummary) -> str:
    t0 = s.header.started or 0.0
    parts = ['<div class="search"><input id="q" type="search" placeholder="search the lines'
             ' below (text or /regex/)" aria-label="search the log lines">'
             '<span id="qcount" class="dim"></span></div>']
    rank, host = s.failing
    if s.failing_tail:
        who = f"rank {rank}" if rank is not None else "the failing node"
        parts.append(f'<section class="block failing" id="failing"><h3>stderr of {text(who)}'
                     f'{" on " + text(host) if host else ""} (the root cause), last '
                     f'{len(s.failing_tail)} lines</h3>{_log(s.failing_tail, t0, who=False)}'
                     f"</section>")
    for i, n in enumerate(s.nodes):
        lines = s.node_tails.get(n.host, ())
        opened = " open" if i < NODE_TAILS_OPEN or n.host == host else ""
        folded = s.chatter.get(n.host, 0)
        fold = (f", torchrun's shutdown ({count(folded, 'line')}) folded: see "
                f"output.jsonl or dtrain logs" if folded else "")
        parts.append(f'<details class="block node"{opened} id="node-{safe.ident(n.host)}">'
                     f'<summary>{text(n.host)} <span class="dim">last {len(lines)} lines'
                     f'{fold}</span></summary>{_log(lines, t0)}</details>')
    if s.notes:
        parts.append(f'<details class="block notes"><summary>dtrain\'s own messages '
                     f'<span class="dim">{len(s.notes)}</span></summary>'
                     f'{_log(s.notes, t0)}</details>')
    return "".join(parts)


def stacks_html(s: RunSummary) -> str:
    if not s.hangs and not s.stacks:
        return ""
    parts = []
    for i, h in enumerate(s.hangs):
        who = (f"rank {h.culprit_rank}" if h.culprit_rank is not None else "unknown") + \
            (f" on {h.culprit_host}" if h.culprit_host else "")
        at = f" at +{fmt_t(h.t)}" if h.t is not None else ""
        anchor = h.anchor or f"hang-{i}"
        folded = "".join(f"<li>{text(f)}</li>" for f in h.folded)
        files = s.stacks.get(h.dump or "", ())
        place = f": {h.place}" if h.place else ""
        why = f'<p class="dim">{text(h.why)}</p>' if h.why else ""
        parts.append(f'<section class="block hang" id="{safe.ident(anchor)}"><h3>hang{at} '
                     f'(attempt {h.attempt}): likely culprit {text(who)}{text(place)}</h3>'
                     + why
                     + (f'<ul class="folded">{folded}</ul>' if folded else "")
                     + _stack_files(files, h.culprit_rank) + "</section>")
    hung = {h.dump for h in s.hangs}
    for dump, files in s.stacks.items():
        if dump not in hung:
            parts.append(f'<section class="block hang" id="dump-{safe.ident(dump)}"><h3>'
                         f'stack dump {text(dump)}</h3>{_stack_files(files, None)}</section>')
    return "".join(parts)


def _stack_files(files: tuple[StackFile, ...], culprit: int | None) -> str:
    out = []
    for f in files:
        mark = " culprit" if culprit is not None and f.rank == culprit else ""
        opened = " open" if mark else ""
        out.append(f'<details class="stack{mark}" id="{safe.ident(f.anchor)}"{opened}>'
                   f'<summary>{text(f.name)}{" (likely culprit)" if mark else ""}</summary>'
                   f'<pre>{text(f.text)}</pre></details>')
    return "".join(out)


def legend_html(runs: list[RunSummary]) -> str:
    """The keys for what the timelines show (roles present, earlier attempts, markers)."""
    present = {r.role for s in runs for n in s.nodes for r in n.ranks}
    items = [("ok", "ok", "finished"), ("root-cause", "root cause", "root cause"),
             ("failed", "failed", "failed"), ("stopped", "stopped", "stopped by dtrain"),
             ("unknown", "unknown", "no exit report"), ("running", "running", "running"),
             ("fenced", "fenced", "fenced node (its last attempt)")]
    keys = [f'<span class="key r-{k}"><i></i>{v}</span>' for k, role, v in items
            if role in present]
    if any(len(s.attempts) > 1 for s in runs):
        keys.append('<span class="key r-prev"><i></i>earlier attempt</span>')
    if any(s.events for s in runs):
        keys.append('<span class="key ev"><i></i>root cause / hang / straggler / fence '
                    '(click: its text)</span>')
    keys.append('<span class="key r-node"><i></i>node program (torchrun)</span>')
    return f'<div class="legend">{"".join(keys)}</div>'


def timeline_html(s: RunSummary) -> str:
    mode = "one lane per node (many ranks)" if s.per_node_lanes else "one lane per rank"
    return (f'<section id="timeline"><h2>Timeline <span class="dim">{mode}, time since '
            f'start</span></h2>{legend_html([s])}<div class="tl">{timeline.svg(s)}</div>'
            f'{_lane_table(s)}</section>')


def _lane_table(s: RunSummary) -> str:
    """The same lanes as a table (searchable by the browser's find; read by screen readers)."""
    rows = []
    for n in s.nodes:
        for r in n.ranks:
            dur = fmt_t(r.end - r.start) if r.start is not None and r.end is not None else "-"
            rows.append(f"<tr><td>{text(n.host)}</td><td>{r.rank}</td><td>{text(how(r))}</td>"
                        f"<td>{text(r.role)}</td><td>{dur}</td><td>{r.lines}</td></tr>")
    return ('<details class="lanes"><summary>every rank as a table</summary><table>'
            '<thead><tr><th>host</th><th>rank</th><th>ended</th><th>role</th><th>ran</th>'
            f'<th>lines</th></tr></thead><tbody>{"".join(rows)}</tbody></table></details>')


def _charts_section(s: RunSummary) -> str:
    if s.curves:
        note = ""
        if s.curves_left_out:
            note = (f'<p class="dim">also matched, not drawn: '
                    f'{text(", ".join(s.curves_left_out))}</p>')
        body = ('<div class="controls" id="curve-controls">x: <button data-x="step" '
                'class="on">step</button><button data-x="time">time</button> &nbsp; y: '
                '<button data-y="mean" class="on">mean of ranks</button><button data-y="rank">'
                'per rank</button></div><div class="charts" id="curves"></div>' + note)
    else:
        body = ('<p class="empty">no metrics found in the ranks\' stdout (the default pattern '
                'reads <code>name=value</code> and <code>name: value</code>; see '
                '<code>dtrain report --metric</code>)</p>')
    usage = '<div class="charts" id="usage"></div>' if s.usage else (
        f'<p class="empty">{text(s.usage_note or "no utilisation samples")}</p>')
    strag = ""
    if s.stragglers:
        strag = (f'<p class="straggler">straggler: {text(", ".join(s.stragglers))} '
                 f'(drawn in red)</p>')
    return (f'<section id="curves-sec"><h2>Training curves</h2>{body}</section>'
            f'<section id="usage-sec"><h2>Utilisation per node</h2>{strag}'
            f'{usage}</section>')


def page_data(runs: list[RunSummary], labels: list[str]) -> dict[str, object]:
    data = document.document(runs)
    # past 64 ranks the per-rank view draws the ranks' spread and outliers (curves.py):
    # the thinned series of every rank stay in --json, not in the page
    slim = [{"label": label, "run_id": r["run_id"],
             "curves": [{**c, "ranks": []} if c.get("spread") else c for c in r["curves"]],
             "usage": page_usage(r["usage"], r["stragglers"]), "stragglers": r["stragglers"],
             "duration": r["duration"]}
            for label, r in zip(labels, data["runs"], strict=True)]
    return {"schema": data["schema"], "runs": safe.clean_data(slim)}


def render(runs: list[RunSummary], *, generated: float | None = None) -> str:
    """The whole page for one run, or two side by side (``--compare``)."""
    from launcher import __version__

    labels = ["A", "B"] if len(runs) == 2 else [""]
    data_json = safe.json_script(page_data(runs, labels))
    css = asset("uPlot.min.css") + "\n" + asset("report.css")
    scripts = [asset("uPlot.iife.min.js"), asset("report.js")]
    csp = (f"default-src 'none'; img-src data:; style-src {_sha(css)}; "
           f"script-src {' '.join(_sha(js) for js in scripts)}; base-uri 'none'; "
           "form-action 'none'")
    title = " vs ".join(r.header.run_id for r in runs)
    if len(runs) == 2:
        body = _compare_body(runs)
    else:
        s = runs[0]
        body = (header_html(s) + '<nav><a href="#timeline">timeline</a><a href="#goodput">'
                'goodput</a><a href="#curves-sec">curves</a><a href="#usage-sec">utilisation'
                '</a><a href="#logs">logs</a>'
                + ('<a href="#stacks">stacks</a>' if s.hangs or s.stacks else "") + "</nav>"
                + timeline_html(s) + ledger.section(s) + _charts_section(s)
                + f'<section id="logs"><h2>Logs</h2>{logs_html(s)}</section>'
                + (f'<section id="stacks"><h2>Hangs and stacks</h2>{stacks_html(s)}'
                   f'</section>' if s.hangs or s.stacks else ""))
    made = _when(generated) if generated else ""
    footer = (f'<footer>dtrain {text(__version__)} report{", " + made if made else ""}. '
              'One self-contained file: nothing is fetched. <details><summary>third-party '
              'licences</summary><p>Charts: uPlot 1.6.32</p>'
              f'<pre>{text(asset("uPlot.LICENSE"))}</pre></details></footer>')
    return ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<title>dtrain report {text(title)}</title><style>{css}</style></head>'
            f'<body><main>{body}</main>{footer}'
            f'<script type="application/json" id="report-data">{data_json}</script>'
            + "".join(f"<script>{js}</script>" for js in scripts) + "</body></html>\n")


def _compare_body(runs: list[RunSummary]) -> str:
    a, b = runs
    da, db = a.header.duration, b.header.duration
    rows = []
    for name, fa, fb in (
            ("duration", _dur(da), _dur(db)),
            ("exit code", a.header.exit_code, b.header.exit_code),
            ("attempts", a.header.attempts, b.header.attempts),
            ("world size", a.header.world_size, b.header.world_size),
            ("hosts", a.header.hosts, b.header.hosts),
            ("root cause", a.header.root_cause, b.header.root_cause)):
        rows.append(f"<tr><th>{name}</th><td>{text(fa)}</td><td>{text(fb)}</td></tr>")
    ratio = f"B took {db / da:.2f}× as long as A" if da and db is not None else ""
    table = ('<section id="compare"><h2>Side by side</h2><table class="cmp"><thead><tr><th>'
             f'</th><th>A: {text(a.header.run_id)}</th><th>B: {text(b.header.run_id)}</th>'
             f'</tr></thead><tbody>{"".join(rows)}</tbody></table>'
             f'<p class="dim">{ratio}</p></section>')
    curves = ('<section id="curves-sec"><h2>Training curves, A and B</h2><div class="controls"'
              ' id="curve-controls">x: <button data-x="step" class="on">step</button><button '
              'data-x="time">time</button></div><div class="charts" id="curves"></div>'
              "</section>")
    tls = "".join(f'<section class="tlc"><h2>Timeline {lab}: {text(r.header.run_id)}</h2>'
                  f'<div class="tl">{timeline.svg(r)}</div></section>'
                  for lab, r in zip("AB", runs, strict=True))
    return ('<div class="pair">' + header_html(a, "A") + header_html(b, "B") + "</div>"
            + table + ledger.compare(runs) + curves + legend_html(runs) + tls)
