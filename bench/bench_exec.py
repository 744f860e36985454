"""`dtrain exec` against pdsh and clush (and a bare asyncssh loop, the floor) on the cluster.

    python bench/bench_exec.py [--reps 5] [--nodes 32] [--seq-nodes 4] [--lines 400000]
                               [--only true,seq,keys,help] [--json results.json]

Cases:

* ``true`` on 32 nodes: connection set-up and teardown, nothing else;
* ``seq 1 400000`` on 4 nodes (1,600,000 lines into a file): the output path. Every line
  must arrive exactly once, in order, tagged with its host (``node5: 17``). It uses
  node5-node8 (--seq-first): the test suite cuts links and swaps keys on node4;
* ``keys check`` on --nodes nodes: ``dtrain keys check`` against ``pdsh``/``clush`` running
  ``true`` with the same key (the way one checks key login with those tools);
* ``dtrain --help``: start-up of the command itself, next to a bare ``python -c pass``.

Two reference floors run beside them: ``asyncssh loop`` (a bare asyncssh client with
dtrain's algorithms: connect, run, tag lines) and ``asyncssh+supervisor`` (the same, with
the command under dtrain's node supervisor, shipped as dtrain ships it). dtrain minus the
second is the launcher's own client-side cost; the second minus the first is the price of
the supervisor (a Python interpreter per node).

The cluster is grown to --nodes (32) and left that way. Targets (reported, never asserted):
dtrain <= 0.5 x pdsh for both exec cases, ``dtrain --help`` <= 0.3 s.
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
from collections.abc import Callable

from common import (
    DTRAIN,
    FANOUT,
    PYTHON,
    Env,
    Run,
    Series,
    bench_parser,
    check_tagged,
    fmt_s,
    log,
    machine,
    provenance,
    ratio_rows,
    revision,
    rounds,
    save_json,
    series_json,
    table,
    wall_table,
)

TOOLS = ("dtrain", "pdsh", "clush", "asyncssh loop", "asyncssh+supervisor")


def seq_checker(n: int) -> Callable[[list[str]], str | None]:
    expected = [str(i) for i in range(1, n + 1)]

    def check(lines: list[str]) -> str | None:
        if lines == expected:
            return None
        have = set(lines)
        lost = sum(1 for e in expected if e not in have)
        dup = len(lines) - len(have)
        order = "" if lost or dup else ", out of order"
        return f"{len(lines)} lines, {lost} lost, {dup} duplicated{order}"

    return check


def empty_checker(lines: list[str]) -> str | None:
    return f"{len(lines)} unexpected lines" if lines else None


def exec_case(env: Env, case: str, k: int, command: str, reps: int,
              checker: Callable[[list[str]], str | None], args: argparse.Namespace) -> Series:
    series = Series(case)
    argvs = {"dtrain": env.dtrain_exec(k, command), "pdsh": env.pdsh(k, command),
             "clush": env.clush(k, command), "asyncssh loop": env.floor(k, command),
             "asyncssh+supervisor": env.floor(k, command, supervisor=True)}
    names = env.names(k)

    def make(tool: str) -> Callable[[int], Run]:
        def fn(r: int) -> Run:
            out = env.tmp / f"{case.split()[0]}-{tool.replace(' ', '_')}-{r}.out"
            run = env.checked(tool, argvs[tool], out)
            run.problems += check_tagged(run.text(), dict.fromkeys(names, checker))
            lines = sum(1 for _ in open(out, "rb"))
            run.extra["lines"] = lines
            out.unlink()
            return run
        return fn

    log(f"{case}: {reps} rounds of {', '.join(TOOLS)}")
    rounds(series, [(t, make(t)) for t in TOOLS], reps, max_busy=args.max_busy,
           patience=args.patience)
    return series


def keys_case(env: Env, k: int, reps: int, args: argparse.Namespace) -> Series:
    """`dtrain keys check` (log in with the key alone, everywhere) against the pdsh/clush
    way of asking the same question: run `true` everywhere with key authentication only."""
    series = Series(f"keys check x {k} nodes")
    c = env.cluster
    argvs = {"dtrain": [DTRAIN, "keys", "check", "-H", f"{c.user}@{env.hostlist(k)}",
                        "--fanout", str(FANOUT), "-i", str(c.identity)],
             "pdsh": env.pdsh(k, "true"), "clush": env.clush(k, "true")}

    def make(tool: str) -> Callable[[int], Run]:
        def fn(r: int) -> Run:
            return env.checked(tool, argvs[tool], env.tmp / f"keys-{r}.out")
        return fn

    log(f"keys check x {k}: {reps} rounds")
    rounds(series, [(t, make(t)) for t in argvs], reps, max_busy=args.max_busy,
           patience=args.patience)
    return series


def help_case(env: Env, reps: int, args: argparse.Namespace) -> Series:
    """dtrain --help, with the interpreter's own start-up and the CLI import beside it."""
    series = Series("dtrain --help")
    argvs = {
        "dtrain --help": [DTRAIN, "--help"],
        "python -c pass": [PYTHON, "-c", "pass"],
        "import launcher.cli": [PYTHON, "-c", "import launcher.cli"],
    }

    def make(tool: str) -> Callable[[int], Run]:
        def fn(r: int) -> Run:
            run = env.checked(tool, argvs[tool], env.tmp / f"help-{r}.out")
            if not run.problems and tool == "dtrain --help" and "Usage" not in run.text():
                run.problems.append(f"exit {run.rc}: {run.stderr.strip()[-300:]}")
            return run
        return fn

    log(f"dtrain --help: {reps} rounds")
    rounds(series, [(t, make(t)) for t in argvs], reps, max_busy=args.max_busy,
           patience=args.patience)
    return series


