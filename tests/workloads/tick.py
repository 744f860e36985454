"""Torch-free workload for the detach tests: prints ``tick <rank> <n>`` every TICK_S seconds
(default 0.5) until stopped, or TICK_N ticks (then exits 0). Honours SIGTERM (the default
action)."""

import os
import sys
import time


def main() -> None:
    rank = os.environ.get("RANK", "?")
    every = float(os.environ.get("TICK_S", "0.5"))
    last = int(os.environ.get("TICK_N", "0")) or None
    n = 0
    while last is None or n < last:
        sys.stdout.write(f"tick {rank} {n}\n")
        sys.stdout.flush()
        n += 1
        time.sleep(every)


if __name__ == "__main__":
    main()
