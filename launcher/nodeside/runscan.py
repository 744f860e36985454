"""Which dtrain runs hold this machine, read from what the OS shows every user: the process
table's dtrain titles (docs/runs.md, "Everyone's runs").

THIS RUNS ON THE NODES (the probe's bundle, launcher/nodeside/wire.py ``PROGRAMS``) and on
the login node (`dtrain ps --everyone`): standard library only, Python >= 3.8.

Every dtrain process says what it is in its title (nodetitle.set_title): ``dtrain supervisor
RUN NODE``, ``dtrain torchrun RUN NODE`` on a node, ``dtrain run RUN N nodes`` (``dtrain
smoke ...``) for a launcher. A scan reads the first bytes of each /proc/PID/cmdline (the
title ends at its NUL; nothing past ``TITLE_BYTES`` is read), the owner of /proc/PID and its
start time; from a title it keeps only the run id and the node. No other argument, no
environment, no path leaves this module. A rank's title (``dtrain rank 3 train.py ...``)
names no run and carries the user's arguments: never matched.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: never evaluated, so 3.8 never sees list[str]
    Json = dict[str, Any]

TITLE_BYTES = 200  # of a process's cmdline: a title is shorter; the rest is never read
MAX_RUNS = 32  # runs one scan reports at most (a node's answer stays small)
# a run id as dtrain writes it (output/archive.check_run_id) and a node's name
WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")
_NODE_KINDS = ("supervisor", "torchrun")
_LAUNCHER_KINDS = ("run", "smoke")


def parse_title(head: bytes) -> tuple[str, str, str | None, int | None] | None:
    """(kind, run id, node or None, node count or None) of a dtrain title, from the start
    of a cmdline; None for anything else (a rank, a probe, ``dtrain supervisor exec``)."""
    title = head.split(b"\0", 1)[0]
    if not title.startswith(b"dtrain ") or b"\0" not in head:
        return None
    try:
        words = title.decode("ascii").split(" ")
    except UnicodeDecodeError:
        return None
    kind = words[1] if len(words) > 1 else ""
    if kind in _NODE_KINDS and len(words) == 4 and words[2] != "exec":
        run_id, node = words[2], words[3]
        if WORD.fullmatch(run_id) and WORD.fullmatch(node):
            return kind, run_id, node, None
    elif kind in _LAUNCHER_KINDS and len(words) >= 3 and WORD.fullmatch(words[2]):
        nodes = None
        if len(words) == 5 and words[3].isdigit() and words[4] in ("node", "nodes"):
            nodes = int(words[3])
        return kind, words[2], None, nodes
    return None


def proc_hidden(root: str = "/proc", euid: int | None = None) -> str | None:
    """The option of /proc's mount that hides other users' processes (``hidepid=2``,
    ``hidepid=invisible``, ``hidepid=noaccess``), when it applies to this process (root
    sees every process); None when nothing is hidden."""
    if (os.geteuid() if euid is None else euid) == 0:
        return None
    try:
        with open(os.path.join(root, "self/mountinfo"), "rb") as f:
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    for line in text.splitlines():
        fields = line.split(" ")
        if len(fields) < 5 or fields[4] != "/proc":
            continue
        for opt in ",".join(fields[5:]).replace(" ", ",").split(","):
            if opt.startswith("hidepid=") and opt[8:] not in ("0", "off"):
                return opt
    return None


def _boot_time(root: str) -> float | None:
    try:
        with open(os.path.join(root, "stat"), "rb") as f:
            for line in f:
                if line.startswith(b"btime "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _started(root: str, pid: str, boot: float | None, tick: float) -> float | None:
    """When the process started (Unix time): /proc/PID/stat's field 22 after boot."""
    if boot is None:
        return None
    try:
        with open(os.path.join(root, pid, "stat"), "rb") as f:
            stat = f.read()
        return round(boot + int(stat[stat.rfind(b")") + 2:].split()[19]) / tick, 1)
    except (OSError, ValueError, IndexError):
        return None


def _user(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return str(uid)


def scan(node: str | None = None, root: str = "/proc", launchers: bool = True,
         skip_uid: int | None = None, euid: int | None = None) -> Json:
    """The dtrain runs on this machine: ``{"hidden", "denied", "runs"}``; each run
    ``{"uid", "user", "run_id", "kinds", "started", "nodes"}`` (``kinds``: the processes
    seen, e.g. ["supervisor", "torchrun"] or ["run"]; ``nodes``: a launcher's node count).

    ``node``: keep node processes titled with this node's name only (several test nodes
    share one process table; on a real node it is the node itself); ``launchers``: keep
    launchers too (the login node); ``skip_uid``: leave this user's runs out."""
    boot = _boot_time(root)
    try:
        tick = float(os.sysconf("SC_CLK_TCK"))
    except (ValueError, OSError):
        tick = 100.0
    runs = {}  # type: dict[tuple[int, str], Json]
    denied = 0
    try:
        pids = [p for p in os.listdir(root) if p.isdigit()]
    except OSError:
        pids = []
    for pid in pids:
        try:
            with open(os.path.join(root, pid, "cmdline"), "rb") as f:
                head = f.read(TITLE_BYTES)
            uid = os.stat(os.path.join(root, pid)).st_uid
        except PermissionError:
            denied += 1
            continue
        except OSError:
            continue  # gone meanwhile
        got = parse_title(head)
        if got is None or uid == skip_uid:
            continue
        kind, run_id, where, count = got
        if where is None and not launchers:
            continue
        if where is not None and node is not None and where != node:
            continue
        run = runs.setdefault((uid, run_id), {"uid": uid, "user": None, "run_id": run_id,
                                              "kinds": [], "started": None, "nodes": None})
        if kind not in run["kinds"]:
            run["kinds"].append(kind)
        if count is not None:
            run["nodes"] = count
        started = _started(root, pid, boot, tick)
        if started is not None and (run["started"] is None or started < run["started"]):
            run["started"] = started
    out = sorted(runs.values(), key=lambda r: (r["started"] or 0, r["run_id"]))[:MAX_RUNS]
    for run in out:
        run["user"] = _user(run["uid"])
        run["kinds"].sort()
    return {"hidden": proc_hidden(root, euid), "denied": denied, "runs": out}
