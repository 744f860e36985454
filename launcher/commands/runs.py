"""`dtrain ps`, `dtrain attach`, `dtrain stop`: the runs of this archive, from any shell.

They find runs the way `dtrain logs` does (``--archive-dir``/``DTRAIN_ARCHIVE_DIR``, a run id,
a unique prefix or a path). Liveness is the launcher's lock (output/runlock.py), never a pid;
stop goes through the launcher's control socket (job/control.py), so the launcher stops the
job exactly as Ctrl-C would in the foreground and records exit 130 in meta.json.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
from collections.abc import Collection
from pathlib import Path

from launcher.decide.copies.filters import select_hosts
from launcher.exitcodes import EXIT_INTERRUPTED, EXIT_UNREACHABLE
from launcher.job.control import request_stop
from launcher.job.orchestrate import KILL_MARGIN, STOP_MARGIN
from launcher.output import render
from launcher.output.archive import read_meta, resolve_run
from launcher.output.logview import replay
from launcher.output.runstate import (
    RunStatus,
    age,
    goodput_steps,
    list_status,
    ps_json,
    render_table,
    run_status,
)
from launcher.text.words import count

STATUS_EVERY_S = 1.0
_WAIT_EXTRA_S = 10.0  # beyond grace + the launcher's own margins, before giving up waiting


def ps(archive_dir: Path, *, as_json: bool = False, active: bool = False,
       show_all: bool = False) -> int:
    """Print the runs of an archive directory (table or versioned JSON): the live ones and
    the newest others (``show_all``: every run; --json lists every run)."""
    from launcher.output.runstate import shown_runs

    runs = list_status(archive_dir)
    if active:
        runs = [r for r in runs if r.alive]
    runs = [live_goodput(r) for r in runs]
    if as_json:
        sys.stdout.write(json.dumps(ps_json(runs, archive_dir), indent=2) + "\n")
    elif not runs:
        render.note(f"no {'running ' if active else ''}runs in {archive_dir}")
    else:
        shown, older = shown_runs(runs, show_all=show_all)
        sys.stdout.write(render_table(shown))
        if older:
            render.note(f"{count(older, 'older run')} not shown (`dtrain ps --all`; "
                        "`dtrain logs --prune --older-than 30d` deletes old ones)")
    sys.stdout.flush()
    return 0


def live_goodput(run: RunStatus) -> RunStatus:
    """A live run's goodput so far (its ledger up to now, from the archive); a finished
    run's is in its meta.json already."""
    if not run.alive or run.kind != "run":
        return run
    from dataclasses import replace

    from launcher.commands.goodput import archive_ledger

    try:
        ledger = archive_ledger(run.path, read_meta(run.path), now=time.time())
    except (OSError, ValueError):
        return run
    return replace(run, goodput=ledger.goodput, goodput_wall=ledger.wall,
                   goodput_steps=goodput_steps([(a.resumed_at, a.highest)
                                                for a in ledger.attempts]))


def prune(archive_dir: Path, older_than: float, *, dry_run: bool = False) -> int:
    """`dtrain logs --prune`: delete this user's runs that ended more than ``older_than``
    seconds ago (never a live one); says how many and how much. Only what is provably a
    dtrain run (``is_dtrain_run``) is touched, through descriptors: nothing is followed."""
    from launcher.output.runstate import prunable

    runs = list_status(archive_dir)
    old = prunable(runs, older_than, time.time())
    size = 0
    doomed = []
    if old:
        top = os.open(archive_dir, os.O_RDONLY | os.O_DIRECTORY)  # runs were listed in it
        try:
            for r in old:
                if r.path.parent != archive_dir or not is_dtrain_run(top, r.path.name):
                    continue
                doomed.append(r)
                size += tree_size(top, r.path.name)
                if not dry_run:
                    shutil.rmtree(r.path.name, dir_fd=top)  # fd-based: no link followed
        finally:
            os.close(top)
    from launcher.commands.cp.view import human

    verb = "would delete" if dry_run else "deleted"
    render.note(f"{verb} {count(len(doomed), 'run')} ({human(size)}) that ended more "
                f"than {age(older_than)} ago in {archive_dir}; "
                f"{count(len(runs) - len(doomed), 'run')} kept")
    return 0


# the keys dtrain itself writes into every run's meta.json (output/archive.py)
_OWN_KEYS = ("archive_version", "run_id", "created_ts")


def is_dtrain_run(top: int, name: str) -> bool:
    """Whether ``name`` in the directory ``top`` is a run dtrain made: a directory (not a
    symlink) of this user named like a run id, whose meta.json has dtrain's own keys and
    names it, beside dtrain's output.jsonl (a project directory with a meta.json is not)."""
    from launcher.output.archive import MAX_META_BYTES, META, OUTPUT, is_run_id, parse_meta
    from launcher.output.rundir import has_entry, read_capped

    if not is_run_id(name):
        return False
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=top)
    except OSError:
        return False
    try:
        if os.fstat(fd).st_uid != os.getuid() or not has_entry(fd, OUTPUT):
            return False
        meta = parse_meta(read_capped(fd, META, MAX_META_BYTES))
    finally:
        os.close(fd)
    return all(k in meta for k in _OWN_KEYS) and meta.get("run_id") == name \
        and isinstance(meta.get("archive_version"), int)


