"""`dtrain report` on what a new user's runs leave (issue 40 items 2, 3, 9): the README's own
example's curves, chart titles, how an earlier attempt ended, why there is no utilisation
chart, one sample, torchrun's shutdown chatter in a node's last lines, "1 node"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from launcher.commands.report.load import load
from launcher.output.runreport import page
from launcher.output.runreport.curves import CurveBuilder, patterns
from tests.report_archives import T0, finished_nodes, line, write_archive


def _archive(tmp: Path, lines: list[dict[str, Any]], *, meta: dict[str, Any] | None = None,
             samples: list[dict[str, Any]] | None = None, nodes: int = 2,
             end: float = 4.0) -> Path:
    lay = [{"host": f"node{i + 1}", "node_rank": i, "ranks": [i]} for i in range(nodes)]
    base = {"created_ts": T0, "start": T0, "end": T0 + end, "exit_code": 0, "outcome": "ok",
            "hosts": [n["host"] for n in lay], "world_size": nodes, "layout": lay,
            "state": "finished", "command": ["dtrain", "run", "examples/ddp_smoke.py"],
            "nodes": finished_nodes(lay, end - 0.5),
            "root_cause": {"kind": None, "summary": "ok", "exit_code": 0}}
    return write_archive(tmp / "r", {**base, **(meta or {})}, lines, samples)


def test_the_readme_examples_loss_lines_make_a_curve(tmp_path: Path) -> None:
    # examples/ddp_smoke.py prints exactly these (and --progress counts them)
    lines = [line(1.0 + s, "node1", 0, f"step {s} loss {14.8792 - s:.4f}") for s in range(5)]
    s = load(_archive(tmp_path, lines), patterns(None)).summary
    assert [c.name for c in s.curves] == ["loss"]
    assert s.curves[0].x_is_step and s.curves[0].mean[1].step == [0, 1, 2, 3, 4]
    html = page.render([s])
    assert "no metrics found" not in html


def _metrics(text: str) -> dict[str, list[tuple[int | None, float]]]:
    b = CurveBuilder(patterns(None))
    b.add(0.0, 0, 1, text)
    return {n: list(zip(x[(0, 1)].step, x[(0, 1)].v, strict=True)) for n, x in b.series.items()}


def test_name_value_pairs_are_read_after_a_step_word_only() -> None:
    assert _metrics("step 5/100, loss 1.25 lr 3e-4 rank 0") == {
        "loss": [(5, 1.25)], "lr": [(5, 3e-4)]}
    assert _metrics("iter 7 | loss 0.5 | grad_norm=2") == {
        "grad_norm": [(7, 2.0)], "loss": [(7, 0.5)]}
    assert _metrics("epoch 3 took 5 s") == {}  # no step word: nothing read
    assert _metrics("rank 0/4 pid 123 ready") == {}


def test_a_metric_chart_is_titled_by_its_group_not_its_regex() -> None:
    def title(rx: str) -> str | None:
        return patterns([rx])[0].label

    assert title(r"throughput (?P<value>[\d.]+) tok/s") == "throughput"
    assert title(r"(?P<loss>[\d.]+) nats") == "loss"
    assert title(r"\bval_acc:\s*(?P<value>\S+)") == "val_acc"
    assert title(r"(?P<value>[\d.]+) tok/s") == "tok/s"
    assert title(r"(\d+)") == r"(\d+)"  # nothing better to say
    two = patterns([r"loss (?P<value>\S+) a", r"loss (?P<value>\S+) b"])
    assert two[0].label == "loss" and two[1].label == r"loss (?P<value>\S+) b"


def test_the_report_says_which_rank_died_in_an_earlier_attempt(tmp_path: Path) -> None:
    died = "rank 1 on node2 exited 137 (killed by SIGKILL)"
    meta = {"attempts": [
        {"n": 1, "start": T0 + 0.5, "end": T0 + 2.0, "exit_code": 137, "cause": "rank",
         "outcome": died, "hosts": ["node1", "node2"], "fenced": []},
        {"n": 2, "start": T0 + 2.5, "end": T0 + 4.0, "exit_code": 0, "cause": "ok",
         "outcome": "succeeded", "hosts": ["node1", "node2"], "fenced": []}]}
    s = load(_archive(tmp_path, [line(1.0, "node1", 0, "hi")], meta=meta),
             patterns(None)).summary
    assert s.attempts[0].outcome == died
    html = page.render([s])
    assert f"attempt 1: {died}" in html


def test_a_run_shorter_than_the_sample_interval_says_so(tmp_path: Path) -> None:
    meta = {"samples": {"interval": 10.0, "file": "samples.jsonl", "errors": {}}}
    s = load(_archive(tmp_path, [line(1.0, "node1", 0, "hi")], meta=meta, end=4.0),
             patterns(None)).summary
    html = page.render([s])
    assert "versions that sample nodes" not in html
    assert "the run took 4 s, less than one --sample-interval (10 s)" in html


def test_one_sample_draws_no_empty_chart_frames(tmp_path: Path) -> None:
    meta = {"samples": {"interval": 10.0, "file": "samples.jsonl", "errors": {}}}
    samples = [{"t": T0 + 3.0, "host": h, "cpu": {"busy": 10.0}, "mem": {"used": 1, "total": 4},
                "gpus": [{"util": 50.0, "mem_used": 10, "mem_total": 40}]}
               for h in ("node1", "node2")]
    path = _archive(tmp_path, [line(1.0, "node1", 0, "hi")], meta=meta, samples=samples,
                    end=12.0)
    s = load(path, patterns(None)).summary
    assert s.usage == ()
    html = page.render([s])
    assert "2 utilisation samples in this archive, one every 10 s: too few to draw" in html
    out = tmp_path / "one.html"
    out.write_text(html)
    from tests.test_report import look_at

    res = look_at(out, search="hi", charts=False)  # no frame drawn, no error
    assert res.values["ink"] == []


def test_a_stopped_runs_node_panel_folds_torchruns_shutdown(tmp_path: Path) -> None:
    chatter = [
        "W1203 07:01:02.123000 99 torch/distributed/elastic/agent/server/api.py:704] "
        "Received 15 death signal, shutting down workers",
        "W1203 07:01:02.124000 99 torch/distributed/elastic/multiprocessing/api.py:897] "
        "Sending process 101 closing signal SIGTERM",
        "Traceback (most recent call last):",
        '  File "/usr/bin/torchrun", line 8, in <module>',
        "    sys.exit(main())",
        "torch.distributed.elastic.multiprocessing.api.SignalException: Process 99 got "
        "signal: 15"]
    lines = [line(1.0, "node1", 0, "step 0 loss 1.0"),
             line(1.5, "node1", None, "real agent warning before the stop", stream="err"),
             line(2.0, "", None, "stop requested by you@here: stopping every node (grace 10 s)",
                  stream="dtrain")]
    lines += [line(2.1 + i / 100, "node1", None, text, stream="err")
              for i, text in enumerate(chatter)]
    s = load(_archive(tmp_path, lines, meta={"exit_code": 130, "outcome": "stopped"}),
             patterns(None)).summary
    tail = [x.text for x in s.node_tails["node1"]]
    assert tail == ["step 0 loss 1.0", "real agent warning before the stop"]
    html = page.render([s])
    assert "torchrun&#x27;s shutdown (6 lines) folded" in html or \
        "torchrun's shutdown (6 lines) folded" in html
    assert "SignalException" not in html.split('id="logs"', 1)[1].split("</section>", 1)[0]


def test_a_one_node_run_is_one_node(tmp_path: Path) -> None:
    s = load(_archive(tmp_path, [line(1.0, "node1", 0, "hi")], nodes=1), patterns(None)).summary
    html = page.render([s])
    assert "(1 node)" in html and "1 nodes" not in html
