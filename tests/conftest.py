"""Shared fixtures: the real-sshd test cluster, and a test environment free of job settings."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from tests import cluster as test_cluster
from tests.util import INTRUDER, SYSTEM_PYTHON, cannot_run


def pytest_configure(config: pytest.Config) -> None:
    """A suite started in the background of a non-interactive shell (`bash scripts/test &`,
    nohup) inherits SIGINT ignored, and so would every dtrain the tests start: the Ctrl-C
    tests would see a process that cannot be interrupted. Python's own handler in this
    process resets the children's SIGINT to the default at exec."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def cluster() -> test_cluster.Cluster:
    """A 4-node real-sshd cluster (built or reused; left up for the next session).

    Skips only where the machine cannot host it (not root, no netns, no sshd), and fails
    there too under ``DTRAIN_REQUIRE_CLUSTER=1`` (scripts/test); any other failure to build
    is an error, not a skip.
    """
    reason = test_cluster.unavailable_reason()
    if reason:
        cannot_run(f"the test cluster cannot run here: {reason}")
    return test_cluster.up(4)


BIG_CLUSTER_NODES = 64


@pytest.fixture(scope="session")
def big_cluster(cluster: test_cluster.Cluster) -> test_cluster.Cluster:
    """The shared cluster grown to 64 nodes (docs/scaling.md). ``up`` only adds nodes
    5..64 and repairs 1..4 in place; the 4-node ``cluster`` fixture never shrinks it (a
    later ``up(4)`` reuses the larger cluster and returns its first 4 nodes)."""
    return test_cluster.up(BIG_CLUSTER_NODES)


@pytest.fixture(scope="session")
def slurm(cluster: test_cluster.Cluster) -> Any:
    """A real Slurm on the cluster (munged, slurmctld, one slurmd per node): started or
    reused. Skips only where the Slurm packages are missing (scripts/test installs them),
    and fails there too under ``DTRAIN_REQUIRE_CLUSTER=1``."""
    from tests.cluster import slurm as test_slurm

    reason = test_slurm.unavailable_reason()
    if reason:
        cannot_run(reason)
    return test_slurm.up(cluster.state_dir)


@pytest.fixture(autouse=True)
def _clean_job_env(monkeypatch: pytest.MonkeyPatch,
                   tmp_path_factory: pytest.TempPathFactory) -> None:
    """NCCL_*/GLOO_*/DTRAIN_*/SLURM_* from the developer's shell (or an allocation) must not
    leak into tests."""
    for name in list(os.environ):
        if name.startswith(("NCCL_", "GLOO_", "DTRAIN_", "SLURM_")):
            monkeypatch.delenv(name, raising=False)
    # the developer's own ~/.config/dtrain/config.toml must not change what tests see
    # (cluster.client_env() has a HOME of its own; tests of the config set their own)
    monkeypatch.setenv("DTRAIN_CONFIG", "")
    # nor the developer's state directory: the default archive (a README run there is the
    # "latest run" for a test's bare `dtrain report`/`attach`) and the fenced-node list; each
    # test gets its own (cluster.client_env() keeps it; tests of the state dir set their own)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))


@pytest.fixture
def jobs() -> Iterator[list[Any]]:
    """The dtrain processes a test started (tests.test_failures.Dtrain, appended by the
    test): killed at its end whatever happened."""
    started: list[Any] = []
    yield started
    for job in started:
        job.kill()


@pytest.fixture
def chatty_bashrc(cluster):
    """node3's ~/.bashrc prints a banner (Debian's bash sources it for ssh commands)."""
    home = cluster.node(3).home
    rc = home / ".bashrc"
    before = rc.read_bytes() if rc.exists() else None
    rc.write_text('echo "Welcome to node3, be nice"\n' + (before or b"").decode())
    os.chown(rc, home.stat().st_uid, home.stat().st_gid)
    yield
    if before is None:
        rc.unlink()
    else:
        rc.write_bytes(before)


@pytest.fixture(scope="session")
def intruder() -> pwd.struct_passwd:
    """An unprivileged second user of this machine, `dtrain-intruder` (made here when
    missing): the other user of a shared login node or cluster (tests/test_private.py,
    tests/test_everyone.py)."""
    if os.getuid() != 0:
        cannot_run("a second local user needs root to make (useradd) and to act as (runuser)")
    for tool in ("useradd", "runuser"):
        if shutil.which(tool) is None:
            cannot_run(f"{tool} is missing")
    if not os.path.exists(SYSTEM_PYTHON):
        cannot_run(f"{SYSTEM_PYTHON} is missing (the second user's interpreter)")
    try:
        return pwd.getpwnam(INTRUDER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                        INTRUDER], check=True, capture_output=True, timeout=30)
        return pwd.getpwnam(INTRUDER)
