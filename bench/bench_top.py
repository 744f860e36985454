"""`dtrain top` at 64 nodes: one refresh's wall and client CPU, the sampler's node CPU, and
a cold snapshot against the pdsh/clush loop it replaces.

    python bench/bench_top.py [--nodes 64] [--first-node 5] [--reps 5] [--seconds 30]
                              [--only micro,steady,snapshot,inrun] [--json results.json]

Cases:

* ``steady``: the live view's machinery in this process (TopState + one sampler per node,
  the rich screen rendered into a 200x80 buffer every interval), for ``--seconds`` after
  every node has sampled once. Per refresh: the *wall* is the slowest node's latest sample
  in transit (its arrival minus the node's sample time: one clock on this box) plus the
  time to build the document and render the screen: from the nodes' readings to the drawn
  screen. The *staleness* is the oldest row's age at the draw plus the render: bounded by
  the interval, since nodes sample at their own phase; the *client CPU* is this
  process's CPU over the window divided by refreshes and nodes; the *node CPU* is each
  sample's ``self_cpu_ms`` (the sampler and its nvidia-smi, measured on the node).
  Targets (issue 29, reported, never asserted): refresh <= 1 s wall, <= 5 ms client CPU per
  node; node CPU reported.
* ``snapshot``: cold ``dtrain top --once`` (connect, start the samplers, one sample each,
  print) against ``pdsh``/``clush`` running ``cat /proc/loadavg /proc/meminfo; nvidia-smi
  --query-gpu=...`` on every node (what a ``watch pdsh ... nvidia-smi`` loop does each
  round), interleaved, rotated, medians (bench/common.py).

* ``inrun``: what `dtrain run`'s own sampling costs at its default (every 10 s): the
  straggler workload (tests/workloads/straggler.py, node<first + 2> computing 10x longer)
  on ``--inrun-nodes`` nodes x 2 ranks for ``--inrun-seconds``, once with
  ``--sample-interval 10`` and then once with 0 (one pair: the launcher's CPU is compared,
  not asserted); per sample the
  node CPU (``self_cpu_ms`` in samples.jsonl: the sampler, its /proc reads of the ranks,
  nvidia-smi), and the launcher's CPU in both runs; when the straggler was flagged.

Uses node<first>.. (default node5 and up: the test suite cuts links on node1-4). Half the
nodes (6, 8, ...) have the test cluster's fake nvidia-smi, a Python script: its CPU is part
of those nodes' ``self_cpu_ms`` and is reported apart (a real nvidia-smi loop is C).
"""

from __future__ import annotations

import asyncio
import io
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import (
    DTRAIN,
    Env,
    Run,
    Series,
    bench_parser,
    log,
    machine,
    revision,
    rounds,
    run_timed,
    save_json,
    series_json,
    table,
    wait_quiet,
    wall_table,
)

QUERY = ("nvidia-smi --query-gpu=index,utilization.gpu,memory.used,memory.total,"
         "temperature.gpu,power.draw --format=csv,noheader,nounits 2>/dev/null; "
         "cat /proc/loadavg; head -3 /proc/meminfo; true")


