"""dtrain smoke's pure parts: backend, sizes, the verdict (versions, exact sum, slow node or
link, --min-busbw), the pair schedule of the node job, and its reports (JSON, JUnit)."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace

import pytest

from launcher.decide.fabric.smoke import (
    MARK,
    RankReport,
    SmokeResults,
    choose_backend,
    evaluate,
    fmt_size,
    make_config,
    pair_results,
    parse_size,
    slow_failures,
)
from launcher.decide.runplan.facts import NodeFacts
from launcher.errors import UsageError
from launcher.output.junit import ExtraCase, to_junit
from launcher.output.report import FAILED, PASSED, CommandReport, NodeResult, RankResult, to_json
from tests.reports import validate_json, validate_junit

HOSTS = ["n1", "n2", "n3", "n4"]


LAYOUT = dict(enumerate(HOSTS))  # one rank per node: rank i on HOSTS[i]


def _line(res: SmokeResults, src: int | None, node: str | None = None, **msg: object) -> bool:
    """A DTRAIN-SMOKE line as the launcher attributes it (rank ``src`` on ``node``, by
    default that rank's node)."""
    return res.add_line(node or LAYOUT[src or 0], src, MARK + json.dumps(msg))


def _pair(a: int, b: int, gbps: float, time_us: float = 100.0) -> dict[str, object]:
    return {"a": a, "b": b, "size": 1 << 20, "time_us": time_us, "gbps": gbps}


def _results(torch: dict[str, str] | None = None, pairs: dict[tuple[int, int], float] | None
             = None, wrong: dict[int, int] | None = None, busbw: float = 1.0,
             sweep: dict[int, float] | None = None,
             views: dict[int, list[dict[str, object]]] | None = None) -> SmokeResults:
    """A healthy 4-node report; ``pairs``: the speed of some pairs as both ends see it,
    ``views``: each rank's own pair rows instead, ``sweep``: busbw per size."""
    return _fill(SmokeResults(layout=LAYOUT, nodes=HOSTS), torch, pairs, wrong, busbw, sweep,
                 views)


def _fill(res: SmokeResults, torch: dict[str, str] | None = None,
          pairs: dict[tuple[int, int], float] | None = None, wrong: dict[int, int] | None = None,
          busbw: float = 1.0, sweep: dict[int, float] | None = None,
          views: dict[int, list[dict[str, object]]] | None = None) -> SmokeResults:
    for i, host in enumerate(HOSTS):
        _line(res, i, kind="rank", rank=i, node_rank=i, hostname=host,
              torch=(torch or {}).get(host, "2.13.0"), nccl=None, device="cpu",
              device_count=0, python="3.11.7")
        _line(res, i, kind="check", rank=i, mismatches={"1024": (wrong or {}).get(i, 0)})
    _line(res, 0, kind="sweep", backend="gloo", rows=[
        {"size": size, "count": size // 4, "iters": 5, "time_us": 10.0, "algbw": bw / 1.5,
         "busbw": bw} for size, bw in (sweep or {1024: busbw}).items()])
    speeds = pairs or {}
    if views is None:
        views = {i: [_pair(a, b, speeds.get((a, b), 10.0)) for a in range(4)
                     for b in range(a + 1, 4) if i in (a, b)] for i in range(4)}
    for i, rows in views.items():
        _line(res, i, kind="pairs", rank=i, rows=rows)
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
    # every pair as its other end saw it (all fast), and node 3's (index 2) slow end
    fast = {0: [(0, 1), (0, 2), (0, 3)], 1: [(1, 2), (1, 3)], 3: [(2, 3)]}
    views = {i: [_pair(a, b, 10.0) for a, b in ab] for i, ab in fast.items()}
    views[2] = [_pair(a, b, 0.01, 1e5) for a, b in ((0, 2), (1, 2), (2, 3))]
    v = _eval(_results(views=views))
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


def test_min_busbw_blames_no_node_when_every_pair_was_within_the_fraction():
    """Issue 24.7: a cluster-wide threshold missed by a healthy-looking fabric fails the
    busbw check, not the nodes of its slowest (but not slow) pair."""
    v = _eval(_results(busbw=1.0), min_busbw=1.5)
    (busbw,) = [f for f in v.failures if f.check == "busbw"]
    assert busbw.hosts == () and not any(p.slow for p in v.pairs)
    assert "(within --pair-fraction of the best: the fabric as a whole is slow)" in busbw.message


def test_min_busbw_is_judged_at_the_largest_size():
    """Three sizes: small messages are latency-bound and slow; only the largest counts."""
    ok = _eval(_results(sweep={1024: 0.01, 65536: 0.2, 4 << 20: 2.0}), min_busbw=1.5)
    assert ok.code == 0, ok.summary
    assert ok.busbw == 2.0
    assert "busbw 2 GB/s at 4M" in ok.summary
    slow = _eval(_results(sweep={1024: 9.0, 65536: 8.0, 4 << 20: 1.0}), min_busbw=1.5)
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


def test_a_pair_slowed_in_one_pass_is_judged_by_its_best_pass(monkeypatch):
    """A burst of load on a shared node slows every iteration of one pass: the other passes
    carry the link's real speed. With one pass the burst would decide (a false "slow")."""
    job = _job()

    class Req:
        def wait(self, timeout=None):
            pass

    class Dist:
        def isend(self, t, peer):
            return Req()

        irecv = isend

        def barrier(self):
            pass

    class Torch:
        float32 = "f32"

        def ones(self, n, **kw):
            return [1.0] * n

        empty = ones

    clock = {"t": 0.0, "calls": 0}

    def perf_counter():  # each exchange: 1 ms, or 100 ms in the first pass (the burst)
        clock["calls"] += 1
        if clock["calls"] % 2 == 0:
            clock["t"] += 0.1 if clock["calls"] <= 2 * 6 else 0.001
        return clock["t"]

    monkeypatch.setattr(job.time, "perf_counter", perf_counter)
    facts = [{"rank": 0, "local_rank": 0, "node_rank": 0},
             {"rank": 1, "local_rank": 0, "node_rank": 1}]
    cfg = {"pair_size": 1 << 20, "pair_warmup": 1, "pair_iters": 5, "pair_passes": 3,
           "pair_timeout": 30.0}
    device = type("D", (), {"type": "cpu"})()
    rows = job.pair_test(Torch(), Dist(), device, facts, 0, cfg)
    assert [(r["a"], r["b"]) for r in rows] == [(0, 1)]
    assert rows[0]["time_us"] == pytest.approx(1000)
    clock.update(t=0.0, calls=0)
    one = job.pair_test(Torch(), Dist(), device, facts, 0, dict(cfg, pair_passes=1))
    assert one[0]["time_us"] == pytest.approx(100_000)


def test_an_exchange_that_times_out_is_reported_and_ends_the_job(monkeypatch, capsys):
    """A pair whose send/recv is not done within pair_timeout: the leader says which pair
    (DTRAIN-SMOKE pair_failed) and ends at once; its peers would wait on it forever."""
    job = _job()
    waits: list[object] = []

    class Req:
        def wait(self, timeout=None):
            waits.append(timeout)
            raise RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
                               "7000ms for recv operation to complete")

    class Dist:
        def isend(self, t, peer):
            return Req()

        irecv = isend

        def barrier(self):
            raise AssertionError("no barrier after a failed pair")

    class Torch:
        float32 = "f32"

        def ones(self, n, **kw):
            return [1.0] * n

        empty = ones

    class Ended(Exception):
        pass

    def _exit(code):
        raise Ended(code)

    monkeypatch.setattr(job.os, "_exit", _exit)
    facts = [{"rank": r, "local_rank": 0, "node_rank": r} for r in range(3)]
    cfg = {"pair_size": 1 << 20, "pair_warmup": 1, "pair_iters": 5, "pair_passes": 3,
           "pair_timeout": 7.0}
    with pytest.raises(Ended) as ended:
        job.pair_test(Torch(), Dist(), type("D", (), {"type": "cpu"})(), facts, 2, cfg)
    from launcher.decide.fabric.smoke import PAIR_FAILED_EXIT

    assert ended.value.args == (job.PAIR_FAILED_EXIT,) == (PAIR_FAILED_EXIT,)
    assert [w.total_seconds() for w in waits] == [7.0]  # type: ignore[attr-defined]
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(MARK)]
    msg = json.loads(line[len(MARK):])
    assert {k: msg[k] for k in ("kind", "rank", "size", "timeout")} == {
        "kind": "pair_failed", "rank": 2, "size": 1 << 20, "timeout": 7.0}
    assert 2 in (msg["a"], msg["b"]) and "Timed out waiting" in msg["error"]


