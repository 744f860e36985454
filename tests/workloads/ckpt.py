"""Restart-test workload (#28): a gloo training loop that checkpoints every few steps and
resumes from its last checkpoint, as torchrun's snapshot convention expects.

Configured by environment variables (dtrain passes them with -e):

  CK_DIR          a directory every node can write (the shared filesystem): the checkpoint
                  (``ckpt.json``, written by rank 0 through a temp file and a rename)
  CK_STEPS        steps in all (default 40)
  CK_EVERY        checkpoint every N steps (default 5)
  CK_STEP_SLEEP   seconds per step (default 0.1)
  CK_MIN_WORLD    refuse to start below this world size (default 1)
  CK_CRASH_RANK   this global rank crashes once, at CK_CRASH_STEP (default: none) ...
  CK_CRASH_STEP   ... (default 7): exit 3 with a RuntimeError traceback, unless the flag
                  file ``CK_DIR/crashed`` exists; it creates it first (so: once)
  CK_BAD_ARG      1 = refuse the arguments like argparse does (exit 2, before any step)

Prints ``world size W attempt A restart_count R`` once, then ``resumed at step N`` (or
``starting at step 0``), ``step N`` per step (flushed), ``checkpoint step N`` after each
checkpoint, ``done`` at the end. Ends with os._exit: torch 2.13 + gloo may abort at
interpreter exit after destroy_process_group.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist


def load(path: str) -> int:
    try:
        with open(path) as fh:
            return int(json.load(fh)["step"])
    except (OSError, ValueError, KeyError):
        return 0


def save(path: str, step: int, world: int) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        json.dump({"step": step, "world": world}, fh)
    os.replace(tmp, path)


def main() -> int:
    if os.environ.get("CK_BAD_ARG") == "1":
        argparse.ArgumentParser(prog="ckpt.py").parse_args(["--lx"])
    folder = os.environ["CK_DIR"]
    path = os.path.join(folder, "ckpt.json")
    steps = int(os.environ.get("CK_STEPS", "40"))
    every = int(os.environ.get("CK_EVERY", "5"))
    pause = float(os.environ.get("CK_STEP_SLEEP", "0.1"))
    crash_rank = int(os.environ.get("CK_CRASH_RANK", "-1"))
    crash_step = int(os.environ.get("CK_CRASH_STEP", "7"))
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"world size {world} attempt {os.environ.get('DTRAIN_ATTEMPT', '?')} restart_count "
          f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '?')}", flush=True)
    if world < int(os.environ.get("CK_MIN_WORLD", "1")):
        print(f"world size {world} is too small", file=sys.stderr, flush=True)
        return 4
    start = load(path)
    print(f"resumed at step {start}" if start else "starting at step 0", flush=True)
    w = torch.zeros(4)
    for step in range(start, steps):
        grad = torch.ones(4) * (rank + 1)
        dist.all_reduce(grad)
        w -= 0.01 * grad
        print(f"step {step}", flush=True)
        if rank == crash_rank and step == crash_step:
            flag = os.path.join(folder, "crashed")
            if not os.path.exists(flag):
                open(flag, "w").close()
                try:
                    raise RuntimeError(f"injected crash at step {step}")
                except RuntimeError:
                    import traceback

                    traceback.print_exc()
                    sys.stderr.flush()
                    return 3
        if (step + 1) % every == 0:
            dist.barrier()
            if rank == 0:
                save(path, step + 1, world)
                print(f"checkpoint step {step + 1}", flush=True)
        time.sleep(pause)
    dist.barrier()
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
