"""A tiny DDP job: a few training steps over gloo, then an all-reduce whose result is checked.

Every rank prints its host, the interface gloo uses, and the loss; rank 0 prints the
verdict. Exits non-zero if the all-reduce is wrong. Works on CPU (gloo) or GPU (nccl).
"""

from __future__ import annotations

import os
import socket
import sys

import torch
import torch.distributed as dist


def main() -> int:
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ['LOCAL_RANK'])}" if backend == "nccl" else "cpu")
    iface = os.environ.get("GLOO_SOCKET_IFNAME", "-")
    print(f"rank {rank}/{world} on {socket.gethostname()} backend={backend} "
          f"GLOO_SOCKET_IFNAME={iface}", flush=True)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model.to(device))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(rank)
    for step in range(int(os.environ.get("DDP_SMOKE_STEPS", "5"))):
        x = torch.randn(32, 16, generator=gen).to(device)
        y = x.sum(dim=1, keepdim=True)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)

    t = torch.tensor([float(rank + 1)], device=device)
    dist.all_reduce(t)
    expected = world * (world + 1) / 2
    ok = abs(t.item() - expected) < 1e-6
    if rank == 0:
        print(f"all-reduce {t.item():g} (expected {expected:g}): {'OK' if ok else 'WRONG'}",
              flush=True)
    if device.type == "cuda":  # name the GPU: torch warns that it guesses it otherwise
        dist.barrier(device_ids=[device.index])
    else:
        dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    # torch 2.13 + gloo can abort at interpreter exit after destroy_process_group
    os._exit(0 if ok else 1)


if __name__ == "__main__":
    sys.exit(main())
