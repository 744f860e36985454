"""`dtrain run --notify URL|COMMAND`: a word to the team when it matters (docs/goodput.md).

Events: ``started``, ``hang`` (with the culprit), ``fenced``, ``relaunched``, ``ended`` (the
verdict and the goodput). A URL (http:// or https://) gets a JSON POST whose ``text`` field
is a Slack-compatible one-line message; anything else is a command (split like a shell
would, run without a shell) that gets the event's JSON on stdin and in ``DTRAIN_EVENT``.

Sending never blocks or slows the run: events go into a bounded queue (full: the event is
dropped, said once) served by one daemon thread; each send has a timeout (``TIMEOUT_S``);
at the end of the run the thread gets at most ``TIMEOUT_S`` more to finish. A failed
notification is one console line. A secret in the URL (userinfo, query values, token-like
path parts) is redacted wherever dtrain prints it (``redact_url``).
"""

from __future__ import annotations

import json
import os
import queue
import re
import shlex
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

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
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    if parts.username or parts.password:
        host = f"***@{host}"
    path = "/".join("***" if _TOKENISH.fullmatch(p) else p for p in parts.path.split("/"))
    query = "&".join(f"{kv.split('=', 1)[0]}=***" for kv in parts.query.split("&") if kv)
    return urlunsplit((parts.scheme, host, path, query, ""))


def redact_target(target: str) -> str:
    return redact_url(target) if is_url(target) else target


def redact_argv(argv: list[str]) -> list[str]:
    """A recorded command line with --notify's URL redacted."""
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == "--notify" and i + 1 < len(out):
            out[i + 1] = redact_target(out[i + 1])
        elif arg.startswith("--notify="):
            out[i] = "--notify=" + redact_target(arg.split("=", 1)[1])
    return out


class Notifier:
    """One run's notifications: ``event`` queues, a daemon thread sends, ``close`` ends."""

    def __init__(self, target: str, run_id: str, say: Callable[[str], None],
                 timeout: float = TIMEOUT_S) -> None:
        self.target, self.run_id, self.say, self.timeout = target, run_id, say, timeout
        self.shown = redact_target(target)
        self._q: queue.Queue[dict[str, Any] | None] = queue.Queue(QUEUE_MAX)
        self._dropped = False
        self._thread = threading.Thread(target=self._serve, name="dtrain-notify", daemon=True)
        self._thread.start()

    def event(self, kind: str, text: str, **fields: Any) -> None:
        ev = {"event": kind, "run_id": self.run_id, "t": time.time(),
              "text": f"dtrain run {self.run_id}: {text}", **fields}
        try:
            self._q.put_nowait(ev)
        except queue.Full:
            if not self._dropped:
                self._dropped = True
                self.say(f"notify {self.shown}: too many events queued, some not sent")

    def close(self) -> None:
        """Let the queued events go, for at most ``timeout`` seconds more."""
        try:
            self._q.put_nowait(None)
        except queue.Full:
            pass
        self._thread.join(self.timeout)

    def _serve(self) -> None:
        while True:
            ev = self._q.get()
            if ev is None:
                return
            try:
                self._send(ev)
            except Exception as exc:  # noqa: BLE001 - one console line, never the run's end
                self.say(f"notify {self.shown}: {ev['event']} not sent "
                         f"({type(exc).__name__}: {redact_target(str(exc))[:200]})")

    def _send(self, ev: dict[str, Any]) -> None:
        body = json.dumps(ev).encode()
        if is_url(self.target):
            req = urllib.request.Request(self.target, data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # noqa: S310
                resp.read(1024)
            return
        argv = shlex.split(self.target)
        res = subprocess.run(argv, input=body, timeout=self.timeout, check=False,
                             capture_output=True,
                             env={**os.environ, "DTRAIN_EVENT": body.decode()})
        if res.returncode != 0:
            raise RuntimeError(f"{argv[0]} exited {res.returncode}")


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
