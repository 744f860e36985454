"""`dtrain run --notify URL|COMMAND`: a word to the team when it matters (docs/goodput.md).

Events: ``started``, ``hang`` (with the culprit), ``fenced``, ``relaunched``, ``ended`` (the
verdict and the goodput). A URL (http:// or https://) gets a JSON POST whose ``text`` field
is a Slack-compatible one-line message; anything else is a command (split like a shell
would, run without a shell) that gets the event's JSON on stdin and in ``DTRAIN_EVENT``.

Sending never blocks or slows the run: events go into a bounded queue (``QUEUE_MAX``) served,
in order, by one daemon thread; each send has a timeout (``TIMEOUT_S``); at the end of the
run the thread gets at most ``TIMEOUT_S`` more to finish. An endpoint slower than the events:
the first event that finds the queue full is said at once, and at the end one line counts
every event not sent (dropped, or still queued when the time was up). A failed notification
is one console line naming the event and the error's kind (its type, an HTTP status, never
the error's text, which may echo the URL).

A secret in the URL (userinfo, query values, token-like path parts) is redacted wherever
dtrain prints it (``redact_url``). Userinfo (``https://user:pass@host/``) is sent as HTTP
basic authentication, never as part of the host name (urllib would look ``user:pass@host``
up in DNS).
"""

from __future__ import annotations

import base64
import json
import os
import queue
import re
import shlex
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

TIMEOUT_S = 5.0
QUEUE_MAX = 64
_TOKENISH = re.compile(r"(?=.*\d)[A-Za-z0-9_\-]{8,}|[A-Za-z0-9_\-]{20,}")


def is_url(target: str) -> bool:
    return target.startswith(("http://", "https://"))


def redact_url(url: str) -> str:
    """The URL as dtrain prints it: no userinfo, no query values, no token-like path part
    (a Slack webhook's ``/services/T0/B0/XXXX``: every part with a digit and 8+ chars)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "***"
    # the netloc as written after any userinfo (a port that is not a number stays visible:
    # it is not secret, and reading it as ``parts.port`` would raise)
    host = parts.netloc.rpartition("@")[2]
    if "@" in parts.netloc:
        host = f"***@{host}"
    path = "/".join("***" if _TOKENISH.fullmatch(p) else p for p in parts.path.split("/"))
    query = "&".join(f"{kv.split('=', 1)[0]}=***" for kv in parts.query.split("&") if kv)
    return urlunsplit((parts.scheme, host, path, query, ""))


def redact_target(target: str) -> str:
    """A --notify target as dtrain prints and records it: a URL redacted (redact_url); a
    command by its program alone, since its arguments may hold a password or a token
    (``curl -u me:secret ...``) that no rule can tell from a plain word."""
    if is_url(target):
        return redact_url(target)
    try:
        words = shlex.split(target)
    except ValueError:
        words = target.split()
    if not words:
        return target
    return words[0] if len(words) == 1 else f"{words[0]} ... (arguments not shown)"


def redact_argv(argv: list[str]) -> list[str]:
    """A recorded command line with --notify's URL redacted."""
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == "--notify" and i + 1 < len(out):
            out[i + 1] = redact_target(out[i + 1])
        elif arg.startswith("--notify="):
            out[i] = "--notify=" + redact_target(arg.split("=", 1)[1])
    return out


def request_of(url: str) -> tuple[str, dict[str, str]]:
    """The URL to open and its headers: userinfo leaves the URL (urllib would take
    ``user:pass@host`` for the host name, look it up in DNS and echo it in its errors) and
    becomes HTTP basic authentication."""
    parts = urlsplit(url)
    headers = {"Content-Type": "application/json"}
    if "@" not in parts.netloc:
        return url, headers
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    token = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode()
    headers["Authorization"] = f"Basic {token}"
    return urlunsplit((parts.scheme, hostport, parts.path, parts.query, "")), headers


class CommandFailed(Exception):
    """A notify command exited non-zero."""

    def __init__(self, code: int) -> None:
        super().__init__(f"exit {code}")
        self.code = code


