"""Test workload: no process group; each rank prints numbered lines in bursts, a progress
bar with \\r, and (rank 4) one 5 MB line. Checks the tagging and archive end to end."""

from __future__ import annotations

import os
import sys
import time

rank = int(os.environ["RANK"])
n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
out = sys.stdout
for burst in range(0, n, 2500):
    out.write("".join(f"rank{rank} line{i} {'x' * (i % 50)}\n"
                      for i in range(burst, min(n, burst + 2500))))
    out.flush()
    time.sleep(0.01)
for pct in range(0, 101, 5):
    out.write(f"\rprogress {pct:3d}%")
    out.flush()
out.write("\n")
sys.stderr.write(f"rank{rank} to stderr\n")
if rank == 4:
    out.write("B" * (5 * 1024 * 1024) + "\n")
out.flush()
