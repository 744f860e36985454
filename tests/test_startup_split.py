"""Where start-up goes (decide/outcome/startup.py, docs/goodput.md): the ledger's ``startup`` split
per
attempt and node into connect_probe, agent_start, rendezvous, rank_start and script, whose
sum is ``startup``; and the node side that reports the instants (the agent's line, the rank's
arm, the supervisor's rank_start and rank_exit), run here through the real bootstrap."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from launcher.commands.startup import StartupClock
from launcher.decide.outcome import startup
from launcher.decide.outcome.goodput import ledger_of
from launcher.decide.outcome.outcomes import RankEnd
from launcher.job.events import Hello, RankExit, RankStart, decode
from launcher.models import Host
from launcher.nodeside import rankshim
from tests.test_goodput import ckpt_run, rec
from tests.test_supervisor import py, sups  # noqa: F401

NODES_A1 = [{"host": "n1", "supervisor": 1000.0, "agent": 1001.5, "rank_start": 1002.0,
             "script": 1002.25},
            {"host": "n2", "supervisor": 1000.5, "agent": 1001.0, "rank_start": 1002.0,
             "script": None}]
NODES_A2 = [{"host": "n1", "supervisor": 1043.0, "agent": 1044.0, "rank_start": 1045.0,
             "script": 1046.0}]


def restarted(startup_records: list[dict[str, Any]] | None) -> Any:
    a1, a2 = ckpt_run()
    meta = {"start": 1000.0, "end": 1100.0, "state": "finished", "exit_code": 0,
            "attempts": [{"n": 1, "start": 999.0, "end": 1040.0, "detected": 1035.0,
                          "relaunched": 1042.0},
                         {"n": 2, "start": 1042.0, "end": 1100.0}]}
    if startup_records is not None:
        meta["startup"] = startup_records
    return ledger_of(meta, [*a1, *a2])


def test_each_attempt_s_startup_splits_by_hand_and_sums_to_it() -> None:
    led = restarted([{"attempt": 1, "nodes": NODES_A1}, {"attempt": 2, "nodes": NODES_A2}])
    a1, a2 = led.attempts
    assert a1.startup_split is not None and a2.startup_split is not None
    # attempt 1 starts at 999 (its own start), its first progress is at 1005
    assert a1.startup_split["node"] == "n1"  # the reference rank's (rank 0) node
    assert a1.startup_split["seconds"] == {"connect_probe": 1.0, "agent_start": 1.5,
                                           "rendezvous": 0.5, "rank_start": 0.25,
                                           "script": 2.75, "unsplit": 0.0}
    # n2 never said when its script started: the two parts it bounds are not measured,
    # their time is unsplit, never guessed
    assert a1.startup_split["nodes"]["n2"] == {"connect_probe": 1.5, "agent_start": 0.5,
                                               "rendezvous": 1.0, "rank_start": None,
                                               "script": None, "unsplit": 3.0}
    # attempt 2: 1042 -> 1048, its restore (1048 -> 1050) carved out of start-up already
    assert a2.startup_split["seconds"] == {"connect_probe": 1.0, "agent_start": 1.0,
                                           "rendezvous": 1.0, "rank_start": 1.0,
                                           "script": 2.0, "unsplit": 0.0}
    for a in led.attempts:
        assert a.startup_split is not None
        for parts in a.startup_split["nodes"].values():
            assert sum(v or 0.0 for v in parts.values()) == pytest.approx(a.seconds["startup"])
    assert led.startup_split == pytest.approx({"connect_probe": 2.0, "agent_start": 2.5,
                                               "rendezvous": 1.5, "rank_start": 1.25,
                                               "script": 4.75, "unsplit": 0.0})
    assert sum(led.startup_split.values()) == pytest.approx(led.totals["startup"] or 0.0)
    doc = led.json()
    assert doc["startup_split"]["script"] == 4.75
    assert doc["attempts"][0]["startup_split"]["nodes"]["n2"]["rank_start"] is None


def test_a_checkpoint_restore_inside_startup_comes_out_of_the_part_it_falls_in() -> None:
    # a restore line 2 s after the line before it, inside the script's part
    recs = [rec(1001.0, "loading data"), rec(1003.0, "restored checkpoint from /ckpt/last.pt"),
            *[rec(1004.0 + s, f"step {s}") for s in range(5)]]
    meta = {"start": 1000.0, "end": 1010.0, "state": "finished", "exit_code": 0,
            "startup": [{"attempt": 1, "nodes": [
                {"host": "n1", "supervisor": 1000.2, "agent": 1000.5, "rank_start": 1000.6,
                 "script": 1000.7}]}]}
    led = ledger_of(meta, recs)
    a = led.attempts[0]
    assert a.seconds["startup"] == pytest.approx(2.0) and a.seconds["checkpoint_restore"] == 2.0
    assert a.startup_split is not None
    assert a.startup_split["seconds"] == pytest.approx({
        "connect_probe": 0.2, "agent_start": 0.3, "rendezvous": 0.1, "rank_start": 0.1,
        "script": 1.3, "unsplit": 0.0})


def test_instants_out_of_order_or_outside_startup_are_kept_in_order() -> None:
    """A node's clock slightly behind or ahead (an offset inside the probe's round trip)
    never gives a negative part: each instant is held between the one before and the end."""
    segs = [(100.0, 110.0)]
    parts = startup.split(100.0, segs, {"supervisor": 99.0, "agent": 103.0,
                                        "rank_start": 102.5, "script": 111.0})
    assert parts == {"connect_probe": 0.0, "agent_start": 3.0, "rendezvous": 0.0,
                     "rank_start": 7.0, "script": 0.0, "unsplit": 0.0}
    assert all(v is None or v >= 0 for v in parts.values())


def test_no_instants_no_split_and_old_archives_read_as_before() -> None:
    led = restarted(None)
    assert all(a.startup_split is None for a in led.attempts)
    assert led.startup_split is None and led.json()["startup_split"] is None
    # one attempt recorded, the other not: the run's split puts that one's start-up in
    # unsplit, and the parts still sum to startup
    led = restarted([{"attempt": 2, "nodes": NODES_A2}])
    assert led.attempts[0].startup_split is None and led.startup_split is not None
    assert led.startup_split["unsplit"] == pytest.approx(6.0)
    assert sum(v or 0.0 for v in led.startup_split.values()) == \
        pytest.approx(led.totals["startup"] or 0.0)


def test_the_clock_offset_is_doctor_s() -> None:
    assert startup.clock_offset(5.0, 4.0, 6.0) == 0.0  # inside the round trip: 0
    assert startup.clock_offset(9.0, 4.0, 6.0) == 3.0  # ahead
    assert startup.clock_offset(1.0, 4.0, 6.0) == -3.0  # behind
    assert startup.to_launcher(103.0, 3.0) == 100.0 and startup.to_launcher(None, 1.0) is None


def test_the_observer_records_each_node_s_first_instants_on_the_launcher_clock() -> None:
    n1, n2 = Host("n1"), Host("n2")
    clock = StartupClock(["n1", "n2"], {"n1": (2.0, 0.01)})
    clock.on_hello(n1, Hello(102.0, pid=1))
    clock.on_hello(n2, Hello(None, error="no such file"))
    clock.on_rank_start(n1, RankStart(106.0, rank=1, agent=None))
    clock.on_rank_start(n1, RankStart(105.0, rank=0, agent=104.0))
    clock.on_rank_exit(n1, RankExit(130.0, RankEnd(0, code=0, script=107.5, t=130.0)))
    clock.on_rank_exit(n1, RankExit(131.0, RankEnd(1, code=0, script=107.0, t=131.0)))
    rec1 = clock.record(3)
    assert rec1["attempt"] == 3
    assert rec1["nodes"][0] == {"host": "n1", "supervisor": 100.0, "agent": 102.0,
                                "rank_start": 103.0, "script": 105.0, "clock_offset": 2.0,
                                "clock_slack": 0.01}
    assert rec1["nodes"][1]["supervisor"] is None and rec1["nodes"][1]["clock_offset"] is None
    kept = clock.meta([{"attempt": 1, "nodes": []}, {"attempt": 3, "nodes": ["old"]}], 3)
    assert [r["attempt"] for r in kept] == [1, 3] and kept[1]["nodes"][0]["host"] == "n1"


def test_the_messages_carry_the_node_instants_checked() -> None:
    ev = decode(json.dumps({"type": "rank_start", "rank": 0, "t": 5.0, "agent_t": 4.0}), {0})
    assert isinstance(ev, RankStart) and ev.agent == 4.0
    ev = decode(json.dumps({"type": "rank_start", "rank": 0, "t": 5.0, "agent_t": 1e300}), {0})
    assert isinstance(ev, RankStart) and ev.agent is None  # not a time: left out
    ev = decode(json.dumps({"type": "rank_exit", "rank": 0, "code": 0, "script_t": 6.5}), {0})
    assert isinstance(ev, RankExit) and ev.end.script == 6.5


# -- the node side, through the real bootstrap --------------------------------------------------

def test_the_supervisor_reports_agent_rank_start_and_script_in_order(
        sups, tmp_path: Path) -> None:  # noqa: F811
    script = tmp_path / "worker.py"
    script.write_text("print('hello from', __import__('os').environ['RANK'])\n")
    # a torchrun stand-in: says it is up as the agent line does, then spawns two ranks
    agent = py(f"""
        import json, os, socket, subprocess, sys, time
        time.sleep(0.2)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(os.environ['{rankshim.SHIM_ENV}'])
        s.sendall(json.dumps({{'stream': 'agent', 'pid': os.getpid(),
                               't': time.time()}}).encode() + b'\\n')
        s.close()
        time.sleep(0.2)
        procs = [subprocess.Popen([sys.executable, '-u', sys.argv[1], {str(script)!r}],
                                  env={{**os.environ, 'RANK': str(r)}}) for r in (0, 1)]
        sys.exit(max(p.wait() for p in procs))
    """) + [rankshim.SHIM_PLACEHOLDER]
    s = sups({"argv": agent, "rank_shim": True})
    assert s.wait() == 0
    hello = s.message("hello")
    starts = [m for m in s.msgs if m.get("type") == "rank_start"]
    exits = [m for m in s.msgs if m.get("type") == "rank_exit"]
    assert len(starts) == 2 and len(exits) == 2
    first = min(m["t"] for m in starts)
    agent_t = starts[0]["agent_t"]
    script_t = min(m["script_t"] for m in exits)
    assert hello["t"] + 0.2 <= agent_t <= first - 0.2 and first <= script_t
    assert all(m["script_t"] <= m["t"] for m in exits)


def test_the_agent_line_tells_the_supervisor_then_runs_torchrun(tmp_path: Path) -> None:
    """TORCHRUN_ISOLATED with a stand-in torch: the ``agent`` header once torch's launcher
    is imported, then torch.distributed.run as __main__ (no runpy warning on stderr)."""
    pkg = tmp_path / "torch" / "distributed" / "launcher"
    pkg.mkdir(parents=True)
    for d in (tmp_path / "torch", tmp_path / "torch" / "distributed", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "api.py").write_text("")
    (tmp_path / "torch" / "distributed" / "run.py").write_text(
        "if __name__ == '__main__':\n    print('torchrun ran')\n")
    import socket

    path = str(tmp_path / "s.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), rankshim.SHIM_ENV: path}
    proc = subprocess.run([sys.executable, "-c", rankshim.TORCHRUN_ISOLATED], env=env,
                          capture_output=True, text=True, timeout=30, check=False)
    conn, _ = listener.accept()
    header = json.loads(conn.makefile().readline())
    conn.close()
    listener.close()
    assert proc.returncode == 0 and proc.stdout == "torchrun ran\n" and proc.stderr == ""
    assert header["stream"] == "agent" and isinstance(header["t"], float)


def test_the_node_programs_stay_python38(tmp_path: Path) -> None:
    import ast

    for name in ("rankshim.py", "nodeevidence.py", "supervisor.py"):
        source = (Path(rankshim.__file__).parent / name).read_text()
        ast.parse(source, feature_version=(3, 8))
    ast.parse(textwrap.dedent(rankshim.TORCHRUN_ISOLATED), feature_version=(3, 8))


def test_the_report_shows_the_split_per_attempt_and_node() -> None:
    from launcher.output.runreport.ledger import startup_table

    doc = restarted([{"attempt": 1, "nodes": NODES_A1},
                     {"attempt": 2, "nodes": NODES_A2}]).json()
    html = startup_table(doc)
    assert "Where start-up went" in html and "attempt 1 (n1)" in html
    assert '<tr data-part="rendezvous"><th>rendezvous</th>' in html
    assert "attempt 1, per node" in html and "attempt 2, per node" not in html  # one node
    assert startup_table(restarted(None).json()) == ""  # an older archive: nothing


def test_the_run_s_parts_sum_to_startup_when_an_attempt_missed_a_part() -> None:
    a = {"seconds": {"connect_probe": 1.0, "agent_start": 1.0, "rendezvous": 1.0,
                     "rank_start": None, "script": None, "unsplit": 3.0}}
    b = {"seconds": {"connect_probe": 1.0, "agent_start": 1.0, "rendezvous": 1.0,
                     "rank_start": 1.0, "script": 2.0, "unsplit": 0.0}}
    run = startup.total([(a, 6.0), (b, 6.0)])
    assert run == {"connect_probe": 2.0, "agent_start": 2.0, "rendezvous": 2.0,
                   "rank_start": None, "script": None, "unsplit": 6.0}
    assert sum(v or 0.0 for v in run.values()) == 12.0