def snapshot_tools(env: Env, k: int) -> list[tuple[str, Any]]:
    hosts = env.hostlist(k)

    def dtrain_top(r: int) -> Run:
        run = run_timed("dtrain top --once", [DTRAIN, "top", "-H", hosts, "--once"],
                        env=env.env(DTRAIN_RESIDENT="0"),  # cold: no resident's warm start
                        out=env.tmp / f"top-{r}.out")
        rows = [ln for ln in run.text().splitlines() if ln.startswith("node")]
        if run.rc != 0 or len(rows) != k or any(" ok " not in ln for ln in rows):
            run.problems.append(f"rc {run.rc}, {len(rows)} rows: {run.stderr[-300:]}")
        return run

    runtime = Path(tempfile.mkdtemp(prefix="dtrain-bench-run-"))  # the keeper's own
    os.chmod(runtime, 0o700)

    def dtrain_top_warm(r: int) -> Run:
        """The same through the connection keeper (--persist), warm after the warm-up round,
        started warm by its resident (docs/connections.md)."""
        run = run_timed("dtrain top --once --persist",
                        [DTRAIN, "top", "-H", hosts, "--once", "--persist", "10m"],
                        env=env.env(XDG_RUNTIME_DIR=str(runtime)),
                        out=env.tmp / f"top-warm-{r}.out")
        rows = [ln for ln in run.text().splitlines() if ln.startswith("node")]
        if run.rc != 0 or len(rows) != k or any(" ok " not in ln for ln in rows):
            run.problems.append(f"rc {run.rc}, {len(rows)} rows: {run.stderr[-300:]}")
        return run

    def tool(name: str, argv: list[str]) -> Any:
        def go(r: int) -> Run:
            run = env.run(name, argv, env.tmp / f"{name}-{r}.out")
            hosts_seen = {ln.split(":", 1)[0] for ln in run.text().splitlines()}
            if run.rc != 0 or len(hosts_seen) != k:
                run.problems.append(f"rc {run.rc}, {len(hosts_seen)} hosts answered")
            return run
        return go

    return [("dtrain top --once", dtrain_top), ("dtrain top --once --persist", dtrain_top_warm),
            ("pdsh", tool("pdsh", env.pdsh(k, QUERY))),
            ("clush", tool("clush", env.clush(k, QUERY)))]


async def steady(env: Env, k: int, seconds: float, interval: float) -> dict[str, Any]:
    """Run the live view's machinery for ``seconds``; what one refresh costs."""
    import os

    from rich.console import Console

    from launcher.commands.top import TopRequest, policy, sampler_params
    from launcher.commands.top.model import TopState
    from launcher.commands.top.screen import KeyState, renderable
    from launcher.commands.top.view import ViewOptions
    from launcher.hosts.hostfile import parse_host_expr
    from launcher.job.sampling import follow
    from launcher.transports import AutoTransport
    from launcher.transports.ssh import SSHSettings

    # asyncssh reads $HOME/.ssh: this process is the client, as `dtrain top` is under
    # HOME=<cluster client home> (bench/README.md)
    os.environ["HOME"] = env.env()["HOME"]
    hosts = parse_host_expr(env.hostlist(k))
    req = TopRequest(interval=interval)
    state = TopState([h.label for h in hosts], interval)
    arrivals: dict[str, float] = {}
    costs: dict[str, list[float]] = {}

    def on_sample(host: str, msg: dict[str, Any]) -> None:
        arrivals[host] = time.time() - float(msg["t"])  # age at arrival (same clock)
        state.on_sample(host, msg)
        if state.nodes[host].samples > 1:  # the first includes the sampler's start-up
            costs.setdefault(host, []).append(float(msg.get("self_cpu_ms") or 0.0))

    console = Console(file=io.StringIO(), width=200, height=80, force_terminal=True)
    keys = KeyState(ViewOptions())
    refresh_walls, stale, render_s = [], [], []
    async with AutoTransport(SSHSettings(), "ssh") as transport:
        task = asyncio.create_task(follow(transport, hosts, sampler_params(req),
                                          on_sample, state.on_state, policy(req),
                                          {h.label: "python3" for h in hosts}))
        t0 = time.monotonic()
        while not all(n.samples >= 2 for n in state.nodes.values()):
            if time.monotonic() - t0 > 120:
                late = {h: (n.state, n.error) for h, n in state.nodes.items() if n.samples < 2}
                raise SystemExit(f"bench: not every node sampled within 120 s: {late}")
            await asyncio.sleep(0.1)
        started = time.monotonic() - t0
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        w0 = time.monotonic()
        n = 0
        next_at = time.monotonic()
        while time.monotonic() - w0 < seconds:
            next_at += interval
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            r0 = time.perf_counter()
            doc = state.document()
            console.file = io.StringIO()
            console.print(renderable(doc, keys, 80))
            r = time.perf_counter() - r0
            render_s.append(r)
            oldest = max(n_["age"] for n_ in doc["nodes"] if n_["age"] is not None)
            stale.append(oldest + r)
            refresh_walls.append(max(arrivals.values()) + r)
            n += 1
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        window = time.monotonic() - w0
        task.cancel()
        try:
            await task
        except (asyncio.CancelledError, Exception):
            pass
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    from tests.cluster.gpus import is_gpu_node

    gpu_costs = [c for h, cs in costs.items() if is_gpu_node(int(h[4:])) for c in cs]
    cpu_costs = [c for h, cs in costs.items() if not is_gpu_node(int(h[4:])) for c in cs]
    return {"nodes": k, "interval": interval, "refreshes": n, "window_s": window,
            "start_s": started, "client_cpu_s": cpu,
            "client_cpu_ms_per_refresh_per_node": cpu / n / k * 1000,
            "refresh_wall_median_s": statistics.median(refresh_walls),
            "refresh_wall_max_s": max(refresh_walls),
            "staleness_median_s": statistics.median(stale),
            "staleness_max_s": max(stale),
            "transit_median_s": statistics.median(arrivals.values()),
            "render_ms_median": statistics.median(render_s) * 1000,
            "node_cpu_ms_cpu_nodes_median": statistics.median(cpu_costs) if cpu_costs else None,
            "node_cpu_ms_cpu_nodes_p95": _p95(cpu_costs),
            "node_cpu_ms_gpu_nodes_median": statistics.median(gpu_costs) if gpu_costs else None,
            "node_cpu_ms_gpu_nodes_p95": _p95(gpu_costs)}


