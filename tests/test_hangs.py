"""Hangs, without the cluster: progress rules, faulthandler parsing, folding, the culprit,
the flight recorder's summary and the rank wrapper's fidelity to ``python SCRIPT``.

The recorded dumps in tests/data/hangs/ are real faulthandler output of the rank wrapper
(tests/workloads/hang.py on 2 ranks: rank 0 in all_reduce, rank 1 in time.sleep).
"""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.decide import flight, hang, stacks
from launcher.models import OutputLine
from launcher.nodeside import supervisor

DATA = Path(__file__).parent / "data" / "hangs"
SHIM = Path(supervisor.__file__)


def _stack(rank: int, host: str, name: str, **sources: str) -> stacks.RankStack:
    return stacks.rank_stack(rank, host, {"text": (DATA / name).read_text(),
                                          "sources": sources})


SLEEP_SRC = {"/work/wt-hangs/tests/workloads/hang.py:42": "time.sleep(3600)"}


# -- faulthandler dumps -------------------------------------------------------------------

def test_main_thread_is_the_users_without_the_wrapper_and_its_helper() -> None:
    s = stacks.rank_stack(1, "node3", {"text": (DATA / "sleep.txt").read_text(),
                                       "sources": SLEEP_SRC})
    assert [t.frames[0].func for t in s.threads] == ["load_batch"]  # helper thread left out
    assert [f.func for f in s.main] == ["load_batch", "main", "<module>"]
    assert s.place() == "time.sleep <- load_batch() hang.py:42"
    assert stacks.rank_stack(1, "n", {"text": (DATA / "sleep.txt").read_text()}).place() \
        == "load_batch() hang.py:42"  # no source line: the frame itself


def test_library_frames_show_the_call_and_the_first_user_frame() -> None:
    s = _stack(0, "node1", "allreduce.txt")
    assert s.place() == "all_reduce <- step_once() hang.py:47"


def test_a_second_dump_in_the_same_file_wins() -> None:
    text = (DATA / "allreduce.txt").read_text() + "\n" + (DATA / "sleep.txt").read_text()
    threads = stacks.user_threads(stacks.parse_faulthandler(text))
    assert stacks.main_frames(threads)[0].func == "load_batch"


# -- folding and the culprit --------------------------------------------------------------

def _six(stuck: int = 4) -> list[stacks.RankStack]:
    hosts = ["node1", "node1", "node2", "node2", "node3", "node3"]
    return [_stack(r, hosts[r], "sleep.txt" if r == stuck else "allreduce.txt", **SLEEP_SRC)
            for r in range(6)]


def test_fold_names_the_rank_that_differs() -> None:
    folded = stacks.fold(_six(), range(6))
    assert folded.lines() == [
        "ranks 0-3,5 (5): all_reduce <- step_once() hang.py:47",
        "rank 4 (node3): time.sleep <- load_batch() hang.py:42   <- likely culprit"]
    c = folded.culprit
    assert c is not None and (c.rank, c.host) == (4, "node3")
    assert c.json()["ranks"] == [4] and "the other 5 ranks'" in c.why


def test_no_culprit_when_every_rank_waits_alike() -> None:
    folded = stacks.fold(_six(stuck=-1), range(6))
    assert folded.culprit is None and len(folded.groups) == 1


def test_a_rank_without_a_dump_is_its_own_group_and_the_culprit() -> None:
    ranks = [*_six(stuck=-1)[:5], stacks.rank_stack(5, "node3", {"error": "no dump within 2 s"})]
    folded = stacks.fold(ranks, range(6))
    assert folded.culprit is not None and folded.culprit.rank == 5
    assert folded.lines()[1].startswith("rank 5 (node3): no stack (no dump within 2 s)")


def test_ranks_of_one_node_name_the_node() -> None:
    ranks = _six(stuck=-1)
    ranks[4] = _stack(4, "node3", "sleep.txt", **SLEEP_SRC)
    ranks[5] = _stack(5, "node3", "sleep.txt", **SLEEP_SRC)
    c = stacks.fold(ranks, range(6)).culprit
    assert c is not None and c.rank is None and c.host == "node3"
    assert c.describe().startswith("ranks 4-5 on node3: time.sleep")


