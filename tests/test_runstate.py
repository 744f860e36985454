"""output/runstate.py's pure half: a run's state from its meta.json and lock, the `ps`
table, which runs `ps` shows and `logs --prune` deletes, ages (the archive reading half is
tests/test_runs.py)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from launcher.output.runstate import (
    PS_RECENT,
    RunStatus,
    age,
    parse_age,
    prunable,
    ps_json,
    render_table,
    shown_runs,
    status_of,
)

LOST_NOTE = ("the launcher died without recording an end (kill -9, reboot); its nodes stopped "
             "the job by themselves (connection closed, or no heartbeat from the launcher for "
             "{}")


def test_every_field_of_a_live_run_from_its_meta_and_lock() -> None:
    meta = {"run_id": "r7", "state": "running", "hosts": ["n1", 3, "n2"], "world_size": 4,
            "start": 100.5, "kind": "smoke", "attempt": 2, "outcome": None,
            "launcher": {"pid": 1, "host": "old", "heartbeat_timeout": 5,
                         "launcher_timeout": 15.0}}
    st = status_of(Path("/a/dir-name"), meta, {"pid": 42, "host": "login1", "detached": 1},
                   last_line_t=120.0)
    assert st == RunStatus(
        run_id="r7", path=Path("/a/dir-name"), state="running", alive=True, exit_code=None,
        outcome=None, pid=42, launcher_host="login1", detached=True, hosts=("n1", "n2"),
        world_size=4, created=100.5, ended=None, last_line_t=120.0, heartbeat_timeout=5.0,
        launcher_timeout=15.0, attempt=2, kind="smoke")
    assert st.label == "running (attempt 2)" and st.note is None


def test_a_lost_launcher_s_fields_come_from_meta_and_wrong_types_are_dropped() -> None:
    meta = {"hosts": "n1", "world_size": True, "exit_code": None, "created_ts": 7,
            "outcome": 3, "launcher": {"pid": "9", "host": 5, "heartbeat_timeout": "5"},
            "command": ["dtrain", "smoke", "-H", "x"]}
    st = status_of(Path("/a/r-dir"), meta, None)
    assert (st.run_id, st.state, st.alive, st.exit_code, st.pid, st.launcher_host,
            st.detached, st.hosts, st.world_size, st.created, st.outcome,
            st.heartbeat_timeout, st.kind) == (
        "r-dir", "finished", False, None, None, None, False, (), None, 7.0, None, None,
        "smoke")
    st = status_of(Path("/a/r"), {"launcher": ["not", "a", "dict"], "end": 0}, None)
    assert st.state == "launcher lost"  # an end of 0 is no end
    assert st.note == LOST_NOTE.format("3 x --heartbeat-timeout)")
    st = status_of(Path("/a/r"), {"launcher": {"pid": 4, "detached": True}}, None)
    assert (st.pid, st.detached) == (4, True)  # recorded by the launcher that is gone


@pytest.mark.parametrize(("meta", "kind"), [
    ({"kind": "smoke"}, "smoke"),
    ({"kind": "", "command": ["dtrain", "smoke"]}, "smoke"),
    ({"command": ["dtrain", "run", "x.py"]}, "run"),
    ({"command": ["dtrain", "exec"]}, "run"),
    ({"command": ["smoke"]}, "run"),
    ({"command": "dtrain smoke"}, "run"),
    ({}, "run"),
])
def test_the_kind_is_meta_s_or_the_recorded_subcommand(meta: dict, kind: str) -> None:
    assert status_of(Path("/r"), meta, None).kind == kind


def test_the_attempt_between_attempts_is_the_next_one() -> None:
    lock = {"pid": 1}
    meta = {"state": "restarting", "attempt": 2, "next_attempt": {"n": 3, "at": 5.0}}
    assert status_of(Path("/r"), meta, lock).attempt == 3
    assert status_of(Path("/r"), {**meta, "next_attempt": 3}, lock).attempt == 2
    assert status_of(Path("/r"), {**meta, "state": "running"}, lock).attempt == 2
    assert status_of(Path("/r"), {"state": "bogus"}, lock).state == "starting"


@pytest.mark.parametrize(("state", "exit_code", "attempt", "label"), [
    ("finished", 0, None, "finished (0)"),
    ("finished", 3, 1, "finished (3)"),
    ("finished", 3, 2, "finished (3, attempt 2)"),
    ("finished", None, None, "finished"),
    ("finished", None, 4, "finished (attempt 4)"),
    ("running", None, 1, "running"),
    ("restarting", None, 3, "restarting (attempt 3)"),
])
def test_labels(state: str, exit_code: int | None, attempt: int | None, label: str) -> None:
    assert RunStatus("r", Path("/r"), state, False, exit_code=exit_code,
                     attempt=attempt).label == label


def test_the_lost_note_says_how_long_the_nodes_waited() -> None:
    st = RunStatus("r", Path("/r"), "launcher lost", False, heartbeat_timeout=5.0)
    assert st.note == LOST_NOTE.format("5 s)")
    st = RunStatus("r", Path("/r"), "launcher lost", False, heartbeat_timeout=5.0,
                   launcher_timeout=15.5)
    assert st.note == LOST_NOTE.format("15.5 s)")
    assert RunStatus("r", Path("/r"), "finished", False, heartbeat_timeout=5.0).note is None


def test_the_ps_table_whole() -> None:
    here = socket.gethostname()
    runs = [
        RunStatus("r1", Path("/a/r1"), "running", True, pid=10, launcher_host=here,
                  hosts=("n1", "n2"), world_size=4, created=1000.0, last_line_t=1090.0),
        RunStatus("r2", Path("/a/r2"), "running", True, pid=11, launcher_host="elsewhere",
                  detached=True, created=400.0, kind="smoke"),
        RunStatus("r3\x1b[2J", Path("/a/r3"), "launcher lost", False, pid=12,
                  heartbeat_timeout=5.0, world_size=0),
        RunStatus("r4", Path("/a/r4"), "finished", False, exit_code=1, pid=13,
                  last_line_t=0.0),
    ]
    runs[3] = RunStatus("r4", Path("/a/r4"), "finished", False, exit_code=1, pid=13,
                        last_line_t=0.0, goodput=0.874, fabric="socket 2/4")
    assert render_table(runs, now=1100.0) == (
        "RUN ID   KIND   STATE          NODES  RANKS  FABRIC      AGE     LAST LINE  GOODPUT  "
        "LAUNCHER\n"
        "r1       run    running        2      4      -           1m40s   10s ago    -        "
        "pid 10\n"
        "r2       smoke  running        -      -      -           11m40s  -          -        "
        "pid 11 detached on elsewhere\n"
        "r3^[[2J  run    launcher lost  -      0      -           -       -          -        -\n"
        "r4       run    finished (1)   -      -      socket 2/4  -       -          87%      -\n"
        "r3^[[2J: launcher lost: " + LOST_NOTE.format("5 s)") + "\n")
    assert render_table([], now=0.0) == (
        "RUN ID  KIND  STATE  NODES  RANKS  FABRIC  AGE  LAST LINE  GOODPUT  LAUNCHER\n")


def test_ps_fabric_cell_from_meta() -> None:
    from launcher.output.runstate import fabric_cell

    assert fabric_cell(None) is None and fabric_cell({"transports": {}}) is None
    assert fabric_cell({"transports": {"0": "gdr", "1": "gdr"}}) == "gdr"
    assert fabric_cell({"transports": {"0": "gdr", "1": "socket", "2": "socket",
                                       "3": "rdma"}}) == "socket 2/4"


def test_ps_json_lists_every_field() -> None:
    run = RunStatus("r1", Path("/a/r1"), "running", True, pid=10, launcher_host="h",
                    hosts=("n1",), world_size=2, created=1.0, attempt=2, kind="smoke")
    doc = ps_json([run], Path("/a"))
    assert doc["ps_version"] == 1 and doc["archive_dir"] == "/a"
    assert doc["host"] == socket.gethostname() and isinstance(doc["now"], float)
    assert doc["runs"] == [{
        "run_id": "r1", "path": "/a/r1", "state": "running", "alive": True,
        "exit_code": None, "outcome": None, "launcher_pid": 10, "launcher_host": "h",
        "detached": False, "hosts": ["n1"], "nodes": 1, "world_size": 2, "created": 1.0,
        "ended": None, "last_line_t": None, "note": None, "attempt": 2, "kind": "smoke",
        "goodput": None, "fabric": None, "goodput_meaningful": False}]


def test_ps_shows_every_live_run_and_the_newest_of_the_others() -> None:
    done = [RunStatus(f"d{i}", Path("/d"), "finished", False) for i in range(PS_RECENT + 3)]
    live = RunStatus("live", Path("/l"), "running", True)
    runs = [done[0], live, *done[1:]]
    shown, left_out = shown_runs(runs)
    assert PS_RECENT == 20
    assert [r.run_id for r in shown] == ["live"] + [f"d{i}" for i in range(3, PS_RECENT + 3)]
    assert left_out == 3
    assert shown_runs(runs, show_all=True) == (runs, 0)
    assert shown_runs(done[:PS_RECENT]) == (done[:PS_RECENT], 0)


@pytest.mark.parametrize(("text", "seconds"), [
    ("45", 45.0), ("45s", 45.0), ("90m", 5400.0), ("12h", 43200.0), ("30d", 2592000.0),
    ("2w", 1209600.0), (" 1.5 h ", 5400.0), ("0", 0.0),
])
def test_parse_age(text: str, seconds: float) -> None:
    assert parse_age(text) == seconds


@pytest.mark.parametrize("text", ["", "d", "1y", "-1d", "1.d", "1 d x", "1e3"])
def test_parse_age_refuses_what_is_no_duration(text: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_age(text)
    assert str(err.value) == f"{text!r}: expected a duration like 30d, 12h, 90m or 3600"


def test_prune_takes_old_runs_that_are_not_live() -> None:
    runs = [
        RunStatus("ended-old", Path("/"), "finished", False, ended=100.0, created=0.0),
        RunStatus("ended-new", Path("/"), "finished", False, ended=950.0, created=0.0),
        RunStatus("at-the-limit", Path("/"), "finished", False, ended=900.0),
        RunStatus("lost-old", Path("/"), "launcher lost", False, last_line_t=50.0,
                  created=950.0),
        RunStatus("created-old", Path("/"), "launcher lost", False, created=10.0),
        RunStatus("no-times", Path("/"), "launcher lost", False),
        RunStatus("live-old", Path("/"), "running", True, created=0.0),
    ]
    assert [r.run_id for r in prunable(runs, 100.0, now=1000.0)] == [
        "ended-old", "lost-old", "created-old"]


@pytest.mark.parametrize(("seconds", "text"), [
    (-5, "0s"), (0, "0s"), (59.9, "59s"), (60, "1m00s"), (65, "1m05s"), (3599, "59m59s"),
    (3600, "1h00m"), (3660, "1h01m"), (86399, "23h59m"), (86400, "1d00h"),
    (90000, "1d01h"), (10 * 86400 + 7200, "10d02h"),
])
def test_age_at_each_unit_s_edges(seconds: float, text: str) -> None:
    assert age(seconds) == text


def test_a_finished_run_s_code_outcome_and_end_come_from_meta() -> None:
    meta = {"run_id": "r", "exit_code": 3, "end": 50.5, "outcome": "rank 1 on n2 exited 3"}
    st = status_of(Path("/r"), meta, None)
    assert (st.state, st.exit_code, st.ended, st.outcome, st.label) == (
        "finished", 3, 50.5, "rank 1 on n2 exited 3", "finished (3)")
    st = status_of(Path("/r"), {"end": 50.5}, {"pid": 1})  # an end without a code
    assert (st.state, st.exit_code, st.ended, st.label) == ("finished", None, 50.5, "finished")


def test_the_table_s_ages_are_from_now_when_no_time_is_given() -> None:
    import time
    run = RunStatus("r", Path("/r"), "finished", False, created=time.time() - 2 * 86400 - 60)
    assert "  2d00h  " in render_table([run])
