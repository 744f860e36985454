"""The GPU check's workload (bench/gpu/check.sh): NCCL on every rank's GPU, numbered steps of
real matrix work, then optionally a rank stuck in a GPU kernel (GPU_STUCK_AT=N: at step N,
rank 0 launches a kernel that spins for minutes and waits for it), the hang dtrain must see,
dump and tear down.

Environment: GPU_STEPS (default 20), GPU_STEP_S (seconds a step at least takes, 0.25),
GPU_MATMULS (4096x4096 bf16 products a step, default 1: `top` shows the GPU idle; 400 keep
an H200 busy), GPU_STUCK_AT (unset: no hang), GPU_SAME_DEVICE (set: every rank on GPU 0).
"""

from __future__ import annotations

import os
import socket
import time

import torch
import torch.distributed as dist


def main() -> int:
    gpu = torch.cuda.is_available()  # without a GPU (a rehearsal of the check): gloo on CPU
    dist.init_process_group("nccl" if gpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    # GPU_SAME_DEVICE=1: every rank on GPU 0, as a script that never calls set_device does
    local = 0 if os.environ.get("GPU_SAME_DEVICE") else int(os.environ["LOCAL_RANK"])
    if gpu:
        torch.cuda.set_device(local)
    dev = torch.device("cuda", local) if gpu else torch.device("cpu")
    name = torch.cuda.get_device_name(dev) if gpu else "(no GPU: CPU)"
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if gpu else "-"
    print(f"rank {rank}/{world} on {socket.gethostname()} GPU {local} {name} NCCL {nccl}",
          flush=True)
    n = 4096 if gpu else 256
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16 if gpu else torch.float32)
    stuck = os.environ.get("GPU_STUCK_AT")
    for step in range(int(os.environ.get("GPU_STEPS", "20"))):
        t0 = time.time()
        if stuck is not None and step == int(stuck) and rank == 0:
            print(f"step {step}: launching a kernel that never ends", flush=True)
            if gpu:
                torch.cuda._sleep(1 << 62)  # spins on the GPU; the synchronize below waits on it
            else:
                time.sleep(1e6)
        for _ in range(int(os.environ.get("GPU_MATMULS", "1"))):
            b = a @ a
        s = b.float().sum()
        dist.all_reduce(s)
        if gpu:
            torch.cuda.synchronize()
        time.sleep(max(0.0, float(os.environ.get("GPU_STEP_S", "0.25")) - (time.time() - t0)))
        mem = torch.cuda.memory_allocated(dev) >> 20 if gpu else 0
        print(f"step {step} sum {s.item():.4g} mem {mem} MiB", flush=True)
    if gpu:  # name the GPU: torch warns that it guesses it otherwise
        dist.barrier(device_ids=[local])
    else:
        dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
