"""`dtrain ps --everyone [-w HOSTS]`: every user's dtrain runs on this login node and, with
hosts, on each node: whose run holds node 7 (docs/runs.md, "Everyone's runs").

Read only from what the OS shows every user: the process table's dtrain titles
(nodeside/runscan.py: user, run id, node, start time). On the nodes the probe's ``runs``
mode does the same scan over the normal transport; nothing else of another user's process
(its arguments, environment, paths, archive) is read.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from launcher import defaults
from launcher.output import render
from launcher.text.termsafe import inert

SCHEMA = "dtrain.ps-everyone/1"
NODE_TIMEOUT_S = 20.0  # one node's answer


def login_machine(now: float) -> dict[str, Any]:
    """This login node's row: its launchers (``dtrain run RUN N nodes``) and any node
    processes titled with its own name (a localhost run)."""
    import os

    from launcher.nodeside.runscan import scan

    got = scan(os.uname().nodename, launchers=True)
    return _machine(socket.gethostname(), "login", got, None)


def _machine(host: str, role: str, got: Mapping[str, Any] | None,
             error: str | None) -> dict[str, Any]:
    """One machine of the document, its runs re-checked (a node's answer is its own)."""
    import os

    from launcher.nodeside.runscan import WORD

    me = os.getuid()
    runs = []
    for r in (got or {}).get("runs") or []:
        if not isinstance(r, Mapping) or not WORD.fullmatch(str(r.get("run_id") or "")):
            continue
        started = r.get("started")
        nodes = r.get("nodes")
        runs.append({
            "user": inert(str(r.get("user") or r.get("uid") or "?"))[:64],
            "run_id": str(r["run_id"]),
            "started": float(started) if isinstance(started, int | float) else None,
            "processes": [str(k) for k in r.get("kinds") or [] if k in (
                "run", "smoke", "supervisor", "torchrun")],
            "nodes": nodes if isinstance(nodes, int) and not isinstance(nodes, bool) else None,
            # on the login node the uid is ours to compare; a node's uids are its own
            "yours": role == "login" and r.get("uid") == me,
        })
    hidden = (got or {}).get("hidden")
    denied = (got or {}).get("denied")
    return {"host": host, "role": role, "reachable": error is None, "error": error,
            "hidden": inert(str(hidden))[:40] if hidden else None,
            "denied": denied if isinstance(denied, int) else 0, "runs": runs}


async def node_machines(hosts: Sequence[Any], settings: Any, *, fanout: int = defaults.FANOUT,
                        python: str = "python3") -> list[dict[str, Any]]:
    """Each node's row: the probe's ``runs`` mode over the usual transport (an unreachable
    node is a row with its error, not a failure)."""
    from launcher.aio import CLOSE_S, cleanup
    from launcher.errors import DtrainError
    from launcher.job.orchestrate import connect_all
    from launcher.job.remote import run_program
    from launcher.transports import AutoTransport

    out: dict[str, dict[str, Any]] = {}
    auto = AutoTransport(settings, "auto")
    async with auto:
        conns, errors = await connect_all(auto, hosts, fanout=fanout,
                                          timeout=settings.connect_timeout)
        try:
            async def one(label: str, conn: Any) -> None:
                try:
                    got = await run_program(conn, "probe", {"mode": "runs"},
                                            python=conn.host.python or python,
                                            timeout=NODE_TIMEOUT_S)
                    out[label] = _machine(label, "node", got, None if got.get("ok") else
                                          str(got.get("error") or "no answer"))
                except (DtrainError, OSError, TimeoutError) as exc:
                    why = exc.message if isinstance(exc, DtrainError) else (
                        f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
                    out[label] = _machine(label, "node", None, why)

            async with asyncio.TaskGroup() as tg:
                for label, conn in conns.items():
                    tg.create_task(one(label, conn), name=f"ps-runs:{label}")
        finally:
            for conn in conns.values():
                await cleanup(conn.aclose(), CLOSE_S)
    for label, why in errors.items():
        out[label] = _machine(label, "node", None, why)
    return [out[h.label] for h in hosts if h.label in out]


def document(machines: list[dict[str, Any]], now: float) -> dict[str, Any]:
    """The ``dtrain.ps-everyone/1`` document (docs/schemas.md)."""
    from launcher import __version__

    return {"schema": SCHEMA, "dtrain_version": __version__, "host": socket.gethostname(),
            "now": now, "machines": machines}


def _when(t: float | None, now: float) -> str:
    if t is None:
        return "-"
    from launcher.output.runstate import age

    return f"{time.strftime('%m-%d %H:%M', time.localtime(t))} ({age(now - t)} ago)"


def _state(run: Mapping[str, Any]) -> str:
    kinds = run["processes"]
    if "run" in kinds or "smoke" in kinds:
        n = run["nodes"]
        return f"{'smoke' if 'smoke' in kinds else 'run'} launcher" + (
            f" ({n} node{'s' if n != 1 else ''})" if n is not None else "")
    return "running" if "torchrun" in kinds else "starting or stopping"


def render_table(machines: list[dict[str, Any]], now: float) -> str:
    """HOST USER RUN ID STARTED STATE: one row per run per machine; a node with none, or
    unreachable, says so in one row."""
    rows = [("HOST", "USER", "RUN ID", "STARTED", "STATE")]
    for m in machines:
        host = inert(m["host"])
        if not m["reachable"]:
            rows.append((host, "?", "?", "-", f"unreachable: {inert(str(m['error']))}"[:100]))
        elif not m["runs"] and m["role"] == "node":
            rows.append((host, "-", "-", "-", "no dtrain run"))
        for r in m["runs"]:
            rows.append((host, r["user"], r["run_id"], _when(r["started"], now), _state(r)))
    if len(rows) == 1:
        return ""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                     for row in rows) + "\n"


def hidden_lines(machines: list[dict[str, Any]]) -> list[str]:
    """Once: where other users' processes cannot be seen (/proc mounted hidepid)."""
    hid = [m for m in machines if m["hidden"] or m["denied"]]
    if not hid:
        return []
    how = next((m["hidden"] for m in hid if m["hidden"]), "hidepid")
    return [f"other users' processes are hidden on {', '.join(m['host'] for m in hid)} "
            f"(/proc mounted {how}): their runs cannot be listed there"]


def everyone(machines: list[dict[str, Any]], *, as_json: bool, now: float) -> int:
    """Print the machines' runs (table or JSON); exit 0 (an unreachable node is a row)."""
    if as_json:
        sys.stdout.write(json.dumps(document(machines, now), indent=2) + "\n")
    else:
        table = render_table(machines, now)
        if table:
            sys.stdout.write(table)
        else:
            render.note(f"no dtrain run on {machines[0]['host'] if machines else 'this host'} "
                        "(any user's)")
    for line in hidden_lines(machines):
        render.note(line)
    sys.stdout.flush()
    return 0


def ps_everyone(hosts: Sequence[Any], settings: Any, *, as_json: bool = False,
                fanout: int = defaults.FANOUT) -> int:
    """`dtrain ps --everyone [-w HOSTS]`: this login node, then each node asked."""
    from launcher.commands.entry import INTERRUPTED, Ended, run_command

    now = time.time()

    async def body() -> list[dict[str, Any]]:
        machines = [login_machine(now)]
        if hosts:
            machines += await node_machines(hosts, settings, fanout=fanout)
        return machines

    def conclude(ended: Ended[list[dict[str, Any]]]) -> int:
        if ended.result is None:
            return INTERRUPTED
        return everyone(ended.result, as_json=as_json, now=now)

    return run_command("ps", hosts, body, conclude)
