"""The score of a mutmut run (scripts/mutate): per module, killed / (killed + survived +
timeout... ), and every mutant that was not killed, from mutmut's own ``mutants/*.meta``.

Usage: python scripts/mutate_score.py WORKDIR [--json]
"""

from __future__ import annotations

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
        return "timeout"  # an endless loop the tests stopped: counted as killed
    if code in NOT_RUN:
        return "not run" if code is None or code == 2 else "no tests"
    return "survived" if code == 0 else "suspicious"


def main(argv: list[str]) -> int:
    work = Path(argv[1])
    data = load(work)
    total: Counter[str] = Counter()
    survivors = []
    print(f"{'module':<42} {'killed':>7} {'surv.':>6} {'no test':>8} {'not run':>8} {'score':>6}")
    for module, codes in data.items():
        counts = Counter(status(c) for c in codes.values())
        total.update(counts)
        judged = counts["killed"] + counts["timeout"] + counts["survived"] + counts["no tests"]
        score = (counts["killed"] + counts["timeout"]) / judged if judged else float("nan")
        print(f"{module:<42} {counts['killed'] + counts['timeout']:>7} {counts['survived']:>6} "
              f"{counts['no tests']:>8} {counts['not run']:>8} {score:>6.1%}")
        survivors += [name for name, c in codes.items()
                      if status(c) in ("survived", "no tests", "suspicious")]
    judged = total["killed"] + total["timeout"] + total["survived"] + total["no tests"]
    if judged:
        print(f"{'all':<42} {total['killed'] + total['timeout']:>7} {total['survived']:>6} "
              f"{total['no tests']:>8} {total['not run']:>8} "
              f"{(total['killed'] + total['timeout']) / judged:>6.1%}")
    print(f"\nnot killed ({len(survivors)}): scripts/mutate --show NAME for the diff")
    for name in survivors:
        print(f"  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
