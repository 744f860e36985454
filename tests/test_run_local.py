"""`dtrain run` on localhost (the README's first command): no sshd involved."""

from __future__ import annotations

import json

import pytest

from tests.util import dtrain

pytestmark = pytest.mark.torch


def test_readme_embedded_default_trains_two_ranks(tmp_path):
    res = dtrain(["run", "-H", "localhost", "--nproc-per-node", "2", "--archive-dir",
                  str(tmp_path), "examples/ddp_smoke.py"], timeout=120)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "localhost r0: all-reduce 3 (expected 3): OK" in res.stdout
    assert "localhost r1: step 4 loss" in res.stdout
    run = next(tmp_path.iterdir())
    meta = json.loads((run / "meta.json").read_text())
    assert meta["exit_code"] == 0 and meta["world_size"] == 2


def test_module_mode_passes_arguments_untouched(tmp_path):
    res = dtrain(["run", "-H", "localhost", "--nproc-per-node", "1", "--archive-dir",
                  str(tmp_path), "-m", "tests.workloads.env_report", "--", "DTRAIN_NODE_RANK"],
                 timeout=120)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    report = json.loads(res.stdout.split("REPORT ", 1)[1].splitlines()[0])
    assert report["rank"] == 0 and report["env"] == {"--": None, "DTRAIN_NODE_RANK": "0"}
