"""The project's own checks run with the tests, so CI fails when they do."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.util import REPO


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is not installed")
def test_ruff_is_clean():
    res = subprocess.run(["ruff", "check", "."], cwd=REPO, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_mypy_strict_is_clean():
    pytest.importorskip("mypy")
    res = subprocess.run([sys.executable, "-m", "mypy"], cwd=REPO, capture_output=True,
                         text=True, timeout=170)
    assert res.returncode == 0, res.stdout + res.stderr