def test_a_failed_pair_names_its_link_or_the_node_in_every_failed_pair():
    from launcher.decide.fabric.smoke import PAIR_FAILED_EXIT

    def failed(pairs: list[tuple[int, int]], views: dict[int, list[dict[str, object]]]
               | None = None) -> SmokeResults:
        res = SmokeResults(layout=LAYOUT, nodes=HOSTS)
        done = {(a, b) for a in range(4) for b in range(a + 1, 4)} - set(pairs)
        _fill(res, views=views if views is not None else {
            i: [_pair(a, b, 10.0) for a, b in sorted(done) if i in (a, b)] for i in range(4)})
        for a, b in pairs:
            _line(res, a, kind="pair_failed", rank=a, a=a, b=b, size=1 << 20, timeout=30.0,
                  error="Timed out")
        return res

    v = _eval(failed([(1, 3)]), job_code=PAIR_FAILED_EXIT)
    assert v.code == 1 and [(f.check, f.hosts) for f in v.failures] == [("pairs", ("n2", "n4"))]
    assert v.failures[0].message == ("link n2 <-> n4 failed: no exchange of 1M within 30 s "
                                     "(--pair-timeout)")
    assert v.summary == v.failures[0].message
    # n3 (index 2) failed with every partner it met, and finished none: the node is named
    v = _eval(failed([(0, 2), (1, 2), (2, 3)]), job_code=PAIR_FAILED_EXIT)
    assert [(f.check, f.hosts) for f in v.failures] == [("pairs", ("n3",))]
    assert v.failures[0].message.startswith("n3 is unreachable for the pair test: no exchange "
                                            "of 1M with n1, n2, n4 within 30 s")
    # a report on a pair the node is no end of is refused, not believed
    res = failed([])
    _line(res, 0, kind="pair_failed", rank=0, a=1, b=2, size=1, timeout=1.0, error="")
    assert not res.failed_pairs and "no end of" in res.refused[0][1]
    # the job's own crash, without a failed pair, keeps its code
    assert _eval(failed([]), job_code=PAIR_FAILED_EXIT).code == PAIR_FAILED_EXIT


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