def micro(render_nodes: list[int] | None = None, n: int = 2000) -> dict[str, float]:
    """What one sample's pieces cost here (no ssh), and a stack sample's for comparison."""
    import os

    from launcher.nodeside import sampler

    def per_call(fn: Any) -> float:
        t0 = time.process_time()
        for _ in range(n):
            fn()
        return (time.process_time() - t0) / n * 1e6

    out = {"host readers (cpu, load, mem, net) us": per_call(
        lambda: (sampler.read_cpu(), sampler.read_load(), sampler.read_mem(),
                 sampler.read_net()))}
    procs = len([p for p in os.listdir("/proc") if p.isdigit()])
    t0 = time.process_time()
    ranks = sampler.Ranks("bench-no-such-run", None)
    ranks._scan()
    out[f"first /proc scan ({procs} processes) us"] = (time.process_time() - t0) * 1e6
    # the steady state: one tracked rank process (this one), its stat read per sample
    me = os.getpid()
    st = sampler.proc_stat("/", me)
    assert st is not None
    ranks.seen = {me: (st[2], 0)}
    out["per-rank CPU read (one /proc/<pid>/stat) us"] = per_call(ranks.sample)
    # a stack sample: faulthandler's all-thread dump (what a rank armed by `hangs` does on
    # its signal; py-spy adds ptrace stops), timed here 30 frames deep: the rank's own CPU
    import faulthandler

    def deep(k: int) -> float:
        return deep(k - 1) if k else per_call(
            lambda: faulthandler.dump_traceback(file=devnull, all_threads=True))

    with open(os.devnull, "w") as devnull:
        out["stack sample (faulthandler dump, 30 frames) us"] = deep(30)
    for k in render_nodes or [64]:
        out[f"live screen, {k} nodes x 8 GPUs (document + render, 200x80) us"] = \
            render_cost(k, n=50 if k <= 128 else 10)
    return out


def render_cost(k: int, n: int = 50) -> float:
    """One refresh of the live screen for k synthetic 8-GPU nodes, CPU per refresh (us)."""
    from rich.console import Console

    from launcher.commands.top.model import TopState
    from launcher.commands.top.screen import KeyState, renderable
    from launcher.commands.top.view import ViewOptions

    hosts = [f"gpu{i:02d}" for i in range(1, k + 1)]
    state = TopState(hosts, 1.0)
    for i, h in enumerate(hosts):
        gpus = [{"index": g, "name": "H100", "util_pct": (i * g) % 100, "mem_used_mib": 1024,
                 "mem_total_mib": 81559, "temp_c": 41, "power_w": 123.45,
                 "power_limit_w": 700} for g in range(8)]
        state.on_sample(h, {"type": "sample", "t": time.time(), "dt": 1.0, "cpu_pct": 12.0,
                            "ncpu": 8, "load": [1.25, 1.0, 0.5], "mem_used": 3 << 30,
                            "mem_total": 16 << 30, "gpus": gpus, "gpu_source": "nvidia-smi",
                            "net": {"iface": "ib0", "rx_bps": 1500 * i, "tx_bps": 2 << 20},
                            "gpu_error": None, "self_cpu_ms": 0.4})
    console = Console(file=io.StringIO(), width=200, height=80, force_terminal=True)
    keys = KeyState(ViewOptions())

    def once() -> None:
        console.file = io.StringIO()
        console.print(renderable(state.document(), keys, 80))

    once()
    t0 = time.process_time()
    for _ in range(n):
        once()
    return (time.process_time() - t0) / n * 1e6


