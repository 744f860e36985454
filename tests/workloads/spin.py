"""Torch-free workload for teardown tests and benchmarks: prints a line, then idles.

``spin.py [seconds] [code]``: after ``seconds`` (default: never; ``inf`` too) exits with
``code`` (default 7), printing ``FAIL <unix time>`` first so a benchmark can time the
failure. Under torchrun, ``SPIN_FAIL_RANK=N`` makes only global rank N fail; the others idle.
Honours SIGTERM (the default action). Ends with os._exit.
"""

import os
import sys
import time


def main() -> None:
    after = float(sys.argv[1]) if len(sys.argv) > 1 else float("inf")
    code = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    only = os.environ.get("SPIN_FAIL_RANK")
    if only is not None and os.environ.get("RANK") != only:
        after = float("inf")
    print(f"spin pid {os.getpid()} up", flush=True)
    start = time.monotonic()
    while time.monotonic() - start < after:
        time.sleep(0.05)
    print(f"FAIL {time.time():.6f}", flush=True)
    os._exit(code)


if __name__ == "__main__":
    main()
