"""Torch-free hang workload (bench/bench_hangs.py at 16 x 2 and 64 x 1 ranks).

Every rank prints "step 0 loss 1.0" (rank 0 only), then rank WL_HANG_RANK (default: the
last) sleeps in ``load_batch`` while every other rank waits in ``all_reduce`` (an Event that
is never set): the shape of a real hang, without importing torch in 64 ranks on 2 cores.
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
    if rank == 0:
        sys.stdout.write("step 0 loss 1.0\n")
        sys.stdout.flush()
    if rank == int(os.environ.get("WL_HANG_RANK", str(world - 1))):
        load_batch()
    all_reduce()


if __name__ == "__main__":
    main()
