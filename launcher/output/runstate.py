"""`dtrain ps`: each run's state from its archive (meta.json) plus its launcher's lock.

    state            when
    starting         the launcher holds the lock; not every node's job has started yet
    running          the launcher holds the lock; every node's job started
    stopping         the launcher holds the lock and is stopping the job
    finished         meta.json records the end (exit_code, outcome)
    launcher lost    no end recorded and no launcher holds the lock: it died (kill -9, the
                     login node rebooted); its nodes stopped the job by themselves (stdin EOF
                     or no heartbeat for --heartbeat-timeout)

``status_of`` is the pure decision; ``run_status`` and ``list_status`` read the files.
``ps_json`` is the versioned ``--json`` document (``ps_version: 1``).
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from launcher.output.archive import list_runs, open_output, read_meta
from launcher.output.runlock import probe
from launcher.runrecord import Launcher, RunMeta, RunState
from launcher.text.termsafe import inert

PS_VERSION = 1
LIVE_STATES: tuple[RunState, ...] = ("starting", "running", "stopping",
                                     "restarting")  # restarting: --restarts
# a run as ps shows it: its recorded state, or its launcher gone without recording an end
PsState = RunState | Literal["launcher lost"]
_TAIL_BYTES = 64 * 1024


@dataclass(frozen=True)
class RunStatus:
    """One run as `dtrain ps` shows it."""

    run_id: str
    path: Path
    state: PsState
    alive: bool  # a launcher holds the run's lock
    exit_code: int | None = None
    outcome: str | None = None
    pid: int | None = None
    launcher_host: str | None = None
    detached: bool = False
    hosts: tuple[str, ...] = ()
    world_size: int | None = None
    created: float | None = None
    ended: float | None = None
    last_line_t: float | None = None
    heartbeat_timeout: float | None = None
    # how long its nodes wait for the launcher's heartbeats (older archives: the timeout)
    launcher_timeout: float | None = None
    attempt: int | None = None  # run --restarts: the attempt running (or the last one)
    kind: str = "run"  # the command that made it: run or smoke
    goodput: float | None = None  # productive / wall time (docs/goodput.md); None: unknown
    goodput_wall: float | None = None  # the ledger's wall time, s (None: not recorded)
    goodput_steps: int | None = None  # the steps the ledger saw, every attempt together
    fabric: str | None = None  # NCCL's transport (docs/fabric.md): gdr, rdma, socket 2/4 ...

    @property
    def label(self) -> str:
        """The state as the table shows it (``, attempt N`` for a run with --restarts)."""
        more = f", attempt {self.attempt}" if self.attempt and self.attempt > 1 else ""
        if self.state == "finished":
            return f"finished ({self.exit_code}{more})" if self.exit_code is not None else \
                f"finished{f' ({more[2:]})' if more else ''}"
        return f"{self.state} ({more[2:]})" if more else self.state

    @property
    def goodput_meaningful(self) -> bool:
        """Whether the goodput says something about the run (goodput_meaningful)."""
        return goodput_meaningful(self.goodput, self.goodput_wall, self.goodput_steps)

    @property
    def note(self) -> str | None:
        """What a user should know beyond the state (launcher lost: what became of the job)."""
        if self.state != "launcher lost":
            return None
        wait = self.launcher_timeout or self.heartbeat_timeout
        hb = f"{wait:g} s" if wait else "3 x --heartbeat-timeout"
        return (f"the launcher died without recording an end (kill -9, reboot); its nodes "
                f"stopped the job by themselves (connection closed, or no heartbeat from the "
                f"launcher for {hb})")


def status_of(run_dir: Path, meta: RunMeta, lock: dict[str, Any] | None,
              last_line_t: float | None = None) -> RunStatus:
    """Pure: a run's state from its meta.json and its lock (None: no live launcher)."""
    recorded_launcher = meta.get("launcher")
    launcher: Launcher = recorded_launcher if isinstance(recorded_launcher, dict) else {}
    finished = "exit_code" in meta or bool(meta.get("end"))
    state: PsState
    if finished:
        state = "finished"
    elif lock is not None:
        recorded = meta.get("state")
        state = recorded if recorded in LIVE_STATES else "starting"
    else:
        state = "launcher lost"
    info: Mapping[str, Any] = lock if lock is not None else launcher
    hosts = meta.get("hosts")
    return RunStatus(
        run_id=str(meta.get("run_id") or run_dir.name), path=run_dir, state=state,
        alive=lock is not None,
        exit_code=_int(meta.get("exit_code")),
        outcome=meta.get("outcome") if isinstance(meta.get("outcome"), str) else None,
        pid=_int(info.get("pid")),
        launcher_host=info.get("host") if isinstance(info.get("host"), str) else None,
        detached=bool(info.get("detached")),
        hosts=tuple(h for h in hosts if isinstance(h, str)) if isinstance(hosts, list) else (),
        world_size=_int(meta.get("world_size")),
        created=_float(meta.get("start")) or _float(meta.get("created_ts")),
        ended=_float(meta.get("end")),
        last_line_t=last_line_t,
        heartbeat_timeout=_float(launcher.get("heartbeat_timeout")),
        launcher_timeout=_float(launcher.get("launcher_timeout")),
        attempt=_attempt(meta),
        kind=_kind(meta),
        goodput=_goodput(meta),
        goodput_wall=_goodput_wall(meta),
        goodput_steps=goodput_steps(_goodput_attempts(meta)),
        fabric=fabric_cell(meta.get("fabric")),
    )


