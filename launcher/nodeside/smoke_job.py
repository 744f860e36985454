"""dtrain smoke's job: THIS PROGRAM RUNS ON THE NODES, as each torchrun worker.

Unlike the supervisor and the probe it imports torch (it is a torch job), but like them it is
never installed on a node: `dtrain smoke` ships its source inside the supervisor's spec, the
supervisor writes it to its private temp directory, and torchrun starts it through the rank
shim. Python >= 3.8, no annotations, nothing from dtrain.

One argument: a JSON object (backend, sizes, iterations). Results go to stdout as lines
``DTRAIN-SMOKE <json>`` which the launcher takes out of the console:

- ``rank``: every rank, before anything collective: host, device, torch/NCCL versions;
- ``check``: every rank: the exact all-reduce sum check (mismatching elements);
- ``sweep``: rank 0: all-reduce time, algbw and busbw per size (nccl-tests' definitions);
- ``pairs``: every rank: the pairs of nodes it measured (as its node's local rank 0), the
  send/recv bandwidth;
- ``pair_failed``: a leader whose exchange with its pair did not finish within
  ``pair_timeout`` seconds (a failed link): it says so and ends the job at once
  (exit ``PAIR_FAILED_EXIT``), instead of leaving it to --timeout.

The launcher takes a pair's time (or failure) only from a rank on one of its two nodes, the
sweep only from rank 0, each rank's facts and check only from that rank.
"""

import json
import os
import socket
import sys
import time

MARK = "DTRAIN-SMOKE "
PAIR_FAILED_EXIT = 3  # decide/fabric/smoke.py's


