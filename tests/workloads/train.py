"""Chaos-test workload: a gloo training loop with an injectable failure, run under torchrun.

Configured by environment variables (dtrain passes them with -e):

  WL_STEPS        steps to run (default: effectively forever)
  WL_STEP_SLEEP   seconds per step (default 0.2)
  WL_COLLECTIVE   1 = all-reduce every step (default); 0 = purely local steps, so ranks keep
                  training when a peer dies (only dtrain stops them)
  WL_FAIL_RANK    the global rank that fails (default: none)
  WL_FAIL_STEP    after which step it fails (default 1)
  WL_FAIL_MODE    exit (os._exit(WL_FAIL_CODE), default) or sigkill (kills itself)
  WL_FAIL_CODE    exit code of the failing rank (default 7)
  WL_IGNORE_TERM  1 = every rank ignores SIGTERM (must be killed after the grace period)

Prints "step N" per step (flushed). Ends with os._exit: torch 2.13 + gloo may abort at
interpreter exit after destroy_process_group.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import torch
import torch.distributed as dist


def main() -> int:
    if os.environ.get("WL_IGNORE_TERM") == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    steps = int(os.environ.get("WL_STEPS", "1000000"))
    pause = float(os.environ.get("WL_STEP_SLEEP", "0.2"))
    collective = os.environ.get("WL_COLLECTIVE", "1") == "1"
    fail_rank = int(os.environ.get("WL_FAIL_RANK", "-1"))
    fail_step = int(os.environ.get("WL_FAIL_STEP", "1"))
    fail_mode = os.environ.get("WL_FAIL_MODE", "exit")
    fail_code = int(os.environ.get("WL_FAIL_CODE", "7"))
    print(f"rank {rank}/{world} pid {os.getpid()} ready", flush=True)
    w = torch.zeros(4)
    for step in range(steps):
        grad = torch.ones(4) * (rank + 1)
        if collective:
            dist.all_reduce(grad)
        w -= 0.01 * grad
        print(f"step {step} w {w[0].item():.3f}", flush=True)
        if rank == fail_rank and step == fail_step:
            print(f"rank {rank}: failing on purpose ({fail_mode} {fail_code})",
                  file=sys.stderr, flush=True)
            if fail_mode == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(fail_code)
        time.sleep(pause)
    if collective:
        dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
