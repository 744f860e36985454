"""Test workload: prints NCCL's INFO lines exactly as NCCL 2.21 does (no GPU here), into the
NCCL_DEBUG_FILE it is given (%h: host, %p: pid), as NCCL would with NCCL_DEBUG=INFO.

``nccl_info.py [--socket HOST,...] [--sleep S]``: the ranks on the named hosts fall back to
NET/Socket ("NET/IB : No device found."), the others use RoCE with GPUDirect. Then it
sleeps S seconds (a run that is refused must not wait for that).
"""

from __future__ import annotations

import os
import socket
import sys
import time

args = sys.argv[1:]
socket_hosts = set(args[args.index("--socket") + 1].split(",")) if "--socket" in args else set()
sleep = float(args[args.index("--sleep") + 1]) if "--sleep" in args else 1.0
host = socket.gethostname()
pid = os.getpid()
rank = int(os.environ.get("RANK", "0"))
world = int(os.environ.get("WORLD_SIZE", "1"))
local = int(os.environ.get("LOCAL_RANK", "0"))
prefix = f"{host}:{pid}:{pid + 1} [{local}] NCCL INFO "
lines = []
if rank == 0:
    lines.append("NCCL version 2.21.5+cuda12.4")
lines.append(prefix + "Bootstrap : Using eth0:10.1.1.1<0>")
if host in socket_hosts:
    lines += [prefix + "NET/IB : No device found.",
              prefix + "NET/Socket : Using [0]eth0:10.1.1.1<0>",
              prefix + "Using network Socket"]
    via = "NET/Socket/0"
else:
    lines += [prefix + "NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/RoCE [RO]; "
                       "OOB eth0:10.1.1.1<0>",
              prefix + "Using network IB",
              prefix + "NET/IB : GPU Direct RDMA Enabled for HCA 0 'mlx5_0'"]
    via = "NET/IB/0/GDRDMA"
peer = (rank + 1) % world
lines += [prefix + f"Channel 00/0 : {rank}[{local}] -> {peer}[0] [send] via {via}",
          prefix + f"ncclCommInitRank comm 0x55d2c8 rank {rank} nranks {world} cudaDev "
                   f"{local} nvmlDev {local} busId 18000 commId 0x3f1e - Init COMPLETE"]
path = os.environ.get("NCCL_DEBUG_FILE")
if os.environ.get("NCCL_DEBUG") == "INFO":
    text = "".join(line + "\n" for line in lines)
    if path:
        with open(path.replace("%h", host).replace("%p", str(pid)), "a") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
print(f"rank {rank} NCCL_DEBUG={os.environ.get('NCCL_DEBUG')} started", flush=True)
time.sleep(sleep)
print(f"rank {rank} done", flush=True)
