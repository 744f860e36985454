"""A short seeded fault campaign (bench/soak.py, issue 39; docs/reliability.md) on the
cluster's extra nodes 9-12: random faults (ranks, torchrun, supervisors, sshd, links, the
launcher, Ctrl-C, dtrain stop, a second run), and after each run no orphan, no line lost or
doubled, the exit code's class and a verdict that names the fault and its node."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.util import REPO

pytestmark = [pytest.mark.ssh, pytest.mark.timeout(900)]

FAULTS = 8  # about 4 minutes on the 2-core box
SEED = 39


def test_a_short_seeded_fault_campaign_breaks_no_invariant(cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    res = subprocess.run([sys.executable, "bench/soak.py", "--faults", str(FAULTS), "--seed",
                          str(SEED), "--work", str(tmp_path)], cwd=REPO,
                         capture_output=True, text=True, timeout=840)
    out = res.stdout + res.stderr
    assert "| fault | runs |" in out, out[-4000:]
    assert res.returncode == 0, out[-6000:]
    assert f"runs with a broken invariant 0/{FAULTS}" in out, out[-4000:]
