"""Issue 50 items 2 and 3: `--notify`'s secrets and a slow endpoint (job/notify.py).

- a URL with a password (``http://user:PASS@127.0.0.1:<closed port>/...``): the password is
  never on stdout, stderr or in any file of the run's archive; the "not sent" line names the
  error's kind only; userinfo is sent as basic authentication, never as a host name;
- the URL is on no command line dtrain starts for a run (a detached run: on none at all);
- a slow endpoint (a server on 127.0.0.1 that sleeps per request): events arrive in order,
  the queue is bounded, a drop is counted and said once.

Every endpoint is on 127.0.0.1 (a real server started here, or a port just closed)."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from launcher.job import notify
from launcher.job.notify import Notifier, redact_url
from tests.util import REPO, webhook

PASSWORD = "S3cretPassw0rdXyz"  # noqa: S105 - the secret the tests look for
SCRIPT = "import time\nprint('step 1', flush=True)\ntime.sleep({sleep})\n"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


serve = webhook  # the server every --notify test uses (tests/util.py)


@pytest.fixture
def server() -> Iterator[tuple[int, list[dict[str, Any]]]]:
    yield from serve()


@pytest.fixture
def slow_server() -> Iterator[tuple[int, list[dict[str, Any]]]]:
    yield from serve(delay=0.3)


def dtrain_run(tmp_path: Path, *args: str, sleep: float = 0.2,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "s.py"
    script.write_text(SCRIPT.format(sleep=sleep))
    return subprocess.run([sys.executable, "-m", "launcher", "run", "-H", "localhost",
                           "--nproc-per-node", "1", "--archive-dir", str(tmp_path / "runs"),
                           "--no-color", *args, str(script)], cwd=REPO, text=True,
                          capture_output=True, timeout=120, env={**os.environ, **(env or {})})


def archive_text(tmp_path: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in (tmp_path / "runs").rglob("*")
                   if p.is_file())


# -- item 2: the password is never shown ------------------------------------------------------

@pytest.mark.parametrize("port", ["closed", "none", "bad"])
def test_a_failed_send_never_shows_the_password(port: str) -> None:
    """Before: ``http://u:PASS@127.0.0.1/x`` was "not sent (InvalidURL: nonnumeric port:
    'PASS@127.0.0.1')", and a bad port made the notifier itself raise."""
    hostport = {"closed": f"127.0.0.1:{closed_port()}", "none": "127.0.0.1",
                "bad": "127.0.0.1:port"}[port]
    said: list[str] = []
    n = Notifier(f"http://user:{PASSWORD}@{hostport}/hook", "r1", said.append, timeout=2)
    n.event("started", "started")
    n.close()
    assert said and all(PASSWORD not in line for line in said), said
    assert said[0].startswith(f"notify http://***@{hostport}/hook: started not sent ("), said


def test_redact_url_hides_userinfo_whatever_the_port() -> None:
    assert redact_url(f"http://user:{PASSWORD}@127.0.0.1:notaport/x") == \
        "http://***@127.0.0.1:notaport/x"
    assert redact_url(f"https://{PASSWORD}@h/x") == "https://***@h/x"
    assert redact_url(f"http://u:p@{PASSWORD}@h:1/x") == "http://***@h:1/x"


def test_userinfo_is_sent_as_basic_auth_not_as_the_host(
        server: tuple[int, list[dict[str, Any]]]) -> None:
    port, got = server
    said: list[str] = []
    n = Notifier(f"http://user:{PASSWORD}@127.0.0.1:{port}/hook/x?a=1", "r1", said.append,
                 timeout=5)
    n.event("started", "started")
    n.close()
    assert said == []
    (ev,) = got
    assert ev["path"] == "/hook/x?a=1" and ev["event"] == "started"
    assert ev["auth"] == "Basic " + base64.b64encode(f"user:{PASSWORD}".encode()).decode()


def test_a_notify_command_is_shown_by_its_program_alone() -> None:
    """A command's arguments may hold a password (``curl -u me:PASS``): never shown."""
    assert notify.redact_target(f"curl -u me:{PASSWORD} https://h/x") == \
        "curl ... (arguments not shown)"
    assert notify.redact_target("/usr/local/bin/page-me") == "/usr/local/bin/page-me"
    assert notify.redact_target("sh -c 'unbalanced") == "sh ... (arguments not shown)"
    line = notify.redact_argv(["dtrain", "run", "--notify", f"mail -p {PASSWORD} me", "t.py"])
    assert PASSWORD not in " ".join(line) and line[3] == "mail ... (arguments not shown)"
    line = notify.redact_argv(["dtrain", "run", f"--notify=mail -p {PASSWORD} me"])
    assert line[2] == "--notify=mail ... (arguments not shown)"


def test_a_run_never_shows_the_password_on_its_console_or_in_its_archive(
        tmp_path: Path) -> None:
    url = f"http://user:{PASSWORD}@127.0.0.1:{closed_port()}/hook"
    res = dtrain_run(tmp_path, "--notify", url)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = [ln for ln in res.stderr.splitlines() if "not sent" in ln]
    assert len(lines) == 2 and all("(ConnectionRefusedError)" in ln for ln in lines), lines
    assert PASSWORD not in res.stdout + res.stderr
    stored = archive_text(tmp_path)
    assert "--notify" in stored and PASSWORD not in stored  # meta.json's command, redacted
    dry = dtrain_run(tmp_path, "--dry-run", "--offline", f"--notify={url}")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert PASSWORD not in dry.stdout + dry.stderr


