"""Teardown-test workload: leaves a daemon behind that nothing but its ancestry can find.

``daemon.py GO_FILE`` (torch-free; run by torchrun or directly): double-forks, the middle
child ``setsid``s, and the grandchild execs a Python that ignores SIGTERM, with an EMPTY
environment (no DTRAIN_RUN_ID, no marker on its command line), stdin/stdout/stderr on
/dev/null. Its parent is gone, so it is reparented to the nearest subreaper: the dtrain
supervisor. Prints ``daemon pid N up`` (N its pid), waits until GO_FILE exists (at most
120 s), then exits 0: whatever kills the daemon after that is the supervisor's teardown.
"""

import os
import sys
import time

DAEMON = ("import signal, time\n"
          "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
          "while True:\n    time.sleep(1)\n")


def spawn_daemon() -> int:
    read_end, write_end = os.pipe()
    if os.fork() == 0:  # middle child: new session, fork again, report, vanish
        os.close(read_end)
        os.setsid()
        pid = os.fork()
        if pid == 0:
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.closerange(3, 256)
            os.execve(sys.executable, [sys.executable, "-S", "-c", DAEMON], {})
        os.write(write_end, b"%d\n" % pid)
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        pid = int(f.read().strip())
    os.wait()  # the middle child: the daemon's parent is gone from here on
    return pid


def main() -> None:
    go = sys.argv[1]
    pid = spawn_daemon()
    print(f"daemon pid {pid} up", flush=True)
    deadline = time.monotonic() + 120
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.05)
    print("going", flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
