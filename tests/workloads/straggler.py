"""A synchronous gloo job where one node computes ten times longer per step (issue 29).

argv: STOP_FILE SLOW_HOST [WORK_S]. Every rank burns WORK_S seconds of CPU per step (x10 on
SLOW_HOST, by hostname), then all-reduces a stop flag, so every rank steps at the slow
node's pace and waits for it in the collective. Rank 0 prints `step N` every 10 steps; the
job stops when rank 0 sees STOP_FILE (the flag reaches every rank in the same step).

For a report with attempts (tests/test_report_cluster.py): WL_CRASH_RANK crashes (a
RuntimeError, exit 1) at step WL_CRASH_STEP (default 20) of the first attempt only
(DTRAIN_ATTEMPT), so `run --restarts 1` starts a second one; rank 0's `step N` lines carry a
`loss=` for the curves.
"""

from __future__ import annotations

import os
import socket
import sys
import time

import torch
import torch.distributed as dist


def main() -> None:
    stop_file, slow_host = sys.argv[1], sys.argv[2]
    work = float(sys.argv[3]) if len(sys.argv) > 3 else 0.01
    if socket.gethostname() == slow_host:
        work *= 10
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    crash_rank = int(os.environ.get("WL_CRASH_RANK", "-1"))
    crash_step = int(os.environ.get("WL_CRASH_STEP", "20"))
    first_attempt = os.environ.get("DTRAIN_ATTEMPT", "1") == "1"
    step = 0
    while True:
        t0 = time.process_time()
        while time.process_time() - t0 < work:  # compute: CPU time, whatever the load
            pass
        flag = torch.tensor([1.0 if rank == 0 and os.path.exists(stop_file) else 0.0])
        dist.all_reduce(flag)
        step += 1
        if rank == crash_rank and step == crash_step and first_attempt:
            raise RuntimeError(f"injected crash at step {step}")
        if rank == 0 and step % 10 == 0:
            print(f"step {step} loss={1 / (1 + 0.01 * step):.4f}", flush=True)
        if flag.item() > 0:
            break
    print(f"rank {rank} done after {step} steps", flush=True)
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
