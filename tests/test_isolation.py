"""Node programs run isolated from the working directory (issue 34, item 3, Low): a
project's json.py, types.py or random.py shadows neither dtrain's probe and supervisor nor
torchrun's own imports, while the user's script still imports from its own directory, as
under plain `torchrun`. On localhost (the local transport runs the same node programs)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.util import REPO

SHADOW = 'import sys\nsys.stderr.write("project {name}.py imported\\n")\nraise SystemExit(3)\n'


def _dtrain(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """dtrain as its console script starts it: the working directory is not on its path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DTRAIN_", "PYTHON"))}
    env["HOME"] = str(cwd / "home")
    boot = (f"import sys; sys.path[0] = {str(REPO)!r}; sys.argv[0] = 'dtrain'; "
            "from launcher.cli import main; main()")
    return subprocess.run([sys.executable, "-c", boot, *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=150)


@pytest.mark.torch
@pytest.mark.timeout(200)
def test_stdlib_names_in_the_working_directory_break_nothing(tmp_path: Path) -> None:
    for name in ("json", "types", "random"):
        (tmp_path / f"{name}.py").write_text(SHADOW.format(name=name))
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "helper.py").write_text("X = 42\n")
    (proj / "train.py").write_text("import helper\nprint('helper', helper.X)\n")
    (tmp_path / "home").mkdir()
    res = _dtrain(["run", "-H", "localhost", "--nproc-per-node", "2", "--python",
                   sys.executable, "--archive-dir", str(tmp_path / "runs"), "--no-color",
                   "proj/train.py"], tmp_path)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "imported" not in out, out
    assert "localhost r0: helper 42" in out and "localhost r1: helper 42" in out, out
