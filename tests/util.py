"""Helpers for tests that run the real `dtrain` command."""

from __future__ import annotations

import contextlib
import importlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

import pytest

# a second local user of the test machine (tests/conftest.py's ``intruder`` fixture) and the
# interpreter it runs (Debian's, as a real second account would)
INTRUDER = "dtrain-intruder"
SYSTEM_PYTHON = "/usr/bin/python3"

REPO = Path(__file__).resolve().parent.parent

# scripts/test (CI) sets DTRAIN_REQUIRE_CLUSTER=1: there, a test that cannot run (no cluster,
# no ruff, no mypy, no torch) is a failure, not a skip. Read once, at import: the autouse
# fixture in conftest.py clears DTRAIN_* from each test's environment.
REQUIRE_CLUSTER = os.environ.get("DTRAIN_REQUIRE_CLUSTER") == "1"


@contextlib.contextmanager
def tbf(dev: str, rate: str, latency: str = "200ms") -> Iterator[None]:
    """Everything out of ``dev`` (a node's root-side veth: into the node) at ``rate``, with a
    token bucket (this kernel has no netem); the qdisc removed after."""
    subprocess.run(["tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst",
                    "16kb", "latency", latency], check=True)
    try:
        yield
    finally:
        subprocess.run(["tc", "qdisc", "del", "dev", dev, "root"], check=False)


def node_program(name: str = "supervisor") -> Path:
    """Node program ``name`` as the nodes get it (launcher/nodeside/wire.py bundles the
    supervisor's modules into one source), in a file: what a test runs as a script, and
    the rank shim torchrun starts. One file per source, in this process's temp dir."""
    import hashlib
    import tempfile

    from launcher.nodeside import wire

    source = wire.program_source(name)
    root = Path(tempfile.gettempdir()) / f"dtrain-tests-{os.getuid()}"
    root.mkdir(mode=0o700, exist_ok=True)
    folder = root / f"{name}-{hashlib.sha256(source).hexdigest()[:16]}"
    folder.mkdir(exist_ok=True)
    path = folder / f"{name}.py"  # its own name: a test may import it from there
    if not path.exists():
        tmp = folder / f".{name}.{os.getpid()}.tmp"
        tmp.write_bytes(source)
        tmp.replace(path)
    return path


def write_under(root: Path, rel: str, text: str | bytes) -> None:
    """Write ``text`` at the absolute path ``rel`` under a fake root directory (a node's
    /proc or /sys as the sampler and probe tests build it), its directories made."""
    path = root / rel.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)


def cannot_run(reason: str, *, require: bool | None = None) -> NoReturn:
    """Skip the test, or fail it where everything must run (``DTRAIN_REQUIRE_CLUSTER=1``)."""
    if REQUIRE_CLUSTER if require is None else require:
        pytest.fail(f"{reason} (DTRAIN_REQUIRE_CLUSTER=1: every test must run here)",
                    pytrace=False)
    pytest.skip(reason)


def need_root(why: str) -> None:
    """Go on as root only (``why``: what needs it); elsewhere ``cannot_run``."""
    if os.geteuid() != 0:
        cannot_run(f"{why} needs root")


def need_module(name: str) -> ModuleType:
    """``pytest.importorskip`` that fails instead where everything must run."""
    try:
        return importlib.import_module(name)
    except ImportError:
        cannot_run(f"{name} is not installed")


