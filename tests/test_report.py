"""`dtrain report` on hand-made archives: the pure summary, the page, the document, the CLI.

The real-cluster archives are in test_report_cluster.py; these cover what the cluster cannot
produce yet (attempts, hangs, samples, stragglers: the archive contract of the restart, hang
and top features) and the corner cases (hostile text, many ranks, guarded reads).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import pytest

from launcher.commands.report.load import load
from launcher.errors import UsageError
from launcher.output.runreport import curves, document, page
from launcher.output.runreport.curves import CurveBuilder, Series, patterns, thin
from launcher.output.runreport.digest import Digest
from launcher.output.runreport.summary import summarize
from launcher.output.runreport.usage import UsageBuilder, sample_values
from tests.report_archives import T0, finished_nodes, layout, line, write_archive
from tests.reports import validate_json
from tests.util import REPO, dtrain, need_module

# the CLI run from another directory must still be this worktree's dtrain
ENV = {**os.environ, "PYTHONPATH": str(REPO)}

HOSTILE = ("<script>alert(1)</script></script><img src=x onerror=alert(2)> \x1b[31mred"
           "\x1b[0m \x1b]52;c;ZXZpbA==\x07 \x00 \ufffe \"><svg onload=alert(3)> "
           "url(http://198.51.100.7/x.css) <!-- --> ]]>")


def metrics_of(text: str, user: list[str] | None = None) -> dict[str, list[tuple[int | None,
                                                                              float]]]:
    b = CurveBuilder(patterns(user))
    b.add(0.0, 0, 1, text)
    return {name: list(zip(s[(0, 1)].step, s[(0, 1)].v, strict=True))
            for name, s in b.series.items()}


@pytest.mark.parametrize(("text", "expected"), [
    ("step=120 loss=0.4312 lr=3e-4", {"loss": [(120, 0.4312)], "lr": [(120, 3e-4)]}),
    ("Epoch 1 | step: 7 | loss: 1.25e+00 | grad_norm=0.5",
     {"loss": [(7, 1.25)], "grad_norm": [(7, 0.5)]}),
    ("step 5 train/loss=2.5 val.acc: 93.2%", {"train/loss": [(5, 2.5)], "val.acc": [(5, 93.2)]}),
    ("iter=3 rank=2 world_size=8 pid=1234 loss=1", {"loss": [(3, 1.0)]}),  # ids are not curves
    ("[W1201 19:26:05.553381554 socket.cpp:207] err=-3", {"err": [(0, -3.0)]}),
    ("12:01:37 eta: 1:23:45 time=0.5s", {}),  # clock times and units are not values
    ("rank 0/4 pid 123 ready", {}),
])
def test_the_default_pattern_reads_name_value_pairs(text: str, expected: dict[str, Any]) -> None:
    assert metrics_of(text) == expected


def test_metric_regex_replaces_the_default() -> None:
    assert metrics_of("step 4: throughput 812.5 tok/s loss=1",
                      [r"throughput (?P<value>[\d.]+) tok/s"]) == {
        "throughput": [(4, 812.5)]}  # titled by its literal word (test_report_texts.py)
    assert metrics_of("ppl 12.5", [r"(?P<name>ppl) (?P<value>\S+)"]) == {"ppl": [(0, 12.5)]}
    assert metrics_of("ppl 12.5", [r"ppl (\S+)"]) == {"ppl": [(0, 12.5)]}
    for bad in ("(unclosed", r"(a)(b)"):
        with pytest.raises(UsageError):
            patterns([bad])


def test_a_line_without_a_step_belongs_to_the_ranks_last_step() -> None:
    b = CurveBuilder(patterns(None))
    for i, text in enumerate(["acc: 0.1", "step=4 loss=2", "epoch: 0, acc: 0.5", "step=9 loss=1"]):
        b.add(float(i), 0, 1, text)
    assert b.series["acc"][(0, 1)].step == [0, 4]  # before any step: its count
    assert b.series["loss"][(0, 1)].step == [4, 9]


def test_thinning_keeps_every_extreme_within_the_budget() -> None:
    n = 10_000
    s = Series([float(i) for i in range(n)], list(range(n)), [float(i % 97) for i in range(n)])
    s.v[4321] = 1e6  # one spike
    s.v[8765] = -1e6
    out = thin(s, 500)
    assert len(out.v) <= 500
    assert 1e6 in out.v and -1e6 in out.v
    assert out.t == sorted(out.t)
    assert thin(s, n) is s


def test_the_mean_is_taken_over_ranks_at_each_step() -> None:
    d = Digest(patterns(None))
    for r in range(4):
        for step in range(3):
            d.add(line(step + 0.1 * r, "n", r, f"step={step} loss={step + r}"))
    (loss,), _ = curves.curves(d.curves, T0)
    assert loss.mean[1].step == [0, 1, 2]
    assert loss.mean[1].v == [1.5, 2.5, 3.5]
    assert loss.x_is_step and not loss.thinned
    assert loss.ranks[(3, 1)].v == [3.0, 4.0, 5.0]


FABRIC_LINE = "NCCL 2.21.5: IB/RoCE on ranks 0-1 (mlx5_0); intra-node P2P"
FABRIC_WARN = ("WARNING: ranks 2-3 (node3) use NET/Socket (TCP): NET/IB found no device "
               "<script>x</script>")


def restarted_archive(tmp: Path) -> Path:
    """2 nodes x 2 ranks, two attempts (node2 fenced after the first, spare node3 in), a hang
    with stacks, samples with a straggler, and a hostile stderr line."""
    lay = [{"host": "node1", "node_rank": 0, "ranks": [0, 1]},
           {"host": "node3", "node_rank": 1, "ranks": [2, 3]}]
    lines = [line(0.05, "", None, "run r: 2 nodes, world size 4", stream="dtrain")]
    for attempt, (t_start, hosts) in ((1, (2.0, ["node1", "node2"])),
                                      (2, (30.0, ["node1", "node3"]))):
        for step in range(10):
            for i, h in enumerate(hosts):
                for r in (2 * i, 2 * i + 1):
                    lines.append(line(t_start + step, h, r,
                                      f"step={step + (5 if attempt == 2 else 0)} "
                                      f"loss={1.0 / (1 + step) + r / 100:.4f}",
                                      attempt=None if attempt == 1 else attempt,
                                      node_rank=i))
    lines.append(line(12.5, "node2", 3, HOSTILE, stream="err"))
    lines.append(line(12.6, "node2", 3, "RuntimeError: NCCL watchdog timeout", stream="err"))
    lines.append(line(40.5, "node3", 3, "rank 3: failing at last", stream="err", attempt=2))
    meta = {
        "created_ts": T0, "start": T0, "end": T0 + 45.0, "exit_code": 3,
        "outcome": "rank 3 on node3 exited 3", "hosts": ["node1", "node3"], "world_size": 4,
        "layout": lay, "command": ["dtrain", "run", "--restarts", "2", "train.py"],
        "nodes": [{**n, "ranks": {r: {**i, "start": T0 + 29.0} for r, i in n["ranks"].items()}}
                  for n in finished_nodes(lay, 44.0, failing=3)],
        "root_cause": {"kind": "rank", "host": "node3", "rank": 3, "exit_code": 3,
                       "summary": "rank 3 on node3 exited 3", "t": T0 + 43.5,
                       "stderr_tail": ["rank 3: failing at last"]},
        "attempts": [
            {"n": 1, "start": T0 + 0.5, "end": T0 + 20.0, "exit_code": 255,
             "cause": "node2 lost (no heartbeat 10 s)", "hosts": ["node1", "node2"],
             "fenced": [{"host": "node2", "reason": "lost"}]},
            {"n": 2, "start": T0 + 28.0, "end": T0 + 45.0, "exit_code": 3,
             "cause": "rank 3 on node3 exited 3", "hosts": ["node1", "node3"], "fenced": []}],
        "hangs": [{"t": T0 + 15.0, "attempt": 1, "culprit": {"rank": 3, "host": "node2"},
                   "folded": ["ranks 0-2 (3): all_reduce ← step() train.py:88",
                              "rank 3 (node2): time.sleep ← load_batch() data.py:41"],
                   "dump": "d1"}],
        "stragglers": [{"host": "node3", "t": T0 + 35.0, "reason": "rarely waits"}],
        "fabric": {"version": "2.21.5", "line": FABRIC_LINE, "warnings": [FABRIC_WARN],
                   "differences": ["node3: NCCL_SOCKET_IFNAME eth1, the plan eth0"],
                   "refusal": None, "ranks": {}, "require": None, "transports": {}},
    }
    samples = [{"t": T0 + k, "host": h, "cpu": {"busy": 10.0 + k}, "mem": {"used": 1, "total": 4},
                "gpus": [{"util": 50.0 + j, "mem_used": 10, "mem_total": 40} for j in (0, 10)],
                "nic": {"rx": 1e6 * k, "tx": 5e5}} for k in range(0, 45, 5)
               for h in ("node1", "node3")]
    stacks = {"d1": {f"r{r}.txt": f"Thread 0x1 (most recent call first):\n  File train.py, "
                                  f"line 88 in step  # rank {r}\n" for r in range(4)}}
    stacks["d1"]["r3.txt"] = "  File data.py, line 41 in load_batch\n" + HOSTILE
    return write_archive(tmp / "r", meta, lines, samples, stacks)


def test_summary_of_a_restarted_run_with_a_hang(tmp_path: Path) -> None:
    s = load(restarted_archive(tmp_path), patterns(None)).summary
    h = s.header
    # every node that took part: node2 (fenced after attempt 1) too
    assert (h.attempts, h.exit_code, h.world_size, h.hosts, h.nodes) == (
        2, 3, 4, "node[1-3]", 3)
    assert h.root_cause.startswith("rank 3 on node3 exited 3")
    assert "hang detected, likely culprit rank 3 on node2" in h.root_cause
    assert [a.n for a in s.attempts] == [1, 2] and s.attempts[0].fenced == ("node2",)
    kinds = {e.kind: e for e in s.events}
    assert kinds["hang"].href == "#dump-d1" and kinds["hang"].t == 15.0
    assert kinds["root cause"].href == "#failing"
    assert kinds["straggler"].host == "node3"
    assert [f.name for f in s.stacks["d1"]] == ["r0.txt", "r1.txt", "r2.txt", "r3.txt"]
    assert s.hangs[0].folded[1].startswith("rank 3 (node2)")
    assert s.stragglers == ("node3",)
    roles = {(n.host, r.rank): r.role for n in s.nodes for r in n.ranks}
    assert roles == {("node1", 0): "stopped", ("node1", 1): "stopped",
                     ("node3", 2): "stopped", ("node3", 3): "root cause",
                     ("node2", 2): "fenced", ("node2", 3): "fenced"}
    node2 = s.nodes[-1]
    assert node2.host == "node2" and node2.fenced == ((1, "lost"),)
    assert (node2.ranks[0].start, node2.ranks[0].end) == (2.0, 11.0)
    # the failing rank's stderr of the attempt that failed (attempt 1's lines were node2's)
    assert [(x.rank, x.attempt, x.text) for x in s.failing_tail] == [
        (3, 2, "rank 3: failing at last")]
    usage = {u.name: u for u in s.usage}
    assert set(usage) == {"gpu_util", "gpu_mem", "cpu", "mem", "nic"}
    assert usage["gpu_util"].hosts["node1"].v[0] == 55.0
    assert usage["gpu_mem"].hosts["node1"].v[0] == 25.0
    assert usage["nic"].hosts["node3"].v[2] == 1e7 + 5e5


def test_the_report_shows_nccls_account_of_the_fabric(tmp_path: Path) -> None:
    """meta.json's fabric (docs/fabric.md): its line in the page's header, then its warnings
    and differences (escaped), and in --json; a run where NCCL said nothing shows none."""
    run = restarted_archive(tmp_path)
    s = load(run, patterns(None)).summary
    assert s.fabric == (FABRIC_LINE, FABRIC_WARN,
                        "NCCL differs from the plan: node3: NCCL_SOCKET_IFNAME eth1, the plan "
                        "eth0")
    html = page.render([s])
    root = parse_html(html)
    (dd,) = [dd for dd in root.iter("dd")
             if any(x.get("id") == "fabric" for x in dd.iter("span"))]
    shown = "".join(dd.itertext())
    assert shown.startswith(FABRIC_LINE) and FABRIC_WARN in shown
    assert "<script>x</script>" not in html and "&lt;script&gt;x" in html
    assert document.run_json(s)["fabric"] == list(s.fabric)
    empty = write_archive(tmp_path / "e", {"start": T0}, [])
    s = load(empty, patterns(None)).summary
    assert s.fabric == () and 'id="fabric"' not in page.render([s])


def test_the_curves_keep_attempts_apart(tmp_path: Path) -> None:
    s = load(restarted_archive(tmp_path), patterns(None)).summary
    (loss,) = s.curves
    assert sorted(loss.mean) == [1, 2]
    assert loss.mean[1].step == list(range(10)) and loss.mean[2].step == list(range(5, 15))
    assert loss.ranks[(3, 2)].v[0] == round(1.0 + 0.03, 4)


def parse_html(text: str) -> Any:
    """Strict HTML5 parse (a parse error raises); the element tree."""
    html5lib = need_module("html5lib")
    parser = html5lib.HTMLParser(strict=True, namespaceHTMLElements=False)
    return parser.parse(text)


URL_ATTRS = ("src", "href", "action", "formaction", "poster", "data", "srcset", "background",
             "{http://www.w3.org/1999/xlink}href", "xlink:href")


def external_urls(root: Any, text: str) -> list[str]:
    """Every URL that could be fetched: a src/href/... attribute that is not a fragment, and
    a url(...) or @import in any <style> or style attribute."""
    found = []
    for el in root.iter():
        for name, value in el.attrib.items():
            if name in URL_ATTRS and not value.startswith("#"):
                found.append(f"{el.tag} {name}={value}")
            if name == "style":
                found += re.findall(r"url\([^)]*\)|@import", value)
        if el.tag == "style":
            found += re.findall(r"url\([^)]*\)|@import", el.text or "")
    return found


def data_of(root: Any) -> dict[str, Any]:
    (el,) = [e for e in root.iter("script") if e.get("id") == "report-data"]
    data: dict[str, Any] = json.loads(el.text)
    return data


def test_the_page_is_valid_self_contained_and_escapes_node_text(tmp_path: Path) -> None:
    s = load(restarted_archive(tmp_path), patterns(None)).summary
    text = page.render([s])
    root = parse_html(text)
    assert external_urls(root, text) == []
    scripts = list(root.iter("script"))
    assert [sc.get("type") for sc in scripts] == ["application/json", None, None]
    assert not [e for e in root.iter() if e.tag in ("img", "iframe", "object", "embed", "link")]
    assert not [e for e in root.iter() for a in e.attrib if a.startswith("on")]
    assert not [e for e in root.iter() if e.tag.endswith("svg")
                and e.get("class") not in ("timeline", "goodput-bands", "gp-key")]
    body = "".join(root.find("body").itertext())
    assert "<script>alert(1)</script>" in body  # shown as text, whole
    assert "\x1b" not in text and "\x00" not in text and "^[]52;c;ZXZpbA==^G" in body
    csp = next(m.get("content") for m in root.iter("meta")
               if m.get("http-equiv") == "Content-Security-Policy")
    assert "default-src 'none'" in csp and "unsafe-inline" not in csp
    for sc in scripts[1:]:
        assert page._sha(sc.text) in csp
    (style,) = root.iter("style")
    assert page._sha(style.text) in csp
    assert root.find(".//*[@id='dump-d1']") is not None
    assert root.find(".//*[@id='stack-d1-r3_txt']") is not None
    hrefs = {a.get("href") for a in root.iter("{http://www.w3.org/2000/svg}a")} | \
        {a.get("href") for a in root.iter("a")}
    for href in hrefs:
        assert root.find(f".//*[@id='{href[1:]}']") is not None, href


def test_every_chart_is_drawn_from_the_archives_numbers(tmp_path: Path) -> None:
    run = restarted_archive(tmp_path)
    root = parse_html(page.render([load(run, patterns(None)).summary]))
    (drawn,) = data_of(root)["runs"]
    expect: dict[tuple[int, int], list[tuple[float, int, float]]] = {}
    for raw in (run / "output.jsonl").read_text().splitlines():
        rec = json.loads(raw)
        m = re.fullmatch(r"step=(\d+) loss=([\d.]+)", rec["line"])
        if m and rec["stream"] == "out":
            expect.setdefault((rec["rank"], rec.get("attempt", 1)), []).append(
                (round(rec["t"] - T0, 3), int(m[1]), float(m[2])))
    (loss,) = drawn["curves"]
    got = {(r["rank"], r["attempt"]): list(zip(r["t"], r["step"], r["v"], strict=True))
           for r in loss["ranks"]}
    assert got == expect
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    cpu = next(u for u in drawn["usage"] if u["name"] == "cpu")
    for host in ("node1", "node3"):
        mine = [(round(x["t"] - T0, 3), x["cpu"]["busy"]) for x in samples if x["host"] == host]
        assert list(zip(cpu["hosts"][host]["t"], cpu["hosts"][host]["v"], strict=True)) == mine
    lanes = {(el.get("data-host"), el.get("data-rank")): el
             for el in root.iter("{http://www.w3.org/2000/svg}g")
             if el.get("class", "").startswith("lane ")}
    meta = json.loads((run / "meta.json").read_text())
    for node in meta["nodes"]:
        for r, info in node["ranks"].items():
            el = lanes[(node["host"], r)]
            assert float(el.get("data-start")) == round(info["start"] - T0, 3)
            assert float(el.get("data-end")) == round(info["end"] - T0, 3)
            assert el.get("data-role") == info["role"]


def test_many_ranks_get_one_lane_per_node(tmp_path: Path) -> None:
    lay = layout(16, 8)
    meta = {"start": T0, "end": T0 + 10, "exit_code": 0, "world_size": 128, "layout": lay,
            "nodes": finished_nodes(lay, 9.0)}
    run = write_archive(tmp_path / "big", meta, [line(1.0, "node1", 0, "step=1 loss=1")])
    for lanes, count in (("auto", 16), ("rank", 128), ("node", 16)):
        s = load(run, patterns(None), lanes=lanes).summary
        svg = page.timeline.svg(s)
        assert svg.count('class="lane ') == count, lanes
    assert 'data-rank="-1"' in page.timeline.svg(load(run, patterns(None)).summary)


def test_the_json_document_follows_its_schema(tmp_path: Path) -> None:
    run = restarted_archive(tmp_path)
    s = load(run, patterns(None)).summary
    validate_json(document.document([s]), "report")
    validate_json(document.document([s, s]), "report")
    empty = write_archive(tmp_path / "empty", {}, [])
    validate_json(document.document([load(empty, patterns(None)).summary]), "report")


def test_reads_are_guarded(tmp_path: Path) -> None:
    run = restarted_archive(tmp_path)
    target = tmp_path / "elsewhere.json"
    target.write_text("{}")
    (run / "meta.json").unlink()
    (run / "meta.json").symlink_to(target)
    with pytest.raises(UsageError, match="not a regular file"):
        load(run, patterns(None))
    (run / "meta.json").unlink()
    (run / "meta.json").write_text('{"start": 1}')
    (run / "samples.jsonl").unlink()
    os.mkfifo(run / "samples.jsonl")  # would block a plain open() for ever
    (run / "stacks" / "d1" / "r0.txt").unlink()
    (run / "stacks" / "d1" / "r0.txt").symlink_to(target)
    out = load(run, patterns(None))
    assert [w.split(": ", 1)[0] for w in out.warnings] == [
        str(run / "samples.jsonl"), str(run / "stacks" / "d1" / "r0.txt")]
    assert [f.name for f in out.summary.stacks["d1"]] == ["r1.txt", "r2.txt", "r3.txt"]
    link = tmp_path / "link"
    link.symlink_to(run)
    with pytest.raises(UsageError, match="not a run directory of yours"):
        load(link, patterns(None))
    with open(run / "output.jsonl", "a") as fh:
        fh.write('{"torn": \n' + "x" * (5 << 20) + "\n")
    assert load(run, patterns(None)).summary.bad_records == 2


def test_sample_fields_are_read_tolerantly() -> None:
    assert sample_values({"cpu": 12.5, "mem": 40, "nic": [{"rx": 1, "tx": 2}, {"rx_bps": 3}],
                          "gpus": [{"utilization": 80, "memory_used": 1, "memory_total": 4},
                                   "junk", {"util": None}]}) == {
        "cpu": 12.5, "mem": 40.0, "nic": 6.0, "gpu_util": 80.0, "gpu_mem": 25.0}
    assert sample_values({"cpu": "busy", "gpus": "none", "nic": None}) == {}
    b = UsageBuilder()
    for rec in ({"t": "x", "host": "a"}, {"t": 1, "host": 3}, {"t": 1, "host": "a", "cpu": 5}):
        b.add(rec)
    assert b.records == 1


def test_an_empty_or_odd_archive_still_gives_a_page(tmp_path: Path) -> None:
    run = write_archive(tmp_path / "odd", {"hosts": "nope", "nodes": [1, None],
                                           "attempts": {"n": 1}, "hangs": "x",
                                           "root_cause": [], "layout": [{"host": 5}]},
                        [{"t": "x"}, [1, 2], line(1, "h", 0, "step=1 loss=2"),
                         line(2, "h", 0, "step=2 loss=1")])
    s = load(run, patterns(None)).summary
    assert s.header.state == "running" and s.bad_records == 2
    parse_html(page.render([s]))


def test_vendored_uplot_is_what_vendor_md_says() -> None:
    assets = Path(page.__file__).parent / "assets"
    listed = re.findall(r"^([0-9a-f]{64})  (\S+)$", (assets / "VENDOR.md").read_text(), re.M)
    assert len(listed) == 3
    for digest, name in listed:
        assert hashlib.sha256((assets / name).read_bytes()).hexdigest() == digest, name
    assert "uPlot 1.6.32" in page.render([summarize({}, Digest(patterns(None)), UsageBuilder())])


def test_cli_writes_a_private_page_and_json(tmp_path: Path) -> None:
    run = restarted_archive(tmp_path)
    res = dtrain(["report", str(run)], cwd=tmp_path, env=ENV)
    assert res.returncode == 0, res.stderr
    out = tmp_path / "dtrain-report-r.html"
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert "dtrain-report-r.html" in res.stderr and res.stdout == ""
    parse_html(out.read_text())
    res = dtrain(["report", str(run), "--json"], cwd=tmp_path, env=ENV)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    validate_json(doc, "report")
    assert doc["runs"][0]["attempts"] == 2
    res = dtrain(["report", "--compare", str(run), str(run), "-o", str(tmp_path / "c.html")])
    assert res.returncode == 0, res.stderr
    assert "Side by side" in (tmp_path / "c.html").read_text()
    res = dtrain(["report", str(run), "-o", "-"])
    assert res.stdout.startswith("<!DOCTYPE html>")


@pytest.mark.parametrize("args", [["--metric", "(x"], ["nosuchrun"], ["--lanes", "some"],
                                  ["r", "--compare", "a", "b"]])
def test_cli_bad_input_exits_2(tmp_path: Path, args: list[str]) -> None:
    restarted_archive(tmp_path)
    res = dtrain(["report", "--archive-dir", str(tmp_path), *args], cwd=tmp_path, env=ENV)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr and "dtrain: error:" in res.stderr
    assert not list(tmp_path.glob("*.html"))


CANVAS_INK = """Array.from(document.querySelectorAll('canvas')).map(function (c) {
  var d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data, n = 0;
  for (var i = 3; i < d.length; i += 4) if (d[i] > 0) n++;
  return n; })"""
SEARCH = """new Promise(function (done) {
  var q = document.getElementById('q');
  q.value = %s; q.dispatchEvent(new Event('input'));
  setTimeout(function () { done([document.getElementById('qcount').textContent,
    document.querySelectorAll('ol.log li:not(.hidden)').length,
    document.querySelectorAll('ol.log mark').length]); }, 400); })"""


def look_at(path: Path, search: str = "failing at last", charts: bool = True,
            evaluate: dict[str, str] | None = None) -> Any:
    """The page in headless Chromium, checked as a person would see it: it finished drawing,
    said nothing on its console, asked for nothing but itself, and is not blank."""
    from tests import browser

    if browser.chromium() is None:
        from tests.util import cannot_run

        cannot_run("chromium is not installed (scripts/test installs Debian's chromium)")
    res = browser.open_page(path, evaluate={"ink": CANVAS_INK,
                                            "search": SEARCH % json.dumps(search),
                                            **(evaluate or {})})
    assert res.ready, "the page's script never finished"
    assert res.errors == []
    assert res.requests == [path.resolve().as_uri()]
    assert browser.colours(res.png, step=6) > 40, "the screenshot is (nearly) blank"
    if charts:  # every chart's canvas has ink
        assert res.values["ink"] and all(n > 100 for n in res.values["ink"]), res.values["ink"]
    else:
        assert res.values["ink"] == []
    return res


def test_the_page_draws_in_chromium_without_errors(tmp_path: Path) -> None:
    s = load(restarted_archive(tmp_path), patterns(None)).summary
    out = tmp_path / "r.html"
    out.write_text(page.render([s]))
    res = look_at(out)
    assert len(res.values["ink"]) == len(s.curves) + len(s.usage)  # every chart drew
    count, shown, marks = res.values["search"]
    assert count == "2 matching lines" and shown == 2 and marks == 2  # tail + node3's tail
