"""Hang workload: a gloo loop in which one rank stops before a collective, under torchrun.

Configured by environment variables (dtrain passes them with -e):

  WL_HANG_RANK   the global rank that blocks (default 4; -1: none; "0,1,2,3": several)
  WL_HANG_STEP   before which step's all_reduce it blocks (default 3)
  WL_HANG_MODE   sleep (time.sleep inside load_batch, default), segv (ctypes reads address
                 0: a segmentation fault), raise (a ValueError), sigkill (kills itself), stop
                 (SIGSTOP to itself: no Python stack answers, as in uninterruptible sleep)
  WL_STEPS       steps to run (default 1000000)
  WL_STEP_SLEEP  seconds per step (default 0.2)
  WL_QUIET       1 = print nothing but the "it N" progress lines

Prints "step N loss X" per step on rank 0 (flushed; "it N" with WL_QUIET). Ends with
os._exit: torch 2.13 + gloo may abort at interpreter exit after destroy_process_group.
"""

from __future__ import annotations

import ctypes
import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist


def load_batch(rank: int, step: int) -> torch.Tensor:
    if rank in {int(r) for r in os.environ.get("WL_HANG_RANK", "4").split(",")} and \
            step == int(os.environ.get("WL_HANG_STEP", "3")):
        mode = os.environ.get("WL_HANG_MODE", "sleep")
        print(f"rank {rank}: blocking before the all_reduce ({mode})", file=sys.stderr,
              flush=True)
        if mode == "segv":
            ctypes.string_at(0)
        elif mode == "raise":
            raise ValueError(f"bad batch at step {step}")
        elif mode == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif mode == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(3600)
    return torch.ones(4) * (rank + 1)


def step_once(grad: torch.Tensor) -> None:
    dist.all_reduce(grad)


def main() -> int:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank = dist.get_rank()
    steps = int(os.environ.get("WL_STEPS", "1000000"))
    pause = float(os.environ.get("WL_STEP_SLEEP", "0.2"))
    quiet = os.environ.get("WL_QUIET") == "1"
    for step in range(steps):
        grad = load_batch(rank, step)
        step_once(grad)
        if rank == 0:
            print(f"it {step}" if quiet else f"step {step} loss {1.0 / (step + 1):.4f}",
                  flush=True)
        time.sleep(pause)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
