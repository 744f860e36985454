"""`dtrain run --detach`: a launcher that outlives the login session.

Design: the command re-executes itself instead of forking. Forking a process that has a
running event loop, open asyncssh connections and a console thread is unsafe (the child
inherits locks held by other threads, the loop's selector and the connections' sockets), so
the parent never starts any of that. It parses and validates the options (bad input still
exits 2 at once), then starts the same command line again as a child in a new session
(``start_new_session=True``: no controlling terminal, so no SIGHUP from a closing terminal;
stdin is /dev/null). The child does the whole run: connect, preflight, plan, launch. Until
every node's job has started, its stdout and stderr are pipes that the parent copies to the
terminal, so a preflight error prints exactly as in the foreground, and the parent exits with
the child's exit code. Ctrl-C in that phase is passed on to the child (SIGTERM and SIGHUP as
SIGTERM): the run is still in the foreground.

Once every node's job has started, the child detaches: it silences its console, points its
stdout and stderr at ``<run_dir>/launcher.log``, ignores SIGHUP and writes one JSON line
(``{"event": "started", "run_id", "path", "pid"}``) on a status pipe whose write end it got
from the parent (fd number in ``DTRAIN_DETACH_STATUS_FD``, removed from its environment at
once). The parent prints the run id and how to attach, ps and stop, and exits 0; the child,
now an orphan adopted by init, goes on with heartbeats, archive and teardown exactly as in the
foreground. The parent is the child's only reader, so it exits only after the child's pipes
are closed (or 2 s, if a local job kept a copy).

What the child runs is fixed and holds nothing of the request: ``python -P -c CHILD_CODE``.
The arguments (``-e NAME=value`` among them) reach it as JSON on its stdin, which it reads
whole and then replaces with /dev/null, so a launcher that lives for days keeps no secret in
its /proc/<pid>/cmdline. ``-P`` keeps the current directory off sys.path: a project's own
``json.py``, ``secrets.py`` or ``types.py`` is never imported by the launcher (only dtrain's
own package directory is put first, as the parent found it).
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from launcher.exitcodes import exit_for_signal
from launcher.output import render

if TYPE_CHECKING:
    from launcher.output.rundir import RunDir

ENV_FD = "DTRAIN_DETACH_STATUS_FD"
LAUNCHER_LOG = "launcher.log"
_DRAIN_S = 2.0


# The detached child's whole program: read the request from stdin, put this dtrain first on
# sys.path, run the CLI. Nothing in it depends on the request (see the module docstring).
CHILD_CODE = ("import json, os, sys; req = json.loads(sys.stdin.buffer.read()); "
              "fd = os.open(os.devnull, os.O_RDONLY); os.dup2(fd, 0); os.close(fd); "
              "sys.path.insert(0, req['root']); sys.argv = ['dtrain', *req['argv']]; "
              "from launcher.cli import main; main()")


def child_argv() -> list[str]:
    """The fixed command line of the detached child (its arguments travel on stdin)."""
    return [sys.executable, "-P", "-c", CHILD_CODE]


def child_request(argv: list[str]) -> bytes:
    """What the child reads on stdin: this very dtrain (the same package, whatever the cwd)
    and the same arguments."""
    import launcher

    root = str(Path(launcher.__file__).resolve().parent.parent)
    return json.dumps({"root": root, "argv": argv}).encode()


def run_detached(argv: list[str], attach_hint: str) -> int:
    """The parent: start the run as a detached child, relay it until it has started."""
    r, w = os.pipe()
    env = {**os.environ, ENV_FD: str(w)}
    proc = subprocess.Popen(child_argv(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, pass_fds=(w,), start_new_session=True,
                            env=env)
    os.close(w)
    assert proc.stdin is not None
    with contextlib.suppress(BrokenPipeError):  # a child that died at once: its rc says why
        proc.stdin.write(child_request(argv))
    proc.stdin.close()
    forwards: dict[int, int] = {signal.SIGINT: signal.SIGINT, signal.SIGTERM: signal.SIGTERM,
                                signal.SIGHUP: signal.SIGTERM}
    previous = {sig: signal.signal(sig, lambda s, _f: _forward(proc, forwards[s]))
                for sig in forwards}
    try:
        started = _relay(proc, r)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        os.close(r)
    if started is None:
        rc = proc.wait()
        return rc if rc >= 0 else exit_for_signal(-rc)
    run_id, path, pid = started.get("run_id"), started.get("path"), started.get("pid")
    render.note(f"run {run_id} started; detached (launcher pid {pid}): closing this shell "
                "does not stop it")
    render.note(f"follow it: dtrain attach {run_id}{attach_hint}   list: dtrain ps"
                f"{attach_hint}   stop it: dtrain stop {run_id}{attach_hint}")
    render.note(f"launcher log: {Path(str(path)) / LAUNCHER_LOG}")
    return 0


def _forward(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)


def _relay(proc: subprocess.Popen[bytes], status_fd: int) -> dict[str, Any] | None:
    """Copy the child's output until it reports "started" (its JSON) or ends (None)."""
    assert proc.stdout is not None and proc.stderr is not None
    sel = selectors.DefaultSelector()
    outs: dict[int, BinaryIO] = {proc.stdout.fileno(): sys.stdout.buffer,
                                 proc.stderr.fileno(): sys.stderr.buffer}
    for fd in outs:
        sel.register(fd, selectors.EVENT_READ)
    sel.register(status_fd, selectors.EVENT_READ)
    status = b""
    started: dict[str, Any] | None = None
    started_at = 0.0
    while sel.get_map():
        if started is not None and time.monotonic() - started_at > _DRAIN_S:
            break  # a local job kept a copy of the pipes: the child has detached anyway
        for key, _ in sel.select(timeout=0.2):
            data = os.read(key.fd, 65536)
            if not data:
                sel.unregister(key.fd)
                continue
            if key.fd == status_fd:
                status += data
                started = started or _started(status)
                if started is not None:
                    started_at = time.monotonic()
                    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                        signal.signal(sig, signal.SIG_IGN)  # the run is on its own now
                continue
            out = outs[key.fd]
            out.write(data)
            out.flush()
    sel.close()
    return started