def import_profile() -> list[tuple[str, float]]:
    """The biggest top-level imports of `dtrain --help` (python -X importtime), in ms."""
    p = subprocess.run([PYTHON, "-X", "importtime", DTRAIN, "--help"], capture_output=True,
                       text=True)
    out: dict[str, float] = {}
    for line in p.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = line.split("|", 2)
        if name.startswith(" ") and not name.startswith("  "):  # top level only
            try:
                out[name.strip()] = int(cumulative) / 1000
            except ValueError:
                continue
    return sorted(out.items(), key=lambda kv: -kv[1])[:6]


def main() -> int:
    parser = bench_parser(__doc__, reps=5, only="true,seq,help", first_node=None)
    parser.add_argument("--nodes", type=int, default=32)
    parser.add_argument("--seq-nodes", type=int, default=4)
    parser.add_argument("--seq-first", type=int, default=5,
                        help="first node of the seq case (tests cut and re-key node4)")
    parser.add_argument("--lines", type=int, default=400_000)
    parser.add_argument("--help-reps", type=int, default=10)
    args = parser.parse_args()
    only = set(args.only.split(","))

    env = Env.setup(max(args.nodes, args.seq_first + args.seq_nodes - 1),
                    ciphers=args.ssh_ciphers)
    log(machine())
    series: list[Series] = []
    try:
        if "true" in only:
            series.append(exec_case(env, f"true x {args.nodes} nodes", args.nodes, "true",
                                    args.reps, empty_checker, args))
        if "seq" in only:
            series.append(exec_case(dataclasses.replace(env, first=args.seq_first),
                                    f"seq 1 {args.lines} x {args.seq_nodes} nodes",
                                    args.seq_nodes, f"seq 1 {args.lines}", args.reps,
                                    seq_checker(args.lines), args))
        if "keys" in only:
            series.append(keys_case(env, args.nodes, args.reps, args))
        help_series = help_case(env, args.help_reps, args) if "help" in only else None
    finally:
        env.cleanup()

    print(f"\n{machine()}\n{revision()}\n")
    if series:
        print(wall_table(series, others=TOOLS[1:]))
        print()
        rows = []
        for s in series:
            if s.case.startswith("keys"):
                continue  # no target: reported for comparison only
            ratio = s.median("dtrain") / s.median("pdsh")
            rows.append([s.case, f"dtrain/pdsh = {ratio:.2f}", "<= 0.5",
                         "met" if ratio <= 0.5 else "NOT met"])
    else:
        rows = []
    if help_series is not None:
        print(wall_table([help_series], ref="dtrain --help",
                         others=("python -c pass", "import launcher.cli")))
        print("\nlargest top-level imports of `dtrain --help` (one run, -X importtime):")
        for name, ms in import_profile():
            print(f"  {name:<40} {ms:7.1f} ms")
        h = help_series.median("dtrain --help")
        rows.append(["dtrain --help", fmt_s(h), "<= 0.3 s", "met" if h <= 0.3 else "NOT met"])
    if rows:
        print("\ntargets (reported, not asserted):")
        print(table(["case", "measured", "target", "verdict"], rows))
    problems = [p for s in series for p in s.problems()]
    if help_series is not None:
        problems += help_series.problems()
    busy = sum(s.busy_rounds() for s in series) + (help_series.busy_rounds()
                                                    if help_series else 0)
    print(f"\nlost or wrong lines / failed runs: {len(problems) or 'none'}")
    for p in problems:
        print(f"  {p}")
    if busy:
        print(f"{busy} runs started on a busy machine (other sessions): numbers are noisier")
    everything = [*series, *([help_series] if help_series else [])]
    save_json(args.json, {**provenance(), "machine": machine(), "revision": revision(),
                          "rows": ratio_rows(series),
                          "series": {s.case: series_json(s) for s in everything}})
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
