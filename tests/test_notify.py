"""`dtrain run --notify` (job/notify.py): a real HTTP server on 127.0.0.1 (stdlib, started
here) gets the run's events as JSON POSTs with a Slack-compatible ``text``; a command gets
them on stdin without a shell; a dead endpoint is one console line and the run goes on;
the URL's secrets never reach meta.json or the console."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from launcher.job.notify import redact_url
from tests.util import REPO, webhook

SCRIPT = "import time\nfor i in range(3):\n    print(f'step {i}', flush=True); time.sleep(0.2)\n"


@pytest.fixture
def server() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    for port, got in webhook():
        yield f"http://127.0.0.1:{port}", got


def run(tmp_path: Path, notify: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "s.py"
    script.write_text(SCRIPT)
    return subprocess.run([sys.executable, "-m", "launcher", "run", "-H", "localhost",
                           "--nproc-per-node", "1", "--archive-dir", str(tmp_path / "runs"),
                           "--no-color", "--notify", notify, str(script)], cwd=REPO,
                          text=True, capture_output=True, timeout=180)


def meta_of(tmp_path: Path) -> dict[str, Any]:
    (path,) = (tmp_path / "runs").glob("*/meta.json")
    return json.loads(path.read_text())


def test_a_webhook_gets_started_and_ended_with_the_goodput(
        tmp_path: Path, server: tuple[str, list[dict[str, Any]]]) -> None:
    base, got = server
    url = f"{base}/services/T0123ABCD/B0456EFGH/s3cretTOKENvalue99?token=hush"
    res = run(tmp_path, url)
    assert res.returncode == 0, res.stdout + res.stderr
    assert [e["event"] for e in got] == ["started", "ended"], got
    m = meta_of(tmp_path)
    assert all(e["run_id"] == m["run_id"] and e["text"].startswith("dtrain run ")
               for e in got)
    end = got[-1]
    assert end["exit_code"] == 0 and end["goodput"] == m["goodput"]["goodput"]
    assert "goodput" in end["text"] and got[0]["path"].startswith("/services/")
    stored = json.dumps(m) + res.stdout + res.stderr
    assert "s3cretTOKENvalue99" not in stored and "hush" not in stored
    assert "T0123ABCD" not in stored


def test_a_command_gets_the_event_on_stdin_without_a_shell(tmp_path: Path) -> None:
    out = tmp_path / "events.jsonl"
    sink = tmp_path / "sink.py"
    sink.write_text("import sys\nopen(sys.argv[1], 'a').write(sys.stdin.read() + '\\n')\n")
    res = run(tmp_path, f"{sys.executable} {sink} {out} ;touch {tmp_path / 'injected'}")
    assert res.returncode == 0, res.stdout + res.stderr
    events = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    assert [e["event"] for e in events] == ["started", "ended"]
    assert not (tmp_path / "injected").exists()


def test_a_dead_endpoint_is_one_line_and_the_run_goes_on(tmp_path: Path) -> None:
    res = run(tmp_path, "http://127.0.0.1:9/hook/abcdef0123456789")
    assert res.returncode == 0, res.stdout + res.stderr
    lines = [ln for ln in (res.stdout + res.stderr).splitlines() if "notify " in ln]
    assert len(lines) == 2 and all("not sent" in ln for ln in lines), lines
    assert "abcdef0123456789" not in res.stdout + res.stderr


def test_redact_url() -> None:
    assert redact_url("https://u:p@hooks.slack.com/services/T0/B0/XXXXXXXXXXXXXXXXXXXXXXXX") \
        == "https://***@hooks.slack.com/services/T0/B0/***"
    assert redact_url("http://h:8080/notify/run42abc?key=v&x=1") == \
        "http://h:8080/notify/***?key=***&x=***"


def test_notify_in_the_user_config_is_the_default(
        tmp_path: Path, server: tuple[str, list[dict[str, Any]]]) -> None:
    base, got = server
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'notify = "{base}/from-config"\n')
    script = tmp_path / "s.py"
    script.write_text(SCRIPT)
    import os

    res = subprocess.run([sys.executable, "-m", "launcher", "run", "-H", "localhost",
                          "--nproc-per-node", "1", "--archive-dir", str(tmp_path / "runs"),
                          str(script)], cwd=REPO, text=True, capture_output=True, timeout=180,
                         env={**os.environ, "DTRAIN_CONFIG": str(cfg)})
    assert res.returncode == 0, res.stdout + res.stderr
    assert [(e["path"], e["event"]) for e in got] == [("/from-config", "started"),
                                                      ("/from-config", "ended")]


BUG = ("import time\nprint('step 1', flush=True)\ntime.sleep(0.2)\n\n\ndef step(n):\n"
       "    raise ValueError(f'bad batch at step {n}')\n\n\nstep(7)\n")


def test_a_failed_attempt_names_its_fingerprint_and_how_often_it_was_seen(
        tmp_path: Path, server: tuple[str, list[dict[str, Any]]]) -> None:
    """Issue 53 item 5: a failed run's ``ended`` and a relaunch's ``relaunched`` name the
    failure's fingerprint and say ``seen N times on M nodes since DATE``, counted in the
    incident store across runs (one store in tmp_path)."""
    import os
    import re

    base, got = server
    script = tmp_path / "bug.py"
    script.write_text(BUG)
    env = {**os.environ, "DTRAIN_STATE_DIR": str(tmp_path / "state")}

    def run_bug(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "launcher", "run", "-H", "localhost",
                               "--nproc-per-node", "1", "--archive-dir", str(tmp_path / "runs"),
                               "--no-color", "--notify", f"{base}/hook", *extra, str(script)],
                              cwd=REPO, text=True, capture_output=True, timeout=240, env=env)

    res = run_bug()
    assert res.returncode == 1, res.stdout + res.stderr
    assert [e["event"] for e in got] == ["started", "ended"], got
    word = re.compile(r"fingerprint ([0-9a-f]{12}) \(ValueError at bug\.py:step\), seen "
                      r"(\d+) times? on (\d+) nodes? since \d{4}-\d\d-\d\d \d\d:\d\d$")
    m = word.search(got[-1]["text"])
    assert m is not None and m.group(2, 3) == ("1", "1"), got[-1]["text"]
    fp = m.group(1)
    inc = got[-1]["incident"]
    assert (inc["fingerprint"], inc["seen"], inc["nodes"], inc["host"]) == (fp, 1, 1,
                                                                           "localhost")
    # a second run, relaunched once: its relaunch and its end count on
    got.clear()
    res = run_bug("--restarts", "1", "--restart-backoff", "0.2")
    assert res.returncode == 1, res.stdout + res.stderr
    assert [e["event"] for e in got] == ["started", "relaunched", "ended"], got
    relaunched, end = got[1], got[2]
    assert "attempt 1 failed: fingerprint " + fp in relaunched["text"], relaunched
    assert word.search(relaunched["text"]).group(2, 3) == ("2", "1")  # type: ignore[union-attr]
    assert word.search(end["text"]).group(2, 3) == ("3", "1")  # type: ignore[union-attr]
    assert relaunched["incident"]["fingerprint"] == end["incident"]["fingerprint"] == fp
    # item 4: each record charged the seconds its attempt cost, from the run's goodput
    # ledger (the plain run's at once, the restarting run's attempts at its end)
    from launcher.decide.outcome.incidents import COST_CAUSES
    from launcher.job.incidents import IncidentStore

    records = IncidentStore(tmp_path / "state").load()
    assert [r.attempt for r in records] == [1, 1, 2], records
    for r in records:
        assert r.seconds is not None and set(r.seconds) == set(COST_CAUSES), r
        assert r.time_lost is not None and r.time_lost > 0, r
        ledger = json.loads((tmp_path / "runs" / r.run_id / "meta.json").read_text())
        (a,) = [a for a in ledger["goodput"]["attempts"] if a["n"] == r.attempt]
        assert r.seconds["startup"] == a["seconds"]["startup"], (r, a)
        assert r.versions.get("nccl"), r.versions
    # a run that succeeds says no fingerprint
    got.clear()
    assert run(tmp_path, f"{base}/hook").returncode == 0
    assert "incident" not in got[-1] and "fingerprint" not in got[-1]["text"]
