"""A module that leaves a thread running when imported: tests/test_warm_cluster.py preloads
it, and the warm process must refuse to fork (its ranks start cold)."""

import threading
import time

threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
