"""cpnode.py's relay mode (one link of `dtrain cp`'s broadcast chain), run locally.

The node program is started as a plain subprocess on 127.0.0.1, spoken to exactly as the
launcher does (JSON lines on stdin, raw data on stdin for the chain's first node, TCP with
a token for the others). No cluster: tests/test_cp_broadcast.py does it on real nodes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

from tests.util import node_program

CPNODE = node_program("cpnode")  # the bundle the nodes get (wire.PROGRAMS)
TOKEN = bytes(range(32))


def start(tmp: Path, final: Path, size: int, *, token: bytes = TOKEN,
          timeout: float = 10.0) -> tuple[subprocess.Popen[bytes], int]:
    proc = subprocess.Popen([sys.executable, "-S", str(CPNODE)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    spec = {"mode": "relay", "tmp": str(tmp), "final": str(final), "size": size,
            "mode_bits": 0o640, "chmod": 0o640, "mtime": 1_600_000_000,
            "bind": "127.0.0.1", "token": token.hex(), "timeout": timeout}
    send(proc, spec)
    assert proc.stdout is not None
    port = json.loads(proc.stdout.readline())["port"]
    return proc, int(port)


def send(proc: subprocess.Popen[bytes], obj: Any) -> None:
    stdin: IO[bytes] | None = proc.stdin
    assert stdin is not None
    stdin.write(json.dumps(obj).encode() + b"\n")
    stdin.flush()


def result(proc: subprocess.Popen[bytes]) -> dict[str, Any]:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.close()
    while (got := json.loads(proc.stdout.readline())).get("linked") is not None:
        pass  # the line after connecting to the next node: not the result
    proc.wait(timeout=10)
    return got  # type: ignore[no-any-return]


def test_two_node_chain_writes_both_files_atomically_with_mode_and_mtime(tmp_path):
    data = os.urandom(3 << 20 | 12345)
    a_tmp, a_fin = tmp_path / "a.tmp", tmp_path / "a"
    b_tmp, b_fin = tmp_path / "b.tmp", tmp_path / "b"
    b, b_port = start(b_tmp, b_fin, len(data))
    a, _ = start(a_tmp, a_fin, len(data))
    send(b, {"stdin": False, "next": None})
    send(a, {"stdin": True, "next": {"addr": "127.0.0.1", "port": b_port,
                                     "token": TOKEN.hex()}})
    assert a.stdin is not None
    a.stdin.write(data)
    a.stdin.flush()
    digest = hashlib.sha256(data).hexdigest()
    send(a, {"sha256": digest})
    send(b, {"sha256": digest})
    ra, rb = result(a), result(b)
    assert ra["ok"] and rb["ok"], (ra, rb)
    assert ra["forward_error"] == "" and rb["refused"] == []
    for final in (a_fin, b_fin):
        assert final.read_bytes() == data
        assert final.stat().st_mode & 0o7777 == 0o640
        assert int(final.stat().st_mtime) == 1_600_000_000
    assert not a_tmp.exists() and not b_tmp.exists()


def test_a_wrong_token_is_refused_before_any_data_and_reported(tmp_path):
    data = b"the real content\n" * 1000
    tmp, final = tmp_path / "f.tmp", tmp_path / "f"
    proc, port = start(tmp, final, len(data))
    send(proc, {"stdin": False, "next": None})
    with socket.create_connection(("127.0.0.1", port), timeout=5) as bad:
        bad.sendall(b"\x00" * 32 + b"injected data " * 2000)
        bad.settimeout(5)
        try:
            assert bad.recv(1) == b""  # closed by the relay
        except ConnectionResetError:
            pass
    with socket.create_connection(("127.0.0.1", port), timeout=5) as good:
        good.sendall(TOKEN + data)
    send(proc, {"sha256": hashlib.sha256(data).hexdigest()})
    r = result(proc)
    assert r["ok"], r
    assert r["refused"] == ["127.0.0.1"]
    assert final.read_bytes() == data
    assert TOKEN.hex() not in json.dumps(r)


def test_sha256_mismatch_removes_the_temp_and_renames_nothing(tmp_path):
    data = os.urandom(100_000)
    tmp, final = tmp_path / "f.tmp", tmp_path / "f"
    proc, port = start(tmp, final, len(data))
    send(proc, {"stdin": False, "next": None})
    with socket.create_connection(("127.0.0.1", port), timeout=5) as up:
        up.sendall(TOKEN + data)
    send(proc, {"sha256": "0" * 64})
    r = result(proc)
    assert not r["ok"] and "sha256 mismatch" in r["error"]
    assert not tmp.exists() and not final.exists()


def test_upstream_closing_early_removes_the_temp(tmp_path):
    tmp, final = tmp_path / "f.tmp", tmp_path / "f"
    proc, port = start(tmp, final, 1 << 20)
    send(proc, {"stdin": False, "next": None})
    with socket.create_connection(("127.0.0.1", port), timeout=5) as up:
        up.sendall(TOKEN + b"x" * 1000)
    r = result(proc)
    assert not r["ok"] and "closed after 1000 of 1048576 bytes" in r["error"]
    assert not tmp.exists() and not final.exists()


def test_no_upstream_within_the_timeout_is_an_error_not_a_hang(tmp_path):
    tmp, final = tmp_path / "f.tmp", tmp_path / "f"
    proc, _ = start(tmp, final, 10, timeout=0.5)
    send(proc, {"stdin": False, "next": None})
    r = result(proc)
    assert not r["ok"] and "within the timeout" in r["error"]
    assert not tmp.exists()


def test_a_next_node_that_cannot_be_reached_is_reported_at_once(tmp_path):
    with socket.socket() as s:  # a port that was free a moment ago: nobody listens there
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    proc, _ = start(tmp_path / "f.tmp", tmp_path / "f", 10)
    send(proc, {"stdin": True, "next": {"addr": "127.0.0.1", "port": dead,
                                        "token": TOKEN.hex()}})
    assert proc.stdout is not None
    linked = json.loads(proc.stdout.readline())  # before any data was sent
    assert linked["linked"] is False and "cannot connect to the next node" in linked["error"]
    assert proc.stdin is not None
    proc.stdin.write(b"0123456789")
    send(proc, {"sha256": hashlib.sha256(b"0123456789").hexdigest()})
    r = result(proc)
    assert r["ok"] and "cannot connect" in r["forward_error"]  # it still got its copy


def test_silent_connections_do_not_cut_the_chain_and_few_refusals_are_kept(tmp_path):
    """Three (and then forty) connections that never send a token, held open, from anyone
    on the network: the real upstream, connecting after them, is still taken well within
    the relay's timeout (tokens are read at the same time, each for TOKEN_WAIT seconds),
    and the reply keeps at most MAX_REFUSED addresses (issue 22, Low 4)."""
    data = b"chain data\n" * 100
    tmp, final = tmp_path / "f.tmp", tmp_path / "f"
    proc, port = start(tmp, final, len(data), timeout=12.0)
    send(proc, {"stdin": False, "next": None})
    silent = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(40)]
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as good:
            good.sendall(TOKEN + data)
            send(proc, {"sha256": hashlib.sha256(data).hexdigest()})
            r = result(proc)
    finally:
        for s in silent:
            s.close()
    assert r["ok"], r
    assert final.read_bytes() == data
    assert len(r["refused"]) <= 17 and len(r["refused"]) <= len(silent) + 1


def test_refused_peers_are_kept_up_to_a_cap():
    import threading
    import time

    from launcher.nodeside import cpnode

    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(128)
    port = lsock.getsockname()[1]

    def peers() -> None:
        for _ in range(40):  # a wrong token each, and wait until the relay hung up
            with socket.create_connection(("127.0.0.1", port), timeout=5) as bad:
                bad.sendall(b"\x01" * 32)
                with contextlib.suppress(ConnectionResetError):
                    assert bad.recv(1) == b""
        good = socket.create_connection(("127.0.0.1", port), timeout=5)
        good.sendall(TOKEN)
        kept.append(good)

    kept: list[socket.socket] = []
    t = threading.Thread(target=peers)
    t.start()
    refused: list[str] = []
    conn = cpnode.accept_upstream(lsock, TOKEN, time.monotonic() + 30, refused)
    t.join(10)
    conn.close()
    lsock.close()
    for s in kept:
        s.close()
    assert refused == ["127.0.0.1"] * cpnode.MAX_REFUSED + ["+24 more"]
