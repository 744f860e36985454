"""Torch-free hang workload (bench/bench_hangs.py at 16 x 2 and 64 x 1 ranks).

Rank 0 prints "step 0 loss 1.0", then rank WL_HANG_RANK (default: the last) sleeps in
``load_batch`` while every other rank waits in ``all_reduce`` (an Event that is never set):
the shape of a real hang, without importing torch in 64 ranks on 2 cores. With
WL_BARRIER_DIR (a directory every node can write), rank 0 prints its step only once every
rank has created its file there: on a loaded box 64 ranks start tens of seconds apart.
"""

import os
import sys
import threading
import time


def load_batch() -> None:
    time.sleep(3600)


def all_reduce() -> None:
    threading.Event().wait()


def main() -> None:
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    barrier = os.environ.get("WL_BARRIER_DIR")
    if barrier:
        open(os.path.join(barrier, str(rank)), "w").close()
        while rank == 0 and len(os.listdir(barrier)) < world:
            time.sleep(0.2)
    if rank == 0:
        sys.stdout.write("step 0 loss 1.0\n")
        sys.stdout.flush()
    if rank == int(os.environ.get("WL_HANG_RANK", str(world - 1))):
        load_batch()
    all_reduce()


if __name__ == "__main__":
    main()
