"""The project's own checks run with the tests, so CI fails when they do."""

from __future__ import annotations

import shutil
import subprocess
import sys

from tests.util import REPO, cannot_run, need_module


def test_ruff_is_clean():
    if shutil.which("ruff") is None:
        cannot_run("ruff is not installed")
    res = subprocess.run(["ruff", "check", "."], cwd=REPO, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_mypy_strict_is_clean():
    need_module("mypy")
    res = subprocess.run([sys.executable, "-m", "mypy"], cwd=REPO, capture_output=True,
                         text=True, timeout=170)
    assert res.returncode == 0, res.stdout + res.stderr
