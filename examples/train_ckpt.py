"""examples/train.py with checkpoints: the script `dtrain run --restarts` resumes.

    dtrain run -H localhost --nproc-per-node 2 --restarts 2 examples/train_ckpt.py \\
        --fail-once-at 12          # a crash on the first attempt, then resumed at step 10
    dtrain run -f hosts.txt --nnodes 3 --restarts 3 examples/train_ckpt.py \\
        --ckpt-dir /shared/ckpt --resume auto

The contract with dtrain (docs/restarts.md): dtrain relaunches the whole gang; the script
resumes itself from its latest checkpoint, and starts from scratch when there is none.
Here rank 0 saves the model, the optimizer and the step every ``--save-every`` steps to
``--ckpt-dir``/ckpt.pt (a temp file, then a rename: a crash mid-save leaves the last good
one). At start every rank loads it: the directory must be one every node sees (a shared
filesystem) when the run spans nodes; a rank that finds no checkpoint where rank 0 found
one stops with a message saying so. ``DTRAIN_ATTEMPT`` (1, 2, ...) is printed with it.

``--fail-once-at STEP`` is a demonstration knob: on the first attempt, rank 0 raises a
RuntimeError at that step, which `--restarts` classifies as a process fault and retries on
the same nodes, from the checkpoint. Without `--restarts` the run fails with its
traceback, as any crash would.
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
    p.add_argument("--steps", type=int, default=40, help="training steps in all (default 40)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--save-every", type=int, default=5, metavar="N",
                   help="checkpoint every N steps (default 5)")
    p.add_argument("--ckpt-dir", default="checkpoints",
                   help="where ckpt.pt lives; shared by every node (default ./checkpoints)")
    p.add_argument("--resume", choices=("auto", "never"), default="auto",
                   help="auto: from the latest checkpoint if there is one (default)")
    p.add_argument("--fail-once-at", type=int, default=None, metavar="STEP",
                   help="demo: rank 0 crashes at STEP on the first attempt")
    p.add_argument("--step-sleep", type=float, default=0.0,
                   help="seconds to sleep per step, to watch it (default 0)")
    return p.parse_args(argv)


def save(path: str, state: dict[str, object]) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)  # atomic: a crash mid-save leaves the previous checkpoint


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    # --ckpt-dir '~/ckpt' (quoted on the login node): this node's home
    args.ckpt_dir = os.path.expanduser(args.ckpt_dir)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if backend == "nccl":
        device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}")
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    attempt = int(os.environ.get("DTRAIN_ATTEMPT", "1") or "1")
    path = os.path.join(os.path.abspath(args.ckpt_dir), "ckpt.pt")
    if rank == 0:
        os.makedirs(args.ckpt_dir, exist_ok=True)
        print(f"training: world size {world}, backend {backend}, lr {args.lr:g}, "
              f"{args.steps} steps, attempt {attempt}", flush=True)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 1)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    start = 0
    found = args.resume == "auto" and os.path.exists(path)
    # rank 0's view decides: every rank must resume from the same step
    flag = torch.tensor([1 if found else 0], device=device)
    dist.broadcast(flag, 0)
    if flag.item() and not found:
        print(f"rank {rank}: rank 0 resumes from {path}, which this node does not see: "
              "--ckpt-dir must be a directory every node shares", file=sys.stderr, flush=True)
        os._exit(1)
    if flag.item():
        state = torch.load(path, map_location=device)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = int(state["step"])
        if rank == 0:
            print(f"attempt {attempt}: resumed at step {start} from {path}", flush=True)
    elif rank == 0:
        print(f"attempt {attempt}: starting at step 0 (no checkpoint in {args.ckpt_dir})",
              flush=True)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    data = torch.Generator().manual_seed(1000 * (start + 1) + rank)
    loss = torch.zeros(())
    for step in range(start, args.steps):
        if args.fail_once_at == step and attempt == 1 and rank == 0:
            raise RuntimeError(f"injected crash at step {step} (--fail-once-at)")
        x = torch.randn(args.batch_size, 16, generator=data).to(device)
        y = x.sum(dim=1, keepdim=True)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item():.4f}", flush=True)
        done = step + 1
        if rank == 0 and (done % args.save_every == 0 or done == args.steps):
            save(path, {"model": model.state_dict(), "opt": opt.state_dict(), "step": done})
            print(f"checkpoint step {done}", flush=True)
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
    os._exit(0)  # torch 2.13 + gloo can abort at interpreter exit


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
