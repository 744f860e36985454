"""Test workload (issue 12): every rank prints the same warning on stderr; rank 1 then fails
with a traceback while the others wait to be stopped (no process group, no torch import)."""

from __future__ import annotations

import os
import sys
import time

rank = int(os.environ["RANK"])
sys.stderr.write("train.py:1: UserWarning: the same warning on every rank\n")
sys.stderr.flush()
print(f"rank {rank} ready", flush=True)
time.sleep(1.5)
if rank == 1:
    raise RuntimeError("boom on purpose")
time.sleep(120)
