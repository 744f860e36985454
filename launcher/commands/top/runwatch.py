"""`dtrain top RUN`: what the run's archive says, beside the samples.

A run in another shell, or detached, writes its archive as it goes: meta.json (state,
attempt, layout, the launcher's straggler flags) and output.jsonl (every line, within a
second). ``RunWatch.poll`` re-reads meta.json when it changed and reads output.jsonl from
where it stopped (the first time from at most ``TAIL_BYTES`` before its end), keeping per
rank the time of its last line and the run's step rate. Nothing here talks to the launcher:
the view works the same for a foreground run, a detached one, or one whose launcher died.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from launcher.decide.outcome.hang import compile_progress
from launcher.decide.outcome.steprate import StepRate
from launcher.job.events import sample_cpu
from launcher.models import Host
from launcher.output.archive import read_meta
from launcher.output.rundir import open_in_run
from launcher.output.runstate import run_status
from launcher.output.samplelog import SAMPLES
from launcher.runrecord import RunMeta

TAIL_BYTES = 4 << 20  # the first read of output.jsonl starts at most this far before its end
READ_BYTES = 8 << 20  # at most this much per poll (a chatty run cannot stall the view)
META = "meta.json"
OUTPUT = "output.jsonl"


def _host(label: str, entry: dict[str, Any] | None) -> Host:
    """A Host to connect to: the run's recorded entry, else its label (name[:port])."""
    if entry:
        port = entry.get("port")
        return Host(str(entry.get("name") or label), user=entry.get("user") or None,
                    port=port if isinstance(port, int) else None,
                    python=entry.get("python") or None, source="meta.json")
    name, _, port_s = label.rpartition(":")
    if name and port_s.isdigit():
        return Host(name, port=int(port_s), source="meta.json")
    return Host(label, source="meta.json")


def plan_iface(env: list[dict[str, Any]]) -> str | None:
    """A node's socket interface from its plan env (GLOO_SOCKET_IFNAME, =NCCL_SOCKET_IFNAME)."""
    values = {str(v.get("name")): str(v.get("value") or "") for v in env if isinstance(v, dict)}
    for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        value = values.get(name, "").lstrip("=").split(",")[0].strip()
        if value and not value.startswith("^") and value != "***":
            return value
    return None


