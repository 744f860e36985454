"""bench/soak.py's workload: numbered lines, each also recorded on the node (the ground truth).

Every SOAK_EVERY seconds (0.05) rank R prints ``soak R N`` and then appends ``N T`` to
``$SOAK_DIR/r<R>`` (T: the wall time it was printed), SOAK_LINES lines (0: until stopped).
SOAK_GLOO=1: a gloo process group, an all_reduce before each line (torchrun's env).
Under `dtrain run --restarts`, attempt A > 1 records to ``r<R>.a<A>`` (DTRAIN_ATTEMPT).
SOAK_RAISE_ON=node5,node6 and SOAK_RAISE_AT=N: the rank on those nodes raises ValueError at
line N, from one line of shard() (the same bug wherever it runs: bench/soak_incidents.py).
"""

import os
import socket
import sys
import time


def shard(n: int) -> None:
    raise ValueError(f"bad shard at line {n}")


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

    raise_at = -1
    if socket.gethostname() in os.environ.get("SOAK_RAISE_ON", "").split(","):
        raise_at = int(os.environ.get("SOAK_RAISE_AT", "20"))
    n = 0
    while last is None or n < last:
        if n == raise_at:
            shard(n)
        if reduce is not None:
            reduce()
        sys.stdout.write(f"soak {rank} {n}\n")
        sys.stdout.flush()
        truth.write(f"{n} {time.time():.3f}\n")
        n += 1
        time.sleep(every)


if __name__ == "__main__":
    main()
