"""The score of a mutmut run (scripts/mutate): per module, killed / (killed + survived + no
test), timeouts and mutants not run yet apart, and every mutant that was not killed, from
mutmut's own ``mutants/*.meta``.

Usage: python scripts/mutate_score.py WORKDIR             the table and the names
       python scripts/mutate_score.py WORKDIR --diff [NAME...]  each not-killed mutant's
                                                    change (or the named ones), one line each
       python scripts/mutate_score.py WORKDIR --diff-module launcher/x/y.py   one module's
"""

from __future__ import annotations

import ast
import difflib
import fnmatch
import functools
import json
import sys
from collections import Counter
from pathlib import Path

# mutmut 3's exit codes (mutmut/stats.py): 1 and 3 are kills, 37 the type checker's
KILLED = {1, 3, 37}
TIMEOUT = {36, -24, 24, 152, 255}
NOT_RUN = {None, 2, 5, 33, 34}  # not checked, interrupted, no tests, skipped


def load(work: Path) -> dict[str, dict[str, int | None]]:
    """module path -> mutant name -> exit code."""
    out = {}
    for meta in sorted((work / "mutants").rglob("*.py.meta")):
        module = str(meta.relative_to(work / "mutants"))[: -len(".meta")]
        out[module] = json.loads(meta.read_text())["exit_code_by_key"]
    return out


def status(code: int | None) -> str:
    if code in KILLED:
        return "killed"
    if code in TIMEOUT:
        # an endless loop the tests stopped, or a box so loaded that the tests ran past
        # mutmut's limit: not counted either way (the table shows how many)
        return "timeout"
    if code in NOT_RUN:
        return "not run" if code is None or code == 2 else "no tests"
    return "survived" if code == 0 else "suspicious"


@functools.cache
def _functions(path: Path) -> dict[str, list[str]]:
    """Every function of a mutated file (mutmut keeps each mutant as a function of its own),
    by name, as source lines."""
    text = path.read_text()
    lines = text.splitlines()
    out = {}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            out[node.name] = lines[node.lineno - 1:node.end_lineno]
    return out


def diff(work: Path, name: str) -> str:
    """``launcher.hosts.slurm.x_expand__mutmut_9`` -> the lines it changed, '-'/'+'."""
    module, _, func = name.rpartition(".")
    path = work / "mutants" / (module.replace(".", "/") + ".py")
    funcs = _functions(path)
    orig = funcs.get(func.rpartition("__mutmut_")[0] + "__mutmut_orig", [])
    mutant = funcs.get(func, [])
    if not orig or not mutant:
        return f"{name}: (not in {path}: run that group again)"
    changed = [line for line in difflib.ndiff([x.strip() for x in orig[1:]],
                                               [x.strip() for x in mutant[1:]])
               if line[:1] in "-+"]
    return "\n".join([f"{name}:"] + [f"  {line}" for line in changed])


def main(argv: list[str]) -> int:
    work = Path(argv[1])
    data = load(work)
    if argv[2:3] == ["--markdown"]:  # the table of docs/testing.md
        print("| module | judged | killed | survived | no test | timeout | not run | score |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for module, codes in data.items():
            c = Counter(status(x) for x in codes.values())
            killed = c["killed"]
            judged = killed + c["survived"] + c["no tests"] + c["suspicious"]
            if judged:
                print(f"| `{module}` | {judged} | {killed} | {c['survived'] + c['suspicious']} "
                      f"| {c['no tests']} | {c['timeout']} | {c['not run']} "
                      f"| {killed / judged:.1%} |")
        return 0
    if argv[2:3] == ["--names"]:  # not killed (or not run yet) in these modules (globs)
        for module, codes in data.items():
            if any(fnmatch.fnmatch(module, pattern) for pattern in argv[3:]):
                print("\n".join(n for n, c in codes.items()
                                if status(c) in ("survived", "no tests", "suspicious",
                                                 "not run")))
        return 0
    if argv[2:3] in (["--diff"], ["--diff-module"]):
        only = argv[3] if argv[2] == "--diff-module" else None
        names = [] if only else argv[3:]
        names = names or [n for module, codes in data.items() for n, c in codes.items()
                          if status(c) in ("survived", "no tests", "suspicious")
                          and only in (None, module)]
        for name in names:
            print(diff(work, name))
        return 0
    total: Counter[str] = Counter()
    survivors = []
    print(f"{'module':<42} {'killed':>7} {'surv.':>6} {'no test':>8} {'not run':>8} {'score':>6}")
    for module, codes in data.items():
        counts = Counter(status(c) for c in codes.values())
        total.update(counts)
        judged = counts["killed"] + counts["survived"] + counts["no tests"]
        score = counts["killed"] / judged if judged else float("nan")
        print(f"{module:<42} {counts['killed']:>7} {counts['survived']:>6} "
              f"{counts['no tests']:>8} {counts['not run'] + counts['timeout']:>8} "
              f"{score:>6.1%}")
        survivors += [name for name, c in codes.items()
                      if status(c) in ("survived", "no tests", "suspicious")]
    judged = total["killed"] + total["survived"] + total["no tests"]
    if judged:
        print(f"{'all':<42} {total['killed']:>7} {total['survived']:>6} "
              f"{total['no tests']:>8} {total['not run'] + total['timeout']:>8} "
              f"{total['killed'] / judged:>6.1%}")
    print(f"\nnot killed ({len(survivors)}): scripts/mutate --show NAME for the diff")
    for name in survivors:
        print(f"  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
