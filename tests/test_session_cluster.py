"""The node session (issue 52 step 3, docs/warm-start.md "Across --restarts attempts") on the
real-sshd cluster: with DTRAIN_KEEP_WARM=1 a warm --restarts run's second attempt forks its
ranks from the same warm process on each node as the first, and nothing of the run (the
session, the warm process) is left on the nodes after it. A session directory that is not
the user's alone is not used: the run relaunches as without a session (a new warm process),
and the directory is left as it was."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import tests.cluster as tc
from tests.test_failures import Dtrain, JobWatch, new_id, run_args

PROBE = "tests/workloads/session_probe.py"
pytestmark = [pytest.mark.ssh, pytest.mark.torch, pytest.mark.timeout(240)]


def _parents(out: str) -> dict[tuple[int, str], int]:
    """(attempt, node) -> the one parent (warm process) of that node's ranks in it."""
    found: dict[tuple[int, str], set[int]] = {}
    for m in re.finditer(r"^(node\d) r\d+: SESSION (\{.*\})$", out, re.M):
        said = json.loads(m.group(2))
        assert said["warm"] is True, out  # forked: torch was there before the script
        found.setdefault((said["attempt"], m.group(1)), set()).add(said["parent"])
    assert all(len(p) == 1 for p in found.values()), found  # one warm process per node
    return {k: p.pop() for k, p in found.items()}


def _run(cluster: tc.Cluster, tmp_path: Path, jobs: list) -> tuple[int, str]:
    run_id = new_id("session")
    args = run_args(cluster, tmp_path, run_id, PROBE, "--restarts", "1", hosts="node[1-2]",
                    nproc=2)
    job = Dtrain(cluster, args, env={"DTRAIN_KEEP_WARM": "1",
                                     "XDG_STATE_HOME": str(tmp_path / "state")})
    jobs.append(job)
    with JobWatch(cluster, [1, 2], run_id=run_id) as watch:
        rc = job.wait(200)
        watch.assert_clean(5.0, since=job.ended)  # no session, no warm process left
    return rc, job.output


def _session_dir(cluster: tc.Cluster) -> Path:
    """The cluster user's session directory on the nodes (their /tmp is this machine's)."""
    uid = int(subprocess.run(["id", "-u", cluster.user], capture_output=True, text=True,
                             check=True).stdout)
    return Path("/tmp") / f"dtrain-{uid}"


def test_the_second_attempt_is_forked_from_the_first_attempts_warm_process(
        cluster: tc.Cluster, tmp_path: Path, jobs) -> None:
    rc, out = _run(cluster, tmp_path, jobs)
    assert rc == 0, out
    assert "attempt 2 on the same nodes" in out, out
    parents = _parents(out)
    assert sorted(parents) == [(1, "node1"), (1, "node2"), (2, "node1"), (2, "node2")], out
    for node in ("node1", "node2"):
        assert parents[(2, node)] == parents[(1, node)], (node, parents)  # kept
    assert parents[(1, "node1")] != parents[(1, "node2")]  # one session per node


def test_a_session_directory_not_the_users_alone_is_not_used(
        cluster: tc.Cluster, tmp_path: Path, jobs) -> None:
    path = _session_dir(cluster)
    saved = None
    if path.exists():
        saved = tmp_path / "saved"
        shutil.move(str(path), saved)
    try:
        path.mkdir(mode=0o700)  # root's: another user's, to the cluster's user
        os.chmod(path, 0o777)
        rc, out = _run(cluster, tmp_path, jobs)
        assert rc == 0, out
        assert "attempt 2 on the same nodes" in out, out
        parents = _parents(out)
        for node in ("node1", "node2"):  # no session: each attempt its own warm process
            assert parents[(2, node)] != parents[(1, node)], (node, parents)
        st = path.stat()
        assert (st.st_uid, st.st_mode & 0o777) == (0, 0o777)  # left as it was
        assert list(path.iterdir()) == []  # nothing of ours put in it
    finally:
        shutil.rmtree(path, ignore_errors=True)
        if saved is not None:
            shutil.move(str(saved), path)
