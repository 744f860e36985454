"""bench/gpu/check.sh (docs/gpu-check.md) is run by hand on a GPU machine; here its rehearsal
without a GPU (NPROC=1: gloo on CPU) keeps every step of it working: each command it runs
ends as the script expects, and no process is left."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.util import REPO, need_module, proc_environ

pytestmark = [pytest.mark.torch, pytest.mark.timeout(400)]

EXPECTED = {"run-hang": 125}  # the stuck rank: a hang, stopped; every other step ends 0


def test_the_gpu_checks_rehearsal_runs_every_step(tmp_path) -> None:  # type: ignore[no-untyped-def]
    need_module("torch")
    env = {**os.environ, "NPROC": "1", "OUT": str(tmp_path / "out"), "W": str(tmp_path / "w"),
           "PYTHON": sys.executable}
    env = {k: v for k, v in env.items() if not k.startswith(("DTRAIN_", "NCCL_", "GLOO_"))}
    res = subprocess.run(["bash", "bench/gpu/check.sh"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=380)
    summary = (tmp_path / "out" / "summary.txt").read_text()
    steps = dict(re.findall(r"^(\S+)\s+rc=(\d+)", summary, re.M))
    assert len(steps) >= 18, summary
    wrong = {k: v for k, v in steps.items() if int(v) != EXPECTED.get(k, 0)}
    assert wrong == {}, summary + res.stdout[-3000:] + res.stderr[-3000:]
    # nothing of these runs left: no process whose environment names this test's directory
    # (the script's own ps count would see other tests' processes on a shared machine)
    mine = str(tmp_path).encode()
    left = [pid for pid in filter(str.isdigit, os.listdir("/proc"))
            if any(mine in entry for entry in proc_environ(pid))]
    assert left == [], left
    assert (tmp_path / "out" / "all.tgz").stat().st_size > 1000
    hang = (tmp_path / "w" / "run-hang.txt").read_text()
    assert "HANG: no rank made progress" in hang and "flight recorder: rank 0" in hang