def test_missing_ranks_are_listed() -> None:
    folded = stacks.fold(_six()[:4], range(6))
    assert folded.missing == (4, 5)
    assert folded.lines()[-1] == "ranks 4-5: no answer from their node"


# -- progress -------------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "step 12 loss 0.3", "Epoch 2/10", "{'loss': 0.3121, 'learning_rate': 1e-4}",
    "train_loss=0.3", "global_step=100", "iter: 3", " 45%|####5     | 45/100 [00:10<00:12]",
    "Epoch 0: 10%|#| 10/100 [00:01<00:09, 9.52it/s]", "it 3"])
def test_default_progress_matches_common_lines(text: str) -> None:
    assert hang.compile_progress(None).search(text)


@pytest.mark.parametrize("text", ["waiting for data", "stepping down", "NCCL INFO Bootstrap",
                                  "Loaded 3 shards"])
def test_default_progress_skips_other_lines(text: str) -> None:
    assert not hang.compile_progress(None).search(text)


def _line(t: float, text: str, rank: int = 0, stream: str = "out") -> OutputLine:
    return OutputLine("node1", stream, text, rank, 0, t)


def test_only_progress_lines_count_once_one_was_seen() -> None:
    policy = hang.HangPolicy(timeout=3)
    w = hang.ProgressWatch(hang.compile_progress(r"^it \d+"), range(2), start=100.0)
    w.observe([_line(101, "loading"), _line(102, "it 0")])
    w.observe([_line(t, "waiting for data") for t in (103, 104, 105, 106)])
    assert w.baseline() == 102 and w.ranks[0].last_line == 106
    assert hang.hang_due(w, 105.5, policy, all_alive=True, declared=None)
    assert not hang.hang_due(w, 105.5, policy, all_alive=False, declared=None)
    assert not hang.hang_due(w, 105.5, policy, all_alive=True, declared=102)  # said once
    w.observe([_line(107, "it 1", rank=1)])
    assert not hang.hang_due(w, 109, policy, all_alive=True, declared=102)
    assert hang.hang_due(w, 110.5, policy, all_alive=True, declared=102)  # a new stall


def test_before_any_progress_line_any_line_counts_and_startup_has_grace() -> None:
    policy = hang.HangPolicy(timeout=3, startup_grace=60)
    w = hang.ProgressWatch(hang.compile_progress(None), range(1), start=100.0)
    assert not hang.hang_due(w, 150, policy, all_alive=True, declared=None)  # importing
    assert hang.hang_due(w, 161, policy, all_alive=True, declared=None)  # never a line
    w.observe([_line(200, "downloading shards")])
    assert not hang.hang_due(w, 202, policy, all_alive=True, declared=None)
    assert hang.hang_due(w, 203.5, policy, all_alive=True, declared=None)
    assert not hang.hang_due(w, 1e9, hang.HangPolicy(timeout=0), all_alive=True,
                             declared=None)  # 0 = off


def test_bad_progress_pattern_is_a_usage_error() -> None:
    from launcher.errors import UsageError

    with pytest.raises(UsageError, match="--progress"):
        hang.compile_progress("(")


# -- the flight recorder ------------------------------------------------------------------

def _fr(enq: int, done: int) -> bytes:
    return pickle.dumps({"version": "2.10", "pg_status": {"0": {
        "last_enqueued_collective": enq, "last_started_collective": -1,
        "last_completed_collective": done}}, "entries": [
        {"pg_id": 0, "collective_seq_id": enq, "profiling_name": "gloo:all_reduce",
         "process_group": ("0", "default_pg")}]})


def test_flight_summary_names_the_rank_behind() -> None:
    dumps = {r: flight.load_dump(_fr(3, 3) if r == 4 else _fr(4, 3)) for r in range(6)}
    positions = {r: p for r, d in dumps.items() if d and (p := flight.rank_flight(r, d))}
    s = flight.summarize(positions)
    assert s is not None and s.behind == (4,)
    assert s.lines == ("ranks 0-3,5 wait in collective #4 (gloo:all_reduce)",
                       "rank 4 is at collective #3: it has not entered #4")