def test_the_job_reads_every_key_the_config_sends_and_nothing_else():
    """SmokeConfig.to_json is the node job's input: the same keys, the same values."""
    import re as re_
    from pathlib import Path

    job = (Path(__file__).parents[1] / "launcher/nodeside/smoke_job.py").read_text()
    read = set(re_.findall(r'cfg\["(\w+)"\]', job))
    cfg = make_config("nccl", None)
    sent = cfg.to_json()
    assert set(sent) == read
    assert sent == {"backend": "nccl", "min_size": 1024, "max_size": 64 << 20, "warmup": 5,
                    "iters": 20, "big": 16 << 20, "pair_size": 16 << 20, "pair_warmup": 2,
                    "pair_iters": 5, "pair_passes": 3, "pair_timeout": 30.0}


def test_gloo_config_and_a_cap_below_the_smallest_size():
    assert make_config("gloo", None).to_json() == {
        "backend": "gloo", "min_size": 1024, "max_size": 4 << 20, "warmup": 2, "iters": 5,
        "big": 1 << 20, "pair_size": 1 << 20, "pair_warmup": 1, "pair_iters": 5,
        "pair_passes": 3, "pair_timeout": 30.0}
    assert (make_config("gloo", 256).min_size, make_config("gloo", 256).max_size) == (256, 256)
    assert (make_config("nccl", 512).min_size, make_config("nccl", 512).max_size) == (512, 512)


