"""Report workload (issue 30): training-like metric lines, a hostile stderr line, an optional
failure. No torch import (fast to start); run under torchrun, which sets RANK.

Every rank prints, per step, ``step=N loss=L lr=R`` with
``L = 2 / (1 + 0.1 N) + 0.01 RANK`` and ``R = 3e-4``, and every 5 steps
``epoch: E, acc: A`` with ``A = 0.5 + 0.01 N`` (tests recompute these from the archive).

  WL_STEPS        steps (default 30)
  WL_STEP_SLEEP   seconds per step (default 0.05)
  WL_FAIL_RANK    the rank that fails (default none) ...
  WL_FAIL_STEP    ... after this step (default 10), with exit code WL_FAIL_CODE (default 3)
  WL_RESUME_FLAG  a file: when missing, the failing rank creates it and fails; when present
                  it runs to the end (a crash cured by a restart)
"""

from __future__ import annotations

import os
import sys
import time

HOSTILE = ("<script>alert('x')</script></script><img src=x onerror=alert(1)> "
           "\x1b[31mred\x1b[0m \x1b]52;c;ZXZpbA==\x07 \"><svg onload=alert(2)> &amp; "
           "url(http://198.51.100.7/x.css)")


def main() -> int:
    rank = int(os.environ["RANK"])
    steps = int(os.environ.get("WL_STEPS", "30"))
    pause = float(os.environ.get("WL_STEP_SLEEP", "0.05"))
    fail_rank = int(os.environ.get("WL_FAIL_RANK", "-1"))
    fail_step = int(os.environ.get("WL_FAIL_STEP", "10"))
    fail_code = int(os.environ.get("WL_FAIL_CODE", "3"))
    flag = os.environ.get("WL_RESUME_FLAG")
    print(f"rank {rank} ready", flush=True)
    print(HOSTILE, file=sys.stderr, flush=True)
    for step in range(steps):
        loss = 2 / (1 + 0.1 * step) + 0.01 * rank
        print(f"step={step} loss={loss:.6f} lr=3e-4", flush=True)
        if step % 5 == 4:
            print(f"epoch: {step // 5}, acc: {0.5 + 0.01 * step:.4f}", flush=True)
        if rank == fail_rank and step == fail_step:
            if flag and os.path.exists(flag):
                pass
            else:
                if flag:
                    open(flag, "w").close()
                print(f"rank {rank}: RuntimeError: failing on purpose at step {step}",
                      file=sys.stderr, flush=True)
                sys.stdout.flush()
                os._exit(fail_code)
        time.sleep(pause)
    return 0


if __name__ == "__main__":
    sys.exit(main())
