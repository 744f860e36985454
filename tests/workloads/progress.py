"""Torch-free progress workload (the hang watch's tests), run under torchrun.

  WL_TICKS     progress lines to print ("it N"), one every WL_EVERY s (default 0.6), then
  WL_CHATTER   lines of chatter ("waiting for data ...") every 0.3 s, no progress (default 0)
  WL_HOLD      then sleep this long, silent (default 0)

Every line is printed by rank 0 only; the other ranks print nothing at all.
"""

import os
import sys
import time


def main() -> None:
    rank = os.environ.get("RANK", "0")
    every = float(os.environ.get("WL_EVERY", "0.6"))
    for n in range(int(os.environ.get("WL_TICKS", "10"))):
        if rank == "0":
            sys.stdout.write(f"it {n}\n")
            sys.stdout.flush()
        time.sleep(every)
    for n in range(int(os.environ.get("WL_CHATTER", "0"))):
        if rank == "0":
            sys.stdout.write(f"waiting for data ({n})\n")
            sys.stdout.flush()
        time.sleep(0.3)
    time.sleep(float(os.environ.get("WL_HOLD", "0")))


if __name__ == "__main__":
    main()
