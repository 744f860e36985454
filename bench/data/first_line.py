"""Run a script after one line that says when this rank reached it (bench/bench_recovery.py).

    python bench/data/first_line.py SCRIPT [ARGS...]

The first thing this process does: print ``dtrain-bench first-line t=<time.time()>
rank=<RANK> attempt=<N>``, before any import beyond the interpreter's own, then run SCRIPT
as ``__main__`` with ARGS as its argv. ``attempt`` is dtrain's ``DTRAIN_ATTEMPT`` where
dtrain set it, else torchrun's ``TORCHELASTIC_RESTART_COUNT`` + 1: the same count under
both launchers (1: the first start, 2: after the first restart). Every node of the test
cluster shares one clock, so the bench compares these instants with the instant it
SIGKILLed a rank. The line matches no progress pattern (dtrain's default ``--progress``
leaves it alone: the goodput ledger's start-up still ends at the script's first step).
"""

import os
import sys
import time

T = time.time()
_ENV = os.environ
_ATTEMPT = _ENV.get("DTRAIN_ATTEMPT") or str(int(_ENV.get("TORCHELASTIC_RESTART_COUNT") or 0) + 1)
# one write(2) of the whole line: ranks that share their agent's stdout (torchrun without
# --tee) cannot interleave inside it (print writes the text and its end apart)
os.write(1, f"dtrain-bench first-line t={T:.6f} rank={_ENV.get('RANK', '-')} "
            f"attempt={_ATTEMPT}\n".encode())

if __name__ == "__main__":
    import runpy

    if len(sys.argv) < 2:
        sys.exit("usage: first_line.py SCRIPT [ARGS...]")
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
    runpy.run_path(sys.argv[0], run_name="__main__")
