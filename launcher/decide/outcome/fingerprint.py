"""Pure: a fingerprint for every failure dtrain explains, the same for the same bug whatever
node, rank, run or time (issue 53, docs/incidents.md).

It is made only from facts dtrain already has: the failure's kind and evidence
(``decide.outcome.failures.FailureReason``), the root-cause rank's last stderr lines (its
traceback), and for a hang the culprit's place and where its stack stood
(``decide.outcome.stacks``). What goes in, by kind:

* ``exception``: the exception's type, its message masked, and its innermost frame of the
  user's code (the last frame of the last traceback outside site-packages, the standard
  library and dtrain's rank shim) as file basename + function + its source line masked.
  **No line number**: an edit above the bug moves it, and the bug stays the same; the
  source line itself tells two raises in one function apart.
* ``segfault``/``abort``: the signal and the crashing thread's frames (function and file
  basename, no line numbers).
* ``oom``: the OOM killer (nothing else is known of a kill).
* ``signal``: the signal's name. ``xid``: the Xid number.
* ``comm``: the communication library's error class (``ncclSystemError``, a watchdog
  timeout and its collective, a peer's closed connection, two ranks on one GPU).
* ``exit``: the exit code and the last stderr line, masked.
* ``hang``: where the culprit's stack stood (script, native) and its place masked.

Masking replaces what differs between ranks, nodes and runs of the same bug: hexadecimal
(addresses, ids), network addresses, paths (a path becomes its basename's place holder),
the run's host names, and every other number (ranks, steps, ports, pids, sizes).

The short form is 12 hex characters of the SHA-256 of the parts.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from launcher.decide.outcome.failures import FailureReason, python_exception
from launcher.decide.outcome.stacks import SHIM_NAME, Frame

SHORT = 12
_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]:\s?")
_FRAME = re.compile(r'^\s*File "(.*)", line (\d+), in (.*)$')
_SYNTAX_AT = re.compile(r'^\s*File "([^"]+)", line (\d+)$')
_CARET = re.compile(r"^\s*[~^]+\s*$")
_MASKS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\[[0-9a-fA-F:]*:[0-9a-fA-F:]*\](?::\d+)?"), "<addr>"),  # [fe80::1]:29500
    (re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b"), "<addr>"),  # 10.0.0.2:29500
    (re.compile(r"\b0[xX][0-9a-fA-F]+\b"), "<hex>"),
    (re.compile(r"\b(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}\b"), "<hex>"),
    (re.compile(r"(?:~|\.{1,2})?(?:/[^\s/'\"():,\]]+)+/?"), "<path>"),
    (re.compile(r"\d+"), "#"),
)
# the communication library's error classes, most specific first
_COMM_CLASS = re.compile(
    r"(ncclSystemError|ncclInternalError|ncclRemoteError|ncclUnhandledCudaError|"
    r"ncclInvalidUsage|ncclInvalidArgument|Duplicate GPU detected|Watchdog caught collective "
    r"operation timeout|Connection closed by peer|Connection reset by peer|Timed out waiting|"
    r"NCCL WARN|NCCL error|DistBackendError)", re.I)
_OPTYPE = re.compile(r"OpType=(\w+)")
_SIGNAL = re.compile(r"\b(SIG[A-Z]{2,7})\b")
_XID = re.compile(r"\bXid (\d{1,9})\b")
_LINE_NO = re.compile(r":\d+\b")


@dataclass(frozen=True)
class Fingerprint:
    """One failure's print: ``digest`` (12 hex), a label a person reads (``ValueError at
    train.py:step``) and the masked parts it was made of."""

    digest: str
    label: str
    kind: str  # the failure's kind (decide.outcome.failures), "hang" for a hang
    parts: tuple[str, ...]


def mask(text: str, hosts: Iterable[str] = ()) -> str:
    """``text`` with what differs between ranks, nodes and runs of one bug replaced (module
    doc); ``hosts``: the run's host names, each replaced by ``<host>``."""
    out = text.strip()
    for host in sorted({h for h in hosts if h}, key=len, reverse=True):
        out = re.sub(rf"(?<![\w.-]){re.escape(host)}(?![\w-])", "<host>", out)
    for pattern, repl in _MASKS:
        out = pattern.sub(repl, out)
    return re.sub(r"\s+", " ", out)[:300]


@dataclass(frozen=True)
class UserFrame:
    """The innermost frame of the user's code: its file's basename, function, source line."""

    file: str
    func: str | None
    source: str | None


def _strip(line: str) -> str:
    return _PREFIX.sub("", line)


