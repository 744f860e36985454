"""`dtrain report` on real archives: a clean and a failed run on the real-sshd cluster.

Each page is parsed strictly (html5lib), its charts' data are recomputed from the archive's
own output.jsonl and meta.json, it has no external URL, and it is drawn in headless Chromium
without a console error. (A restarted run's archive is hand-made in test_report.py until
`run --restarts` writes attempts; see docs/report.md.)
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.test_report import data_of, external_urls, look_at, parse_html
from tests.util import dtrain

pytestmark = [pytest.mark.ssh, pytest.mark.torch]
STEPS = 30
LINE = re.compile(r"step=(\d+) loss=([\d.]+) lr=3e-4")


def _run(cluster: Any, runs: Path, run_id: str, *env: str) -> Path:
    res = dtrain(["run", "-H", "node[1-3]", "--python", cluster.python, "--nproc-per-node",
                  "2", "--archive-dir", str(runs), "--run-id", run_id, "--no-color",
                  "-e", f"WL_STEPS={STEPS}", "-e", "WL_STEP_SLEEP=0.02", *env,
                  "tests/workloads/curves.py"], env=cluster.client_env(), timeout=170)
    assert res.returncode in (0, 3), res.stdout[-2000:] + res.stderr[-2000:]
    return runs / run_id


@pytest.fixture(scope="module")
def runs(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("report-runs")
    return {"ok": _run(cluster, base, "clean"),
            "failed": _run(cluster, base, "failed", "-e", "WL_FAIL_RANK=4",
                           "-e", "WL_FAIL_STEP=12")}


def _report(run: Path, out: Path, *extra: str) -> tuple[str, Any]:
    res = dtrain(["report", str(run), "-o", str(out), *extra])
    assert res.returncode == 0, res.stderr
    text = out.read_text()
    return text, parse_html(text)


def _archive_points(run: Path) -> dict[tuple[int, int], list[tuple[float, int, float]]]:
    meta = json.loads((run / "meta.json").read_text())
    points: dict[tuple[int, int], list[tuple[float, int, float]]] = {}
    for raw in (run / "output.jsonl").read_text().splitlines():
        rec = json.loads(raw)
        m = LINE.fullmatch(rec["line"])
        if m and rec["stream"] == "out":
            points.setdefault((rec["rank"], 1), []).append(
                (round(rec["t"] - meta["start"], 3), int(m[1]), float(m[2])))
    return points


@pytest.mark.parametrize("which", ["ok", "failed"])
def test_the_report_of_a_real_run_shows_what_the_archive_says(runs: dict[str, Path],
                                                              tmp_path: Path, which: str) -> None:
    run = runs[which]
    meta = json.loads((run / "meta.json").read_text())
    text, root = _report(run, tmp_path / "r.html")
    assert external_urls(root, text) == []
    (drawn,) = data_of(root)["runs"]
    curves = {c["name"]: c for c in drawn["curves"]}
    assert {"loss", "lr", "acc"} <= set(curves), sorted(curves)
    loss = curves["loss"]
    got = {(r["rank"], r["attempt"]): list(zip(r["t"], r["step"], r["v"], strict=True))
           for r in loss["ranks"]}
    assert got == _archive_points(run)
    assert len(got) == 6 and not loss["thinned"]
    # the mean at each step is the mean of the ranks that printed it
    for i, step in enumerate(loss["mean"]["1"]["step"]):
        vals = [v for pts in got.values() for _, s, v in pts if s == step]
        assert loss["mean"]["1"]["v"][i] == pytest.approx(sum(vals) / len(vals))
    lanes = [el for el in root.iter("{http://www.w3.org/2000/svg}g")
             if el.get("class", "").startswith("lane ")]
    assert sorted(int(el.get("data-rank")) for el in lanes) == list(range(6))
    for el in lanes:
        info = next(n["ranks"][el.get("data-rank")] for n in meta["nodes"]
                    if n["host"] == el.get("data-host"))
        assert el.get("data-role") == info["role"]
        assert float(el.get("data-end")) == pytest.approx(info["end"] - meta["start"], abs=2e-3)
        assert float(el.get("data-start")) == pytest.approx(info["start"] - meta["start"],
                                                            abs=2e-3)
    cause = root.find(".//*[@id='root-cause']")
    body = "".join(root.find("body").itertext())
    assert not [e for e in root.iter() for a in e.attrib if a.startswith("on")]
    if which == "failed":
        assert meta["exit_code"] == 3
        # the verdict's summary, with #27's explanation of why when the archive has one
        why = meta["root_cause"].get("failure", {}).get("summary", "")
        assert "".join(cause.itertext()) == (why or "rank 4 on node3 exited 3")
        assert "".join(cause.itertext()).startswith("rank 4 on node3 exited 3")
        failing = root.find(".//*[@id='failing']")
        assert "failing on purpose at step 12" in "".join(failing.itertext())
        assert "<script>alert('x')</script>" in body  # the hostile stderr line, as text
        assert {el.get("data-role") for el in lanes} == {"root cause", "stopped"}
    else:
        assert meta["exit_code"] == 0 and {el.get("data-role") for el in lanes} == {"ok"}
    look_at(tmp_path / "r.html", search="failing on purpose" if which == "failed" else "loss")


def test_compare_puts_two_real_runs_side_by_side(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "c.html"
    res = dtrain(["report", "--compare", str(runs["ok"]), str(runs["failed"]), "-o", str(out)])
    assert res.returncode == 0, res.stderr
    root = parse_html(out.read_text())
    a, b = data_of(root)["runs"]
    assert (a["run_id"], b["run_id"]) == ("clean", "failed")
    assert {c["name"] for c in a["curves"]} >= {"loss"} <= {c["name"] for c in b["curves"]}
    table = "".join(root.find(".//*[@id='compare']").itertext())
    assert "clean" in table and "failed" in table and "duration" in table
    look_at(out, search="loss")
    res = dtrain(["report", "--compare", str(runs["ok"]), str(runs["failed"]), "--json"])
    doc = json.loads(res.stdout)
    ma, mb = (json.loads((runs[k] / "meta.json").read_text()) for k in ("ok", "failed"))
    expect = round((mb["end"] - mb["start"]) - (ma["end"] - ma["start"]), 3)
    assert doc["compare"]["duration_delta"] == pytest.approx(expect, abs=2e-3)


def test_a_real_hang_links_its_marker_to_every_ranks_stack(cluster: Any,
                                                          tmp_path: Path) -> None:
    """hangs (#27) writes stacks/h1/r<rank>.txt and meta.json hangs[]: the page links the
    timeline's marker to the dump, opens the culprit's stack and folds the rest."""
    res = dtrain(["run", "-H", "node[1-3]", "--python", cluster.python, "--nproc-per-node",
                  "2", "--archive-dir", str(tmp_path), "--run-id", "hang", "--no-color",
                  "--hang-timeout", "5", "--on-hang", "stop", "--grace", "3",
                  "--sample-interval", "0",  # no samples: the page has no charts to draw
                  "-e", "WL_HANG_RANK=4", "-e", "WL_HANG_STEP=3", "tests/workloads/hang.py"],
                 env=cluster.client_env(), timeout=170)
    assert res.returncode == 125, res.stdout[-3000:] + res.stderr[-2000:]
    run = tmp_path / "hang"
    meta = json.loads((run / "meta.json").read_text())
    (hang,) = meta["hangs"]
    text, root = _report(run, tmp_path / "h.html")
    assert external_urls(root, text) == []
    marks = [a for a in root.iter("{http://www.w3.org/2000/svg}a")
             if any(g.get("data-kind") == "hang" for g in a)]
    assert [a.get("href") for a in marks] == [f"#dump-{hang['dump']}"]
    section = root.find(f".//*[@id='dump-{hang['dump']}']")
    shown = ["".join(li.itertext()) for li in section.iter("li")]
    assert [s.split(": ", 1)[1] for s in shown] == [f["place"] for f in hang["folded"]]
    stacks = {d.get("id"): d for d in section.iter("details")}
    culprit = stacks[f"stack-{hang['dump']}-r4_txt"]
    assert culprit.get("open") is not None and "culprit" in culprit.get("class")
    assert "load_batch" in "".join(culprit.itertext())
    assert (run / "stacks" / hang["dump"] / "r4.txt").read_text().strip() in \
        "".join(culprit.find("pre").itertext())
    assert len([k for k in stacks if k.endswith("_txt") and "-r" in k]) >= 6
    cause = "".join(root.find(".//*[@id='root-cause']").itertext())
    assert cause == meta["root_cause"]["summary"]
    look_at(tmp_path / "h.html", search="load_batch", charts=False)  # no metrics, samples off
