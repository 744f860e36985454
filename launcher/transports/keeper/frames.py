"""The keeper's wire: frames over a unix stream socket, and where the socket lives.

One unix connection carries one request. Its first frame is a JSON request (``REQ``); the
keeper answers with one JSON frame (``REP``: ``{"ok": true, ...}`` or ``{"ok": false,
"error": {...}}``). A ``start`` request then carries one channel: ``IN``/``EOF``/``ABORT``
from the command to the keeper, ``OUT``/``ERR``/``EXIT`` back. A frame is one type byte,
a 4-byte big-endian length and the payload (at most ``MAX_FRAME`` bytes).

No asyncssh here: a warm command imports only this module and ``client``.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import struct
from pathlib import Path
from typing import Any

from launcher import private

REQ, REP, IN, EOF, ABORT, OUT, ERR, EXIT = (bytes([c]) for c in b"QRIEAOXT")
_HEAD = struct.Struct(">cI")
MAX_FRAME = 1 << 20  # a request or one chunk of output; more is a protocol error
CHUNK = 64 * 1024  # what one OUT/ERR/IN frame carries at most


class FrameError(Exception):
    """The peer broke the protocol (bad type, oversized frame, bad JSON)."""


def encode(kind: bytes, payload: bytes) -> bytes:
    if len(payload) > MAX_FRAME:
        raise FrameError(f"frame of {len(payload)} bytes (at most {MAX_FRAME})")
    return _HEAD.pack(kind, len(payload)) + payload


def encode_json(kind: bytes, obj: Any) -> bytes:
    return encode(kind, json.dumps(obj, separators=(",", ":")).encode())


async def read_frame(reader: asyncio.StreamReader) -> tuple[bytes, bytes] | None:
    """The next frame, or None at a clean EOF between frames."""
    try:
        head = await reader.readexactly(_HEAD.size)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise FrameError("connection closed inside a frame header") from None
        return None
    kind, size = _HEAD.unpack(head)
    if size > MAX_FRAME:
        raise FrameError(f"frame of {size} bytes (at most {MAX_FRAME})")
    try:
        payload = await reader.readexactly(size)
    except asyncio.IncompleteReadError:
        raise FrameError("connection closed inside a frame") from None
    return kind, payload


def decode_json(payload: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(payload)
    except ValueError as exc:
        raise FrameError(f"bad JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise FrameError("a request or reply must be a JSON object")
    return obj


# ------------------------------------------------------------------------- where it lives

def keeper_dir(environ: dict[str, str] | None = None, uid: int | None = None) -> Path:
    """The user's private directory for the keeper's socket: $XDG_RUNTIME_DIR/dtrain when
    that runtime directory is the user's own, else /tmp/dtrain-keeper-UID."""
    env = os.environ if environ is None else environ
    uid = os.getuid() if uid is None else uid
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime:
        try:
            st = os.stat(runtime)
            if st.st_uid == uid and stat.S_ISDIR(st.st_mode) and not st.st_mode & 0o077:
                return Path(runtime) / "dtrain"
        except OSError:
            pass
    return Path(f"/tmp/dtrain-keeper-{uid}")


def private_dir(path: Path, *, create: bool) -> str | None:
    """None when ``path`` is a directory of this user's alone (0700, not a link); else why
    not (launcher/private.py, the one helper for the login node's private places)."""
    return private.private_dir(path, create=create)


def socket_path(directory: Path) -> Path:
    return directory / "keeper.sock"


def parse_persist(text: str | None) -> float | None:
    """``10m``, ``600``, ``90s``, ``1h`` as seconds; ``0``/``no``/``off``/empty: None (off).
    Anything else is ValueError with the reason."""
    if text is None:
        return None
    value = text.strip().lower()
    if value in ("", "0", "no", "off", "false", "none"):
        return None
    scale = {"s": 1, "m": 60, "h": 3600}.get(value[-1:], 0)
    number = value[:-1] if scale else value
    try:
        seconds = float(number) * (scale or 1)
    except ValueError:
        raise ValueError("expected a duration: 90s, 10m, 1h (or off)") from None
    if not seconds > 0 or seconds > 7 * 86400:
        raise ValueError("expected a duration between 1s and 7 days (or off)")
    return seconds