@pytest.mark.parametrize(("text", "size"), [("4", 4), ("7", 7), ("2g", 2 << 30),
                                            ("1G", 1 << 30), ("3K", 3072), ("5MiB", 5 << 20)])
def test_parse_size_units(text, size):
    assert parse_size(text) == size


def test_parse_size_needs_one_float():
    with pytest.raises(UsageError) as exc:
        parse_size("3", "--max-size")
    assert str(exc.value) == "--max-size '3': at least 4 bytes (one float)"


def test_backend_reasons():
    gpu, one, cpu = NodeFacts(gpus=8), NodeFacts(gpus=1), NodeFacts(gpus=0)
    assert choose_backend({"a": gpu}, "gloo") == ("gloo", "--backend")
    assert choose_backend({"a": gpu, "b": one}, None) == ("nccl", "every node has a GPU")
    assert choose_backend({"a": gpu, "b": cpu, "c": cpu}, None) == ("gloo", "no GPU on b, c")
    assert choose_backend({"a": cpu, "b": cpu}, None) == ("gloo", "no GPU on any node")


def test_lines_that_are_not_reports_are_left_alone():
    """A plain line stays in the output; a line with the mark is always taken out of it,
    and counts only when it is a report of that rank (else it is refused, see below)."""
    res = SmokeResults(layout=LAYOUT, nodes=HOSTS)
    assert res.add_line("n1", 0, "loss 0.5") is False
    assert res.add_line("n1", 0, "DTRAIN-SMOKE") is False  # no space: not the mark
    for body in ("{not json", "[1, 2]", '{"kind": "other"}'):
        assert res.add_line("n1", 0, MARK + body) is True
    assert res.ranks == {} and res.sweep == [] and len(res.refused) == 3


def test_a_busbw_failure_names_the_slowest_pair():
    """Named in the message; its nodes are blamed only when the pair is slow (24.7)."""
    v = _eval(_results(busbw=1.0, pairs={(1, 3): 4.0}), min_busbw=1.5)
    assert [(f.check, f.hosts) for f in v.failures] == [("busbw", ())]
    assert v.failures[0].message.endswith(
        "; slowest pair n2 <-> n4 (within --pair-fraction of the best: the fabric as a "
        "whole is slow)")


@pytest.mark.parametrize(("n", "text"), [(1 << 30, "1G"), (3 << 20, "3M"), (1024, "1K"),
                                         (1536, "1536"), (512, "512"), (0, "0"),
                                         (1 << 40, "1024G")])
def test_fmt_size(n, text):
    assert fmt_size(n) == text


def test_a_rank_report_is_read_field_by_field():
    res = SmokeResults(layout={5: "node2", 6: "node3"}, nodes=["node1", "node2", "node3"])
    assert res.add_line("node2", 5, MARK + json.dumps({
        "kind": "rank", "rank": 5, "node_rank": 1, "hostname": "gpu07", "torch": "2.13.0",
        "nccl": "2.27.3", "device": "cuda", "device_count": 8, "python": "3.12.1"}))
    assert res.ranks[5] == RankReport(5, "node2", 1, "gpu07", "2.13.0", "2.27.3", "cuda", 8,
                                      "3.12.1")
    # a report without every field is no report of the job's (issue 22): refused
    res.add_line("node3", 6, MARK + json.dumps({"kind": "rank", "rank": 6, "torch": "2.13.0",
                                                "device": "cpu"}))
    assert 6 not in res.ranks and res.refused == [("node3", "node_rank is not an integer >= 0")]


# -- a node speaks only for its own ranks (issue 22, Medium 4) ------------------------------

