"""A new user's second month (issue 55): each item as the user met it, without the cluster."""

from __future__ import annotations

import os
import time
from pathlib import Path

from launcher.output.archive import RunArchive
from launcher.output.runlock import LauncherLock
from tests.util import assert_exit, dtrain


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DTRAIN_", "SLURM_"))}
    env.pop("WCOLL", None)
    return {**env, "HOME": str(tmp_path), "DTRAIN_CONFIG": "",
            "XDG_STATE_HOME": str(tmp_path / "state"), **extra}


# -- 1. `dtrain top` with no RUN follows the running run, config hostfile or not --------------

def test_top_without_a_run_follows_the_running_run_when_the_config_names_a_hostfile(
        tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    archive = RunArchive.create(runs, "20260101-000000-live")
    archive.update_meta(hosts=["localhost"], world_size=1, state="running",
                        start=time.time() - 30, layout=[{"host": "localhost", "ranks": [0]}])
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost\n")
    config = tmp_path / "config.toml"
    config.write_text(f'hostfile = "{hosts}"\n')
    lock = LauncherLock.acquire(archive.dir, detached=True)  # the run's launcher: alive
    try:
        res = dtrain(["top", "--once", "--no-gpu", "--archive-dir", str(runs)],
                     env=_env(tmp_path, DTRAIN_CONFIG=str(config)))
        assert_exit(res, 0)
        assert "run 20260101-000000-live" in res.stdout, res.stdout
        # -f names hosts: the cluster view of those hosts, as before
        res = dtrain(["top", "--once", "--no-gpu", "--archive-dir", str(runs), "-f", str(hosts)],
                     env=_env(tmp_path, DTRAIN_CONFIG=str(config)))
        assert_exit(res, 0)
        assert "run 20260101-000000-live" not in res.stdout, res.stdout
    finally:
        lock.release()
