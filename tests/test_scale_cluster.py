"""The supervisor's exec path at 64 nodes on the real-sshd cluster (docs/scaling.md).

One short run, so a regression in concurrency (a per-host await in a row, an fd or
connection limit, a lost or mistagged node) shows up in CI. No wall time is asserted.
"""

from __future__ import annotations

import pytest

from tests.conftest import BIG_CLUSTER_NODES
from tests.util import dtrain

pytestmark = pytest.mark.ssh


@pytest.mark.timeout(600)  # the first run builds nodes 5..64 (see docs/scaling.md)
def test_exec_reaches_every_node_of_64(big_cluster):
    n = BIG_CLUSTER_NODES
    assert len(big_cluster.nodes) == n
    hosts = f"{big_cluster.user}@198.18.0.[11-{10 + n}]"
    res = dtrain(["exec", "-H", hosts, "--fanout", "64", "--", "hostname"],
                 env=big_cluster.client_env(), timeout=150)
    assert res.returncode == 0, res.stderr[-2000:]
    assert sorted(res.stdout.splitlines()) == sorted(
        f"198.18.0.{10 + k}: node{k}" for k in range(1, n + 1))
