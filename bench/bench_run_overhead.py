"""The launcher's overhead: `dtrain run` of a 3-node x 2-rank DDP job against starting the
same torchruns by hand (a parallel ssh loop), with pdsh and with clush.

    python bench/bench_run_overhead.py [--reps 3] [--steps 3] [--json F]

The job is examples/ddp_smoke.py (gloo on CPU, DDP_SMOKE_STEPS steps, then an all-reduce
whose result it checks). The hand-written loop is what a user would type:

    ssh node_i "cd /work/main && PYTHONUNBUFFERED=1 GLOO_SOCKET_IFNAME=<iface of node i> \\
        python -m torch.distributed.run --nnodes 3 --node-rank i --master-addr <node 0> \\
        --master-port P --nproc-per-node 2 examples/ddp_smoke.py"     (3 at once, wait all)

The nodes are node5-node7 (--first-node; the test suite cuts links and swaps keys on
node1-4), so the master is 198.18.0.15. pdsh and clush send one command to the 3 nodes;
it picks the node rank and the interface from the node's hostname. dtrain run does more
before it starts anything: it probes every node, picks and checks the master address and
port, and decides each node's environment.

Reported: wall time (median), time to the first rank's first line, time from rank 0's
all-reduce line to the tool's exit (teardown), and for dtrain the pre-flight phase
(process start -> run archive created, i.e. connect + probe + master check). Goal
(reported, not asserted): dtrain / ssh loop <= 1.1. Every run must end with exit 0,
"all-reduce 21 (expected 21): OK", one start line per rank and every step line.
"""

from __future__ import annotations

import json
import random
import re
import sys
from collections.abc import Callable

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

SCRIPT = "examples/ddp_smoke.py"
RANK_LINE = re.compile(r"rank (\d+)/(\d+) on (\S+) ")