def why_not_sent(exc: BaseException) -> str:
    """A failed send as dtrain prints it: the error's kind, never its text (urllib's and
    http.client's messages may quote the URL, its userinfo included)."""
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code}"
    if isinstance(exc, CommandFailed):
        return f"exit {exc.code}"
    if isinstance(exc, urllib.error.URLError) and isinstance(exc.reason, BaseException):
        return type(exc.reason).__name__
    return type(exc).__name__


class Notifier:
    """One run's notifications: ``event`` queues, a daemon thread sends them in order,
    ``close`` ends (bounded) and counts what was not sent."""

    def __init__(self, target: str, run_id: str, say: Callable[[str], None],
                 timeout: float = TIMEOUT_S) -> None:
        self.target, self.run_id, self.say, self.timeout = target, run_id, say, timeout
        self.shown = redact_target(target)
        self._q: queue.Queue[dict[str, Any] | None] = queue.Queue(QUEUE_MAX)
        self.dropped = 0  # events that found the queue full
        self.queued = 0  # events that went into the queue
        self.done = 0  # of those, the ones the thread finished with (sent or failed)
        self._thread = threading.Thread(target=self._serve, name="dtrain-notify", daemon=True)
        self._thread.start()

    def event(self, kind: str, text: str, **fields: Any) -> None:
        ev = {"event": kind, "run_id": self.run_id, "t": time.time(),
              "text": f"dtrain run {self.run_id}: {text}", **fields}
        try:
            self._q.put_nowait(ev)
            self.queued += 1
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1:
                self.say(f"notify {self.shown}: {QUEUE_MAX} events queued, the endpoint "
                         f"is slower than the run: {kind} and any later event that finds "
                         "the queue full are dropped (counted at the end)")

    def close(self) -> None:
        """Let the queued events go, for at most ``timeout`` seconds more; then one line
        counts the events not sent (dropped, or still queued)."""
        deadline = time.monotonic() + self.timeout
        try:  # waits for room while the thread works (a full queue), never past the deadline
            self._q.put(None, timeout=max(0.0, deadline - time.monotonic()))
        except queue.Full:
            pass
        self._thread.join(max(0.0, deadline - time.monotonic()))
        left = self.queued - self.done
        if self.dropped or left:
            parts = ([f"{self.dropped} dropped (the queue was full)"] if self.dropped else []) \
                + ([f"{left} still queued after {self.timeout:g} s more"] if left else [])
            self.say(f"notify {self.shown}: {self.dropped + left} event(s) not sent: "
                     f"{', '.join(parts)}")

    def _serve(self) -> None:
        while True:
            ev = self._q.get()
            if ev is None:
                return
            try:
                self._send(ev)
            except Exception as exc:  # noqa: BLE001 - one console line, never the run's end
                self.say(f"notify {self.shown}: {ev['event']} not sent ({why_not_sent(exc)})")
            finally:
                self.done += 1

    def _send(self, ev: dict[str, Any]) -> None:
        body = json.dumps(ev).encode()
        if is_url(self.target):
            url, headers = request_of(self.target)
            req = urllib.request.Request(url, data=body, method="POST", headers=headers)
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # noqa: S310
                resp.read(1024)
            return
        argv = shlex.split(self.target)
        res = subprocess.run(argv, input=body, timeout=self.timeout, check=False,
                             capture_output=True,
                             env={**os.environ, "DTRAIN_EVENT": body.decode()})
        if res.returncode != 0:
            raise CommandFailed(res.returncode)


_active: Notifier | None = None


def start(target: str | None, run_id: str, say: Callable[[str], None]) -> Notifier | None:
    global _active
    _active = Notifier(target, run_id, say) if target else None
    return _active


def event(kind: str, text: str, **fields: Any) -> None:
    """An event of the run being launched (no-op without --notify)."""
    if _active is not None:
        _active.event(kind, text, **fields)


def stop() -> None:
    global _active
    if _active is not None:
        _active.close()
        _active = None
