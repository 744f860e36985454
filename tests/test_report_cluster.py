"""`dtrain report` on real archives: a clean and a failed run, a hang, and a sampled run of
the straggler workload restarted once (--restarts 1), on the real-sshd cluster.

Each page is parsed strictly (html5lib), its charts' data are recomputed from the archive's
own output.jsonl, samples.jsonl and meta.json, it has no external URL, and it is drawn in
headless Chromium without a console error.
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
    # its `step N` lines are a metric now (issue 40): one chart, drawn
    look_at(tmp_path / "h.html", search="load_batch")


# -- a real sampled run: the straggler workload, restarted once (#29's samples, #28's attempts)

WINDOW, HOLD, INTERVAL = 6.0, 6.0, 1.0


def _util_expected(rec: dict[str, Any]) -> dict[str, float]:
    """What one samples.jsonl record should draw, from the sampler's own fields
    (docs/output-and-archive.md), computed here and not by the report's reader."""
    out = {"cpu": rec["cpu_pct"], "mem": 100.0 * rec["mem_used"] / rec["mem_total"],
           "nic": rec["net"]["rx_bps"] + rec["net"]["tx_bps"]}
    if rec["gpus"]:
        out["gpu_util"] = sum(g["util_pct"] for g in rec["gpus"]) / len(rec["gpus"])
        out["gpu_mem"] = 100.0 * sum(g["mem_used_mib"] for g in rec["gpus"]) / sum(
            g["mem_total_mib"] for g in rec["gpus"])
    return out


def sampled_straggler_run(cluster: Any, runs: Path, run_id: str,
                          timeout: float = 420) -> tuple[Path, str]:
    """node[1-4] x 1 rank, samples every 1 s, node3 computing 10x longer per step, rank 1
    crashing at step 20 of attempt 1 (--restarts 1); stopped once attempt 2's straggler line
    is printed (on a loaded machine attempt 1 lives long enough to be flagged too). Returns
    the run directory and the console."""
    import time

    from tests.util import StragglerRun

    deadline = time.monotonic() + timeout
    with StragglerRun(cluster, runs, "--run-id", run_id, "--no-color", "--restarts", "1",
                      "--restart-backoff", "0.2", "-e", "WL_CRASH_RANK=1", "-e",
                      "WL_CRASH_STEP=20", window=WINDOW, hold=HOLD, interval=INTERVAL,
                      prefix="report") as run:
        # the crash, and the decision
        run.wait_line("; attempt 2 on the same nodes", deadline - time.monotonic())
        # attempt 2's flag (attempt 1 may have had one too)
        run.wait_line("straggler:", deadline - time.monotonic())
        time.sleep(2 * INTERVAL)  # a few samples more after the flag
    out = run.output()
    assert run.returncode == 0, out[-4000:]
    return runs / run_id, out


def test_the_report_of_a_real_sampled_restarted_run_draws_its_samples_and_straggler(
        cluster: Any, tmp_path: Path) -> None:
    run, console = sampled_straggler_run(cluster, tmp_path / "runs", "sampled")
    assert "straggler: node3 (rank 2) is rarely waiting" in console, console[-3000:]
    meta = json.loads((run / "meta.json").read_text())
    assert [a["cause"] for a in meta["attempts"]] == ["process", "ok"]
    assert {s["host"] for s in meta["stragglers"]} == {"node3"}
    assert [s["attempt"] for s in meta["stragglers"]][-1] == 2  # earlier flags kept too
    records = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    assert {r["host"] for r in records} == {"node1", "node2", "node3", "node4"}

    text, root = _report(run, tmp_path / "s.html")
    assert external_urls(root, text) == []
    (drawn,) = data_of(root)["runs"]
    # every utilisation chart is the samples.jsonl records, point for point (not thinned:
    # far fewer than 720 samples per node)
    expect: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for rec in sorted(records, key=lambda r: r["t"]):
        for name, v in _util_expected(rec).items():
            expect.setdefault(name, {}).setdefault(rec["host"], []).append(
                (round(rec["t"] - meta["start"], 3), round(v, 3)))
    got = {u["name"]: {h: list(zip(s["t"], s["v"], strict=True)) for h, s in u["hosts"].items()}
           for u in drawn["usage"]}
    assert set(got) == {"gpu_util", "gpu_mem", "cpu", "mem", "nic"}
    assert set(got["gpu_util"]) == {"node4"}  # the fake nvidia-smi's node; 1-3 are CPU only
    for name in got:
        assert got[name].keys() == expect[name].keys(), name
        for host, pts in got[name].items():
            assert [t for t, _ in pts] == [t for t, _ in expect[name][host]], (name, host)
            assert [v for _, v in pts] == pytest.approx([v for _, v in expect[name][host]],
                                                        abs=1e-3), (name, host)
    # the straggler: in the page's data (drawn in red), badged on node3's lanes, its marker
    assert drawn["stragglers"] == ["node3"]
    svg = "{http://www.w3.org/2000/svg}"
    badged = {lane.get("data-host") for lane in root.iter(f"{svg}g")
              if lane.get("class") == "node"
              for g in lane.iter(f"{svg}g") if g.get("class") == "badge b-straggler"}
    marks = [g for g in root.iter(f"{svg}g") if g.get("data-kind") == "straggler"]
    body = "".join(root.find("body").itertext())
    assert "straggler: node3 (drawn in red)" in body and badged == {"node3"}
    assert len(marks) == len(meta["stragglers"])
    assert all("node3" in "".join(m.itertext()) for m in marks)
    # both attempts: bands behind the lanes, in the header, and in --json
    bands = [g.get("data-attempt") for g in root.iter(f"{svg}g")
             if g.get("class", "").startswith("attempt ")]
    assert bands == ["1", "2"]
    res = dtrain(["report", str(run), "--json"])
    assert res.returncode == 0, res.stderr
    (doc,) = json.loads(res.stdout)["runs"]
    assert doc["attempts"] == 2
    # attempt 1: rank 1's RuntimeError, named, whatever its peers' aborts; its code is 1, or
    # 134 when gloo aborted its interpreter's end (a loaded machine: docs/failure-semantics.md)
    assert [(a["n"], a["cause"]) for a in doc["attempt_list"]] == [(1, "process"), (2, "ok")]
    assert doc["attempt_list"][0]["exit_code"] in (1, 134) and \
        doc["attempt_list"][1]["exit_code"] == 0
    assert "rank 1 on node2" in meta["attempts"][0]["why"], meta["attempts"][0]
    assert {n["host"]: bool(n["straggler"]) for n in doc["node_lanes"]} == \
        {"node1": False, "node2": False, "node3": True, "node4": False}
    # one timeline event per flag, at the time its evidence began, with its own line and rank
    events = [(e["t"], e["label"], e["rank"]) for e in doc["events"] if e["kind"] == "straggler"]
    assert events == [(pytest.approx(f["since"] - meta["start"], abs=1e-3),
                       f"node3: {f['summary']}", 2) for f in meta["stragglers"]]
    ranks = {(r["rank"], r["attempt"]) for c in drawn["curves"] if c["name"] == "loss"
             for r in c["ranks"]}
    assert ranks == {(0, 1), (0, 2)}  # rank 0's loss, one series per attempt
    look_at(tmp_path / "s.html", search="done after")