def fabric_cell(fabric: object) -> str | None:
    """meta.json's ``fabric`` as one word: the one transport of every rank (gdr, rdma,
    socket, plugin), or the worst with its count (``socket 2/4``); None: no account."""
    if not isinstance(fabric, dict) or not isinstance(fabric.get("transports"), dict):
        return None
    kinds = [k for k in fabric["transports"].values() if isinstance(k, str)]
    if not kinds:
        return None
    if len(set(kinds)) == 1:
        return kinds[0][:12]
    for worst in ("none", "socket", "plugin", "rdma", "gdr"):
        if worst in kinds:
            return f"{worst} {kinds.count(worst)}/{len(kinds)}"
    return "mixed"


def _goodput(meta: RunMeta) -> float | None:
    """meta.json's recorded goodput (a finished run's ledger, docs/goodput.md)."""
    g = meta.get("goodput")
    return _float(g.get("goodput")) if isinstance(g, dict) else None


def _goodput_wall(meta: RunMeta) -> float | None:
    g = meta.get("goodput")
    return _float(g.get("wall_s")) if isinstance(g, dict) else None


def _goodput_attempts(meta: RunMeta) -> list[tuple[object, object]]:
    g = meta.get("goodput")
    attempts = g.get("attempts") if isinstance(g, dict) else None
    return [(a.get("resumed_at"), a.get("highest_step")) for a in attempts or []
            if isinstance(a, dict)]


def goodput_steps(attempts: list[tuple[object, object]]) -> int | None:
    """The steps a ledger's attempts ran, from each one's (resumed_at, highest_step); None:
    no attempt numbered its steps."""
    steps = [max(0, high - (_int(first) or 0) + 1) for first, high
             in ((f, _int(h)) for f, h in attempts) if high is not None]
    return sum(steps) if steps else None


# Under both, start-up dominates: a healthy 5 s run is 3 % goodput. ps shows '-' there (the
# number stays in --json, with goodput_meaningful false); docs/runs.md, docs/goodput.md.
GOODPUT_MIN_WALL_S = 300.0
GOODPUT_MIN_STEPS = 50
GOODPUT_LEGEND = (f"GOODPUT -: under {GOODPUT_MIN_WALL_S / 60:g} min and "
                  f"{GOODPUT_MIN_STEPS} steps start-up dominates, so the figure says "
                  "little (ps --json has it)")


def goodput_meaningful(value: float | None, wall: float | None, steps: int | None) -> bool:
    """A goodput worth showing: known, and the run long enough (GOODPUT_MIN_WALL_S of wall
    time or GOODPUT_MIN_STEPS steps) for start-up not to dominate it. A ledger that does
    not record its wall time is shown (nothing to judge it by)."""
    if value is None:
        return False
    if wall is None:
        return True
    return wall >= GOODPUT_MIN_WALL_S or (steps or 0) >= GOODPUT_MIN_STEPS


def goodput_cell(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.0f}%"


def _kind(meta: RunMeta) -> str:
    """run or smoke: meta's ``kind``, else the recorded command line's subcommand."""
    kind = meta.get("kind")
    if isinstance(kind, str) and kind:
        return kind
    command = meta.get("command")
    if isinstance(command, list) and len(command) > 1 and command[1] in ("run", "smoke"):
        return str(command[1])
    return "run"


def run_status(run_dir: Path) -> RunStatus:
    """Read one run's files and decide its state (lock first: meta's end wins a race)."""
    lock = probe(run_dir)
    return status_of(run_dir, read_meta(run_dir), lock, last_line_time(run_dir))


def list_status(archive_dir: Path) -> list[RunStatus]:
    """Every run in an archive directory, oldest first."""
    return [run_status(p) for p in list_runs(archive_dir)]


