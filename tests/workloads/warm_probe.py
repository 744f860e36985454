"""tests/test_warm_cluster.py's rank: what this process is, as one JSON line (before it
imports anything), then an exit chosen by its argv: ``--kill RANK`` SIGKILLs that rank."""

import sys

WARM = "torch" in sys.modules  # before any import of ours: the interpreter it came from

import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402


def _environ() -> dict[str, str]:
    with open("/proc/self/environ", "rb") as f:
        items = f.read().split(b"\0")
    return dict(i.decode(errors="replace").partition("=")[::2] for i in items if b"=" in i)


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return ""


shown = _environ()
import torch  # noqa: E402  (after the check above: a cold rank imports it only now)

print("PROBE " + json.dumps({
    "warm": WARM, "pid": os.getpid(), "ppid": os.getppid(), "parent": _cmdline(os.getppid()),
    "sid": os.getsid(0), "argv": sys.argv, "cwd": os.getcwd(),
    "env": {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES",
                                           "DTRAIN_WARM_PAD", "DTRAIN_WARM_FD")},
    "proc_env": {k: shown.get(k) for k in ("RANK", "LOCAL_RANK", "DTRAIN_RUN_ID")},
    "stdin": os.path.realpath("/proc/self/fd/0"),
    # torchrun gives each of several workers OMP_NUM_THREADS=1: torch's threads follow
    "threads": torch.get_num_threads(), "omp": os.environ.get("OMP_NUM_THREADS")}), flush=True)
if "--kill" in sys.argv and os.environ.get("RANK") == sys.argv[sys.argv.index("--kill") + 1]:
    os.kill(os.getpid(), signal.SIGKILL)
