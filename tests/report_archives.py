"""Hand-made run archives for the report's tests and bench/bench_report.py.

``write_archive`` lays out exactly the archive contract (docs/output-and-archive.md):
meta.json, output.jsonl, hosts/<host>.log, and the newer optional files other features add
(samples.jsonl, stacks/<dump>/r<rank>.txt, meta.json attempts[], hangs[], stragglers[]).
``synthetic`` makes a big one (a 64-rank hour) to measure the page's size.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

T0 = 1_800_000_000.0


def write_archive(run_dir: Path, meta: Mapping[str, Any], lines: Iterable[Mapping[str, Any]],
                  samples: Iterable[Mapping[str, Any]] | None = None,
                  stacks: Mapping[str, Mapping[str, str]] | None = None) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "hosts").mkdir()
    (run_dir / "meta.json").write_text(json.dumps({"archive_version": 1,
                                                   "run_id": run_dir.name, **meta}))
    with open(run_dir / "output.jsonl", "w") as fh:
        for rec in lines:
            fh.write(json.dumps(rec) + "\n")
    if samples is not None:
        with open(run_dir / "samples.jsonl", "w") as fh:
            for rec in samples:
                fh.write(json.dumps(rec) + "\n")
    for dump, files in (stacks or {}).items():
        d = run_dir / "stacks" / dump
        d.mkdir(parents=True)
        for name, body in files.items():
            (d / name).write_text(body)
    return run_dir


def line(t: float, host: str, rank: int | None, text: str, stream: str = "out",
         attempt: int | None = None, node_rank: int | None = 0) -> dict[str, Any]:
    rec: dict[str, Any] = {"t": T0 + t, "host": host, "node_rank": node_rank, "rank": rank,
                           "stream": stream, "line": text}
    if attempt is not None:
        rec["attempt"] = attempt
    return rec


def layout(nodes: int, per_node: int) -> list[dict[str, Any]]:
    return [{"host": f"node{n + 1}", "node_rank": n,
             "ranks": list(range(n * per_node, (n + 1) * per_node))} for n in range(nodes)]


def finished_nodes(lay: list[dict[str, Any]], end: float, failing: int | None = None,
                   code: int = 3) -> list[dict[str, Any]]:
    out = []
    for node in lay:
        ranks = {}
        for r in node["ranks"]:
            if failing is None:
                ranks[str(r)] = {"exit_code": 0, "signal": None, "duration": end - 1.0,
                                 "role": "ok", "start": T0 + 1.0, "end": T0 + end}
            elif r == failing:
                ranks[str(r)] = {"exit_code": code, "signal": None, "duration": end - 1.5,
                                 "role": "root cause", "start": T0 + 1.0,
                                 "end": T0 + end - 0.5}
            else:
                ranks[str(r)] = {"exit_code": 143, "signal": 15, "duration": end - 1.0,
                                 "role": "stopped", "start": T0 + 1.0, "end": T0 + end}
        out.append({"host": node["host"], "node_rank": node["node_rank"],
                    "exit_code": 0 if failing is None else 137,
                    "signal": None if failing is None else 9, "error": None, "lost": False,
                    "duration": end, "start": T0 + 0.2, "end": T0 + end + 0.3, "ranks": ranks})
    return out


def synthetic(run_dir: Path, *, nodes: int = 8, per_node: int = 8, seconds: float = 3600,
              every: float = 1.0, sample_every: float = 10.0, gpus: int = 8,
              phased: bool = False) -> Path:
    """A clean run of nodes x per_node ranks: every rank prints ``step=N loss=... lr=...
    tokens_per_s=...`` every ``every`` seconds, one sample per node every ``sample_every``
    (``phased``: each node at its own instant within the interval, as real samplers are)."""
    lay = layout(nodes, per_node)
    world = nodes * per_node
    meta = {"created_ts": T0, "start": T0, "end": T0 + seconds + 2, "exit_code": 0,
            "outcome": "ok", "hosts": [n["host"] for n in lay], "world_size": world,
            "layout": lay, "state": "finished",
            "command": ["dtrain", "run", "-f", "hosts.txt", "train.py", "--lr", "3e-4"],
            "nodes": finished_nodes(lay, seconds + 1.5),
            "root_cause": {"kind": None, "summary": "ok", "exit_code": 0}}

    def lines() -> Iterable[dict[str, Any]]:
        steps = int(seconds / every)
        for step in range(steps):
            t = 1.0 + step * every
            for node in lay:
                for r in node["ranks"]:
                    loss = 3.0 * math.exp(-step / (steps / 4)) + 0.02 * math.sin(step + r)
                    yield line(t + 0.001 * r, node["host"], r,
                               f"step={step} loss={loss:.5f} lr=3.0e-04 "
                               f"tokens_per_s={41000 + 37 * ((step * 7 + r) % 11)}",
                               node_rank=node["node_rank"])

    def samples() -> Iterable[dict[str, Any]]:
        for k in range(int(seconds / sample_every)):
            for i, node in enumerate(lay):
                slow = i == 3
                phase = (i * 0.6180339887 % 1.0) * sample_every if phased else 0.0
                yield {"t": round(T0 + k * sample_every + phase, 3), "host": node["host"],
                       "cpu": {"busy": 35.0 + 3 * math.sin(k / 7 + i)},
                       "mem": {"used": 300e9, "total": 1000e9},
                       "gpus": [{"util": (99.0 if slow else 71.0) + (k + g) % 5,
                                 "mem_used": 61000, "mem_total": 81559} for g in range(gpus)],
                       "nic": {"rx": 9.1e9 + 1e8 * (k % 3), "tx": 9.0e9}}

    meta["stragglers"] = [{"host": lay[3]["host"], "t": T0 + 600,
                           "reason": "rarely waits in the collective"}]
    return write_archive(run_dir, meta, lines(), samples())


def file_size(path: Path) -> int:
    return os.stat(path).st_size
