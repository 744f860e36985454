"""examples/: the README's `train.py` and the checkpointing script `--restarts` resumes
(issue 40, item 8), run as the README and docs/restarts.md show them, on localhost."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.util import REPO, dtrain


def test_the_readme_names_only_scripts_that_exist() -> None:
    """Every script the README's commands run is in the tree; none is a bare `train.py`."""
    readme = (REPO / "README.md").read_text()
    named = set(re.findall(r"\b(examples/\w+\.py)\b", readme))
    assert {"examples/train.py", "examples/train_ckpt.py", "examples/ddp_smoke.py"} <= named
    for path in named:
        assert (REPO / path).is_file(), path
    commands = [line.split(" #")[0] for line in readme.splitlines() if line.lstrip().startswith(
        ("dtrain run", "--setup", "python3 -m venv", "&&"))]
    for line in commands:
        assert not re.search(r"(?<![\w/])train\.py", line), line
    restarts = [line for line in commands if "--restarts" in line]
    assert restarts and all("examples/train_ckpt.py" in line for line in restarts), restarts


def test_the_readme_dry_run_of_the_examples() -> None:
    """`dtrain run ... --dry-run examples/train.py --lr 3e-4`, as in the tour."""
    for name in ("train.py", "train_ckpt.py"):
        res = dtrain(["run", "-H", "localhost", "--nproc-per-node", "2", "--dry-run",
                      f"examples/{name}", "--lr", "3e-4"], timeout=60)
        assert res.returncode == 0, res.stdout + res.stderr
        assert f"examples/{name} --lr 3e-4" in res.stdout, res.stdout


@pytest.mark.torch
def test_train_py_trains_as_the_readme_shows(tmp_path: Path) -> None:
    res = dtrain(["run", "-H", "localhost", "--nproc-per-node", "2", "--archive-dir",
                  str(tmp_path), "--no-color", "examples/train.py", "--lr", "3e-4",
                  "--steps", "5"], timeout=150)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    for rank in (0, 1):
        assert re.search(rf"localhost r{rank}: step 4 loss \d+\.\d+", res.stdout), res.stdout
    assert "localhost r0: done: 5 steps, final loss" in res.stdout
    assert "training: world size 2, backend gloo, lr 0.0003" in res.stdout


@pytest.mark.torch
def test_train_ckpt_resumes_from_its_checkpoint_under_restarts(tmp_path: Path) -> None:
    """The first attempt crashes at step 12 (--fail-once-at); --restarts relaunches the gang,
    which resumes from the step-10 checkpoint and finishes: exit 0, one run."""
    ckpt = tmp_path / "ckpt"
    res = dtrain(["run", "-H", "localhost", "--nproc-per-node", "2", "--restarts", "2",
                  "--archive-dir", str(tmp_path / "runs"), "--no-color",
                  "examples/train_ckpt.py", "--ckpt-dir", str(ckpt), "--steps", "14",
                  "--fail-once-at", "12"], timeout=300)
    out = res.stdout
    assert res.returncode == 0, out[-4000:] + res.stderr[-3000:]
    assert f"attempt 1: starting at step 0 (no checkpoint in {ckpt})" in out, out
    assert "RuntimeError: injected crash at step 12 (--fail-once-at)" in out, out
    assert "attempt 2 on the same nodes from the last checkpoint" in out, out
    assert f"attempt 2: resumed at step 10 from {ckpt}/ckpt.pt" in out, out
    assert "localhost r0: done: 14 steps" in out
    assert not re.search(r"r\d: step [0-9] loss", out.split("attempt 2: resumed")[1]), out
    assert (ckpt / "ckpt.pt").is_file()


@pytest.mark.torch
def test_train_py_learns_in_its_100_steps_with_the_readme_s_lr(tmp_path: Path) -> None:
    """Issue 55 item 5: the README's `examples/train.py --lr 3e-4` went from loss 15.5 to
    18.1 in its 100 steps. Each rank's loss now falls by more than half (the mean of its
    first and of its last five steps: one batch's loss is noisy)."""
    res = dtrain(["run", "-H", "localhost", "--nproc-per-node", "2", "--archive-dir",
                  str(tmp_path), "--no-color", "examples/train.py", "--lr", "3e-4"],
                 timeout=200)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    for rank in (0, 1):
        losses = [float(v) for v in re.findall(rf"^localhost r{rank}: step \d+ loss (\S+)$",
                                               res.stdout, re.M)]
        assert len(losses) == 100, res.stdout
        first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
        assert last < first / 2, (rank, first, last)


def test_the_tour_quotes_a_node_s_home() -> None:
    """An unquoted `~/proj/` or `--ckpt-dir ~/ckpt` is expanded by the login node's shell,
    to the login node's home: the tour quotes every node-side `~` (issue 55 item 5)."""
    readme = (REPO / "README.md").read_text()
    tour = readme.split("## A 5-minute tour", 1)[1].split("\n```\n", 1)[0]
    commands = [line.split(" #")[0] for line in tour.splitlines()
                if line.startswith("dtrain ")]
    assert [c for c in commands if re.search(r"(^|\s)~", c)] == []
    assert any("'~/proj/'" in c for c in commands)
    assert any("--ckpt-dir '~/ckpt'" in c for c in commands)