class Tail:
    """An archive file read as it grows: whole lines only, from where the last read
    stopped; the first read starts at most TAIL_BYTES before the end."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset: int | None = None
        self.partial = b""

    def _open(self) -> int | None:
        """The file, with the archive readers' checks (this user's regular file, no
        symlink followed: output/rundir.py)."""
        return open_in_run(self.path.parent, self.path.name)

    def lines(self) -> list[bytes]:
        fd = self._open()
        if fd is None:
            return []
        try:
            with os.fdopen(fd, "rb") as fh:
                size = fh.seek(0, os.SEEK_END)
                if self.offset is None or self.offset > size:
                    start = max(0, size - TAIL_BYTES)
                    fh.seek(start)
                    if start:
                        fh.readline()  # a torn first line
                    self.offset, self.partial = fh.tell(), b""
                fh.seek(self.offset)
                data = fh.read(READ_BYTES)
        except OSError:
            return []
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        return lines


class RunWatch:
    """One run, followed through its archive."""

    def __init__(self, run_dir: Path, pattern: re.Pattern[str] | None = None) -> None:
        self.run_dir = run_dir
        self.pattern = pattern or compile_progress(None)
        self.meta: RunMeta = {}
        self._meta_stamp: tuple[int, int] | None = None
        self._output = Tail(run_dir / OUTPUT)
        self._samples = Tail(run_dir / SAMPLES)
        self.last_line: dict[int, float] = {}
        self.steps = StepRate(self.pattern)
        self.state: str | None = None
        self.poll()

    # -- what the run is --------------------------------------------------------------------
    @property
    def run_id(self) -> str:
        return str(self.meta.get("run_id") or self.run_dir.name)

    @property
    def layout(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for n in self.meta.get("layout") or []:
            if isinstance(n, dict) and isinstance(n.get("host"), str):
                out[n["host"]] = [int(r) for r in n.get("ranks") or [] if isinstance(r, int)]
        return out

    def hosts(self) -> list[Host]:
        entries = {e.get("label"): e for e in self.meta.get("host_entries") or []
                   if isinstance(e, dict)}
        labels = [h for h in self.meta.get("hosts") or [] if isinstance(h, str)]
        return [_host(label, entries.get(label)) for label in labels]

    def ifaces(self) -> dict[str, str]:
        out = {}
        for n in (self.meta.get("plan") or {}).get("nodes") or []:
            if isinstance(n, dict) and isinstance(n.get("host"), str):
                iface = plan_iface(n.get("env") or [])
                if iface:
                    out[n["host"]] = iface
        return out

    def attempt(self) -> int | None:
        attempts = self.meta.get("attempts")
        if isinstance(attempts, list) and attempts:
            return len(attempts)
        a = self.meta.get("attempt")
        return a if isinstance(a, int) else None

    def stragglers(self) -> list[dict[str, Any]]:
        return [s for s in self.meta.get("stragglers") or [] if isinstance(s, dict)]

    def flagged_hosts(self) -> set[str]:
        return {str(s.get("host")) for s in self.stragglers() if s.get("cleared") is None}

    def line_age(self, rank: int, now: float) -> float | None:
        t = self.last_line.get(rank)
        return round(max(0.0, now - t), 2) if t is not None else None

    # -- reading the archive ----------------------------------------------------------------
    def poll(self) -> None:
        """Read what changed since the last poll (cheap when nothing did)."""
        try:
            st = os.stat(self.run_dir / META)
            stamp = (st.st_mtime_ns, st.st_size)
        except OSError:
            stamp = None
        if stamp != self._meta_stamp:
            self._meta_stamp = stamp
            self.meta = read_meta(self.run_dir)
            self.state = run_status(self.run_dir).label
        elif self.state in ("starting", "running", "stopping"):
            self.state = run_status(self.run_dir).label  # a launcher that died says nothing
        self._read_output()

    def _read_output(self) -> None:
        for raw in self._output.lines():
            self._record(raw)

    def history(self) -> list[tuple[str, float, dict[int, float]]]:
        """New samples.jsonl lines since the last call, as (host, t, per-rank CPU s): the
        run's own samples from before top started prime top's straggler evidence."""
        out = []
        for raw in self._samples.lines():
            try:
                rec = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(rec, dict) or not isinstance(rec.get("host"), str):
                continue
            found = sample_cpu(rec)  # job/events.py's reading of a sample
            if found is not None:
                out.append((rec["host"], *found))
        return out

    def _record(self, raw: bytes) -> None:
        try:
            rec = json.loads(raw)
        except ValueError:
            return
        if not isinstance(rec, dict):
            return
        rank, t = rec.get("rank"), rec.get("t")
        if not isinstance(rank, int) or not isinstance(t, (int, float)):
            return
        if rec.get("stream") not in ("out", "err"):
            return
        self.last_line[rank] = float(t)
        self.steps.feed(rank, float(t), str(rec.get("line", "")))

    def document(self, now: float) -> dict[str, Any]:
        """dtrain.top/1's ``run`` section."""
        rate = self.steps.rate(now)
        code = self.meta.get("exit_code")
        return {"run_id": self.run_id, "state": self.state, "attempt": self.attempt(),
                "world_size": self.meta.get("world_size"),
                "outcome": self.meta.get("outcome") if isinstance(self.meta.get("outcome"), str)
                else None, "exit_code": code if isinstance(code, int) else None,
                "step": self.steps.step(), "step_rate": round(rate, 3) if rate is not None
                else None, "progress": self.pattern.pattern, "archive": str(self.run_dir)}