def test_a_node_speaks_only_for_its_own_ranks():
    """One extra DTRAIN-SMOKE line on a node's stdout neither replaces the sweep nor
    another rank's report, nor times a pair it is no end of: it is refused, and the smoke
    fails naming the node it came from (a FAIL stays a FAIL, nobody else is accused)."""
    views = {i: [_pair(a, b, 10.0) for a in range(4) for b in range(a + 1, 4) if i in (a, b)]
             for i in (0, 1, 3)}  # n3 (rank 2) has not reported its pairs yet
    res = _results(busbw=1.0, wrong={1: 3}, views=views)
    fast = [{"size": 1024, "count": 256, "iters": 5, "time_us": 0.1, "algbw": 600.0,
             "busbw": 999.0}]
    assert _line(res, 2, kind="sweep", backend="gloo", rows=fast)  # n3 is not rank 0
    assert _line(res, 2, kind="check", rank=1, mismatches={"1024": 0})  # rank 1's sum is ok?
    assert _line(res, 2, kind="rank", rank=0, node_rank=0, hostname="n1", torch="9.9",
                 nccl=None, device="cpu", device_count=0, python="3.11.7")
    assert _line(res, 2, kind="pairs", rank=2, rows=[_pair(0, 1, 0.001)])  # n1 <-> n2
    assert _line(res, None, "n2", kind="sweep", backend="gloo", rows=fast)  # not from a rank
    assert _line(res, 1, "n4", kind="check", rank=1, mismatches={"1024": 0})  # rank 1 is n2's
    assert _line(res, 0, kind="sweep", backend="gloo", rows=fast)  # rank 0, a second time
    v = _eval(res, min_busbw=1.5)
    assert v.code == 1
    assert res.sweep[0]["busbw"] == 1.0 and res.checks[1] == {"1024": 3}
    assert res.ranks[0].torch == "2.13.0"
    refused = [(f.check, f.hosts) for f in v.failures if "refused" in f.message]
    assert refused == [("ranks", ("n3",))] * 4 + [("ranks", ("n2",)), ("ranks", ("n4",)),
                                                  ("ranks", ("n1",))]
    assert "n3: a smoke report refused: a sweep from rank 2" in v.summary
    assert "which it is no end of" in v.summary and "a second sweep" in v.summary
    others = [(f.check, f.hosts) for f in v.failures if "refused" not in f.message]
    assert others == [("correctness", ("n2",)), ("busbw", ())], v.failures
    assert not any(p.slow for p in v.pairs)  # n3's word on n1 <-> n2 did not count


@pytest.mark.parametrize("body", [
    "not json", "[1, 2]", '{"kind": "rank"}', '{"kind": "rank", "rank": "0"}',
    '{"kind": "rank", "rank": true}', '{"kind": "check", "rank": 0, "mismatches": {"x": 1}}',
    '{"kind": "check", "rank": 0, "mismatches": [1]}',
    '{"kind": "sweep", "backend": "gloo", "rows": [{"size": 1024, "count": 1, "iters": 1, '
    '"time_us": 1, "algbw": 1, "busbw": NaN}]}',
    '{"kind": "sweep", "backend": "gloo", "rows": "many"}',
    '{"kind": "pairs", "rank": 0, "rows": [{"a": 0, "b": 99, "size": 1, "time_us": 1, '
    '"gbps": 1}]}',
    '{"kind": "pairs", "rank": 0, "rows": [{"a": 0, "b": 1, "size": 1, "time_us": 1, '
    '"gbps": -1}]}',
    '{"kind": "rank", "rank": 0, "node_rank": 0, "hostname": "' + "x" * 5000 + '", '
    '"torch": "2", "nccl": null, "device": "cpu", "device_count": 0, "python": "3"}',
    '{"kind": "nonsense"}',
], ids=lambda b: b[:40])
def test_a_malformed_report_is_a_failure_naming_the_node_not_a_traceback(body: str):
    res = SmokeResults(layout=LAYOUT, nodes=HOSTS)
    assert res.add_line("n1", 0, MARK + body)
    assert res.refused and res.refused[0][0] == "n1"
    v = _eval(res)
    assert v.code == 1
    assert v.failures[0].check == "ranks" and v.failures[0].hosts == ("n1",)
    assert v.failures[0].message.startswith("n1: a smoke report refused: ")


