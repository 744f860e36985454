"""Torch-free OOM workload (tests/test_hangs.py): rank 0 prints "oom-ready pid N", waits
until the test has moved it into a memory-limited cgroup, gives the supervisor a heartbeat
to see the move, then allocates until the kernel's OOM killer ends it."""

import os
import sys
import time


def main() -> None:
    before = open("/proc/self/cgroup").read()
    sys.stdout.write(f"oom-ready pid {os.getpid()}\n")
    sys.stdout.flush()
    deadline = time.monotonic() + 60
    while open("/proc/self/cgroup").read() == before and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(3.0)  # the supervisor samples every rank at its heartbeat (2 s)
    hog = []
    while True:
        hog.append(bytearray(16 * 1024 * 1024))


if __name__ == "__main__":
    main()