def last_line_time(run_dir: Path) -> float | None:
    """The time of output.jsonl's last complete record (its mtime if the tail is one long
    line); None when there is no output yet."""
    fd = open_output(run_dir)
    if fd is None:
        return None
    try:
        with open(fd, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            if size == 0:
                return None
            fh.seek(max(0, size - _TAIL_BYTES))
            tail = fh.read()
            mtime = os.fstat(fh.fileno()).st_mtime
    except OSError:
        return None
    for raw in reversed(tail.split(b"\n")):
        try:
            record = json.loads(raw)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("t"), int | float):
            return float(record["t"])
    return mtime


def _attempt(meta: RunMeta) -> int | None:
    """The attempt a run with --restarts is at: the one due next between attempts."""
    nxt = meta.get("next_attempt")
    if meta.get("state") == "restarting" and isinstance(nxt, dict):
        return _int(nxt.get("n"))
    return _int(meta.get("attempt"))


def ps_json(runs: list[RunStatus], archive_dir: Path) -> dict[str, Any]:
    """The versioned `dtrain ps --json` document."""
    return {
        "ps_version": PS_VERSION, "archive_dir": str(archive_dir),
        "host": socket.gethostname(), "now": time.time(),
        "runs": [{
            "run_id": r.run_id, "path": str(r.path), "state": r.state, "alive": r.alive,
            "exit_code": r.exit_code, "outcome": r.outcome, "launcher_pid": r.pid,
            "launcher_host": r.launcher_host, "detached": r.detached, "hosts": list(r.hosts),
            "nodes": len(r.hosts), "world_size": r.world_size, "created": r.created,
            "ended": r.ended, "last_line_t": r.last_line_t, "note": r.note,
            "attempt": r.attempt, "kind": r.kind, "goodput": r.goodput, "fabric": r.fabric,
            "goodput_meaningful": r.goodput_meaningful,
        } for r in runs],
    }


def render_table(runs: list[RunStatus], now: float | None = None) -> str:
    """The `dtrain ps` table, with a note under it for each lost launcher."""
    now = time.time() if now is None else now
    here = socket.gethostname()
    rows = [("RUN ID", "KIND", "STATE", "NODES", "RANKS", "FABRIC", "AGE", "LAST LINE",
             "GOODPUT", "LAUNCHER")]
    for r in runs:
        who = f"pid {r.pid}" if r.pid is not None and r.alive else "-"
        if r.alive and r.detached:
            who += " detached"
        if r.alive and r.launcher_host and r.launcher_host != here:
            who += f" on {r.launcher_host}"
        last = f"{age(now - r.last_line_t)} ago" if r.last_line_t else "-"
        rows.append((r.run_id, r.kind, r.label, str(len(r.hosts)) if r.hosts else "-",
                     str(r.world_size) if r.world_size is not None else "-",
                     r.fabric or "-", age(now - r.created) if r.created else "-", last,
                     goodput_cell(r.goodput if r.goodput_meaningful else None), who))
    cells = [[inert(cell) for cell in row] for row in rows]  # archive text: no controls
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in cells]
    lines += [f"{inert(r.run_id)}: launcher lost: {r.note}" for r in runs if r.note]
    if any(r.goodput is not None and not r.goodput_meaningful for r in runs):
        lines.append(GOODPUT_LEGEND)
    return "\n".join(lines) + "\n"


PS_RECENT = 20  # `dtrain ps` shows the live runs and this many of the others (--all: all)


def shown_runs(runs: list[RunStatus], *, show_all: bool = False) -> tuple[list[RunStatus], int]:
    """The runs `ps` lists (oldest first) and how many older ones it leaves out: every
    live run, and the PS_RECENT newest of the others, unless ``show_all``."""
    if show_all:
        return runs, 0
    done = [r for r in runs if not r.alive]
    keep = {id(r) for r in done[-PS_RECENT:]} | {id(r) for r in runs if r.alive}
    return [r for r in runs if id(r) in keep], len(runs) - len(keep)


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_age(text: str) -> float:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w`` or plain seconds -> seconds (ValueError)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text)
    if not match:
        raise ValueError(f"{text!r}: expected a duration like 30d, 12h, 90m or 3600")
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]


def prunable(runs: list[RunStatus], older_than: float, now: float) -> list[RunStatus]:
    """The runs `logs --prune` deletes: finished (or launcher lost) and ended (or, without
    an end, created) more than ``older_than`` seconds ago; a live run never."""
    out = []
    for r in runs:
        when = r.ended or r.last_line_t or r.created
        if not r.alive and when is not None and now - when > older_than:
            out.append(r)
    return out


def age(seconds: float) -> str:
    """A short duration: 42s, 5m03s, 2h07m, 3d04h."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else None