def test_a_forged_report_that_comes_first_takes_no_rank_s_place():
    """n4's supervisor claims lines of rank 1 (n2's) and rank 0 (n1's) before they speak:
    refused, so the real reports count (rank 1's wrong sum is still found)."""
    res = SmokeResults(layout=LAYOUT, nodes=HOSTS)
    assert _line(res, 1, "n4", kind="check", rank=1, mismatches={"1024": 0})
    assert _line(res, 0, "n4", kind="sweep", backend="gloo", rows=[
        {"size": 1024, "count": 256, "iters": 5, "time_us": 0.1, "algbw": 600.0,
         "busbw": 999.0}])
    assert _line(res, 0, "n4", kind="pairs", rank=0, rows=[_pair(0, 3, 0.001)])
    v = _eval(_fill(res, wrong={1: 3}, busbw=1.0), min_busbw=1.5)
    assert [(f.check, f.hosts) for f in v.failures] == [("ranks", ("n4",))] * 3 + [
        ("correctness", ("n2",)), ("busbw", ())]
    assert "not from a rank of this node" in v.failures[0].message
    assert not any(p.slow for p in v.pairs)




def test_a_tie_names_no_node_and_the_majority_wins_otherwise():
    """Issue 50: a tie at the top has no majority; node 0's value winning it let node 0's
    word name the other node (tests/test_hostile_rules.py)."""
    from launcher.decide.fabric.smoke import _odd_ones

    assert _odd_ones({"a": "x", "b": "y"}, ["b", "a"]) is None
    assert _odd_ones({"a": "x", "b": "x", "c": "y", "d": "y"}, ["a", "b", "c", "d"]) is None
    assert _odd_ones({"a": "x", "b": "y", "c": "y"}, ["a", "b", "c"]) == {"a": "x"}
    assert _odd_ones({"a": "x", "b": "x"}, ["a", "b"]) == {}


@pytest.mark.parametrize(("field", "what"), [("torch", "torch"), ("nccl", "NCCL"),
                                             ("device", "device"), ("python", "Python")])
def test_each_version_check_names_what_differs(field, what):
    res = _results()
    for rank in res.ranks:
        value = {2: "odd-2", 3: "odd-3"}.get(rank, "same")
        res.ranks[rank] = replace(res.ranks[rank], **{field: value})
    [failure] = _eval(res).failures
    assert (failure.check, failure.hosts) == ("versions", ("n3", "n4"))
    assert failure.message == f"{what} differs: n3 has odd-2, n4 has odd-3 (the others: same)"


def test_parse_size_names_max_size_by_default():
    with pytest.raises(UsageError, match=r"^--max-size '2': at least 4 bytes"):
        parse_size("2")


def _pairs_only(n: int, rows: list[tuple[int, int, float]]) -> SmokeResults:
    """Pair rows as the job sends them: each from one of its two ends (a pair's first row
    from ``a``, a second row of the same pair from ``b``: the other end's view)."""
    labels = [f"n{i + 1}" for i in range(n)]
    res = SmokeResults(layout=dict(enumerate(labels)), nodes=labels)
    by_rank: dict[int, list[dict[str, object]]] = {}
    seen: set[tuple[int, int]] = set()
    for a, b, g in rows:
        src = b if (a, b) in seen else a
        seen.add((a, b))
        by_rank.setdefault(src, []).append(_pair(a, b, g))
    for src, mine in by_rank.items():
        assert res.add_line(labels[src], src, MARK + json.dumps(
            {"kind": "pairs", "rank": src, "rows": mine}))
    assert not res.refused, res.refused
    return res


def _pair_failures(n: int, rows: list[tuple[int, int, float]]) -> list[tuple[str, tuple]]:
    pairs, best = pair_results(_pairs_only(n, rows), [f"n{i + 1}" for i in range(n)], 0.25)
    return [(f.message, f.hosts) for f in slow_failures(pairs, best, 0.25)]


@pytest.mark.parametrize("slow", [0, 3], ids=["first-node", "last-node"])
def test_a_slow_node_is_named_whichever_end_of_its_pairs_it_is(slow):
    rows = [(a, b, 1.0 if slow in (a, b) else 10.0) for a in range(4) for b in range(a + 1, 4)]
    name = f"n{slow + 1}"
    assert _pair_failures(4, rows) == [(
        f"{name} is slow: every pair with it moves at most 1 GB/s (< 0.25 x the best pair's "
        "10 GB/s)", (name,))]


