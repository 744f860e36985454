"""The fixed cost of one dtrain command (issue 26): what a pdsh user feels on every call.

    python bench/bench_startup.py [--reps 10] [--only help,local,one] [--json FILE]

Cases, each interleaved round by round with its yardsticks (rotated order, medians):

* ``help``: ``dtrain --help`` next to a bare ``python -c pass`` (the interpreter's own
  start-up on this machine, site and .pth files included: the floor of any Python CLI);
* ``local``: ``dtrain exec -H localhost -- true`` (no SSH at all: the local transport)
  next to ``pdsh -R exec -w localhost true`` and ``python -c pass``;
* ``one``: ``dtrain exec -H node5 -- true`` (one SSH node) next to ``pdsh -w node5 true``,
  ``ssh node5 true`` and the bare asyncssh loop (bench/common.py), with and without
  dtrain's node program (``asyncssh+supervisor``).

dtrain (its console script) runs the code of this tree (PYTHONPATH, bench/common.py), with
its .pyc files written (the warm-up round), as an installed dtrain runs.
Targets (issue 26, reported, never asserted): ``--help`` <= 0.3 s, local exec <= 0.25 s,
one SSH node <= 1.0x pdsh. ``--ref TREE`` adds another checkout's dtrain to every case
(``dtrain (ref)``): an A/B of two commits in the same interleaved rounds.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from common import (
    DTRAIN,
    PDSH,
    PYTHON,
    Env,
    Run,
    Series,
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
    wall_table,
)


def case(env: Env, name: str, argvs: dict[str, list[str]], reps: int,
         check: Callable[[str, Run], str | None], args: argparse.Namespace) -> Series:
    series = Series(name)
    cenv = env.env()

    def make(tool: str) -> Callable[[int], Run]:
        def fn(r: int) -> Run:
            out = env.tmp / f"{name.split()[0]}-{tool.replace(' ', '_')}-{r}.out"
            run = run_timed(tool, argvs[tool], env=cenv, out=out)
            problem = check(tool, run)
            if problem:
                run.problems.append(problem)
            out.unlink()
            return run
        return fn

    log(f"{name}: {reps} rounds of {', '.join(argvs)}")
    rounds(series, [(t, make(t)) for t in argvs], reps,
           max_busy=args.max_busy, patience=args.patience)
    return series


def ok_exit(tool: str, run: Run) -> str | None:
    return f"exit {run.rc}: {run.stderr.strip()[-300:]}" if run.rc else None


def main() -> int:
    parser = bench_parser(__doc__, reps=10, only="help,local,one")
    parser.add_argument("--ref", help="another checkout (a worktree of an older commit): its "
                        "dtrain runs beside this tree's in every case, as 'dtrain (ref)'")
    args = parser.parse_args()
    ref = ["env", f"PYTHONPATH={Path(args.ref).resolve()}", DTRAIN] if args.ref else None
    only = set(args.only.split(","))
    env = Env.setup(1, first=args.first_node, ciphers=args.ssh_ciphers)
    node = env.names(1)[0]
    user = env.cluster.user
    log(machine())
    series: list[Series] = []
    refs: dict[str, tuple[str, ...]] = {}
    try:
        if "help" in only:
            def help_ok(tool: str, run: Run) -> str | None:
                if run.rc or (tool.startswith("dtrain") and "Usage" not in run.text()):
                    return f"exit {run.rc}: {run.stderr.strip()[-300:]}"
                return None
            tools = {"dtrain --help": [DTRAIN, "--help"],
                     "python -c pass": [PYTHON, "-c", "pass"]}
            if ref:
                tools["dtrain (ref) --help"] = [*ref, "--help"]
            s = case(env, "dtrain --help", tools, args.reps, help_ok, args)
            series.append(s)
            refs[s.case] = ("dtrain --help", *list(tools)[1:])
        if "local" in only:
            local = ["exec", "-H", "localhost", "--no-color", "--", "true"]
            tools = {"dtrain": [DTRAIN, *local],
                     "pdsh -R exec": [PDSH, "-S", "-R", "exec", "-w", "localhost", "true"],
                     "python -c pass": [PYTHON, "-c", "pass"]}
            if ref:
                tools["dtrain (ref)"] = [*ref, *local]
            s = case(env, "exec -H localhost -- true", tools, args.reps, ok_exit, args)
            series.append(s)
            refs[s.case] = ("dtrain", *list(tools)[1:])
        if "one" in only:
            one = ["exec", "-H", f"{user}@{node}", "--no-color", "--", "true"]
            tools = {
                "dtrain": [DTRAIN, *one],
                "pdsh": env.pdsh(1, "true"),
                "ssh": env.ssh(env.nodes(1)[0].name, "true"),
                "asyncssh loop": env.floor(1, "true"),
                "asyncssh+supervisor": env.floor(1, "true", supervisor=True)}
            if ref:
                tools["dtrain (ref)"] = [*ref, *one]
            s = case(env, f"exec -H {node} -- true", tools, args.reps, ok_exit, args)
            series.append(s)
            refs[s.case] = ("dtrain", *list(tools)[1:])
    finally:
        env.cleanup()

    print(f"\n{machine()}\n{revision()}\n")
    for s in series:
        ref, *others = refs[s.case]
        print(wall_table([s], ref=ref, others=others))
        print()
    rows = []
    for s in series:
        if s.case == "dtrain --help":
            h = s.median("dtrain --help")
            rows.append([s.case, fmt_s(h), "<= 0.3 s", fmt_s(s.median("python -c pass")),
                         "met" if h <= 0.3 else "NOT met"])
        elif "localhost" in s.case:
            w = s.median("dtrain")
            rows.append([s.case, fmt_s(w), "<= 0.25 s", fmt_s(s.median("python -c pass")),
                         "met" if w <= 0.25 else "NOT met"])
        else:
            ratio = s.median("dtrain") / s.median("pdsh")
            rows.append([s.case, f"dtrain/pdsh = {ratio:.2f}", "<= 1.0",
                         f"asyncssh loop/pdsh = "
                         f"{s.median('asyncssh loop') / s.median('pdsh'):.2f}",
                         "met" if ratio <= 1.0 else "NOT met"])
    print("targets (reported, not asserted):")
    print(table(["case", "measured", "target", "floor (same run)", "verdict"], rows))
    problems = [p for s in series for p in s.problems()]
    busy = sum(s.busy_rounds() for s in series)
    print(f"\nfailed runs: {len(problems) or 'none'}")
    for p in problems:
        print(f"  {p}")
    if busy:
        print(f"{busy} runs started on a busy machine (other sessions): numbers are noisier")
    save_json(args.json, {"machine": machine(), "revision": revision(),
                          "series": {s.case: series_json(s) for s in series}})
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
