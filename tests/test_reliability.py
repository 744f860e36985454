"""What the fault campaign (bench/soak.py, docs/reliability.md) found, as regressions that
run without the cluster."""

from __future__ import annotations

import subprocess
import sys

from tests.util import REPO, TRACEBACK

# Ctrl-C while `dtrain` still imports its CLI (seconds on a loaded box): the interrupt is
# raised where the import stands, here at the import of launcher.cli.run, deterministically
INTERRUPTED_IMPORT = """
import sys
class Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name == "launcher.cli.run":
            raise KeyboardInterrupt
        return None
sys.meta_path.insert(0, Interrupt())
from launcher.cli import main
main()
"""


def test_ctrl_c_while_the_cli_imports_is_exit_130_without_a_traceback() -> None:
    res = subprocess.run([sys.executable, "-c", INTERRUPTED_IMPORT, "--version"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert not TRACEBACK.search(res.stderr), res.stderr[-2000:]
    assert res.returncode == 130, (res.returncode, res.stderr[-2000:])


class _FullDisk:
    """A file whose every write and flush fails as on a full disk."""

    def write(self, data: str) -> int:
        raise OSError(28, "No space left on device")

    def flush(self) -> None:
        raise OSError(28, "No space left on device")

    def close(self) -> None:
        self.flush()


def test_a_full_archive_disk_is_one_warning_not_the_runs_end(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """The archive's filesystem full (the campaign's small tmpfs): every archive write
    raised ENOSPC up through the job, a traceback that ended the run; now the archive stops
    with one warning and the run goes on (the console still shows its lines)."""
    from launcher.models import OutputLine
    from launcher.output.archive import RunArchive

    archive = RunArchive.create(tmp_path, "full")
    archive._out = _FullDisk()  # type: ignore[assignment]

    def full(*a: object) -> None:
        raise OSError(28, "No space left on device")

    archive.dir.replace = full  # type: ignore[method-assign]
    archive.write_lines([OutputLine("n1", "out", "soak 0 1", 0, 0, 1.0)])
    archive.flush()
    archive.write_lines([OutputLine("n1", "out", "soak 0 2", 0, 0, 2.0)])
    archive.update_meta(end=3.0, exit_code=0)
    archive.close()
    assert archive.failed == "No space left on device"
    assert archive.meta["exit_code"] == 0  # kept in memory for the summary
    err = capsys.readouterr().err
    assert err.count("cannot write the archive") == 1, err


def test_ctrl_c_while_the_job_starts_is_recorded_as_interrupted(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The campaign's ctrl-c-start: a Ctrl-C after the run's archive exists but before the
    job ran reaches the run's body as CancelledError (asyncio.run cancels it); meta.json said
    "launcher ended early: CancelledError", exit_code null, no root cause, while dtrain exited
    130. Now: exit_code 130 and a root cause that names the interrupt."""
    import asyncio
    import json
    from types import SimpleNamespace

    import pytest

    from launcher.commands.launch import held_run

    req, opts = SimpleNamespace(run_id="cc"), SimpleNamespace(archive_dir=tmp_path, notify=None)
    with pytest.raises(asyncio.CancelledError), held_run(req, opts, None):  # type: ignore[arg-type]
        raise asyncio.CancelledError
    meta = json.loads((tmp_path / "cc" / "meta.json").read_text())
    assert meta["exit_code"] == 130 and meta["state"] == "finished", meta
    assert meta["root_cause"]["kind"] == "interrupted", meta
