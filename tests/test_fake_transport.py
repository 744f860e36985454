"""transports/fake.py: the whole stack above the transport (the job, its verdict, exec's
summary) driven without sshd or the test cluster, in-process, with nodes that are down,
freeze (a lost node, found by its missing heartbeat) or die."""

from __future__ import annotations

import threading
import time

from typer.testing import CliRunner

from launcher.cli import app
from launcher.transports.fake import FakeTransport


def _exec(fake: FakeTransport, *args: str):
    with fake.installed():
        return CliRunner().invoke(app, ["exec", *args])


def test_every_node_runs_under_its_own_name_and_the_exit_code_is_the_largest():
    fake = FakeTransport()
    res = _exec(fake, "-H", "n[1-3]", "--",
                'echo "$DTRAIN_FAKE_NODE"; [ "$DTRAIN_FAKE_NODE" = n2 ] && exit 4; exit 0')
    assert res.exit_code == 4, res.stderr
    assert sorted(res.stdout.splitlines()) == ["n1: n1", "n2: n2", "n3: n3"]
    assert "n2: exit 4" in res.stderr
    assert sorted(fake.connects) == ["n1", "n2", "n3"]
    assert len(fake.started) == 3


def test_a_node_that_is_down_is_named_with_the_way_out():
    fake = FakeTransport(unreachable={"n2"})
    res = _exec(fake, "-H", "n[1-2]", "--", "true")
    assert res.exit_code == 255
    assert "n2: not reached: the fake node is down" in res.stderr
    assert "--exclude n2" in res.stderr
    assert [label for label, _ in fake.started] == ["n1"]


def test_a_frozen_node_is_declared_lost_by_its_missing_heartbeat():
    fake = FakeTransport()

    def freeze_when_started() -> None:
        deadline = time.monotonic() + 30
        while len(fake.pids.get("n2", [])) < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.5)  # the supervisor is up and has sent its first frames
        fake.freeze("n2")

    t = threading.Thread(target=freeze_when_started)
    t.start()
    try:
        res = _exec(fake, "-H", "n[1-2]", "--heartbeat-timeout", "2", "--",
                    'if [ "$DTRAIN_FAKE_NODE" = n2 ]; then sleep 30; else sleep 4; fi')
    finally:
        t.join()
        fake.kill("n2")
        fake.kill("n1")
    assert res.exit_code == 255, res.stderr
    assert "n2" in res.stderr and "lost" in res.stderr.lower(), res.stderr
    assert "n1" not in res.stderr, res.stderr  # the healthy node finished on its own


def test_a_node_whose_processes_die_is_reported_not_hung():
    fake = FakeTransport()

    def kill_when_started() -> None:
        deadline = time.monotonic() + 30
        while not fake.pids.get("n1") and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.5)
        fake.kill("n1")

    t = threading.Thread(target=kill_when_started)
    t.start()
    started = time.monotonic()
    try:
        res = _exec(fake, "-H", "n1", "--", "sleep 30")
    finally:
        t.join()
    assert time.monotonic() - started < 20
    assert res.exit_code != 0, res.stdout