def main() -> int:
    parser = bench_parser(__doc__, reps=3, only="dtrain run,ssh loop,pdsh,clush")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()

    env = Env.setup(args.nodes, args.first_node, ciphers=args.ssh_ciphers)
    log(machine())
    k, nproc = args.nodes, args.nproc
    world = k * nproc
    nodes = env.nodes(k)
    master = nodes[0].ip
    cenv = env.env()
    runs_dir = env.tmp / "runs"

    def torchrun(rank: str, iface: str, port: int) -> str:
        return (f"PYTHONUNBUFFERED=1 GLOO_SOCKET_IFNAME={iface} "
                f"DDP_SMOKE_STEPS={args.steps} {PYTHON} -m torch.distributed.run "
                f"--nnodes {k} --node-rank {rank} --master-addr {master} "
                f"--master-port {port} --nproc-per-node {nproc} {SCRIPT}")

    def by_hostname(port: int) -> str:
        cases = " ".join(f"{n.name}) i={i}; f={n.ifname};;" for i, n in enumerate(nodes))
        return (f"case $(hostname) in {cases} esac; cd {REPO} && "
                + torchrun("$i", "$f", port))

    def argvs(tool: str, r: int) -> list[str] | list[list[str]]:
        port = random.randrange(30000, 40000)
        if tool == "dtrain run":
            return [DTRAIN, "run", "-H", f"{env.cluster.user}@{env.hostlist(k)}",
                    "--nproc-per-node", str(nproc), "--python", PYTHON, "--workdir",
                    str(REPO), "--archive-dir", str(runs_dir), "--run-id", f"ddp-{r + 1}",
                    "--no-color", "--env", f"DDP_SMOKE_STEPS={args.steps}", SCRIPT]
        if tool == "ssh loop":
            return [env.ssh(n.name, f"cd {REPO} && " + torchrun(str(i), n.ifname, port))
                    for i, n in enumerate(nodes)]
        if tool == "pdsh":
            return env.pdsh(k, by_hostname(port))
        return env.clush(k, by_hostname(port))

    def measure(tool: str) -> Callable[[int], Run]:
        def fn(r: int) -> Run:
            run_dir = runs_dir / f"ddp-{r + 1}"
            if run_dir.exists():
                import shutil

                shutil.rmtree(run_dir)
            out = env.tmp / f"ddp-{tool.replace(' ', '_')}-{r}.out"
            run = run_timed(tool, argvs(tool, r), env=cenv, out=out, pipe=True, timeout=300)
            data = out.read_bytes()
            text = data.decode(errors="replace")
            if run.rc != 0:
                run.problems.append(f"exit {run.rc}: {run.stderr.strip()[-400:]}")
            expected = world * (world + 1) // 2
            if f"all-reduce {expected} (expected {expected}): OK" not in text:
                run.problems.append("no all-reduce OK line")
            ranks = [int(m.group(1)) for m in RANK_LINE.finditer(text)]
            if sorted(ranks) != list(range(world)):
                run.problems.append(f"rank start lines: {sorted(ranks)}")
            steps = len(re.findall(r"step \d+ loss ", text))
            if steps != world * args.steps:
                run.problems.append(f"{steps} step lines of {world * args.steps}")
            first = RANK_LINE.search(text)
            if first:
                run.extra["first_rank_line"] = arrival_time(run, first.start()) - run.t_start
            done = text.find("all-reduce ")
            if done >= 0:  # rank 0's last line: from here on it is teardown and exit
                run.extra["after_job"] = run.t_start + run.wall - arrival_time(run, done)
            if run.problems and run.rc == 0:
                run.problems.append(f"stderr: {run.stderr.strip()[-300:]}")
            if tool == "dtrain run" and (run_dir / "meta.json").exists():
                meta = json.loads((run_dir / "meta.json").read_text())
                run.extra["preflight"] = float(meta["created_ts"]) - run.t_start
                run.extra["teardown"] = run.t_start + run.wall - float(meta["end"])
                if meta.get("exit_code") != 0:
                    run.problems.append(f"archive exit_code {meta.get('exit_code')}")
            out.unlink()
            return run
        return fn

    tools = [t for t in args.only.split(",") if t]
    series = Series(f"{k} nodes x {nproc} ranks, {args.steps} steps")
    log(f"{series.case}: {args.reps} rounds of {', '.join(tools)}")
    try:
        rounds(series, [(t, measure(t)) for t in tools], args.reps, max_busy=args.max_busy,
               patience=args.patience)
    finally:
        env.cleanup()

    def med(tool: str, key: str) -> float:
        return series.median(tool, lambda r: r.extra.get(key, float("nan")))

    rows = []
    base = series.median("ssh loop") if "ssh loop" in series.runs else float("nan")
    for tool in tools:
        wall = series.median(tool)
        runs = series.runs.get(tool, [])
        walls = sorted(r.wall for r in runs if not r.problems)
        rows.append([tool, fmt_s(wall), f"{walls[0]:.2f}-{walls[-1]:.2f}" if walls else "-",
                     fmt_s(med(tool, "first_rank_line")),
                     fmt_s(med(tool, "preflight")), fmt_s(med(tool, "after_job")),
                     fmt_s(series.median(tool, lambda r: r.client_cpu)),
                     fmt_s(series.median(tool, lambda r: r.machine_cpu)),
                     f"{wall / base:.2f}" if base == base else "",
                     f"{sum(1 for r in runs if not r.problems)}/{len(runs)}"])
    print(f"\n{machine()}\n{revision()}\n")
    print(f"{series.case} (examples/ddp_smoke.py, gloo); medians of {args.reps}\n")
    print(table(["tool", "wall (median)", "range", "first rank line", "pre-flight",
                 "after all-reduce", "client CPU", "machine CPU", "x ssh loop", "ok runs"],
                rows))
    if "dtrain run" in series.runs and base == base:
        ratio = series.median("dtrain run") / base
        print(f"\ngoal dtrain run / ssh loop <= 1.1 (reported, not asserted): {ratio:.2f} "
              f"({'met' if ratio <= 1.1 else 'NOT met'}); dtrain's extra time "
              f"{series.median('dtrain run') - base:+.2f} s, of which pre-flight "
              f"{med('dtrain run', 'preflight'):.2f} s")
    problems = series.problems()
    print(f"\nfailed runs / missing lines: {len(problems) or 'none'}")
    for p in problems:
        print(f"  {p}")
    if series.busy_rounds():
        print(f"{series.busy_rounds()} runs started on a busy machine (other sessions)")
    save_json(args.json, {"machine": machine(), "revision": revision(),
                          "series": {series.case: series_json(series)}})
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
