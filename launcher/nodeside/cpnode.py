"""dtrain cp's node program: runs ON THE NODES (stdlib only, Python >= 3.8).

Shipped over the SSH channel like the probe (nodeside/wire.py); parameters arrive as one
JSON line on stdin, the answer is one JSON line on stdout.

Modes:
  hash  {"mode": "hash", "paths": [...]} -> {"sha256": {path: hexdigest or null}}
        sha256 of each regular file (null when missing or unreadable), so that
        `dtrain cp --checksum` compares content without reading files back.
"""

import hashlib
import json
import sys


def sha256_of(path):
    try:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while True:
                chunk = f.read(1 << 20)
                if not chunk:
                    break
                h.update(chunk)
        return h.hexdigest()
    except OSError:
        return None


def read_params():
    spec = globals().get("DTRAIN_SPEC")
    if spec:
        return json.loads(spec)
    line = sys.stdin.readline()
    return json.loads(line) if line.strip() else {}


def main():
    params = read_params()
    mode = params.get("mode")
    if mode != "hash":
        sys.stdout.write(json.dumps({"error": "unknown mode %r" % (mode,)}) + "\n")
        return 2
    sums = {p: sha256_of(p) for p in params.get("paths", [])}
    sys.stdout.write(json.dumps({"sha256": sums}) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
