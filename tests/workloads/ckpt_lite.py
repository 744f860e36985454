"""Torch-free restart workload (bench/bench_restarts.py at 4 and 16 nodes): the checkpoint
protocol of tests/workloads/ckpt.py without torch in the ranks, so that 16 nodes' ranks fit
on a 2-core box and the benchmark measures the relaunch, not 16 torch imports.

Each rank's first line is ``resumed at step N`` (from rank 0's checkpoint) or ``starting at
step 0``, then ``step N`` per step (flushed); rank 0 writes ``CK_DIR/ckpt.json`` every
CK_EVERY steps and prints ``checkpoint step N``. No collective: each rank steps on its own.

  CK_DIR, CK_STEPS (default 40), CK_EVERY (5), CK_STEP_SLEEP (0.1): as in ckpt.py
  CK_CRASH_RANK, CK_CRASH_STEP (7): that rank exits 3 with a RuntimeError traceback once
                  (the flag file CK_DIR/crashed says it already did)
"""

import json
import os
import sys
import time
import traceback


def main() -> int:
    folder = os.environ["CK_DIR"]
    path = os.path.join(folder, "ckpt.json")
    rank = int(os.environ.get("RANK", "0"))
    steps = int(os.environ.get("CK_STEPS", "40"))
    every = int(os.environ.get("CK_EVERY", "5"))
    pause = float(os.environ.get("CK_STEP_SLEEP", "0.1"))
    crash_rank = int(os.environ.get("CK_CRASH_RANK", "-1"))
    crash_step = int(os.environ.get("CK_CRASH_STEP", "7"))
    try:
        with open(path) as fh:
            start = int(json.load(fh)["step"])
    except (OSError, ValueError, KeyError):
        start = 0
    print(f"resumed at step {start}" if start else "starting at step 0", flush=True)
    for step in range(start, steps):
        print(f"step {step}", flush=True)
        if rank == crash_rank and step == crash_step:
            flag = os.path.join(folder, "crashed")
            if not os.path.exists(flag):
                open(flag, "w").close()
                try:
                    raise RuntimeError(f"injected crash at step {step}")
                except RuntimeError:
                    traceback.print_exc()
                    sys.stderr.flush()
                    return 3
        if rank == 0 and (step + 1) % every == 0:
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as fh:
                json.dump({"step": step + 1}, fh)
            os.replace(tmp, path)
            print(f"checkpoint step {step + 1}", flush=True)
        time.sleep(pause)
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
