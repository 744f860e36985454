"""The report of a run on many nodes (issue 56: 512 nodes, 4,096 ranks): the page draws the
nodes' spread instead of one line per node, scrolls only the logs on screen, and draws in
headless Chromium without errors. bench/bench_report.py times it (never asserted here)."""

from __future__ import annotations

import json
import random
from pathlib import Path

from launcher.commands.report.load import load
from launcher.output.runreport import document, page
from launcher.output.runreport.curves import patterns
from launcher.output.runreport.usage import NODE_SERIES_MAX, OUTLIERS, page_usage
from tests.report_archives import synthetic
from tests.reports import validate_json
from tests.test_report import look_at


def chart(hosts: int, *, low: str | None = None) -> dict[str, object]:
    """A utilisation chart of ``hosts`` nodes sampled at their own instants, every 10 s;
    ``low`` idles at 5 % while the others work at 70-75 %."""
    rnd = random.Random(hosts)
    series = {}
    for i in range(hosts):
        host = f"n{i:03d}"
        phase = rnd.random() * 10
        t = [round(k * 10 + phase, 3) for k in range(60)]
        v = [5.0 if host == low else 70.0 + rnd.random() * 5 for _ in t]
        series[host] = {"t": t, "v": v}
    return {"name": "gpu_util", "title": "GPU utilisation", "unit": "%", "hosts": series}


def test_up_to_the_limit_every_node_is_drawn() -> None:
    c = chart(NODE_SERIES_MAX)
    assert page_usage([c], []) == [c]


def test_many_nodes_are_drawn_as_their_spread_the_stragglers_and_the_outliers() -> None:
    c = chart(512, low="n317")
    [drawn] = page_usage([c], ["n042"])
    names = list(drawn["hosts"])
    assert names[:3] == ["min of 512 nodes", "median of 512 nodes", "max of 512 nodes"]
    assert "n042" in names and "n317" in names  # the straggler, and the idle node
    assert len(names) == 3 + 1 + OUTLIERS
    assert "512 nodes: their minimum, median and maximum" in drawn["summary"]
    lo, mid, hi = (drawn["hosts"][n] for n in names[:3])
    assert lo["t"] == mid["t"] == hi["t"] and len(lo["t"]) <= 360
    assert all(a <= b <= c for a, b, c in zip(lo["v"], mid["v"], hi["v"], strict=True))
    assert min(lo["v"]) == 5.0 and 70.0 <= min(mid["v"]) and max(hi["v"]) <= 75.0
    # the page's data for 512 nodes is a few series, not 512 of every instant
    assert len(json.dumps(drawn)) < len(json.dumps(c)) / 20


def test_a_page_of_many_nodes_draws_their_spread_in_chromium(tmp_path: Path) -> None:
    run = synthetic(tmp_path / "run", nodes=40, per_node=1, seconds=120, every=5,
                    sample_every=5, phased=True)
    s = load(run, patterns(None)).summary
    out = tmp_path / "r.html"
    out.write_text(page.render([s]))
    html = out.read_text()
    res = look_at(out, search="step=3 ", evaluate={
        "usage": "document.getElementById('usage').textContent",
        "at_end": "Array.from(document.querySelectorAll('details[open] ol.log')).map("
                  "function (ol) { return ol.scrollHeight - ol.clientHeight - ol.scrollTop; })"})
    # as a person sees it: each chart says what it draws; an open node's log is at its end
    assert res.values["usage"].count("40 nodes: their minimum, median and maximum") == \
        len(s.usage), res.values["usage"]
    assert res.values["at_end"] and all(gap <= 1 for gap in res.values["at_end"])
    data = json.loads(html.split('id="report-data"')[1].split(">", 1)[1].split("</script>")[0])
    usage = data["runs"][0]["usage"]
    assert usage and all(u.get("summary", "").startswith("40 nodes: ") for u in usage)
    assert all(len(u["hosts"]) <= 3 + 1 + OUTLIERS for u in usage)
    assert len(res.values["ink"]) == len(s.curves) + len(s.usage)


def test_many_ranks_are_drawn_as_their_spread_and_outliers() -> None:
    """Past RANK_SERIES_MAX ranks: per step the lowest and highest value over the ranks, and
    the ranks farthest from the others at their own resolution."""
    from launcher.output.runreport.curves import (
        RANK_OUTLIERS,
        RANK_SERIES_MAX,
        CurveBuilder,
        curves,
    )

    b = CurveBuilder(patterns(None))
    ranks = RANK_SERIES_MAX + 36
    for step in range(50):
        for r in range(ranks):
            loss = 10.0 - step * 0.1 + (5.0 if r == 77 else 0.0) + r * 1e-4
            b.add(1000.0 + step + r * 1e-3, r, 1, f"step={step} loss={loss:.4f}")
    [curve], _ = curves(b, 1000.0)
    lo, hi = curve.spread[1]["min"], curve.spread[1]["max"]
    assert lo.step == hi.step == list(range(50))
    assert lo.v[0] == 10.0 and hi.v[0] == 15.0 + 77e-4  # rank 0's, rank 77's
    assert len(curve.outliers) == RANK_OUTLIERS and (77, 1) in curve.outliers
    assert len(curve.outliers[(77, 1)].v) == 50  # not thinned to the shared budget
    few = CurveBuilder(patterns(None))
    for step in range(5):
        few.add(1000.0 + step, 0, 1, f"step={step} loss=1")
    [small], _ = curves(few, 1000.0)
    assert small.spread == {} and small.outliers == {}


def test_a_page_of_many_ranks_draws_their_spread_in_chromium(tmp_path: Path) -> None:
    """The per-rank view of 100 ranks, as a person clicks it: a few lines, each with ink."""
    run = synthetic(tmp_path / "run", nodes=25, per_node=4, seconds=60, every=5)
    s = load(run, patterns(None)).summary
    doc = page.page_data([s], [""])
    curve = doc["runs"][0]["curves"][0]  # type: ignore[index]
    assert curve["ranks"] == [] and curve["spread"] and curve["outliers"]
    full = document.document([s])  # --json: every rank, and the spread, in the schema
    validate_json(full, "report")
    assert len(full["runs"][0]["curves"][0]["ranks"]) == 100
    out = tmp_path / "r.html"
    out.write_text(page.render([s]))
    click = ("new Promise(function (done) { document.querySelector('button[data-y=rank]')"
             ".click(); setTimeout(function () { done(Array.from(document.querySelectorAll("
             "'#curves .chart h3')).map(function (h) { return h.textContent; })); }, 300); })")
    res = look_at(out, search="step=3 ", evaluate={"rank_view": click})
    assert res.values["rank_view"] and all(
        "many ranks: the lowest and highest per step" in h for h in res.values["rank_view"])
