"""Torch-free workload for the detach tests: prints ``tick <rank> <n>`` every TICK_S seconds
(default 0.5) until stopped. Honours SIGTERM (the default action)."""

import os
import sys
import time


def main() -> None:
    rank = os.environ.get("RANK", "?")
    every = float(os.environ.get("TICK_S", "0.5"))
    n = 0
    while True:
        sys.stdout.write(f"tick {rank} {n}\n")
        sys.stdout.flush()
        n += 1
        time.sleep(every)


if __name__ == "__main__":
    main()