def user_frame(stderr: Sequence[str]) -> UserFrame | None:
    """The last traceback's innermost frame outside libraries and the rank shim (else its
    innermost frame); a SyntaxError's ``File "x.py", line N`` and the line under it."""
    text = [_strip(t) for t in stderr]
    start = None
    for i, line in enumerate(text):
        if line.startswith("Traceback (most recent call last)"):
            start = i
    frames: list[tuple[Frame, str | None]] = []
    if start is not None:
        for i in range(start + 1, len(text)):
            m = _FRAME.match(text[i])
            if not m:
                continue
            src = text[i + 1].strip() if i + 1 < len(text) else None
            if src is not None and (_FRAME.match(text[i + 1]) or _CARET.match(text[i + 1]) or
                                    not text[i + 1].startswith(" ")):
                src = None
            frames.append((Frame(m.group(1), int(m.group(2)), m.group(3)), src))
    else:
        for i in range(len(text) - 1, -1, -1):
            at = _SYNTAX_AT.match(text[i])
            if at:
                src = text[i + 1].strip() if i + 1 < len(text) else None
                if src is not None and (_CARET.match(src) or src.startswith(("SyntaxError",
                                                                             "Indentation"))):
                    src = None
                return UserFrame(at.group(1).rsplit("/", 1)[-1], None, src or None)
        return None
    frames = [(f, s) for f, s in frames if f.basename != SHIM_NAME] or frames
    if not frames:
        return None
    user = [(f, s) for f, s in frames if not f.library]
    frame, src = (user or frames)[-1]
    return UserFrame(frame.basename, frame.func, src)


def _digest(parts: Sequence[str]) -> str:
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:SHORT]


def _make(kind: str, label: str, parts: Sequence[str]) -> Fingerprint:
    return Fingerprint(_digest([kind, *parts]), label, kind, (kind, *parts))


def of_failure(reason: FailureReason | None, stderr: Sequence[str] = (), *,
               code: int | None = None, hosts: Iterable[str] = ()) -> Fingerprint | None:
    """The print of one explained rank failure (None: nothing explained)."""
    if reason is None:
        return None
    hosts = tuple(hosts) + ((reason.host,) if reason.host else ())
    kind = reason.kind
    if kind == "exception":
        exc = python_exception(stderr)
        if exc is not None:
            etype, message = exc[0], exc[1]
        else:  # the evidence keeps "Type: message"
            first = reason.evidence[0] if reason.evidence else ""
            etype, _, message = first.partition(": ")
        etype = etype.rsplit(".", 1)[-1] if etype.startswith("__main__.") else etype
        frame = user_frame(stderr)
        where = f"{frame.file}:{frame.func}" if frame and frame.func else \
            (frame.file if frame else "")
        source = mask(frame.source, hosts) if frame and frame.source else ""
        label = f"{etype} at {where}" if where else etype
        return _make(kind, label, [etype, mask(message, hosts), where, source])
    if kind in ("segfault", "abort"):
        frames = reason.details.get("frames") if reason.details else None
        places = [_LINE_NO.sub("", str(f)) for f in list(frames or [])[:8]]
        m = _SIGNAL.search(reason.summary)
        sig = m.group(1) if m else kind.upper()
        user = next((p for p in places), None)
        label = f"{sig} in {user}" if user else sig
        return _make(kind, label, [sig, *places])
    if kind == "oom":
        return _make(kind, "killed by the OOM killer", [])
    if kind == "signal":
        m = _SIGNAL.search(reason.summary)
        sig = m.group(1) if m else "signal"
        return _make(kind, f"killed by {sig}", [sig])
    if kind == "xid":
        m = _XID.search(reason.summary)
        n = m.group(1) if m else "?"
        return _make(kind, f"GPU Xid {n}", [n])
    if kind == "comm":
        said = " ".join([*reason.evidence, reason.summary])
        m = _COMM_CLASS.search(said)
        cls = m.group(1) if m else "communication error"
        op = _OPTYPE.search(said)
        parts = [cls.lower()] + ([op.group(1)] if op else [])
        return _make(kind, f"communication: {cls}" + (f" in {op.group(1)}" if op else ""),
                     parts)
    last = reason.evidence[-1] if reason.evidence else ""
    n = "" if code is None else str(code)
    return _make("exit", f"exit {n}".strip() + (f": {mask(last, hosts)[:60]}" if last else ""),
                 [n, mask(last, hosts)])


def of_hang(where: str | None, place: str | None, hosts: Iterable[str] = ()) -> Fingerprint:
    """The print of a hang: where the culprit's stack stood and its place (no line
    numbers); a hang without a culprit has one print of its own."""
    spot = mask(_LINE_NO.sub("", place), hosts) if place else ""
    stood = where or "unknown"
    label = f"hang at {spot}" if spot else f"hang ({stood})"
    return _make("hang", label, [stood, spot])