def dtrain(args: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: Path = REPO,
           input: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run `python -m launcher ARGS` as a user would, capturing text output."""
    return subprocess.run([sys.executable, "-m", "launcher", *args], env=env, cwd=cwd,
                          input=input, capture_output=True, text=True, timeout=timeout)


# a Python traceback at the start of a line: dtrain (or a node program) crashed. A rank's own
# traceback is tagged ("node2 r1: Traceback ...") and does not match.
TRACEBACK = re.compile(r"^Traceback \(most recent call last\):", re.M)


def assert_exit(res: subprocess.CompletedProcess[str] | subprocess.CompletedProcess[bytes],
                code: int) -> None:
    """The documented exit ``code``, reached as an error message, not as a crash."""
    out = "".join(s.decode(errors="replace") if isinstance(s, bytes) else (s or "")
                  for s in (res.stdout, res.stderr))
    assert not TRACEBACK.search(out), f"a traceback, not an error message:\n{out[-4000:]}"
    assert res.returncode == code, f"exit {res.returncode}, expected {code}:\n{out[-4000:]}"


def wait_until(cond: Callable[[], object], timeout: float = 15.0,
               what: str = "condition") -> None:
    """Poll ``cond`` every 50 ms until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def proc_environ(pid: int | str) -> list[bytes]:
    """A process's initial environment as NAME=value entries ([] when it is gone or not
    ours to read): what the tests find a job's processes by (its DTRAIN_RUN_ID tag)."""
    try:
        return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return []


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def end_pid(pid: int, wait: float = 5.0) -> None:
    """Give a process ``wait`` seconds to end on its own, then SIGKILL it (by its pid)."""
    import signal

    deadline = time.monotonic() + wait
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if pid_alive(pid):
        os.kill(pid, signal.SIGKILL)


def interrupt_when(args: Sequence[str], env: Mapping[str, str], ready: Callable[[], bool],
                   timeout: float = 60) -> tuple[int, str, str]:
    """Start dtrain, SIGINT it (Ctrl-C) once ``ready()`` holds; (exit code, stdout, stderr).

    Fails if dtrain ends before it could be interrupted or ``ready`` does not hold within
    ``timeout`` seconds.
    """
    proc = subprocess.Popen([sys.executable, "-m", "launcher", *args], env=dict(env), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + timeout
        while not ready():
            assert proc.poll() is None, "dtrain finished before it could be interrupted"
            assert time.monotonic() < deadline, "never ready to interrupt"
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out, err


# a sitecustomize.py that records every socket.connect and name lookup of the process it is
# loaded into (PYTHONPATH) in the file $DTRAIN_TEST_DIAL_LOG: the oracle of "nothing dialled"
DIAL_SITECUSTOMIZE = '''
import os, socket
_log = os.environ["DTRAIN_TEST_DIAL_LOG"]
def _note(what):
    with open(_log, "a") as f:
        f.write(what + "\\n")
_connect, _connect_ex, _gai = socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo
def connect(self, address):
    _note("connect %r" % (address,))
    return _connect(self, address)
def connect_ex(self, address):
    _note("connect_ex %r" % (address,))
    return _connect_ex(self, address)
def getaddrinfo(host, *args, **kwargs):
    _note("getaddrinfo %r" % (host,))
    return _gai(host, *args, **kwargs)
socket.socket.connect, socket.socket.connect_ex = connect, connect_ex
socket.getaddrinfo = getaddrinfo
'''


def dial_watch(env: Mapping[str, str], site: Path) -> tuple[dict[str, str], Path]:
    """``env`` with DIAL_SITECUSTOMIZE loaded from ``site``; (env, the log it writes)."""
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(DIAL_SITECUSTOMIZE)
    log = site / "dials.log"
    out = dict(env)
    out.update(PYTHONPATH=os.pathsep.join(p for p in (str(site), str(REPO),
                                                      env.get("PYTHONPATH", "")) if p),
               DTRAIN_TEST_DIAL_LOG=str(log))
    return out, log


class StragglerRun:
    """`dtrain run` of tests/workloads/straggler.py on node[1-4] x 1 rank, node3 computing
    10x longer per step, sampled every ``interval`` s with the given straggler window and
    hold (plus ``extra`` options before the script); its console (stdout and stderr) read
    line by line. Leaving the ``with`` block stops it (the workload's stop file) and waits
    for dtrain (killed after 120 s); then ``output()`` is the whole console.
    """

    def __init__(self, cluster: Any, archive: Path, *extra: str, window: float, hold: float,
                 interval: float, prefix: str) -> None:
        import uuid

        self.stop = Path(cluster.shared_dir) / f"{prefix}-stop-{uuid.uuid4().hex}"
        self.cmd = [sys.executable, "-m", "launcher", "run", "-H", "node[1-4]", "--python",
                    cluster.python, "--nproc-per-node", "1", "--archive-dir", str(archive),
                    *extra, "--sample-interval", str(interval), "--straggler-window",
                    str(window), "--straggler-hold", str(hold), "tests/workloads/straggler.py",
                    str(self.stop), "node3"]
        self.env = cluster.client_env()
        self.seen: list[str] = []
        self.lines: queue.Queue[str] = queue.Queue()

    def __enter__(self) -> StragglerRun:
        self.proc = subprocess.Popen(self.cmd, env=self.env, cwd=REPO, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        threading.Thread(target=self._read, daemon=True).start()
        return self

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put("")

    def wait_line(self, what: str, timeout: float) -> str:
        """The next console line with ``what`` in it, within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"no {what!r} line in time:\n{''.join(self.seen)[-4000:]}"
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            assert line, f"dtrain ended before {what!r}:\n{''.join(self.seen)[-4000:]}"
            self.seen.append(line)
            if what in line:
                return line

    def __exit__(self, *exc: object) -> None:
        self.stop.touch()
        try:
            self.proc.wait(timeout=120)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.stop.unlink(missing_ok=True)

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    def output(self) -> str:
        """The whole console, once the run has ended (the rest read to its end)."""
        while (line := self.lines.get(timeout=10)) != "":
            self.seen.append(line)
        return "".join(self.seen)


def on_pty(argv: Sequence[str], env: Mapping[str, str], *,
           answers: Sequence[tuple[bytes, bytes]] = (), stdin: bool = False,
           cwd: Path | None = None, timeout: float = 60) -> tuple[int, bytes]:
    """Run ``argv`` with stdout and stderr on a new terminal; (exit code, what it wrote, the
    pty's CRLFs as they are). ``stdin``: stdin on the terminal too, as the controlling
    terminal of a new session (password prompts read it); else /dev/null. Each
    ``(prompt, reply)`` of ``answers`` is typed once its prompt appears."""
    import fcntl
    import select
    import termios

    def take_terminal() -> None:
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    pending = list(answers)
    master, slave = os.openpty()
    proc = subprocess.Popen(list(argv), stdin=slave if stdin else subprocess.DEVNULL,
                            stdout=slave, stderr=slave, env=dict(env), cwd=cwd,
                            preexec_fn=take_terminal if stdin else None)  # noqa: PLW1509
    os.close(slave)
    out, seen, deadline = b"", 0, time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.1)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            out += data
            if pending and pending[0][0] in out[seen:]:
                seen = len(out)
                os.write(master, pending.pop(0)[1])
    finally:
        os.close(master)
        code = proc.wait(timeout=10)
    return code, out


def webhook(delay: float = 0.0) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """A real HTTP server on 127.0.0.1 (stdlib) for --notify: (its port, what it got: each
    POST's path, Authorization header and JSON body, after ``delay`` s). A generator: the
    server stops when it is closed (``yield from webhook()`` in a fixture)."""
    import json
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    got: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers["Content-Length"]))
            time.sleep(delay)
            got.append({"path": self.path, "auth": self.headers.get("Authorization"),
                        **json.loads(body)})
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: Any) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(srv.server_address[1]), got
    finally:
        srv.shutdown()
        srv.server_close()
