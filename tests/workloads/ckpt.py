"""Restart-test workload (#28): a training loop that checkpoints every few steps and
resumes from its last checkpoint, as torchrun's snapshot convention expects. By default a
gloo job (an all_reduce per step); with CK_LITE=1 torch-free ranks (bench/bench_restarts.py
at 4 and 16 nodes, the restart tests that need no collective): the same checkpoint
protocol, no torch import, no collective (each rank steps on its own), so that 16 nodes'
ranks fit on a 2-core box and the benchmark measures the relaunch, not 16 torch imports.

Configured by environment variables (dtrain passes them with -e):

  CK_DIR          a directory every node can write (the shared filesystem): the checkpoint
                  (``ckpt.json``, written by rank 0 through a temp file and a rename)
  CK_LITE         1 = torch-free ranks (the rank from $RANK), as above (default 0)
  CK_STEPS        steps in all (default 40)
  CK_EVERY        checkpoint every N steps (default 5)
  CK_STEP_SLEEP   seconds per step (default 0.1)
  CK_MIN_WORLD    refuse to start below this world size (default 1; not with CK_LITE)
  CK_CRASH_RANK   this global rank crashes once, at CK_CRASH_STEP (default: none) ...
  CK_CRASH_STEP   ... (default 7): exit 3 with a RuntimeError traceback, unless the flag
                  file ``CK_DIR/crashed`` exists; it creates it first (so: once)
  CK_BAD_ARG      1 = refuse the arguments like argparse does (exit 2, before any step)

Prints ``world size W attempt A restart_count R`` once (not with CK_LITE), then ``resumed at
step N`` (or ``starting at step 0``), ``step N`` per step (flushed), ``checkpoint step N``
after each checkpoint, ``done`` at the end. Ends with os._exit: torch 2.13 + gloo may abort
at interpreter exit after destroy_process_group.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback


def load(path: str) -> int:
    try:
        with open(path) as fh:
            return int(json.load(fh)["step"])
    except (OSError, ValueError, KeyError):
        return 0


def save(path: str, state: dict[str, int]) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        json.dump(state, fh)
    os.replace(tmp, path)


class Solo:
    """CK_LITE: no torch, no collective; the rank is $RANK."""

    def __init__(self) -> None:
        self.rank = int(os.environ.get("RANK", "0"))
        self.world = 0  # not known, not needed

    def step(self) -> None:
        pass

    def barrier(self) -> None:
        pass


class Gloo:
    """A gloo process group: an all_reduce of a gradient per step, a barrier per checkpoint."""

    def __init__(self) -> None:
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        dist.init_process_group("gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.w = torch.zeros(4)

    def step(self) -> None:
        grad = self.torch.ones(4) * (self.rank + 1)
        self.dist.all_reduce(grad)
        self.w -= 0.01 * grad

    def barrier(self) -> None:
        self.dist.barrier()


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
    lite = os.environ.get("CK_LITE") == "1"
    group = Solo() if lite else Gloo()
    rank, world = group.rank, group.world
    if not lite:
        print(f"world size {world} attempt {os.environ.get('DTRAIN_ATTEMPT', '?')} "
              f"restart_count {os.environ.get('TORCHELASTIC_RESTART_COUNT', '?')}", flush=True)
        if world < int(os.environ.get("CK_MIN_WORLD", "1")):
            print(f"world size {world} is too small", file=sys.stderr, flush=True)
            return 4
    start = load(path)
    print(f"resumed at step {start}" if start else "starting at step 0", flush=True)
    for step in range(start, steps):
        group.step()
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
        if (step + 1) % every == 0:
            group.barrier()
            if rank == 0:
                save(path, {"step": step + 1, **({"world": world} if world else {})})
                print(f"checkpoint step {step + 1}", flush=True)
        time.sleep(pause)
    group.barrier()
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
