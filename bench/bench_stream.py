"""Streaming output: 6 ranks x 20,000 lines, through dtrain (console + archive), pdsh, clush.

    python bench/bench_stream.py [--reps 3] [--nodes 3] [--ranks-per-node 2]
                                 [--lines 20000] [--burst 1000] [--pause 0.005] [--json F]

Each "rank" is this file in worker mode: it prints --lines lines (~45 bytes) in bursts of
--burst lines (written in <= 4 KiB pieces cut at line ends, so two workers sharing one pipe
never interleave inside a line), pausing --pause s between bursts. Its first line carries
its start time. Tools:

* ``dtrain run``: torchrun with 2 ranks on each of 3 nodes, every rank a worker; lines are
  tagged ``node1 r0:`` on the console and archived in output.jsonl with their rank;
* ``dtrain exec``, ``pdsh``, ``clush``, ``asyncssh loop``: one shell command per node that
  starts the node's 2 workers in the background (40,000 lines per node); tagged by host only.

The benchmark reads each tool's stdout through a pipe itself (a fast terminal) and notes
when every chunk arrived. Throughput = worker lines / (arrival of the last worker line -
the earliest worker start); "worker start spread" is how much later the last worker
started (torchrun starts ranks when its agents meet; ssh tools when their session opens).
For dtrain run the archive's own receive times give the archive throughput. Checks: every
(rank, line) exactly once, under the right host (and, for dtrain run, the right rank) on
the console and in output.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

MARK = "@@"


def worker(argv: list[str]) -> int:
    """One rank: print the lines in bursts (standard library only: runs on the nodes)."""
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, default=None)
    p.add_argument("--lines", type=int, default=20000)
    p.add_argument("--burst", type=int, default=1000)
    p.add_argument("--pause", type=float, default=0.005)
    a = p.parse_args(argv)
    rank = a.rank if a.rank is not None else int(os.environ["RANK"])
    t0 = time.time()
    lines = [f"r{rank} {i:06d} {MARK} loss 0.{i * 7919 % 1000000:06d} lr 1e-4\n".encode()
             for i in range(a.lines)]
    lines[0] = f"r{rank} {0:06d} {MARK} t0={t0:.6f}\n".encode()
    for start in range(0, a.lines, a.burst):
        piece: list[bytes] = []
        size = 0
        for line in lines[start:start + a.burst]:
            if size + len(line) > 4096 and piece:
                _write_all(b"".join(piece))
                piece, size = [], 0
            piece.append(line)
            size += len(line)
        if piece:
            _write_all(b"".join(piece))
        if a.pause:
            time.sleep(a.pause)
    return 0


def _write_all(data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]


# ---------------------------------------------------------------- the benchmark


def main() -> int:
    from pathlib import Path
    from typing import Any

    from common import (
        DTRAIN,
        PYTHON,
        REPO,
        Env,
        Run,
        Series,
        arrival_time,
        bench_parser,
        fmt_s,
        log,
        machine,
        revision,
        rounds,
        run_timed,
        save_json,
        series_json,
        table,
    )

    parser = bench_parser(__doc__, reps=3,
                          only="dtrain run,dtrain exec,pdsh,clush,asyncssh loop")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--ranks-per-node", type=int, default=2)
    parser.add_argument("--lines", type=int, default=20000)
    parser.add_argument("--burst", type=int, default=1000)
    parser.add_argument("--pause", type=float, default=0.005)
    args = parser.parse_args()

    env = Env.setup(args.nodes, args.first_node, ciphers=args.ssh_ciphers)
    log(machine())
    k, per = args.nodes, args.ranks_per_node
    world = k * per
    total = world * args.lines
    me = str(Path(__file__).resolve().relative_to(REPO))
    wargs = f"--lines {args.lines} --burst {args.burst} --pause {args.pause}"
    shell = (f"cd {REPO} && n=$(hostname) && n=${{n#node}} && "
             f"for r in $(seq 0 {per - 1}); do {PYTHON} -u {me} --worker "
             f"--rank $(( (n - {env.first}) * {per} + r )) {wargs} & done; wait")
    cenv = env.env()
    names = env.names(k)
    host_of = {r: names[r // per] for r in range(world)}
    runs_dir = env.tmp / "runs"

    def argv(tool: str, r: int) -> list[str]:
        if tool == "dtrain run":
            return [DTRAIN, "run", "-H", f"{env.cluster.user}@{env.hostlist(k)}",
                    "--nproc-per-node", str(per), "--python", PYTHON, "--workdir", str(REPO),
                    "--archive-dir", str(runs_dir), "--run-id", f"stream-{r + 1}",
                    "--no-color", me, "--worker", *wargs.split()]
        return {"dtrain exec": env.dtrain_exec, "pdsh": env.pdsh, "clush": env.clush,
                "asyncssh loop": env.floor}[tool](k, shell)

    def measure(tool: str) -> Any:
        def fn(r: int) -> Run:
            if tool == "dtrain run" and (runs_dir / f"stream-{r + 1}").exists():
                import shutil

                shutil.rmtree(runs_dir / f"stream-{r + 1}")
            out = env.tmp / f"stream-{tool.replace(' ', '_')}-{r}.out"
            run = run_timed(tool, argv(tool, r), env=cenv, out=out, pipe=True, timeout=300)
            if run.rc != 0:
                run.problems.append(f"exit {run.rc}: {run.stderr.strip()[-400:]}")
            data = out.read_bytes()
            text = data.decode(errors="replace")
            # the console: "<host>: rR i @@ ..." (exec tools) or "<host> rR: rR i @@ ..." (run)
            seen, t0s, problems = check_console(text, tool == "dtrain run")
            run.problems += problems
            run.problems += missing(seen)
            last = data.rfind(MARK.encode())
            if last >= 0 and t0s:
                start = min(t0s)
                end = arrival_time(run, data.find(b"\n", last))
                run.extra.update(window=end - start, rate=sum(seen.values()) / (end - start),
                                 lines=sum(seen.values()), start_spread=max(t0s) - start)
            if tool == "dtrain run":
                check_archive(run, runs_dir / f"stream-{r + 1}", min(t0s) if t0s else None)
            out.unlink()
            return run
        return fn

    def check_console(text: str, ranked: bool) -> tuple[dict[tuple[int, int], int],
                                                          list[float], list[str]]:
        seen: dict[tuple[int, int], int] = {}
        t0s: list[float] = []
        problems: list[str] = []
        wrong = 0
        for line in text.splitlines():
            if MARK not in line:
                continue
            tag, _, body = line.partition(": ")
            parts = body.split(" ", 3)
            rank, i = int(parts[0][1:]), int(parts[1])
            want = f"{host_of[rank]} r{rank}" if ranked else host_of[rank]
            if tag != want:
                wrong += 1
            seen[(rank, i)] = seen.get((rank, i), 0) + 1
            if i == 0:
                t0s.append(float(parts[3].partition("t0=")[2]))
        if wrong:
            problems.append(f"console: {wrong} lines under the wrong tag")
        if len(t0s) != world:
            problems.append(f"console: {len(t0s)} worker start lines of {world}")
        return seen, t0s, problems

    def missing(seen: dict[tuple[int, int], int], where: str = "console") -> list[str]:
        lost = sum(1 for r in range(world) for i in range(args.lines) if (r, i) not in seen)
        dup = sum(n - 1 for n in seen.values() if n > 1)
        out = []
        if lost:
            out.append(f"{where}: {lost} of {total} lines lost")
        if dup:
            out.append(f"{where}: {dup} lines duplicated")
        return out

    def check_archive(run: Run, run_dir: Path, start: float | None) -> None:
        path = run_dir / "output.jsonl"
        if not path.exists():
            run.problems.append(f"archive: no {path}")
            return
        seen: dict[tuple[int, int], int] = {}
        wrong = 0
        last_t = 0.0
        with open(path) as f:
            for raw in f:
                rec = json.loads(raw)
                text = rec["line"]
                if MARK not in text or rec["stream"] != "out":
                    continue
                parts = text.split(" ", 2)
                rank, i = int(parts[0][1:]), int(parts[1])
                if rec["rank"] != rank or rec["host"] != host_of[rank] \
                        or rec["node_rank"] != rank // per:
                    wrong += 1
                seen[(rank, i)] = seen.get((rank, i), 0) + 1
                last_t = max(last_t, rec["t"])
        if wrong:
            run.problems.append(f"archive: {wrong} lines with the wrong rank/host")
        run.problems += missing(seen, "archive")
        if start is not None and last_t:
            run.extra.update(archive_window=last_t - start,
                             archive_rate=sum(seen.values()) / (last_t - start))
        meta = json.loads((run_dir / "meta.json").read_text())
        run.extra["exit_code"] = meta.get("exit_code")
        run.extra["console_skipped"] = meta.get("console_skipped")

    tools = [t for t in args.only.split(",") if t]
    series = Series(f"{world} ranks x {args.lines} lines")
    log(f"{series.case} ({total} lines): {args.reps} rounds of {', '.join(tools)}")
    try:
        rounds(series, [(t, measure(t)) for t in tools], args.reps, max_busy=args.max_busy,
               patience=args.patience)
    finally:
        env.cleanup()

    def med(tool: str, key: str) -> float:
        return series.median(tool, lambda r: r.extra.get(key, float("nan")))

    rows = []
    for tool in tools:
        rate, arate = med(tool, "rate"), med(tool, "archive_rate")
        rows.append([tool, fmt_s(series.median(tool)), fmt_s(med(tool, "window")),
                     fmt_s(med(tool, "start_spread")),
                     f"{rate:,.0f}", "-" if arate != arate else f"{arate:,.0f}",
                     fmt_s(series.median(tool, lambda r: r.client_cpu)),
                     "yes" if tool == "dtrain run" else "no",
                     f"{sum(1 for r in series.runs.get(tool, []) if not r.problems)}/"
                     f"{len(series.runs.get(tool, []))}"])
    print(f"\n{machine()}\n{revision()}\n")
    print(f"{series.case} ({total} lines, {k} nodes, bursts of {args.burst}, "
          f"pause {args.pause} s); medians of {args.reps}\n")
    print(table(["tool", "wall", "stream window", "worker start spread", "console lines/s",
                 "archive lines/s",
                 "client CPU", "rank tags", "runs with every line"], rows))
    ratios = []
    for tool in ("dtrain run", "dtrain exec"):
        for other in ("pdsh", "clush"):
            if tool in series.runs and other in series.runs:
                ratios.append([f"{tool} / {other}",
                               f"{med(tool, 'rate') / med(other, 'rate'):.2f}",
                               f"{med(tool, 'window') / med(other, 'window'):.2f}"])
    if ratios:
        print()
        print(table(["ratio", "throughput (>1: dtrain faster)",
                     "stream window (<1: dtrain faster)"], ratios))
    problems = series.problems()
    print(f"\nlost or wrong lines / failed runs: {len(problems) or 'none'}")
    for p in problems:
        print(f"  {p}")
    if series.busy_rounds():
        print(f"{series.busy_rounds()} runs started on a busy machine (other sessions)")
    save_json(args.json, {"machine": machine(), "revision": revision(),
                          "series": {series.case: series_json(series)}})
    return 1 if problems else 0


if __name__ == "__main__":
    if "--worker" in sys.argv[1:]:
        sys.exit(worker([a for a in sys.argv[1:] if a != "--worker"]))
    sys.exit(main())
