"""Torch-free workload for the graceful-stop tests: counts its stop signals, checkpoints on
SIGTERM, then exits on its own, as training scripts do.

Run under torchrun (``RANK`` names the files). ``CKPT_DIR`` (a directory every node can
write) receives:

  r<RANK>.signals   one line per stop signal the process received (``SIGTERM 1712.3``),
                    written by the handler itself, so a second or third TERM shows
  r<RANK>.ckpt      written when the checkpoint is complete (``CKPT_SECONDS`` after the
                    first SIGTERM, default 2): its presence proves the grace was honoured

Prints ``rank R up`` and then ``tick N`` every 0.2 s; on the first SIGTERM prints
``rank R saving checkpoint...``, keeps ticking while it "saves", prints ``rank R checkpoint
saved`` and exits 143 (``sys.exit(128 + SIGTERM)``, not a death by signal: the shim
reports it as an exit code). Ends with os._exit, as the other workloads do.
"""

from __future__ import annotations

import os
import signal
import sys
import time

RANK = os.environ.get("RANK", "x")
DIR = os.environ["CKPT_DIR"]
SAVE = float(os.environ.get("CKPT_SECONDS", "2"))
got = []  # the signals received, in order


def record(signum, frame):  # type: ignore[no-untyped-def]
    got.append(signum)
    fd = os.open(os.path.join(DIR, f"r{RANK}.signals"), os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                 0o666)
    try:
        os.write(fd, f"{signal.Signals(signum).name} {time.time():.3f}\n".encode())
    finally:
        os.close(fd)


def main() -> None:
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, record)
    print(f"rank {RANK} up pid {os.getpid()}", flush=True)
    tick = 0
    saving_since = None
    while True:
        time.sleep(0.2)
        tick += 1
        print(f"tick {tick}", flush=True)
        if got and saving_since is None:
            saving_since = time.monotonic()
            print(f"rank {RANK} saving checkpoint...", flush=True)
        if saving_since is not None and time.monotonic() - saving_since >= SAVE:
            with open(os.path.join(DIR, f"r{RANK}.ckpt"), "w") as f:
                f.write(f"step {tick}\n")
            print(f"rank {RANK} checkpoint saved", flush=True)
            sys.stdout.flush()
            os._exit(128 + signal.SIGTERM)


if __name__ == "__main__":
    main()
