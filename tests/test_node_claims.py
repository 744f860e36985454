"""What a node sends is a claim (issue 34, item 3), without the cluster: the checks in
launcher/job/nodemsg.py, the node session that applies them, the hang watch that must stay
up whatever arrives, dtrain's own lines quoting a node, and the report's arithmetic.
The same hostile node on the real-sshd cluster: tests/test_hostile_cluster.py."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import math
import pickle
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.hostile import Liar

# -- the checks ------------------------------------------------------------------------------


@pytest.mark.parametrize("key,rank", [("3", 3), (3, 3), ("0", 0), ("\u00b2", None),
                                      ("03", None), ("+3", None), ("-1", None), (-1, None),
                                      (True, None), ("3 ", None), ("", None), ("1" * 20, None),
                                      ("\u0663", None), (3.0, None), (None, None)])
def test_a_rank_key_is_an_int_or_its_canonical_text(key: object, rank: int | None) -> None:
    from launcher.job import nodemsg

    assert nodemsg.rank_of(key) == rank


def test_json_from_a_node_has_no_nan_infinity_or_endless_nesting() -> None:
    from launcher.job import nodemsg

    assert nodemsg.loads(b'{"a": NaN, "b": Infinity, "c": -Infinity, "d": 1e999, "e": 1.5}') \
        == {"a": None, "b": None, "c": None, "d": None, "e": 1.5}
    with pytest.raises(nodemsg.BadMessage):
        nodemsg.loads(b"[" * 200_000 + b"]" * 200_000)


def test_a_host_speaks_only_for_its_own_ranks_each_once() -> None:
    from launcher.decide.outcome.outcomes import RankEnd
    from launcher.decide.outcome.stacks import StackAnswer
    from launcher.job.events import Exit, Flight, Heartbeat, RankExit, Stacks, typed

    mine = {2, 3}
    entry = {"text": "x"}
    msg = {"type": "stacks", "id": "h1", "ranks": {"0": entry, "2": entry, "02": entry,
                                                   "\u00b2": entry, "3": 5, "7": entry}}
    assert typed(msg, mine) == Stacks(None, id="h1", ranks={2: StackAnswer(text="x")})
    assert typed({"type": "rank_start", "rank": 0}, mine) is None
    assert typed({"type": "rank_exit", "rank": "2", "code": 1}, mine) == \
        RankExit(None, RankEnd(2, code=1))
    assert typed({"type": "flight", "files": {"0": "a", "3": "b", "2": 7}}, mine) == \
        Flight(None, files={3: "b"})
    exit_msg = typed({"type": "exit", "code": 0, "t": "soon",
                      "ranks": {"2": {"code": 0}, "9": {"code": 1}}}, mine)
    assert exit_msg == Exit(None, code=0, ranks={2: RankEnd(2, code=0)})
    for t in (math.nan, math.inf, -1.0, 1e300, True, "1"):
        assert typed({"type": "hb", "t": t}, mine) == Heartbeat(None)


def test_a_sample_keeps_its_own_ranks_with_a_plausible_cpu() -> None:
    from launcher.job import nodemsg

    msg = {"type": "sample", "t": 5.0, "ranks": {
        "2": {"cpu": 1.5}, "3": {"cpu": math.nan}, "4": {"cpu": 0.0}, "\u00b2": {"cpu": 1.0}}}
    got = nodemsg.checked_sample(msg, (2, 3))
    assert got["ranks"] == {"2": {"cpu": 1.5}, "3": {}}
    got = nodemsg.checked_sample({"type": "sample", "ranks": {"2": {"cpu": 1e300}}}, None)
    assert got["ranks"] == {"2": {}}


# -- the node session applies them to every message -------------------------------------------

class _Proc:
    def __init__(self, data: bytes) -> None:
        self.chunks = [data]

    async def read_stdout(self, n: int) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""

    def abort(self) -> None:
        pass


def _session(frames: list[tuple[int, int, bytes]]) -> tuple[Any, list, list]:
    from launcher.job.node import JobSpec, NodeSession
    from launcher.models import Host

    chunks: list = []
    events: list = []
    conn = SimpleNamespace(host=Host("n2"))
    s = NodeSession(conn, JobSpec(argv=("x",)), on_chunk=lambda *a: chunks.append(a),  # type: ignore[arg-type]
                    on_event=lambda h, m: events.append(m), ranks=(2, 3))
    s.proc = _Proc(Liar.stream(frames))  # the liar's framed stream (tests/hostile.py)  # type: ignore[assignment]
    return s, chunks, events


def _ctl(msg: dict[str, Any]) -> tuple[int, int, bytes]:
    return Liar.control(json.dumps(msg).encode())


def test_the_session_hands_on_only_checked_messages_and_output() -> None:
    s, chunks, events = _session([
        _ctl({"type": "rank_start", "rank": 0}), _ctl({"type": "rank_start", "rank": 2}),
        _ctl({"type": "stacks", "id": "h1", "ranks": {"0": {"text": "lie"},
                                                      "3": {"text": "mine"}}}),
        Liar.output(0, b"step 5\n"), Liar.output(3, b"step 4\n"),
        _ctl({"type": "exit", "code": 0, "t": "late", "ranks": {"1": {}}}),
    ])
    from launcher.decide.outcome.stacks import StackAnswer
    from launcher.job.events import Exit, RankStart, Stacks

    asyncio.run(s._frames())
    assert events == [RankStart(None, rank=2),
                      Stacks(None, id="h1", ranks={3: StackAnswer(text="mine")}),
                      Exit(None, code=0, ranks={})]
    assert [(c[1], c[3]) for c in chunks] == [(None, b"step 5\n"), (3, b"step 4\n")]
    outcome = s._outcome(0)  # a bad t in the exit message: the launcher's clock instead
    assert outcome.exit_code == 0 and outcome.ended > 0


def test_a_message_nested_too_deeply_is_the_node_s_error() -> None:
    s, _, events = _session([Liar.control(b"[" * 100_000 + b"]" * 100_000)])
    asyncio.run(s._frames())
    assert events == [] and s._bad and "nested too deeply" in s._bad


# -- the hang watch stays up --------------------------------------------------------------------

def _watch(tmp_path: Path, say: list[str]) -> Any:
    from launcher.decide.outcome.hang import HangPolicy, ProgressWatch, compile_progress
    from launcher.job.hangwatch import HangWatch
    from launcher.output.rundir import RunDir

    (tmp_path / "run").mkdir()
    job = SimpleNamespace(sessions={"n1": None, "n2": None}, outcome=SimpleNamespace(nodes={}))
    progress = ProgressWatch(compile_progress(None), range(4), 0.0)
    return HangWatch(job, HangPolicy(timeout=5.0), progress,  # type: ignore[arg-type]
                     {"n1": [0, 1], "n2": [2, 3]}, RunDir.open(tmp_path / "run"), say.append,
                     alive=lambda: True)


STACK = ('Thread 0x1 (most recent call first):\n  File "/x/train.py", line 3 in step\n'
         '  File "/x/train.py", line 9 in <module>\n')


def test_odd_keys_and_an_unreadable_flight_dump_leave_the_dump_whole(tmp_path: Path) -> None:
    from launcher.job.hangwatch import StackDump

    say: list[str] = []
    w = _watch(tmp_path, say)
    bad_fr = base64.b64encode(pickle.dumps({"pg_status": {"0": {
        "last_enqueued_collective": 3, "last_completed_collective": 2}}, "entries": 5})).decode()
    dump = StackDump("h1", "test", 0.0)
    from launcher.job.events import Flight, Stacks, typed

    # odd keys never reach the watch: the decoder keeps the canonical ranks only
    n1 = typed({"type": "stacks", "id": "h1", "ranks": {
        "\u00b2": {"text": STACK}, "0": {"text": STACK},
        "1": {"text": STACK, "fr": {"ok": True, "data": bad_fr}}}}, None)
    n2 = typed({"type": "stacks", "id": "h1", "ranks": {"2": {"text": STACK},
                                                        "3": {"text": STACK}}}, None)
    assert isinstance(n1, Stacks) and isinstance(n2, Stacks) and sorted(n1.ranks) == [0, 1]
    w._collect(dump, {"n1": n1.ranks, "n2": n2.ranks})
    assert sorted(s.rank for s in dump.stacks) == [0, 1, 2, 3]
    native = typed({"type": "stacks", "id": "h1", "native": True,
                    "ranks": {"\u00b2": {"pyspy": {"text": "x"}}}}, None)
    flight = typed({"type": "flight", "files": {"\u00b2": "AAAA"}}, None)
    assert native == Stacks(None, id="h1", native=True) and flight == Flight(None)
    w.on_stacks(SimpleNamespace(label="n2"), native)  # type: ignore[arg-type]
    w.on_flight(SimpleNamespace(label="n2"), flight)  # type: ignore[arg-type]


def test_an_exception_in_the_watch_is_told_and_the_watch_goes_on(tmp_path: Path) -> None:
    say: list[str] = []
    w = _watch(tmp_path, say)
    calls = []

    def look(now: float, due: float, tick: float) -> None:
        calls.append(now)
        raise ValueError("invalid literal for int() with base 10: '\u00b2'")

    w.watch.look = look

    async def main() -> None:
        task = asyncio.create_task(w.run())
        await asyncio.sleep(1.3)
        assert not task.done()  # still watching
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())
    assert len(calls) >= 2
    told = [line for line in say if "hang watch failed" in line]
    assert len(told) == 1 and "ValueError" in told[0] and "goes on watching" in told[0], say


# -- dtrain's own lines quote a node inertly, on a pipe too -----------------------------------

def test_failed_summary_and_restart_lines_are_inert_on_a_pipe() -> None:
    from launcher.models import OutputLine
    from launcher.output.console import Console

    out = io.StringIO()  # a pipe: no terminal
    console = Console(out, color=False)
    evil = "r3: ValueError: \x1b]52;c;cHduZWQ=\x07\x1b[2J\x1b[1;1Hok\r"
    console.write([OutputLine("", "dtrain", f"FAILED: {evil}", None, None, 1.0),
                   OutputLine("node2", "dtrain", f"restarting: {evil}", None, None, 1.0),
                   OutputLine("node2", "out", f"raw {evil}", 0, 0, 1.0)])
    text = out.getvalue()
    own = [line for line in text.splitlines() if "FAILED" in line or "restarting" in line]
    assert len(own) == 2 and all("\x1b" not in line and "\x07" not in line and "\r" not in line
                                 and "^[]52;c;cHduZWQ=^G" in line for line in own), text
    assert "raw r3: ValueError: \x1b]52" in text  # the node's own output: as it was sent


# -- the report's arithmetic -----------------------------------------------------------------

def test_huge_values_still_give_a_page_and_valid_json(tmp_path: Path) -> None:
    from tests.report_archives import line, write_archive
    from tests.util import dtrain

    run = write_archive(tmp_path / "r1", {"hosts": ["node1"], "world_size": 2},
                        [line(t, "node1", r, f"step={t} loss=1.7e308 lr=1e308")
                         for t in (1, 2, 3) for r in (0, 1)],
                        samples=[{"t": 1_800_000_000.0 + t, "host": "node1", "cpu": 1e308,
                                  "gpus": [{"util": 1e308, "mem": 1e308, "mem_total": 1e308}]}
                                 for t in (1, 2, 3)])
    res = dtrain(["report", str(run), "-o", str(tmp_path / "p.html")])
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert (tmp_path / "p.html").stat().st_size > 0
    res = dtrain(["report", str(run), "--json"])
    assert res.returncode == 0, res.stderr
    assert not re.search(r"\b(Infinity|NaN)\b", res.stdout)
    doc = json.loads(res.stdout)
    (loss,) = [c for c in doc["runs"][0]["curves"] if c["name"] == "loss"]
    assert loss["mean"]["1"]["v"] == [1.7e308] * 3




# -- logs --prune touches only dtrain's runs ----------------------------------------------------

def test_prune_deletes_only_provable_runs_by_descriptor(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import os
    import time

    from launcher.commands.runs import prune
    from launcher.output.archive import RunArchive

    archive_dir = tmp_path / "runs"
    archive_dir.mkdir()
    old = time.time() - 90 * 86400
    run = RunArchive.create(archive_dir, "20260101-000000-abcd")
    run.update_meta(hosts=["n1"], world_size=1, start=old, end=old + 60, exit_code=0)
    run.close()
    deep = run.path / "stacks" / "h1"
    deep.mkdir(parents=True)
    (deep / "r0.txt").write_bytes(b"x" * 300_000)
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    os.symlink(outside, run.path / "link")  # never followed: only the link goes
    # a project directory with an old meta.json, and look-alikes without dtrain's own keys
    for name, meta in (("myproject", {"end": old, "run_id": "myproject"}),
                       ("20260101-000000-ffff", {"end": old, "archive_version": 1,
                                                 "created_ts": old, "run_id": "other"}),
                       ("20260101-000000-eeee", {"end": old, "run_id": "20260101-000000-eeee"})):
        d = archive_dir / name
        d.mkdir(mode=0o700)
        (d / "meta.json").write_text(json.dumps(meta))
        (d / "output.jsonl").write_text("")
        (d / "notes.txt").write_text("mine")
    prune(archive_dir, 30 * 86400)
    err = capsys.readouterr()[1]
    assert "deleted 1 run (29" in err, err  # the whole run: its stacks too
    assert sorted(p.name for p in archive_dir.iterdir()) == [
        "20260101-000000-eeee", "20260101-000000-ffff", "myproject"]
    assert (outside / "keep.txt").read_text() == "keep"


# -- dtrain nodes: the lemon file's text and times ---------------------------------------------

def test_nodes_shows_lemon_text_inert_and_survives_a_huge_until(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from launcher.commands.nodes import list_nodes
    from launcher.job.lemons import LemonStore

    store = LemonStore(tmp_path / "state")
    (tmp_path / "state").mkdir(mode=0o700)
    store.path.write_text(json.dumps({"lemons_version": 1, "lemons": [
        {"host": "node3", "why": "hang \x1b]52;c;cHduZWQ=\x07\x1b[2J", "run_id": "r\x1b[1A",
         "t": 1_800_000_000.0, "until": 1e300},
        {"host": "node4", "why": "oom", "run_id": "r", "t": 1_800_000_000.0,
         "until": float("inf")}]}).replace("Infinity", "1e999"))
    assert list_nodes(store=store) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "^[]52;c;cHduZWQ=^G" in out, out
    assert list_nodes(store=store, as_json=True) == 0
    doc = json.loads(capsys.readouterr().out)  # valid JSON: no Infinity
    assert [n["host"] for n in doc["nodes"]] == ["node3", "node4"]


# -- the sampler's lines -----------------------------------------------------------------------

def test_a_sampler_s_deep_nan_and_foreign_lines_change_nothing() -> None:
    """A line nested past the recursion limit is dropped (the channel goes on), NaN and
    Infinity arrive as null (samples.jsonl stays JSON), another host's ranks are gone."""
    from launcher.job.sampling import NodeSampler, SamplerParams

    got: list[dict[str, Any]] = []
    conn = SimpleNamespace(host=SimpleNamespace(label="n2"))
    s = NodeSampler(conn, SamplerParams(ranks=(2, 3)), lambda h, m: got.append(m))  # type: ignore[arg-type]
    s._line(b'{"type": "sample", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    s._line(b'{"type": "sample", "t": NaN, "cpu": Infinity, "mem": -Infinity, '
            b'"ranks": {"0": {"cpu": 5.0}, "2": {"cpu": NaN}, "3": {"cpu": 1e999}}}')
    (msg,) = got
    assert msg["cpu"] is None and msg["mem"] is None and "t" not in msg
    assert msg["ranks"] == {"2": {}, "3": {}}
    json.dumps(msg, allow_nan=False)


def test_a_node_sending_nan_or_huge_cpu_does_not_make_an_honest_node_a_straggler(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """node2's sampler says NaN, then 1e300 CPU seconds for its ranks (a broken or lying
    sampler): honest node1, as busy as ever, is not flagged against them."""
    from launcher.commands import run_sampling
    from launcher.commands.run_sampling import RunSampling
    from launcher.decide.outcome.stragglers import StragglerDetector, StragglerSettings
    from launcher.job.sampling import NodeSampler, SamplerParams

    said: list[str] = []
    rs = RunSampling.__new__(RunSampling)
    rs.node_ranks, rs.log, rs.say = {"node1": 0, "node2": 1}, None, said.append
    rs.detector = StragglerDetector(StragglerSettings(window=4.0, hold=2.0))
    rs._record = lambda: None  # type: ignore[method-assign]
    samplers = {h: NodeSampler(SimpleNamespace(host=SimpleNamespace(label=h)),  # type: ignore[arg-type]
                               SamplerParams(ranks=ranks), rs.on_sample)
                for h, ranks in (("node1", (0, 1)), ("node2", (2, 3)))}
    clock = [0.0]
    monkeypatch.setattr(run_sampling, "time", SimpleNamespace(time=lambda: clock[0]))
    for i in range(30):
        t = clock[0] = 1_800_000_000.0 + i
        for r in (0, 1):
            samplers["node1"]._line(json.dumps({"type": "sample", "t": t, "ranks": {
                str(r): {"cpu": 0.9 * i}}}).encode())
        bad = "NaN" if i < 15 else "1e300"
        cpu = f'{{"cpu": {bad}}}'
        samplers["node2"]._line(f'{{"type": "sample", "t": {t!r}, "ranks": {{"2": {cpu}, '
                                f'"3": {cpu}}}}}'.encode())
    assert said == [] and not rs.detector.flagged, said


def test_exec_s_own_lines_quote_a_node_inertly_on_a_pipe() -> None:
    """exec's fast path: "node3: remote shell exited ..." carries the node's last stderr line."""
    from launcher.output.fastout import ExecOutput

    out, err = io.BytesIO(), io.BytesIO()
    fast = ExecOutput(["node3"], color=False, out=out, err=err)  # type: ignore[arg-type]
    fast.say("node3", "banner \x1b]52;c;cHduZWQ=\x07\x1b[2J")
    fast.close()
    assert err.getvalue() == b"dtrain: node3: banner ^[]52;c;cHduZWQ=^G^[[2J\n"


def test_with_a_dynamic_rendezvous_a_host_claims_as_many_ranks_as_it_runs() -> None:
    """--rdzv c10d: torchrun numbers the ranks; each rank is one host's (the first to name
    it), and no host speaks for more ranks than it runs."""
    from launcher.job import nodemsg

    static = nodemsg.rank_owners({"n1": [0, 1], "n2": [2, 3]}, planned=True)
    assert 2 in static["n2"] and 0 not in static["n2"]
    owners = nodemsg.rank_owners({"n1": [0, 1], "n2": [2, 3]}, planned=False)
    n1, n2 = owners["n1"], owners["n2"]
    assert 0 in n2 and 3 in n2  # torchrun gave node2 ranks 0 and 3
    assert 1 not in n2 and 4 not in n1 and -1 not in n1 and True not in n1  # its count, world
    assert 0 not in n1 and 1 in n1 and 2 in n1 and 0 in n2  # once claimed, one host's
    msg = {"type": "stacks", "ranks": {"0": {}, "1": {}, "2": {}, "3": {}}}
    from launcher.job.events import Stacks, typed

    ev = typed(msg, n1)
    assert isinstance(ev, Stacks) and sorted(ev.ranks) == [1, 2]