def inrun(env: Env, k: int, seconds: float) -> dict[str, Any]:
    import json
    import threading
    import uuid

    from tests.util import REPO

    c = env.cluster
    nodes = env.nodes(k)
    slow = nodes[2].name if k > 2 else nodes[-1].name
    out: dict[str, Any] = {"nodes": k, "ranks_per_node": 2, "seconds": seconds}
    for interval in (10.0, 0.0):
        archive = env.tmp / f"inrun-{interval:g}"
        stop = Path(c.shared_dir) / f"bench-top-stop-{uuid.uuid4().hex}"
        timer = threading.Timer(seconds, stop.touch)
        timer.start()
        try:
            run = env.run(f"run --sample-interval {interval:g}", [
                DTRAIN, "run", "-H", env.hostlist(k), "--python", c.python,
                "--nproc-per-node", "2", "--archive-dir", str(archive), "--run-id", "inrun",
                "--sample-interval", f"{interval:g}", "--no-color",
                "tests/workloads/straggler.py", str(stop), slow],
                env.tmp / f"inrun-{interval:g}.out", cwd=REPO, timeout=seconds + 300)
        finally:
            timer.cancel()
            stop.unlink(missing_ok=True)
        case: dict[str, Any] = {"rc": run.rc, "wall_s": run.wall,
                                "launcher_cpu_s": run.client_cpu}
        if interval:
            recs = [json.loads(x) for x in
                    (archive / "inrun" / "samples.jsonl").read_text().splitlines()]
            firsts: set[str] = set()
            costs = []
            for r in recs:  # the first sample of each node includes the sampler's start-up
                if r["host"] in firsts:
                    costs.append(float(r["self_cpu_ms"]))
                firsts.add(r["host"])
            meta = json.loads((archive / "inrun" / "meta.json").read_text())
            case.update({
                "samples": len(recs), "node_cpu_ms_median": statistics.median(costs),
                "node_cpu_ms_p95": _p95(costs), "node_cpu_ms_max": max(costs),
                "node_cpu_share_pct": statistics.median(costs) / (interval * 1000) * 100,
                "stragglers": [(s["host"], round(s["flagged"] - meta["start"], 1))
                               for s in meta.get("stragglers") or []]})
        out[f"interval_{interval:g}"] = case
    return out


def _p95(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * (len(ordered) - 1)))]