def test_a_dump_that_names_a_class_is_not_loaded() -> None:
    evil = pickle.dumps({"x": io.BytesIO})  # any global: os.system would be the same
    assert flight.load_dump(evil) is None
    assert flight.load_dump(b"not a pickle") is None


@pytest.mark.parametrize("version, names", [("2.13.0+cpu", "current"), ("2.9.1", "current"),
                                            ("2.5.1+cu124", "both"), (None, "both")])
def test_flight_names_follow_torch(version: str | None, names: str) -> None:
    assert flight.flight_names(version) == names


def test_flight_defaults_leave_a_users_settings_alone() -> None:
    d = "/tmp/dtrain-x/flight"
    assert supervisor.flight_defaults({"TORCH_NCCL_TRACE_BUFFER_SIZE": "100"}, d) == {}
    assert supervisor.flight_defaults({}, d) == {
        "TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_FR_DUMP_TEMP_FILE": d + "/rank_"}
    mine = supervisor.flight_defaults({"TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
                                       "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/x/"}, d, "both")
    assert mine == {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}


# -- the rank wrapper behaves as `python SCRIPT` ----------------------------------------

SCRIPT = '''import sys, os
print(repr(sys.argv), __name__, os.path.basename(__file__), sys.path[0] == os.path.dirname(
    os.path.realpath(__file__)), __spec__)
def f():
    raise ValueError("bad batch")
if len(sys.argv) > 1 and sys.argv[1] == "raise":
    f()
if len(sys.argv) > 1 and sys.argv[1] == "exit":
    sys.exit(3)
'''


@pytest.mark.parametrize("arg", ["ok", "raise", "exit"])
def test_rank_wrapper_runs_a_script_as_python_does(tmp_path: Path, arg: str) -> None:
    script = tmp_path / "user.py"
    script.write_text(SCRIPT)
    plain = subprocess.run([sys.executable, "-u", str(script), arg], capture_output=True,
                           text=True, cwd=tmp_path)
    sock = tmp_path / "ranks.sock"  # nobody listens: arming is best effort
    wrapped = subprocess.run([sys.executable, "-u", str(SHIM), str(script), arg],
                             capture_output=True, text=True, cwd=tmp_path,
                             env={**os.environ, "DTRAIN_ARM_SOCK": str(sock), "RANK": "0"})
    assert (wrapped.returncode, wrapped.stdout, wrapped.stderr) == (
        plain.returncode, plain.stdout, plain.stderr)
    assert (tmp_path / "stacks" / "r0.txt").exists()  # armed all the same


def test_rank_wrapper_runs_a_module(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "job.py").write_text("import sys\nprint(__name__, sys.argv[1:])\n")
    wrapped = subprocess.run([sys.executable, "-u", str(SHIM), "-m", "pkg.job", "a"],
                             capture_output=True, text=True, cwd=tmp_path,
                             env={**os.environ, "DTRAIN_ARM_SOCK": str(tmp_path / "s"),
                                  "RANK": "0"})
    assert wrapped.stdout == "__main__ ['a']\n", wrapped.stderr


def test_the_shim_starts_workers_through_the_wrapper(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = supervisor.rank_argv(["train.py", "--lr", "1"], "/tmp/d/ranks.sock")
    assert argv[1:] == ["-u", str(SHIM), "train.py", "--lr", "1"]
    assert supervisor.rank_env("/tmp/d/ranks.sock")["DTRAIN_ARM_SOCK"] == "/tmp/d/ranks.sock"
    monkeypatch.setenv("DTRAIN_STACKS", "0")  # the escape hatch: plain python -u SCRIPT
    assert supervisor.rank_argv(["train.py"], "s")[1:] == ["-u", "train.py"]
    assert "DTRAIN_ARM_SOCK" not in supervisor.rank_env("s")
