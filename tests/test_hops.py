"""Where a one-shot command's time goes (``DTRAIN_HOPS=1``, launcher/text/hops.py,
docs/connections.md): the marks, their spans, and on the real-sshd cluster a warm and a cold
`exec` that say each hop they passed, summing to their total."""

from __future__ import annotations

import os
import re
import time

import pytest

from launcher.text import hops
from tests.test_resident import warm  # noqa: F401  (the fixture)
from tests.util import dtrain

HOPS = re.compile(r"^dtrain: hops \(ms\): (.*) \| total ([\d.]+)$", re.M)


def parsed(stderr: str) -> tuple[dict[str, float], float]:
    m = HOPS.search(stderr)
    assert m, stderr
    spans = {}
    for part in m.group(1).split(" | "):
        name, _, ms = part.rpartition(" ")
        spans[name] = float(ms)
    return spans, float(m.group(2))


def test_spans_follow_the_order_and_skip_what_was_not_passed() -> None:
    marks = {"end": 10.5, "process": 10.0, "command": 10.2, "entry": 10.05}
    assert hops.spans(marks) == [("process → entry", pytest.approx(0.05)),
                                 ("entry → command", pytest.approx(0.15)),
                                 ("command → end", pytest.approx(0.3))]
    # another clock's mark earlier than the one before it: 0, never negative
    assert hops.spans({"sent": 5.0, "forked": 4.9}) == [("sent → forked", 0.0)]
    line = hops.line({"process": 1.0, "entry": 1.02, "end": 1.1})
    assert line == "dtrain: hops (ms): process → entry 20.0 | entry → end 80.0 | total 100.0"


def test_marks_travel_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(hops.ENV, "1")
    monkeypatch.delenv(hops.CARRY, raising=False)
    hops.carry(process=1.5, entry=None)
    hops.carry(first_byte=2.25)
    assert hops.parse(os.environ[hops.CARRY]) == {"process": 1.5, "first byte": 2.25}
    assert hops.parse("x=1,garbage,y=nan?") == {"x": 1.0}


def test_off_by_default_and_said_once(monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv(hops.ENV, raising=False)
    monkeypatch.setattr(hops, "_marks", {})
    hops.mark("command")
    hops.report()
    assert hops._marks == {} and capsys.readouterr().err == ""
    monkeypatch.setenv(hops.ENV, "1")
    monkeypatch.delenv(hops.CARRY, raising=False)
    hops.mark("command")
    hops.mark("exit status", last=True)
    hops.mark("exit status", last=True, t=time.time() + 0.001)
    hops.report()
    hops.report()
    err = capsys.readouterr().err
    assert err.count("dtrain: hops") == 1 and "command → exit status" in err, err


def test_the_process_start_is_before_now_and_recent() -> None:
    start = hops.process_start()
    assert start is not None and time.time() - 3600 < start <= time.time()


@pytest.mark.ssh
def test_a_warm_and_a_cold_exec_say_each_hop(warm) -> None:  # noqa: F811
    env = {**warm, "DTRAIN_HOPS": "1"}
    res = dtrain(["exec", "-H", "node[1-2]", "--", "echo hi"], env=env)
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.splitlines()) == ["node1: hi", "node2: hi"]
    spans, total = parsed(res.stderr)
    assert list(spans) == ["process → entry", "entry → sent", "sent → forked",
                           "forked → command", "command → connected",
                           "connected → first byte", "first byte → exit status",
                           "exit status → end"], spans
    assert abs(sum(spans.values()) - total) < 0.5, (spans, total)
    cold = dtrain(["exec", "-H", "node[1-2]", "--", "echo hi"],
                  env={**env, "DTRAIN_RESIDENT": "0", "DTRAIN_PERSIST": "0"})
    assert cold.returncode == 0, cold.stderr
    spans, _ = parsed(cold.stderr)
    assert "entry → command" in spans and "sent → forked" not in spans, spans
    quiet = dtrain(["exec", "-H", "node1", "--", "true"], env=warm)
    assert quiet.returncode == 0 and "hops" not in quiet.stderr, quiet.stderr
