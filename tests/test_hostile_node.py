"""A node whose programs answer with what dtrain's never would (issue 22, Low 6 and Low 2),
run on localhost through the local transport: its "python" is a script of ours.

A supervisor stream with a 4 GiB frame length (then bytes forever) is that node's error at
once, with the launcher's memory bounded (it runs under RLIMIT_AS here: buffering the frame
would end in a MemoryError traceback).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

from tests.util import REPO, assert_exit

HOSTILE_FRAMES = """#!/bin/sh
# the frame marker, a 4 GiB frame header, then bytes forever
exec {python} -c '
import struct, sys
out = sys.stdout.buffer
out.write(b"\\n\\x00DTRAIN-FRAMES-1\\x00\\n" + struct.pack("!BiI", 1, 0, 0xFFFFFFFF))
while True:
    out.write(b"x" * 65536)
    out.flush()
'
"""


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def test_a_4_gib_frame_is_the_node_s_error_not_the_login_node_s_memory(tmp_path: Path) -> None:
    py = tmp_path / "python3"
    py.write_text(HOSTILE_FRAMES.format(python=sys.executable))
    os.chmod(py, 0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTRAIN_")}
    res = subprocess.run([sys.executable, "-m", "launcher", "exec", "-H", "localhost",
                          "--python", str(py), "--", "true"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120, preexec_fn=_limited)
    assert_exit(res, 255)
    assert "localhost: the node's supervisor stream is not dtrain's: a frame of 4294967295 " \
        "bytes" in res.stderr
