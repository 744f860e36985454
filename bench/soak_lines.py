"""bench/soak.py's workload: numbered lines, each also recorded on the node (the ground truth).

Every SOAK_EVERY seconds (0.05) rank R prints ``soak R N`` and then appends ``N T`` to
``$SOAK_DIR/r<R>`` (T: the wall time it was printed), SOAK_LINES lines (0: until stopped).
SOAK_GLOO=1: a gloo process group, an all_reduce before each line (torchrun's env).
Under `dtrain run --restarts`, attempt A > 1 records to ``r<R>.a<A>`` (DTRAIN_ATTEMPT).
"""

import os
import sys
import time


def main() -> None:
    rank = int(os.environ.get("RANK", "0"))
    every = float(os.environ.get("SOAK_EVERY", "0.05"))
    last = int(os.environ.get("SOAK_LINES", "0")) or None
    attempt = os.environ.get("DTRAIN_ATTEMPT", "1")
    name = f"r{rank}" if attempt in ("", "1") else f"r{rank}.a{attempt}"
    truth = open(os.path.join(os.environ["SOAK_DIR"], name), "a", buffering=1)
    reduce = None
    if os.environ.get("SOAK_GLOO") == "1":
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        one = torch.ones(1)

        def reduce() -> None:
            dist.all_reduce(one)

    n = 0
    while last is None or n < last:
        if reduce is not None:
            reduce()
        sys.stdout.write(f"soak {rank} {n}\n")
        sys.stdout.flush()
        truth.write(f"{n} {time.time():.3f}\n")
        n += 1
        time.sleep(every)


if __name__ == "__main__":
    main()
