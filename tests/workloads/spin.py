"""Torch-free workload for teardown benchmarks: prints a line, then idles until killed.

``spin.py [seconds] [fail_code]``: after ``seconds`` (default: never) exits with fail_code
(default 7), printing ``FAIL <unix time>`` first so a benchmark can time the failure.
Honours SIGTERM (the default action). Ends with os._exit so it never lingers.
"""

import os
import sys
import time


def main() -> None:
    after = float(sys.argv[1]) if len(sys.argv) > 1 else None
    code = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    print(f"spin pid {os.getpid()} up", flush=True)
    start = time.monotonic()
    while after is None or time.monotonic() - start < after:
        time.sleep(0.05)
    print(f"FAIL {time.time():.6f}", flush=True)
    os._exit(code)


if __name__ == "__main__":
    main()