def emit(kind, **fields):
    fields["kind"] = kind
    sys.stdout.write(MARK + json.dumps(fields, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def rank_facts(torch, rank, local_rank):
    cuda = bool(torch.cuda.is_available())
    count = torch.cuda.device_count() if cuda else 0
    name = torch.cuda.get_device_name(local_rank % count) if count else "cpu"
    nccl = None
    if cuda:
        try:
            v = torch.cuda.nccl.version()
            nccl = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
        except Exception:  # noqa: BLE001 - a torch without NCCL reports none
            nccl = None
    return {
        "rank": rank, "local_rank": local_rank,
        "node_rank": int(os.environ.get("DTRAIN_NODE_RANK", os.environ.get("GROUP_RANK", "0"))),
        "hostname": socket.gethostname(), "pid": os.getpid(),
        "python": "%d.%d.%d" % sys.version_info[:3],
        "torch": str(torch.__version__), "cuda": cuda, "device_count": count,
        "device": name, "nccl": nccl,
    }


def sizes(min_size, max_size):
    out, size = [], min_size
    while size <= max_size:
        out.append(size)
        size *= 2
    return out


def sync(torch, device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check_sum(torch, dist, device, rank, world, count):
    """all-reduce of small integers in float32: the exact sum is known on every rank."""
    pattern = torch.arange(count, dtype=torch.float32, device=device) % 7
    x = pattern + (rank + 1)
    dist.all_reduce(x)
    expected = pattern * world + world * (world + 1) / 2
    return int((x != expected).sum().item())


def barrier(dist, device):
    """A barrier on the rank's own GPU under NCCL (otherwise torch warns, once per rank,
    that it guesses the device: torch 2.11 on an H200, docs/gpu-check.md)."""
    if device.type == "cuda":
        dist.barrier(device_ids=[device.index])
    else:
        dist.barrier()


def sweep(torch, dist, device, world, cfg):
    rows = []
    for size in sizes(cfg["min_size"], cfg["max_size"]):
        count = max(1, size // 4)
        x = torch.ones(count, dtype=torch.float32, device=device)
        iters = cfg["iters"] if size <= cfg["big"] else max(2, cfg["iters"] // 2)
        for _ in range(cfg["warmup"]):
            dist.all_reduce(x)
        sync(torch, device)
        barrier(dist, device)
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        sync(torch, device)
        elapsed = (time.perf_counter() - t0) / iters
        t = torch.tensor([elapsed], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank's time, like a barrier
        secs = float(t.item())
        algbw = count * 4 / secs / 1e9
        rows.append({"size": count * 4, "count": count, "iters": iters, "time_us": secs * 1e6,
                     "algbw": algbw, "busbw": algbw * 2 * (world - 1) / world})
    return rows


def schedule(n):
    """Rounds of disjoint node pairs: every pair (circle method) up to 8 nodes, else the ring
    (each node with its neighbour) in two or three rounds."""
    if n < 2:
        return []
    if n <= 8:
        nodes = list(range(n)) + ([-1] if n % 2 else [])  # -1: the bye
        m = len(nodes)
        rounds = []
        for _ in range(m - 1):
            pairs = [(nodes[i], nodes[m - 1 - i]) for i in range(m // 2)]
            rounds.append([(min(a, b), max(a, b)) for a, b in pairs if a >= 0 and b >= 0])
            nodes = [nodes[0]] + [nodes[-1]] + nodes[1:-1]
        return rounds
    ring = [(i, (i + 1) % n) for i in range(n)]
    rounds = [ring[0:n - (n % 2):2], ring[1:n - (n % 2):2]]
    if n % 2:
        rounds.append([ring[-1]])
    return [[(min(a, b), max(a, b)) for a, b in r] for r in rounds]


def log_rounds(n):
    """decide/fabric/smoke.py log_rounds, here too (a node program imports nothing of dtrain):
    tests/test_smoke_pairs.py checks both give the same rounds."""
    if n < 2:
        return []
    met = set()  # type: set[tuple[int, int]]
    degree = [0] * n
    rounds = []  # type: list[list[tuple[int, int]]]

    def add(rnd, i, j):
        pair = (min(i, j), max(i, j))
        rnd.append(pair)
        met.add(pair)
        degree[i] += 1
        degree[j] += 1

    def fill(rnd, used, want):
        for i in want:
            if i in used:
                continue
            for j in range(n):
                if j != i and j not in used and (min(i, j), max(i, j)) not in met:
                    add(rnd, i, j)
                    used.update((i, j))
                    break

    for b in range((n - 1).bit_length()):
        rnd = []  # type: list[tuple[int, int]]
        used = set()  # type: set[int]
        for i in range(n):
            j = i ^ (1 << b)
            if i < j < n:
                add(rnd, i, j)
                used.update((i, j))
        fill(rnd, used, [i for i in range(n) if i not in used])
        rounds.append(sorted(rnd))
    need = min(2, n - 1)
    while any(d < need for d in degree):
        rnd, used = [], set()
        fill(rnd, used, [i for i in range(n) if degree[i] < need])
        if not rnd:
            break
        rounds.append(sorted(rnd))
    return rounds


def pair_test(torch, dist, device, facts, rank, cfg):
    """Each pair of node leaders exchanges ``pair_size`` bytes both ways, several times, in
    ``pair_passes`` passes over the whole schedule; the best time counts (noise only ever
    adds time, and a burst of load on a shared node hits one pass; a slow link stays slow).
    Both leaders report their time: a send completes once the kernel has buffered it, so
    only the side that receives over a slow direction is sure to see it (decide/fabric/smoke.py
    keeps the slower)."""
    leaders = {}
    for f in facts:
        if f["local_rank"] == 0:
            leaders[f["node_rank"]] = f["rank"]
    order = sorted(leaders)
    best = {}  # type: dict[tuple[int, int], float]
    count = max(1, cfg["pair_size"] // 4)
    send = torch.ones(count, dtype=torch.float32, device=device)
    recv = torch.empty(count, dtype=torch.float32, device=device)
    import datetime

    limit = datetime.timedelta(seconds=float(cfg["pair_timeout"]))
    rounds = schedule(len(order))
    if cfg.get("pairs"):  # smoke --pairs: the launcher's O(log n) rounds (decide/fabric/smoke.py)
        rounds = log_rounds(len(order))
    for _ in range(max(1, cfg["pair_passes"])):
        for rnd in rounds:
            for a, b in rnd:
                ra, rb = leaders[order[a]], leaders[order[b]]
                if rank not in (ra, rb):
                    continue
                peer = rb if rank == ra else ra
                key = (order[a], order[b])
                for i in range(cfg["pair_warmup"] + cfg["pair_iters"]):
                    sync(torch, device)
                    t0 = time.perf_counter()
                    reqs = [dist.isend(send, peer), dist.irecv(recv, peer)]
                    try:
                        for r in reqs:
                            r.wait(limit)
                        sync(torch, device)
                    except Exception as exc:  # noqa: BLE001 - gloo's/NCCL's timeout error
                        emit("pair_failed", rank=rank, a=order[a], b=order[b], size=count * 4,
                             timeout=limit.total_seconds(), error=str(exc)[:300])
                        sys.stderr.flush()
                        os._exit(PAIR_FAILED_EXIT)  # the peers wait on us: end, not hang
                    dt = time.perf_counter() - t0
                    if i >= cfg["pair_warmup"]:
                        best[key] = min(best.get(key, float("inf")), dt)
            barrier(dist, device)
    return [{"a": a, "b": b, "size": count * 4, "time_us": t * 1e6, "gbps": count * 4 / t / 1e9}
            for (a, b), t in sorted(best.items())]


def main():
    cfg = json.loads(sys.argv[1])
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    facts = rank_facts(torch, rank, local_rank)
    emit("rank", **facts)
    backend = cfg["backend"]
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend)
    all_facts = [None] * world
    dist.all_gather_object(all_facts, facts)
    bad = {}
    for count in (max(1, cfg["min_size"] // 4), max(1, cfg["max_size"] // 4)):
        bad[str(count * 4)] = check_sum(torch, dist, device, rank, world, count)
    emit("check", rank=rank, mismatches=bad)
    rows = sweep(torch, dist, device, world, cfg)
    pairs = pair_test(torch, dist, device, all_facts, rank, cfg)
    if rank == 0:
        emit("sweep", backend=backend, world=world, rows=rows)
    emit("pairs", rank=rank, rows=pairs)  # each end its own view (decide/fabric/smoke.py)
    barrier(dist, device)
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    # torch + gloo may abort at interpreter exit after destroy_process_group (torch-facts)
    os._exit(0)


if __name__ == "__main__":
    main()