def tree_size(top: int, name: str) -> int:
    """Bytes of every file and link under ``name`` (walked by descriptor, links not followed)."""
    total = 0
    for _, _, files, dirfd in os.fwalk(name, dir_fd=top, follow_symlinks=False):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.stat(f, dir_fd=dirfd, follow_symlinks=False).st_size
    return total


def attach(archive_dir: Path, run: str | None, *, ranks: Collection[int] | None = None,
           host: str | None = None, grep: str | None = None, lines: int = 20,
           color: bool | None = None, hint: str = "") -> int:
    """Follow a run's live console from its archive; Ctrl-C detaches and leaves it running.

    Returns 0 when the user detaches, else the run's exit code once it ends (255 when its
    launcher is lost).
    """
    run_dir = resolve_run(archive_dir, run)
    st = run_status(run_dir)
    hosts = select_hosts(host, st.hosts) if host else None
    if not st.alive:
        render.note(f"run {st.run_id} is not running ({st.label}); its last lines follow "
                    f"(`dtrain logs {st.run_id}{hint}` shows all)")
        replay(run_dir, ranks=ranks, hosts=hosts, grep=grep, color=color, tail=lines,
               fold=True)
        return _ended(run_dir)
    size = f"{count(len(st.hosts), 'node')}, {count(st.world_size or 0, 'rank')}"
    render.note(f"attached to run {st.run_id} ({st.label}, {size}); Ctrl-C detaches and "
                "leaves the run running")
    status = _StatusLine(run_dir)
    code = replay(run_dir, ranks=ranks, hosts=hosts, grep=grep, color=color, follow=True,
                  tail=lines, status=status.render, ended=lambda: not run_status(run_dir).alive,
                  fold=True)
    if code == EXIT_INTERRUPTED:
        render.note(f"detached from run {st.run_id}; it is still running. Come back with "
                    f"`dtrain attach {st.run_id}{hint}`, end it with `dtrain stop "
                    f"{st.run_id}{hint}`")
        return 0
    return _ended(run_dir)


def _ended(run_dir: Path) -> int:
    st = run_status(run_dir)
    if st.state == "finished":
        render.note(f"run {st.run_id} finished: {st.outcome or 'no outcome recorded'}"
                    f" (exit {st.exit_code})")
        return st.exit_code if st.exit_code is not None else 1
    render.note(f"run {st.run_id}: {st.label}: {st.note or ''}")
    return EXIT_UNREACHABLE


class _StatusLine:
    """The attach status line, re-read from the archive at most once a second."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._text = ""
        self._at = 0.0

    def render(self) -> str:
        now = time.monotonic()
        if now - self._at >= STATUS_EVERY_S or not self._text:
            self._at = now
            st = run_status(self.run_dir)
            wall = time.time()
            up = age(wall - st.created) if st.created else "-"
            last = f"last line {age(wall - st.last_line_t)} ago" if st.last_line_t else "no output"
            size = (f"{count(len(st.hosts), 'node')}, "
                    f"{count(st.world_size or 0, 'rank')}")
            self._text = (f"dtrain attach {st.run_id} | {st.label} | {size} | up {up} | {last} "
                          "| Ctrl-C detaches "
                          "(the run goes on)")
        return self._text


def stop(archive_dir: Path, run: str, *, grace: float | None = None, kill: bool = False,
         hint: str = "") -> int:
    """Ask a run's launcher to stop its job (as Ctrl-C would) and wait until it has ended."""
    run_dir = resolve_run(archive_dir, run)
    st = run_status(run_dir)
    if st.state == "finished":
        render.note(f"run {st.run_id} has already finished: {st.outcome} (exit {st.exit_code})")
        return 0
    if not st.alive:
        render.note(f"run {st.run_id}: nothing to stop: {st.label}: {st.note}")
        return 0
    reply = request_stop(run_dir, grace=grace, kill=kill)
    run_grace = _run_grace(run_dir) if grace is None else grace
    how = "KILL now" if kill else f"TERM, KILL after {run_grace:g} s"
    render.note(f"stopping run {st.run_id} ({how}); launcher answered: {reply.get('state')}")
    limit = (KILL_MARGIN if kill else run_grace + STOP_MARGIN) + _WAIT_EXTRA_S
    deadline = time.monotonic() + limit
    while run_status(run_dir).alive:
        if time.monotonic() > deadline:
            render.note(f"run {st.run_id} is still stopping after {limit:g} s; "
                        f"see `dtrain ps{hint}`")
            return 1
        time.sleep(0.1)
    end = run_status(run_dir)
    if end.state != "finished":
        render.note(f"run {st.run_id}: {end.label}: {end.note}")
        return 1
    render.note(f"run {st.run_id} stopped: {end.outcome} (exit {end.exit_code})")
    return 0


def _run_grace(run_dir: Path) -> float:
    launcher = read_meta(run_dir).get("launcher")
    grace = launcher.get("grace") if isinstance(launcher, dict) else None
    return float(grace) if isinstance(grace, int | float) else 10.0
