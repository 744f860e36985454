"""Helpers for tests that run the real `dtrain` command."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def dtrain(args: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: Path = REPO,
           input: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run `python -m launcher ARGS` as a user would, capturing text output."""
    return subprocess.run([sys.executable, "-m", "launcher", *args], env=env, cwd=cwd,
                          input=input, capture_output=True, text=True, timeout=timeout)
