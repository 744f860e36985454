"""A hostile node's supervisor stream (a trap of the test cluster, like hostile_sftp.py).

Used as ``python3 SUPERVISOR... | python3 hostile_frames.py CONFIG`` by a wrapper
interpreter (a hostfile's ``python=``): bytes before dtrain's frame marker (the probe's
answer) pass unchanged; after it, every frame passes, except the control messages the
config names, which are rewritten to claim what the node does not own.

CONFIG is a JSON file: ``{"stacks": {rank: text}, "rank_start": [ranks], "flight": {rank: b64},
"bad_key": true}``: a ``stacks`` answer gets an entry per named rank (a copy of the node's own
first entry with ``text`` replaced), ``rank_start`` messages are sent for the named ranks
before the node's own first one, ``flight`` end messages get files for the named ranks;
``bad_key`` adds the rank key "²" (str.isdigit() is true, int() fails) to stacks answers
and a flight dump whose ``entries`` is an int.

Standard library only (it runs with the cluster's Python).
"""

from __future__ import annotations

import json
import os
import struct
import sys

MAGIC = b"\n\x00DTRAIN-FRAMES-1\x00\n"
FRAME = struct.Struct("!BiI")
CTL = 3


def frame(kind: int, rank: int, data: bytes) -> bytes:
    return FRAME.pack(kind, rank, len(data)) + data


def rewrite(msg: dict, config: dict, said: set) -> list[dict]:
    kind = msg.get("type")
    out = []
    if kind == "rank_start" and config.get("rank_start") and "rank_start" not in said:
        said.add("rank_start")
        out += [dict(msg, rank=int(r)) for r in config["rank_start"]]
    if kind == "stacks" and not msg.get("native") and isinstance(msg.get("ranks"), dict) \
            and msg["ranks"]:
        own = next(iter(msg["ranks"].values()))
        for rank, text in (config.get("stacks") or {}).items():
            msg["ranks"][str(rank)] = dict(own, text=text)
        if config.get("bad_key"):
            msg["ranks"]["\u00b2"] = dict(own)
            for entry in msg["ranks"].values():
                if isinstance(entry, dict) and isinstance(entry.get("fr"), dict):
                    entry["fr"]["data"] = config["bad_flight"]
    if kind == "flight" and isinstance(msg.get("files"), dict):
        msg["files"].update(config.get("flight") or {})
    return out + [msg]


def main() -> None:
    with open(sys.argv[1]) as f:
        config = json.load(f)
    out = sys.stdout.buffer
    buf = b""
    synced = False
    said: set = set()
    window = b""
    while True:
        data = os.read(0, 1 << 16)
        if not data:
            out.write(buf)
            out.flush()
            return
        buf += data
        if not synced:  # pass everything through at once (the probe waits on its line)
            seen = window + data
            at = seen.find(MAGIC)
            if at < 0:
                out.write(data)
                out.flush()
                window = seen[-(len(MAGIC) - 1):]
                buf = b""
                continue
            cut = at + len(MAGIC) - len(window)
            out.write(data[:cut])
            buf = data[cut:]
            synced = True
        while len(buf) >= FRAME.size:
            kind, rank, length = FRAME.unpack_from(buf)
            if len(buf) < FRAME.size + length:
                break
            body = buf[FRAME.size:FRAME.size + length]
            buf = buf[FRAME.size + length:]
            if kind == CTL:
                try:
                    msg = json.loads(body)
                except ValueError:
                    msg = None
                if isinstance(msg, dict):
                    for m in rewrite(msg, config, said):
                        out.write(frame(CTL, rank, json.dumps(m).encode()))
                    continue
            out.write(frame(kind, rank, body))
        out.flush()


if __name__ == "__main__":
    main()
