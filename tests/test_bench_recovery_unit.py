"""bench/bench_recovery.py's pure half (issue 52 step 3): the first-line records of
bench/data/first_line.py, the one metric every mode shares (kill -> every rank at its first
line), the per-mode summary and the torchrun command line. No cluster: the bench itself runs
on it by hand."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bench import bench_recovery as br
from launcher.decide.outcome.hang import DEFAULT_PROGRESS
from tests.util import REPO

WRAPPER = REPO / "bench" / "data" / "first_line.py"


def _wrapped(tmp_path: Path, **env: str) -> tuple[float, float, list[str]]:
    script = tmp_path / "script.py"
    script.write_text("import sys\nprint('script', __name__, sys.argv[1:], sys.path[0])\n")
    clean = {k: v for k, v in os.environ.items()
             if k not in ("RANK", "DTRAIN_ATTEMPT", "TORCHELASTIC_RESTART_COUNT")}
    before = time.time()
    out = subprocess.run([sys.executable, str(WRAPPER), str(script), "--x", "1"],
                         env={**clean, **env}, capture_output=True, text=True, timeout=60,
                         check=True).stdout.splitlines()
    return before, time.time(), out


def test_the_wrapper_prints_its_instant_rank_and_attempt_then_runs_the_script(
        tmp_path: Path) -> None:
    before, after, out = _wrapped(tmp_path, RANK="3", TORCHELASTIC_RESTART_COUNT="1")
    (rec,) = br.first_lines(out)
    assert rec["rank"] == 3 and rec["attempt"] == 2  # torchrun's count + 1
    assert before <= rec["t"] <= after
    # the script after it, as __main__, with its own argv and its directory first on the path
    assert out[1] == f"script __main__ ['--x', '1'] {tmp_path}"
    # dtrain's attempt wins where dtrain set it (its own torchrun's count stays 0)
    _, _, out = _wrapped(tmp_path, RANK="0", TORCHELASTIC_RESTART_COUNT="0",
                         DTRAIN_ATTEMPT="2")
    assert [(r["rank"], r["attempt"]) for r in br.first_lines(out)] == [(0, 2)]


def test_the_first_line_is_no_progress_line_for_the_ledger(tmp_path: Path) -> None:
    _, _, out = _wrapped(tmp_path, RANK="12", TORCHELASTIC_RESTART_COUNT="0")
    assert out[0].startswith("dtrain-bench first-line t=")
    assert not re.search(DEFAULT_PROGRESS, out[0]), out[0]


def _rec(t: float, rank: int, attempt: int = 1) -> dict[str, Any]:
    return {"t": t, "rank": rank, "attempt": attempt}


def test_every_rank_at_its_first_line_after_an_instant() -> None:
    texts = ["node1 r0: dtrain-bench first-line t=100.0 rank=0 attempt=1",
             "dtrain-bench first-line t=101.5 rank=1 attempt=1", "step 5 loss 1.0",
             "dtrain-bench first-line t=110.25 rank=1 attempt=2",
             "dtrain-bench first-line t=112.0 rank=0 attempt=1",  # torchrun: not its count
             "dtrain-bench first-line t=111.0 rank=1 attempt=2",  # a rank's 2nd line: later
             "dtrain-bench first-line t=109.0 rank=7 attempt=2"]  # beyond the world
    records = br.first_lines(texts)
    assert [r["rank"] for r in records] == [0, 1, 1, 0, 1, 7]
    assert br.all_ranks_after(records, 0.0, 2) == 101.5  # the first start
    assert br.all_ranks_after(records, 105.0, 2) == 112.0  # the latest rank's earliest
    assert br.all_ranks_after(records, 111.5, 2) is None  # rank 1 printed none after it
    assert br.all_ranks_after(records, None, 2) is None  # never killed
    assert br.all_ranks_after([], 0.0, 0) is None
    assert br.since(105.0, 112.0) == 7.0 and br.since(None, 1.0) is None


def test_modes_are_rotated_round_by_round() -> None:
    modes = ["cold", "warm", "torchrun"]
    assert [br.rotated(modes, r) for r in range(4)] == [
        ["cold", "warm", "torchrun"], ["warm", "torchrun", "cold"],
        ["torchrun", "cold", "warm"], ["cold", "warm", "torchrun"]]


def _dtrain_run(mode: str, k2f: float, startup: float) -> dict[str, Any]:
    split = dict.fromkeys(br.PARTS, 0.5)
    return {"mode": mode, "ok": True, "kill_to_first_line_s": k2f,
            "start_to_first_line_s": 3.0, "kill_to_noticed_s": 0.03,
            "attempts": [{"n": n, "startup_s": startup, "node": "node1", "split": split}
                         for n in (1, 2)]}


def test_by_mode_rows_and_the_ratio_to_torchrun() -> None:
    runs = [_dtrain_run("warm", 8.0, 7.0), _dtrain_run("warm", 6.0, 9.0),
            {"mode": "torchrun", "ok": True, "kill_to_first_line_s": 2.0,
             "start_to_first_line_s": 9.5, "kill_to_noticed_s": 0.1,
             "kill_to_all_noticed_s": 1.1},
            {"mode": "torchrun", "ok": False, "kill_to_first_line_s": 50.0}]  # not counted
    modes = br.by_mode(runs)
    assert modes["warm"]["kill_to_first_line"] == {"median": 7.0, "min": 6.0, "max": 8.0,
                                                   "n": 2}
    assert modes["warm"]["2"]["startup_s"]["median"] == 8.0
    assert "kill_to_all_noticed" not in modes["warm"]
    assert modes["torchrun"] == {
        "kill_to_first_line": {"median": 2.0, "min": 2.0, "max": 2.0, "n": 1},
        "start_to_first_line": {"median": 9.5, "min": 9.5, "max": 9.5, "n": 1},
        "kill_to_noticed": {"median": 0.1, "min": 0.1, "max": 0.1, "n": 1},
        "kill_to_all_noticed": {"median": 1.1, "min": 1.1, "max": 1.1, "n": 1}}
    assert br.vs_torchrun(modes) == {"warm": 3.5}
    assert br.vs_torchrun({"warm": modes["warm"]}) == {}
    table = br.rows(runs)
    assert [(r["run"], r["mode"], r["attempt"]) for r in table] == [
        (1, "warm", 1), (1, "warm", 2), (2, "warm", 1), (2, "warm", 2),
        (3, "torchrun", 1), (3, "torchrun", 2), (4, "torchrun", 1), (4, "torchrun", 2)]
    assert table[1]["kill_to_first_line_s"] == 8.0 and table[1]["startup_s"] == 7.0
    assert table[0]["start_to_first_line_s"] == 3.0 and "kill_to_first_line_s" not in table[0]
    assert table[5] == {"run": 3, "mode": "torchrun", "attempt": 2,
                        "kill_to_first_line_s": 2.0}
    # a dtrain run that left no meta.json: no rows, as before
    assert br.rows([{"mode": "cold", "ok": False, "problem": "x"}]) == []


def test_torchrun_gets_the_c10d_restart_and_dtrains_environment() -> None:
    cluster = SimpleNamespace(python="/py", repo=Path("/repo dir"), ssh_config="cfg",
                              identity="key", known_hosts="kh", user="dtuser")
    node = SimpleNamespace(ifname="eth0")
    line = br.torchrun_command(cluster, node, nnodes=4, nproc=2,  # type: ignore[arg-type]
                               endpoint="198.18.0.11:4000", run_id="rid", host=False,
                               ck=Path("/shared/ck-1"), steps=30)
    words = shlex.split(line)
    assert words[:3] == ["cd", "/repo dir", "&&"]
    env = dict(w.split("=", 1) for w in words[5:9])
    assert env == {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "eth0",
                   "PYTHONUNBUFFERED": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    argv = words[9:]
    assert argv[:3] == ["/py", "-m", "torch.distributed.run"]
    flags = dict(zip(argv[3:19:2], argv[4:19:2], strict=True))
    assert flags == {"--nnodes": "4", "--nproc-per-node": "2", "--max-restarts": "1",
                     "--monitor-interval": "0.2", "--rdzv-backend": "c10d",
                     "--rdzv-endpoint": "198.18.0.11:4000", "--rdzv-id": "rid",
                     "--rdzv-conf": "is_host=0"}
    assert argv[19:] == [br.WRAPPER, br.SCRIPT, "--ckpt-dir", "/shared/ck-1", "--steps", "30",
                         "--step-sleep", "0.2"]
    ssh = br.ssh_argv(cluster, "node2", line)  # type: ignore[arg-type]
    assert ssh[:2] == ["ssh", "-n"] and ssh[-2:] == ["node2", line]


def test_two_ranks_lines_run_together_are_still_two_records() -> None:
    """Two ranks on one node share their agent's stdout under torchrun: seen at 8 x 2, one
    rank's line ran into the other's (print wrote the text and its end apart, fixed in
    first_line.py with one write), and the rank read from the second was lost."""
    text = ("dtrain-bench first-line t=5.537381 rank=7 attempt=1"
            "dtrain-bench first-line t=5.550591 rank=6 attempt=1")
    assert [(r["rank"], r["t"]) for r in br.first_lines([text])] == [(7, 5.537381),
                                                                    (6, 5.550591)]
