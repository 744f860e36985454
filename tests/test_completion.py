"""Shell completion (issue 12): typer's env protocol, run as the shell does, offers commands,
options, hostfile paths and run ids; `dtrain completion SHELL` prints the script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.cli.completion import complete_paths

REPO = Path(__file__).resolve().parents[1]
RUNS = ("20261130-101500-ab12", "20261130-111500-cd34")
# the default archive: the per-user state directory's runs/ (XDG_STATE_HOME=<cwd>/state)
ARCHIVE = Path("state") / "dtrain" / "runs"


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    for i, run_id in enumerate(RUNS):
        run = tmp_path / ARCHIVE / run_id
        run.mkdir(parents=True)
        (run / "meta.json").write_text(json.dumps({"archive_version": 1, "run_id": run_id,
                                                   "created_ts": 1_800_000_000 + i}))
    (tmp_path / ARCHIVE / "not-a-run").mkdir()  # no meta.json: not offered
    (tmp_path / "hosts.txt").write_text("node1\n")
    (tmp_path / "hostfiles").mkdir()
    (tmp_path / "hostfiles" / "gpu.yaml").write_text("hosts: [node1]\n")
    return tmp_path


def complete(cwd: Path, shell: str, words: str, **env: str) -> list[str]:
    """What dtrain answers the shell for the command line ``words`` (the cursor at its end)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("DTRAIN_")}
    full.update(PYTHONPATH=str(REPO), _DTRAIN_COMPLETE=f"complete_{shell}",
                XDG_STATE_HOME=str(cwd / "state"), DTRAIN_CONFIG="", **env)
    if shell == "bash":
        parts = words.split(" ")
        full.update(COMP_WORDS=words, COMP_CWORD=str(len(parts) - 1))
    else:
        full.update(_TYPER_COMPLETE_ARGS=words, _TYPER_COMPLETE_FISH_ACTION="get-args")
    res = subprocess.run([sys.executable, "-m", "launcher"], cwd=cwd, env=full,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout.splitlines()


def test_bash_offers_run_ids_newest_first(workdir: Path) -> None:
    for cmd in ("logs", "attach", "stop"):
        assert complete(workdir, "bash", f"dtrain {cmd} ") == list(reversed(RUNS))
    assert complete(workdir, "bash", "dtrain logs 20261130-10") == [RUNS[0]]


def test_run_ids_come_from_the_archive_dir_given(workdir: Path) -> None:
    other = workdir / "elsewhere"
    (other / "x-run").mkdir(parents=True)
    (other / "x-run" / "meta.json").write_text('{"archive_version": 1, "run_id": "x-run"}')
    assert complete(workdir, "bash", f"dtrain logs --archive-dir {other} ") == ["x-run"]
    assert complete(workdir, "bash", "dtrain stop ", DTRAIN_ARCHIVE_DIR=str(other)) == ["x-run"]


def test_bash_offers_hostfile_paths(workdir: Path) -> None:
    assert complete(workdir, "bash", "dtrain run -f ho") == ["hostfiles/", "hosts.txt"]
    assert complete(workdir, "bash", "dtrain exec --hostfile hostfiles/") == \
        ["hostfiles/gpu.yaml"]


def test_commands_and_options_are_offered(workdir: Path) -> None:
    commands = complete(workdir, "bash", "dtrain ")
    assert {"exec", "run", "cp", "logs", "ps", "attach", "stop", "keys", "doctor",
            "completion"} <= set(commands)
    assert complete(workdir, "bash", "dtrain run --nproc") == ["--nproc-per-node"]


def test_zsh_and_fish_answer_too(workdir: Path) -> None:
    zsh = "\n".join(complete(workdir, "zsh", "dtrain logs 2026"))
    assert f'"{RUNS[0]}"' in zsh and f'"{RUNS[1]}"' in zsh
    assert complete(workdir, "fish", "dtrain logs ") == list(reversed(RUNS))


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_command_prints_the_script(shell: str) -> None:
    res = subprocess.run([sys.executable, "-m", "launcher", "completion", shell], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert f"_DTRAIN_COMPLETE=complete_{shell}" in res.stdout
    assert "dtrain" in res.stdout


def test_completion_command_refuses_an_unknown_shell() -> None:
    res = subprocess.run([sys.executable, "-m", "launcher", "completion", "tcsh"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert "no completion for 'tcsh'; one of: bash, zsh, fish" in res.stderr


def test_complete_paths_hides_dot_files_unless_asked(tmp_path: Path) -> None:
    (tmp_path / ".hidden").write_text("")
    (tmp_path / "shown").write_text("")
    assert complete_paths(f"{tmp_path}/") == [f"{tmp_path}/shown"]
    assert complete_paths(f"{tmp_path}/.h") == [f"{tmp_path}/.hidden"]
    assert complete_paths(f"{tmp_path}/nothing/x") == []
