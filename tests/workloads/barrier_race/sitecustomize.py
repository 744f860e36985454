"""Test-only (tests/test_fold_cluster... see docs/testing.md): makes torchrun's exit-barrier
race happen every time. With DTRAIN_BARRIER_RACE=1 and this directory on PYTHONPATH, the
torchrun agent of every node but node 0 (the rendezvous store's host) arrives at its exit
barrier 1 s late and reads the store 3 s after checking in: by then node 0's agent passed the
barrier and exited, its store with it, and the others print c10d's "Connection was likely
closed" warning and the "Error waiting on exit barrier" traceback (then exit 0)."""

import os


def _patch() -> None:
    import time

    import torch.distributed.elastic.utils.store as store_util

    first = store_util._barrier_nonblocking

    def late(store, world_size, key_prefix):  # type: ignore[no-untyped-def]
        time.sleep(1.0)
        key = first(store, world_size, key_prefix)
        time.sleep(3.0)
        return key

    store_util._barrier_nonblocking = late


try:
    with open("/proc/self/cmdline", "rb") as f:
        _agent = b"torch.distributed.run" in f.read()
except OSError:
    _agent = False
if _agent and os.environ.get("DTRAIN_BARRIER_RACE") == "1" \
        and os.environ.get("DTRAIN_NODE_RANK", "0") != "0":
    _patch()