# -- item 3: the URL on command lines (ps) ---------------------------------------------------

def cmdlines() -> dict[int, bytes]:
    found = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                found[int(proc.name)] = (proc / "cmdline").read_bytes()
            except OSError:
                pass
    return found


def wait_for(path: Path, what: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            meta = json.loads(path.read_text())
            if meta.get("state") in what.split("|"):
                return dict(meta)
        except (OSError, ValueError):
            pass
        time.sleep(0.1)
    raise AssertionError(f"{path}: never {what}")


def test_a_detached_run_puts_the_url_on_no_command_line(tmp_path: Path) -> None:
    """While the run lasts, no process (the detached launcher, torchrun, the supervisor, the
    ranks) has the URL's secret in /proc/<pid>/cmdline: the child gets its arguments on
    stdin (commands/detach.py), and nothing of --notify goes to a node."""
    url = f"http://user:{PASSWORD}@127.0.0.1:{closed_port()}/hook"
    res = dtrain_run(tmp_path, "--detach", "--run-id", "det", "--notify", url, sleep=3)
    assert res.returncode == 0, res.stdout + res.stderr
    meta = tmp_path / "runs" / "det" / "meta.json"
    wait_for(meta, "running")
    during = cmdlines()
    deadline = time.monotonic() + 60  # "running" is the nodes' hello; the rank comes after
    while not any(b"s.py" in c for c in during.values()) and time.monotonic() < deadline:
        time.sleep(0.05)
        during = cmdlines()
    # the detached launcher, titled with its run (docs/runs.md)
    assert any(c.startswith(b"dtrain run det ") for c in during.values())
    assert any(b"s.py" in c for c in during.values())  # the rank is up
    assert not [c for c in during.values() if PASSWORD.encode() in c]
    assert wait_for(meta, "finished")["exit_code"] == 0
    assert PASSWORD not in archive_text(tmp_path)


def test_a_foreground_run_starts_nothing_with_the_url(tmp_path: Path) -> None:
    """The URL from the user config (not the command line): no process of the run shows it."""
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'notify = "http://user:{PASSWORD}@127.0.0.1:{closed_port()}/hook"\n')
    seen: list[bytes] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.extend(c for c in cmdlines().values() if b"s.py" in c or PASSWORD.encode() in c)
            time.sleep(0.05)

    t = threading.Thread(target=watch)
    t.start()
    try:
        res = dtrain_run(tmp_path, sleep=2, env={"DTRAIN_CONFIG": str(cfg)})
    finally:
        stop.set()
        t.join()
    assert res.returncode == 0, res.stdout + res.stderr
    assert "not sent" in res.stderr  # the URL was used
    assert any(b"s.py" in c for c in seen)  # the watch saw the run
    assert not [c for c in seen if PASSWORD.encode() in c]
    assert PASSWORD not in res.stdout + res.stderr + archive_text(tmp_path)


# -- item 3: a slow endpoint ------------------------------------------------------------------

def test_a_slow_endpoint_gets_every_event_in_order(
        slow_server: tuple[int, list[dict[str, Any]]]) -> None:
    port, got = slow_server
    said: list[str] = []
    n = Notifier(f"http://127.0.0.1:{port}/hook", "r1", said.append, timeout=5)
    started = time.monotonic()
    for i in range(5):
        n.event("e", f"event {i}", i=i)
    assert time.monotonic() - started < 0.2  # queueing never waits for the endpoint
    n.close()
    assert [e["i"] for e in got] == [0, 1, 2, 3, 4] and said == []


def test_events_beyond_the_queue_are_dropped_counted_and_said_once(
        slow_server: tuple[int, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(notify, "QUEUE_MAX", 3)
    port, got = slow_server
    said: list[str] = []
    n = Notifier(f"http://127.0.0.1:{port}/hook", "r1", said.append, timeout=1.5)
    started = time.monotonic()
    for i in range(10):
        n.event("e", f"event {i}", i=i)
    assert time.monotonic() - started < 0.2
    n.close()
    assert time.monotonic() - started < 3  # the end is bounded too
    sent = [e["i"] for e in got]
    assert sent == sorted(sent) and sent[0] == 0, sent  # in order, the first kept
    dropped = [ln for ln in said if "dropped" in ln]
    assert len(dropped) == 2, said  # the first drop, at once; the count, at the end
    assert "3 events queued" in dropped[0]
    assert n.dropped >= 6 and f"{n.dropped} dropped" in dropped[1], said
    assert dropped[1].startswith(f"notify http://127.0.0.1:{port}/hook: ")
    assert len(said) == 2, said


def test_an_endpoint_too_slow_for_the_end_is_counted_not_waited_for(
        monkeypatch: pytest.MonkeyPatch) -> None:
    gen = serve(delay=1.0)
    port, got = next(gen)
    try:
        said: list[str] = []
        n = Notifier(f"http://127.0.0.1:{port}/hook", "r1", said.append, timeout=1.5)
        for i in range(4):
            n.event("e", f"event {i}", i=i)
        started = time.monotonic()
        n.close()
        assert time.monotonic() - started < 2.5
        assert said and "still queued" in said[-1] and "event(s) not sent" in said[-1], said
    finally:
        gen.close()
