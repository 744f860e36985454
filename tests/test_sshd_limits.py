"""sshd's own limits, met on the real sshd (issue 56 item 4; docs/scaling.md "sshd's
limits"): MaxStartups drops handshakes beyond its bound. dtrain retries those drops with a
jittered back-off, and when every try is dropped it says which limit does that and what to
do, instead of "connection lost"."""

from __future__ import annotations

import os
import re
import signal
import socket
import time
from collections.abc import Iterator

import pytest

from tests.cluster import sshd_pid
from tests.util import dtrain, wait_until

pytestmark = pytest.mark.ssh

NODE = 4


def _sshd_serves(ip: str) -> bool:
    try:
        with socket.create_connection((ip, 22), timeout=2) as s:
            s.settimeout(2)
            return s.recv(64).startswith(b"SSH-")
    except OSError:
        return False


@pytest.fixture
def max_startups_1(cluster) -> Iterator[str]:
    """node4's sshd with `MaxStartups 1`: one handshake at a time, every other one dropped
    (restored, and sshd reloaded, afterwards)."""
    node = cluster.node(NODE)
    config = node.dir / "sshd_config"
    original = config.read_text()
    pid = sshd_pid(NODE, cluster.state_dir)
    assert pid, "node4's sshd is not running"

    def reload(text: str) -> None:
        config.write_text(text)
        os.kill(pid, signal.SIGHUP)  # sshd re-executes itself with the file, same pid
        time.sleep(0.3)
        wait_until(lambda: _sshd_serves(node.ip), timeout=15, what="sshd after SIGHUP")

    reload(re.sub(r"(?m)^MaxStartups .*$", "MaxStartups 1", original))
    try:
        yield node.ip
    finally:
        reload(original)


def test_a_handshake_sshd_drops_is_retried_then_named(cluster, max_startups_1):
    ip = max_startups_1
    # one unauthenticated connection holds sshd's only startup slot (LoginGraceTime); sshd
    # frees the slot of an earlier probe a moment after it closed (until then it answers
    # "Exceeded MaxStartups" and closes)
    holders: list[socket.socket] = []

    def hold() -> bool:
        s = socket.create_connection((ip, 22), timeout=5)
        if s.recv(64).startswith(b"SSH-"):
            holders.append(s)
            return True
        s.close()
        return False

    wait_until(hold, timeout=15, what="sshd's one startup slot")
    holder = holders[0]
    try:
        t0 = time.monotonic()
        res = dtrain(["exec", "-H", f"node{NODE}", "--", "true"],
                     env=cluster.client_env(DTRAIN_RESIDENT="0"))
        took = time.monotonic() - t0
    finally:
        holder.close()
    assert res.returncode == 255, res.stderr
    assert re.search(r"sshd closed the connection before the login finished, 5 tries in "
                     r"\d+\.\d s", res.stderr), res.stderr
    assert "MaxStartups" in res.stderr and "PerSourcePenalties" in res.stderr
    assert "--fanout" in res.stderr
    assert took < 30  # the back-off is bounded: 4 waits of at most 2 s (with jitter)
    # the slot free again: the same command goes through (the retries did no harm)
    again = dtrain(["exec", "-H", f"node{NODE}", "--", "echo", "ok"],
                   env=cluster.client_env(DTRAIN_RESIDENT="0"))
    assert again.returncode == 0 and again.stdout == f"node{NODE}: ok\n", again.stderr


def test_concurrent_logins_past_max_startups_all_succeed_by_retrying(cluster, max_startups_1):
    """Four names of the one sshd at once, under `MaxStartups 1`: the handshakes beyond the
    first are dropped, retried, and every one logs in."""
    ip = max_startups_1
    hosts = f"node{NODE},alt{NODE},dtuser@{ip},dtuser@{ip}:2222"  # one sshd, 2 ports
    res = dtrain(["exec", "-H", hosts, "--", "echo", "in"],
                 env=cluster.client_env(DTRAIN_RESIDENT="0"))
    assert res.returncode == 0, res.stderr
    assert res.stdout.count(": in\n") == 4, res.stdout