def test_three_nodes_can_name_a_node_two_only_a_link():
    rows = [(0, 1, 10.0), (0, 2, 1.0), (1, 2, 1.0)]
    assert [h for _, h in _pair_failures(3, rows)] == [("n3",)]
    # two nodes: one pair, both ends' views; the slower one is slow against the faster
    assert _pair_failures(2, [(0, 1, 10.0), (0, 1, 1.0)]) == [(
        "link n1 <-> n2 is slow: 1 GB/s (< 0.25 x the best pair's 10 GB/s)", ("n1", "n2"))]


def test_a_pair_exactly_at_the_fraction_is_not_slow():
    rows = [(0, 1, 10.0), (0, 2, 2.5), (1, 2, 10.0)]
    pairs, best = pair_results(_pairs_only(3, rows), ["n1", "n2", "n3"], 0.25)
    assert best == 10.0 and not any(p.slow for p in pairs)


def test_pair_results_keep_size_and_time():
    res = _pairs_only(3, [(0, 1, 8.0), (1, 2, 9.0)])
    res.pairs[0]["time_us"] = 123.5
    pairs, _ = pair_results(res, ["n1", "n2", "n3"], 0.25)
    assert [(p.a, p.b, p.size, p.time_us, p.gbps) for p in pairs] == [
        ("n1", "n2", 1 << 20, 123.5, 8.0), ("n2", "n3", 1 << 20, 100.0, 9.0)]


def test_a_wrong_sum_names_its_host_even_without_the_rank_s_report():
    res = _results(wrong={3: 5})
    del res.ranks[3]
    v = _eval(res, ranks_of={3: "n4"})
    wrong = [f for f in v.failures if f.check == "correctness"]
    assert [(f.hosts, f.message) for f in wrong] == [(
        ("n4",), "all-reduce sum wrong on rank 3 (n4): 5 of 256 elements at 1K")]
    res = _results(wrong={3: 5})
    del res.ranks[3]
    assert [f.hosts for f in _eval(res).failures if f.check == "correctness"] == [("?",)]


def test_wrong_sums_at_several_sizes_are_listed_with_their_element_counts():
    res = _results()
    res.checks[1] = {"1024": 3, "4096": 2, "65536": 0}
    [f] = _eval(res).failures
    assert f.message == ("all-reduce sum wrong on rank 1 (n2): 3 of 256 elements at 1K, "
                         "2 of 1024 elements at 4K")


def test_missing_reports_without_a_rank_map_and_without_a_sweep():
    res = _results()
    del res.ranks[3]
    assert [f.hosts for f in _eval(res).failures] == [("?",)]
    res = _results()
    res.sweep = []
    [f] = _eval(res).failures
    assert (f.message, f.hosts, f.ranks) == ("the job ended without a full report", (), ())


def test_busbw_at_the_threshold_passes_and_under_it_without_pairs_blames_no_node():
    assert _eval(_results(busbw=1.5), min_busbw=1.5).code == 0
    res = _results(busbw=1.0)
    res.pairs = []
    v = _eval(res, min_busbw=1.5)
    [f] = v.failures
    assert f.hosts == ()  # a cluster-wide threshold: the check fails, no node (24.7)
    assert f.message == "all-reduce busbw 1 GB/s at 1K is under --min-busbw 1.5"


def test_the_summary_in_each_case():
    v = evaluate(_results(), node_labels=HOSTS, world_size=4, job_code=255,
                 job_summary="node2 was lost")
    assert (v.code, v.summary) == (255, "the smoke job failed: node2 was lost")
    v = _eval(_results(torch={"n2": "2.0.0"}, wrong={0: 1}))
    assert v.summary == "; ".join(f.message for f in v.failures) and len(v.failures) == 2
    assert "; all-reduce sum wrong on rank 0" in v.summary
    res = _results(pairs={(0, 1): 9.0})
    res.backend = None
    v = _eval(res)
    assert v.summary == "4 nodes, 4 ranks, ?; busbw 1 GB/s at 1K"
    assert (v.best_pair, v.busbw) == (10.0, 1.0)
