"""Step-time workload (bench/bench_hangs.py): a gloo all_reduce loop that reports its own
median step time, to compare the armed dumper and the flight recorder on and off.

  WL_STEPS  timed steps (default 2000, after 100 untimed)
"""

import os
import statistics
import sys
import time

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    t = torch.ones(1024)
    times = []
    for step in range(100 + int(os.environ.get("WL_STEPS", "2000"))):
        start = time.perf_counter()
        dist.all_reduce(t)
        if step >= 100:
            times.append(time.perf_counter() - start)
    if dist.get_rank() == 0:
        print(f"steptime median_us {statistics.median(times) * 1e6:.1f} "
              f"mean_us {statistics.fmean(times) * 1e6:.1f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
