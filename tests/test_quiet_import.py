"""`import asyncssh` under dtrain does not probe for liboqs (launcher/_quiet_import.py).

The probe runs ldconfig, gcc and ld on every dtrain start; dtrain never offers the key
exchanges liboqs would add. Other find_library calls pass through, and the real function is
back in place once asyncssh is imported.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.util import REPO

PROGRAM = """
import ctypes.util, json
calls = []
real = ctypes.util.find_library
def recorder(name):
    calls.append(name)
    return real(name)
ctypes.util.find_library = recorder
import launcher
import asyncssh
from asyncssh.crypto import pq
print(json.dumps({"calls": calls, "restored": ctypes.util.find_library is recorder,
                  "kex": "curve25519-sha256" in [a.decode() for a in asyncssh.kex.get_kex_algs()]}))
"""


def test_asyncssh_imports_without_the_liboqs_probe() -> None:
    out = subprocess.run([sys.executable, "-c", PROGRAM], cwd=REPO, capture_output=True,
                         text=True, check=True, timeout=60)
    seen = json.loads(out.stdout)
    assert not {"oqs", "liboqs"} & set(seen["calls"]), seen
    assert seen["restored"] and seen["kex"], seen
