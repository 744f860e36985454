"""dtrain smoke's pure parts: backend, sizes, the verdict (versions, exact sum, slow node or
link, --min-busbw), the pair schedule of the node job, and its reports (JSON, JUnit)."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace

import pytest

from launcher.decide.facts import NodeFacts
from launcher.decide.smoke import (
    MARK,
    SmokeResults,
    choose_backend,
    evaluate,
    make_config,
    parse_size,
)
from launcher.errors import UsageError
from launcher.output.junit import ExtraCase, to_junit
from launcher.output.report import FAILED, PASSED, CommandReport, NodeResult, RankResult, to_json
from tests.reports import validate_json, validate_junit

HOSTS = ["n1", "n2", "n3", "n4"]


def _results(torch: dict[str, str] | None = None, pairs: dict[tuple[int, int], float] | None
             = None, wrong: dict[int, int] | None = None, busbw: float = 1.0) -> SmokeResults:
    res = SmokeResults()
    for i, host in enumerate(HOSTS):
        res.add_line(host, MARK + json.dumps({
            "kind": "rank", "rank": i, "node_rank": i, "hostname": host,
            "torch": (torch or {}).get(host, "2.13.0"), "nccl": None, "device": "cpu",
            "device_count": 0, "python": "3.11.7"}))
        res.add_line(host, MARK + json.dumps({"kind": "check", "rank": i,
                                              "mismatches": {"1024": (wrong or {}).get(i, 0)}}))
    res.add_line("n1", MARK + json.dumps({"kind": "sweep", "backend": "gloo", "rows": [
        {"size": 1024, "count": 256, "iters": 5, "time_us": 10.0, "algbw": busbw / 1.5,
         "busbw": busbw}]}))
    speeds = pairs or {}
    rows = [{"a": a, "b": b, "size": 1 << 20, "time_us": 100.0,
             "gbps": speeds.get((a, b), 10.0)} for a in range(4) for b in range(a + 1, 4)]
    res.add_line("n1", MARK + json.dumps({"kind": "pairs", "rows": rows}))
    return res


def _eval(res: SmokeResults, **kw):
    return evaluate(res, node_labels=HOSTS, world_size=4, job_code=kw.pop("job_code", 0),
                    job_summary="", **kw)


def test_healthy_is_exit_0():
    v = _eval(_results())
    assert v.code == 0 and not v.failures and "4 nodes, 4 ranks, gloo" in v.summary


def test_a_node_whose_every_pair_is_slow_is_named():
    v = _eval(_results(pairs={(0, 2): 1.0, (1, 2): 0.5, (2, 3): 2.0}))
    assert v.code == 1
    assert [(f.check, f.hosts) for f in v.failures] == [("pairs", ("n3",))]


def test_the_slower_end_of_a_pair_is_the_link_s_speed():
    """Both ends report: the sender's view of a slow direction can be only its buffer's."""
    res = _results()
    # every pair as its lower end saw it (all fast), then node 3's end of its three pairs
    fast_view = [{"a": a, "b": b, "size": 1 << 20, "time_us": 100.0, "gbps": 10.0}
                 for a in range(4) for b in range(a + 1, 4)]
    slow_view = [{"a": a, "b": b, "size": 1 << 20, "time_us": 1e5, "gbps": 0.01}
                 for a, b in ((0, 2), (1, 2), (2, 3))]
    res.add_line("n1", MARK + json.dumps({"kind": "pairs", "rows": fast_view + slow_view}))
    v = _eval(res)
    assert [(f.check, f.hosts) for f in v.failures] == [("pairs", ("n3",))]
    assert sorted((p.a, p.b, p.gbps) for p in v.pairs if p.slow) == [
        ("n1", "n3", 0.01), ("n2", "n3", 0.01), ("n3", "n4", 0.01)]
    assert len(v.pairs) == 6


def test_a_single_slow_pair_names_the_link():
    v = _eval(_results(pairs={(1, 3): 1.0}))
    assert [(f.check, f.hosts) for f in v.failures] == [("pairs", ("n2", "n4"))]
    assert "link n2 <-> n4" in v.failures[0].message


def test_pair_noise_within_the_fraction_passes():
    assert _eval(_results(pairs={(0, 1): 3.0, (2, 3): 5.0})).code == 0


def test_the_odd_torch_is_named_not_the_majority():
    v = _eval(_results(torch={"n2": "2.0.0"}))
    assert [(f.check, f.hosts) for f in v.failures] == [("versions", ("n2",))]
    assert "n2 has 2.0.0" in v.failures[0].message


def test_wrong_sum_names_the_rank():
    v = _eval(_results(wrong={3: 5}))
    assert [(f.check, f.hosts, f.ranks) for f in v.failures] == [("correctness", ("n4",), (3,))]


def test_min_busbw():
    assert _eval(_results(busbw=2.0), min_busbw=1.5).code == 0
    v = _eval(_results(busbw=1.0), min_busbw=1.5)
    assert v.code == 1 and v.failures[0].check == "busbw"


def _sweep(res: SmokeResults, busbw_by_size: dict[int, float]) -> SmokeResults:
    res.add_line("n1", MARK + json.dumps({"kind": "sweep", "backend": "gloo", "rows": [
        {"size": size, "count": size // 4, "iters": 5, "time_us": 10.0, "algbw": bw / 1.5,
         "busbw": bw} for size, bw in busbw_by_size.items()]}))
    return res


def test_min_busbw_is_judged_at_the_largest_size():
    """Three sizes: small messages are latency-bound and slow; only the largest counts."""
    ok = _eval(_sweep(_results(), {1024: 0.01, 65536: 0.2, 4 << 20: 2.0}), min_busbw=1.5)
    assert ok.code == 0, ok.summary
    assert ok.busbw == 2.0
    assert "busbw 2 GB/s at 4M" in ok.summary
    slow = _eval(_sweep(_results(), {1024: 9.0, 65536: 8.0, 4 << 20: 1.0}), min_busbw=1.5)
    assert slow.code == 1
    assert [f.check for f in slow.failures] == ["busbw"]
    assert "busbw 1 GB/s at 4M is under --min-busbw 1.5" in slow.failures[0].message


def test_a_different_gpu_count_on_one_node_is_named():
    res = _results()
    for rank in res.ranks:
        res.ranks[rank] = replace(res.ranks[rank], device="cuda",
                                  device_count=4 if rank == 2 else 8)
    v = _eval(res)
    assert v.code == 1
    assert [(f.check, f.hosts) for f in v.failures] == [("versions", ("n3",))]
    assert "GPU count differs: n3 has 4 (the others: 8)" in v.failures[0].message


@pytest.mark.parametrize("gone", ["report", "check", "both"])
def test_the_last_rank_missing_is_no_pass(gone: str):
    """A rank that never reported (its report or its sum check) fails the smoke, the last
    rank included: the range of expected ranks ends at world_size - 1, not before."""
    res = _results()
    if gone in ("report", "both"):
        del res.ranks[3]
    if gone in ("check", "both"):
        del res.checks[3]
    v = _eval(res, ranks_of={3: "n4"})
    assert v.code == 1
    assert [(f.check, f.hosts, f.ranks) for f in v.failures] == [("ranks", ("n4",), (3,))]
    assert "the job ended without a full report (ranks [3])" in v.summary


def test_no_sweep_is_no_pass():
    res = _results()
    res.sweep = []
    v = _eval(res)
    assert v.code == 1 and [f.check for f in v.failures] == ["ranks"]


def test_a_crashed_job_keeps_its_own_exit_code():
    assert _eval(SmokeResults(), job_code=255).code == 255


def test_missing_rank_reports_fail():
    res = _results()
    del res.ranks[2], res.checks[2]
    v = _eval(res, ranks_of={2: "n3"})
    assert v.code == 1 and v.failures[-1].hosts == ("n3",)


def test_backend_and_sizes():
    gpu, cpu = NodeFacts(gpus=8), NodeFacts(gpus=0)
    assert choose_backend({"a": gpu, "b": gpu}, None)[0] == "nccl"
    assert choose_backend({"a": gpu, "b": cpu}, None) == ("gloo", "no GPU on b")
    assert choose_backend({"a": gpu}, "gloo")[0] == "gloo"
    assert make_config("nccl", None).max_size == 64 << 20
    assert make_config("gloo", None).max_size == 4 << 20
    assert make_config("gloo", parse_size("64K")).max_size == 64 << 10
    assert parse_size("4M") == 4 << 20 and parse_size("512KiB") == 512 << 10
    with pytest.raises(UsageError, match="--max-size"):
        parse_size("lots")


def _job():
    spec = importlib.util.spec_from_file_location("smoke_job", "launcher/nodeside/smoke_job.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("n", range(1, 13))
def test_pair_schedule_rounds_are_disjoint_and_cover_every_pair_or_the_ring(n):
    rounds = _job().schedule(n)
    pairs = [p for r in rounds for p in r]
    for r in rounds:
        nodes = [x for p in r for x in p]
        assert len(nodes) == len(set(nodes))
    if n <= 8:
        assert sorted(pairs) == [(a, b) for a in range(n) for b in range(a + 1, n)]
    else:
        assert sorted(pairs) == sorted(tuple(sorted((i, (i + 1) % n))) for i in range(n))


def _report(code: int = 1) -> CommandReport:
    ranks = (RankResult(0, FAILED, 3, None, "root cause", "rank 0 exited 3", 1.5,
                        ("Traceback", "ValueError: <bad> & \"worse\"")),)
    nodes = (NodeResult("n1", FAILED if code else PASSED, code, "exit 3", 2.0, ranks),
             NodeResult("n2", PASSED, 0, None, 2.0))
    return CommandReport("smoke", code, "rank 0 on n1 exited 3", 1000.0, 1003.5, nodes,
                         {"kind": "rank", "host": "n1", "rank": 0, "exit_code": code,
                          "summary": "x"}, "/tmp/a",
                         {"backend": "gloo", "backend_reason": "", "world_size": 2,
                          "sweep": [], "pairs": [], "best_pair_gbps": None, "busbw": None,
                          "failures": []})


def test_json_report_validates_and_a_broken_one_does_not():
    import jsonschema

    doc = to_json(_report())
    validate_json(doc, "smoke")
    assert doc["schema"] == "dtrain.smoke/1" and doc["outcome"] == "failed"
    del doc["nodes"][0]["ranks"][0]["exit_code"]
    with pytest.raises(jsonschema.ValidationError):
        validate_json(doc, "smoke")


def test_junit_has_a_case_per_node_and_rank_with_the_failure_story():
    root = validate_junit(to_junit(_report(), [ExtraCase("check pairs", PASSED)]))
    suite = root.find("testsuite")
    assert suite.get("tests") == "4" and suite.get("failures") == "2"
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert set(cases) == {"n1", "n1 rank 0", "n2", "check pairs"}
    text = cases["n1 rank 0"].find("failure").text
    assert "exit code: 3" in text and 'ValueError: <bad> & "worse"' in text
    assert cases["n2"].find("failure") is None
