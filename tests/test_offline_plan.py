"""`run --dry-run --offline` (issue 24 item 13): the plan from the hostfile alone, each node's
facts marked unknown, and nothing contacted: a dial recorder (tests/util.DIAL_SITECUSTOMIZE)
sees no connect and no name lookup. Failed on the old main: no such option --offline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.decide.runplan.plan import RunRequest, offline_plan
from launcher.decide.runplan.runoptions import RunOptions
from launcher.errors import UsageError
from launcher.models import Host
from tests.util import REPO, assert_exit, dial_watch

# unreachable on purpose: a connect would hang or fail, and the recorder would see it
HOSTFILE = "dtuser@198.18.0.99 slots=2\nnode-nowhere slots=1\n"


def _run(args: list[str], tmp: Path) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    hostfile = tmp / "hosts"
    hostfile.write_text(HOSTFILE)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DTRAIN_", "DS_"))}
    env, log = dial_watch({**base, "HOME": str(tmp)}, tmp / "site")
    res = subprocess.run([sys.executable, "-m", "launcher", "run", "-f", str(hostfile),
                          *args, "examples/ddp_smoke.py"], capture_output=True, text=True,
                         cwd=REPO, env=env, timeout=60)
    dials = log.read_text().splitlines() if log.exists() else []
    return res, dials


def test_offline_dry_run_plans_without_connecting(tmp_path: Path) -> None:
    res, dials = _run(["--dry-run", "--offline", "-v", "-e", "A=1"], tmp_path)
    assert_exit(res, 0)
    assert dials == [], dials
    out = res.stdout
    assert out.startswith("offline: not connected (--offline)")
    assert "world size 3" in out and "master 198.18.0.99:29500" in out
    assert "node 1  node-nowhere  ranks 2" in out and "A=1  [user: --env]" in out
    assert "NCCL_SOCKET_IFNAME" not in out  # detection needs the node: not guessed


def test_the_dry_run_shows_what_the_supervisor_adds_on_the_node(tmp_path: Path) -> None:
    """The variables the node adds by itself (the flight recorder's, NCCL's account) are in
    the dry run with why; a user's NCCL_DEBUG turns NCCL's off, as on the node."""
    res, _ = _run(["--dry-run", "--offline", "-v"], tmp_path)
    assert_exit(res, 0)
    added = [ln.split("=")[0].strip() for ln in res.stdout.splitlines()
             if ln.startswith("  + ")]
    # torch unknown offline: both names of the flight recorder's variables
    assert added[:7] == ["+ TORCH_FR_BUFFER_SIZE", "+ TORCH_NCCL_TRACE_BUFFER_SIZE",
                         "+ TORCH_NCCL_DUMP_ON_TIMEOUT", "+ TORCH_FR_DUMP_TEMP_FILE",
                         "+ TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "+ NCCL_DEBUG",
                         "+ NCCL_DEBUG_FILE"], added
    assert "  + NCCL_DEBUG=INFO  [node: added on the node unless its own environment sets " \
           "NCCL_DEBUG or NCCL_DEBUG_FILE: NCCL's own account of the fabric]" in res.stdout
    res, _ = _run(["--dry-run", "--offline", "-v", "-e", "NCCL_DEBUG=WARN"], tmp_path)
    assert_exit(res, 0)
    assert "+ NCCL_DEBUG" not in res.stdout and "+ TORCH_FR_BUFFER_SIZE" in res.stdout


def test_offline_json_marks_the_facts_unknown(tmp_path: Path) -> None:
    res, dials = _run(["--dry-run", "--offline", "--json"], tmp_path)
    assert_exit(res, 0)
    assert dials == []
    plan = json.loads(res.stdout)
    assert plan["offline"] is True and "unknown" in plan["facts"]
    assert [n["nproc"] for n in plan["nodes"]] == [2, 1]


def test_offline_needs_dry_run_and_a_known_rank_count(tmp_path: Path) -> None:
    res, dials = _run(["--offline"], tmp_path)
    assert_exit(res, 2)
    assert "goes with --dry-run" in res.stderr and dials == []
    res, dials = _run(["--dry-run", "--offline", "--nproc-per-node", "gpu"], tmp_path)
    assert_exit(res, 2)
    assert "unknown without connecting" in res.stderr and dials == []


def test_offline_plan_is_pure() -> None:
    hosts = [Host("a", slots=4), Host("b", slots=4)]
    plan = offline_plan(RunRequest(script="t.py", master_port=1234), RunOptions(), hosts)
    assert (plan.master_addr, plan.master_port, plan.world_size) == ("a", 1234, 8)
    assert [n.first_rank for n in plan.nodes] == [0, 4] and plan.offline
    with pytest.raises(UsageError, match="unknown without connecting"):
        offline_plan(RunRequest(script="t.py"), RunOptions(), [Host("a")])


def test_the_recorder_sees_the_dial_of_a_dry_run_that_connects(tmp_path: Path) -> None:
    """The oracle works: the same dry run without --offline dials the first host."""
    res, dials = _run(["--dry-run", "--connect-timeout", "1"], tmp_path)
    assert res.returncode == 255, res.stderr
    assert any("198.18.0.99" in d or "node-nowhere" in d for d in dials), dials