def main(argv: list[str]) -> int:
    parser = bench_parser(__doc__, reps=5, only="micro,steady,snapshot,inrun")
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--inrun-nodes", type=int, default=4)
    parser.add_argument("--inrun-seconds", type=float, default=120.0)
    parser.add_argument("--render-nodes", default="64",
                        help="micro: the live screen's CPU per refresh at these node counts "
                             "(synthetic 8-GPU nodes; e.g. 64,512,2048)")
    args = parser.parse_args(argv)
    only = set(args.only.split(","))
    # micro alone needs no node (its pieces run here)
    env = None if only == {"micro"} else Env.setup(args.nodes, args.first_node,
                                                   ciphers=args.ssh_ciphers)
    out: dict[str, Any] = {"machine": machine(), "revision": revision()}
    try:
        if "micro" in only:
            m = micro([int(k) for k in args.render_nodes.split(",")])
            out["micro"] = m
            print("\n### the sampler's pieces, here (no ssh)\n")
            print(table(["piece", "cost"], [[k, f"{v:.1f}"] for k, v in m.items()]))
        if "steady" in only:
            assert env is not None
            log(f"steady: {args.nodes} nodes, every {args.interval:g} s, {args.seconds:g} s")
            quiet = wait_quiet(args.max_busy, args.patience)
            st = asyncio.run(steady(env, args.nodes, args.seconds, args.interval))
            st["quiet"] = quiet
            out["steady"] = st
            print(f"\n### dtrain top, steady refresh at {st['nodes']} nodes "
                  f"(every {st['interval']:g} s, {st['refreshes']} refreshes)\n")
            print(table(["measure", "value", "target"], [
                ["refresh wall (slowest node's transit + render), median",
                 f"{st['refresh_wall_median_s']:.3f} s", "<= 1 s"],
                ["refresh wall, worst", f"{st['refresh_wall_max_s']:.3f} s", ""],
                ["oldest row's age + render (<= interval + wall), median / worst",
                 f"{st['staleness_median_s']:.3f} / {st['staleness_max_s']:.3f} s", ""],
                ["render (document + rich screen), median", f"{st['render_ms_median']:.1f} ms",
                 ""],
                ["client CPU per refresh per node",
                 f"{st['client_cpu_ms_per_refresh_per_node']:.2f} ms", "<= 5 ms"],
                ["sampler node CPU per sample, CPU-only nodes (median / p95)",
                 f"{st['node_cpu_ms_cpu_nodes_median']:.2f} / "
                 f"{st['node_cpu_ms_cpu_nodes_p95']:.2f} ms", "reported"],
                ["... GPU nodes, incl. the fake nvidia-smi (median / p95)",
                 f"{st['node_cpu_ms_gpu_nodes_median']:.2f} / "
                 f"{st['node_cpu_ms_gpu_nodes_p95']:.2f} ms", "reported"],
                ["every node sampling after", f"{st['start_s']:.1f} s", ""],
                ["started on a quiet machine", "yes" if st["quiet"] else "no (busy)", ""],
            ]))
        if "inrun" in only:
            assert env is not None
            log(f"inrun: {args.inrun_nodes} nodes x 2 ranks, {args.inrun_seconds:g} s, "
                "sampling every 10 s and off")
            ir = inrun(env, args.inrun_nodes, args.inrun_seconds)
            out["inrun"] = ir
            on, off = ir["interval_10"], ir["interval_0"]
            print(f"\n### dtrain run's sampling every 10 s ({ir['nodes']} nodes x 2 ranks, "
                  f"{ir['seconds']:g} s)\n")
            print(table(["measure", "value"], [
                ["node CPU per sample (median / p95 / max)",
                 f"{on['node_cpu_ms_median']:.2f} / {on['node_cpu_ms_p95']:.2f} / "
                 f"{on['node_cpu_ms_max']:.2f} ms"],
                ["... as a share of one CPU", f"{on['node_cpu_share_pct']:.3f} %"],
                ["samples", str(on["samples"])],
                ["launcher CPU, sampling every 10 s / off",
                 f"{on['launcher_cpu_s']:.2f} / {off['launcher_cpu_s']:.2f} s"],
                ["run wall, sampling every 10 s / off",
                 f"{on['wall_s']:.1f} / {off['wall_s']:.1f} s"],
                ["straggler flagged (host, s after start)", str(on["stragglers"])],
            ]))
            if on["rc"] or off["rc"]:
                log(f"problems: exit {on['rc']} / {off['rc']}")
                return 1
        if "snapshot" in only:
            assert env is not None
            series = Series(f"snapshot, {args.nodes} nodes")
            log(f"snapshot: {args.nodes} nodes, {args.reps} rounds")
            rounds(series, snapshot_tools(env, args.nodes), args.reps,
                   max_busy=args.max_busy, patience=args.patience)
            out["snapshot"] = series_json(series)
            print(f"\n### one cold snapshot, {args.nodes} nodes\n")
            print(wall_table([series], ref="dtrain top --once"))
            bad = series.problems()
            if bad:
                log("problems:\n  " + "\n  ".join(bad))
                return 1
    finally:
        if env is not None:
            env.cleanup()
    print(f"\n{out['machine']}\n{out['revision']}")
    save_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