def _started(status: bytes) -> dict[str, Any] | None:
    for raw in status.split(b"\n")[:-1]:
        with contextlib.suppress(ValueError):
            msg = json.loads(raw)
            if isinstance(msg, dict) and msg.get("event") == "started":
                return msg
    return None


class Detacher:
    """The child's end: run in the foreground until started, then leave the terminal."""

    def __init__(self, status_fd: int) -> None:
        self.status_fd: int | None = status_fd
        self.detached = False

    @classmethod
    def from_env(cls) -> Detacher | None:
        """The detached child's status pipe (None in a plain `dtrain run`)."""
        value = os.environ.pop(ENV_FD, None)
        if value is None:
            return None
        fd = int(value)
        os.set_inheritable(fd, False)  # no job process may hold the parent's pipe
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        return cls(fd)

    def detach(self, run_id: str, run_dir: RunDir) -> None:
        """Point stdout/stderr at the launcher log (0600, in the held run directory) and tell
        the parent we have started."""
        if self.detached:
            return
        self.detached = True
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        log = run_dir.append(LAUNCHER_LOG)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        sys.stderr.write(f"dtrain: {time.strftime('%Y-%m-%d %H:%M:%S')} detached: launcher "
                         f"pid {os.getpid()}, run {run_id}\n")
        sys.stderr.flush()
        msg = {"event": "started", "run_id": run_id, "path": str(run_dir.path),
               "pid": os.getpid()}
        if self.status_fd is not None:
            with contextlib.suppress(OSError):  # the parent was killed: we go on regardless
                os.write(self.status_fd, (json.dumps(msg) + "\n").encode())
            os.close(self.status_fd)
            self.status_fd = None
