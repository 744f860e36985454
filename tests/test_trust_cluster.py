"""Trust on the real-sshd cluster: terminal safety of remote output, known_hosts, ProxyJump."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

import pytest

from tests.util import REPO

pytestmark = pytest.mark.ssh

OSC52 = "printf 'a\\033]52;c;cm0gLXJmIH4K\\007b\\n\\033[1A\\rnode2: fake\\n\\033[31mred\\n'"


def on_terminal(args: Sequence[str], env: Mapping[str, str], timeout: float = 60) -> bytes:
    """Run `python -m launcher ARGS` with stdout and stderr on a new pty; what it wrote."""
    master, slave = os.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "launcher", *args], stdin=subprocess.DEVNULL,
                            stdout=slave, stderr=slave, env=dict(env), cwd=REPO)
    os.close(slave)
    out, deadline = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.1)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            out += data
    finally:
        os.close(master)
        proc.wait(timeout=10)
    return out.replace(b"\r\n", b"\n")  # the pty's own ONLCR


def test_exec_neutralises_control_sequences_on_a_terminal(cluster):
    env = cluster.client_env(NO_COLOR="1")
    out = on_terminal(["exec", "-H", "node1", "--", OSC52], env)
    assert b"\x1b]52" not in out and b"\x1b[1A" not in out
    # the line's colour ends with it (the reset), the fake tag stays behind the real one
    assert out.endswith(b"node1: a^[]52;c;cm0gLXJmIH4K^Gb\x1b[0m\nnode1: node2: fake\x1b[0m\n"
                        b"node1: \x1b[31mred\x1b[0m\n")
    raw = on_terminal(["exec", "--raw", "-H", "node1", "--", OSC52], env)
    assert b"node1: a\x1b]52;c;cm0gLXJmIH4K\x07b\n" in raw
    assert b"node1: \x1b[1A\rnode2: fake\n" in raw
