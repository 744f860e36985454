"""The README's `train.py`: a small DDP training loop, runnable anywhere dtrain runs.

    dtrain run -H localhost --nproc-per-node 2 examples/train.py --lr 3e-4
    dtrain run -f hosts.txt --dry-run examples/train.py --lr 3e-4

A two-layer network learns y = sum(x) / 4 (16 inputs: unit variance) on random batches
(each rank its own data), with DistributedDataParallel over gloo on CPU, or nccl with one
GPU per rank when there are GPUs. 100 steps take the loss from about 0.9 to about 0.1 at
--lr 3e-4, and under 0.01 at the default 1e-2: a few seconds on CPU. Every rank prints
``step N loss X`` (what `--progress`, the hang watch and `dtrain report`'s loss curves
read); rank 0 prints the final loss. Standard library and torch only; a copy to start
your own script from.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lr", type=float, default=1e-2, help="learning rate (default 1e-2)")
    p.add_argument("--steps", type=int, default=100, help="training steps (default 100)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--step-sleep", type=float, default=0.0,
                   help="seconds to sleep per step, to watch it (default 0)")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if backend == "nccl":
        device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}")
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if rank == 0:
        print(f"training: world size {world}, backend {backend}, lr {args.lr:g}, "
              f"{args.steps} steps", flush=True)

    torch.manual_seed(0)  # the same initial weights on every rank (DDP checks that)
    # 256 hidden units: wide enough that even --lr 3e-4 visibly learns in 100 steps
    model = torch.nn.Sequential(torch.nn.Linear(16, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 1)).to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=args.lr)
    data = torch.Generator().manual_seed(1000 + rank)  # each rank its own batches
    loss = torch.zeros(())
    for step in range(args.steps):
        x = torch.randn(args.batch_size, 16, generator=data).to(device)
        y = x.sum(dim=1, keepdim=True) / 4  # unit variance: a loss of 1 is "knows nothing"
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()  # DDP averages the gradients over every rank here
        opt.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)
        if args.step_sleep:
            time.sleep(args.step_sleep)
    if rank == 0:
        print(f"done: {args.steps} steps, final loss {loss.item():.4f}", flush=True)
    if device.type == "cuda":  # name the GPU: torch warns that it guesses it otherwise
        dist.barrier(device_ids=[device.index])
    else:
        dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    # torch 2.13 + gloo can abort at interpreter exit after destroy_process_group
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
