"""tests/test_warm_cluster.py's rank that ends as its argv says (an atexit handler always
prints): ``thread`` (a non-daemon thread still running at the script's end), ``exit3``,
``exitmsg`` (sys.exit with a message), ``raise``, ``kbd`` (an uncaught KeyboardInterrupt),
``segv``; anything else ends normally."""

import atexit
import sys
import threading
import time

mode = sys.argv[1]
atexit.register(lambda: print("atexit ran", flush=True))
if mode == "thread":
    threading.Thread(target=lambda: (time.sleep(1), print("thread done", flush=True))).start()
if mode == "exit3":
    sys.exit(3)
if mode == "exitmsg":
    sys.exit("bye")
if mode == "raise":
    raise ValueError("boom")
if mode == "kbd":
    raise KeyboardInterrupt
if mode == "segv":
    import ctypes

    ctypes.string_at(0)
print("end", flush=True)
