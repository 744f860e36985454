"""`dtrain connections`: what the connection keeper holds (list), and closing it (close);
docs/connections.md."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from launcher.output import render
from launcher.text.termsafe import inert
from launcher.transports.keeper.client import KeeperUnavailable, call
from launcher.transports.keeper.frames import keeper_dir, private_dir, socket_path

CONNECTIONS_SCHEMA = "dtrain.connections/1"


def _ask(req: dict[str, Any]) -> dict[str, Any] | None:
    directory = keeper_dir()
    if private_dir(directory, create=False) is not None:
        return None
    try:
        return asyncio.run(call(socket_path(directory), req, timeout=10.0))
    except KeeperUnavailable:
        return None


def _age(seconds: Any) -> str:
    s = int(seconds) if isinstance(seconds, int | float) else 0
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    return f"{s // 3600}h"


def list_connections(*, as_json: bool = False) -> int:
    reply = _ask({"op": "list"})
    sock = str(socket_path(keeper_dir()))
    conns = [c for c in (reply or {}).get("connections", []) if isinstance(c, dict)]
    if as_json:
        keeper = None if reply is None else {"pid": reply.get("pid"),
                                              "idle_s": reply.get("idle_s"),
                                              "resident": reply.get("resident")}
        doc = {"schema": CONNECTIONS_SCHEMA, "socket": sock, "keeper": keeper,
               "connections": conns}
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return 0
    if reply is None:
        sys.stdout.write(f"no connection keeper runs ({sock}); --persist 10m starts one\n")
        return 0
    if not conns:
        sys.stdout.write(f"the keeper (pid {reply.get('pid')}) holds no connections\n")
        return 0
    rows = [("HOST", "USER", "PORT", "PEER", "AGE", "IDLE", "CHANNELS", "STATE")]
    for c in conns:
        rows.append((inert(str(c.get("host"))), str(c.get("user") or "-"),
                     str(c.get("port") or "-"), str(c.get("peer") or "-"), _age(c.get("age_s")),
                     _age(c.get("idle_s")), str(c.get("channels", 0)),
                     "closing: " + str(c["stale"]) if c.get("stale") else "kept"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        sys.stdout.write("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True))
                         .rstrip() + "\n")
    resident = reply.get("resident")
    warm = f", resident pid {resident} (warm starts)" if resident else ""
    sys.stdout.write(f"keeper pid {reply.get('pid')}{warm}, {sock}; `dtrain connections close` "
                     "closes them\n")
    return 0


def close_connections(hosts: list[str]) -> int:
    from launcher.hosts.hostfile import _nodeset

    names = [str(n) for text in hosts for n in _nodeset(text, "HOST")]
    reply = _ask({"op": "close", "hosts": names})
    if reply is None:
        render.note("no connection keeper runs: nothing to close")
        return 0
    closed = [str(h) for h in reply.get("closed", [])]
    what = f"{len(closed)} connection{'s' if len(closed) != 1 else ''}"
    if not hosts:
        render.note(f"closed {what}; the keeper exits")
    else:
        render.note(f"closed {what}" + (f" ({', '.join(closed)})" if closed else ""))
    return 0
