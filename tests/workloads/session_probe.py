"""A rank of tests/test_session_cluster.py: who forked it, in which attempt; rank 1 fails the
first attempt (after a progress line, so that dtrain relaunches), every rank passes the next."""
import json
import os
import sys
import time

WARM = "torch" in sys.modules  # before anything of ours is imported
attempt = os.environ.get("DTRAIN_ATTEMPT", "1")
print("SESSION " + json.dumps({"attempt": int(attempt), "rank": int(os.environ["RANK"]),
                               "warm": WARM, "parent": os.getppid()}), flush=True)
print("step 1", flush=True)
time.sleep(1.0)
if attempt == "1" and os.environ["RANK"] == "1":
    sys.exit(3)
time.sleep(1.0)
print("step 2", flush=True)
