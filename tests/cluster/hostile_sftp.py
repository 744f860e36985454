"""A hostile node's SFTP server (a trap of the test cluster, see docs/test-cluster.md).

Runs on the node as the SFTP subsystem (``hostile_sftp(k, ...)`` bind-mounts a launcher for
it over the node's ``/usr/lib/openssh/sftp-server``) and sits between sshd and a copy of
the real sftp-server: every packet passes unchanged, except the names in the answers to
READDIR, which are renamed as the config says (``{"server": path, "rename": {old: new}}``):
a real file ``evil`` can be listed as ``../../../x``, ``a/b`` or ``g1\\x00x``. Nothing else
changes, so a client that trusts the listing acts on the real files behind those names.

Standard library only (it runs with the cluster's Python); SFTP version 3 (OpenSSH's).
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import threading
from typing import BinaryIO

READDIR, NAME = 12, 104


def read_packet(f: BinaryIO) -> bytes | None:
    head = f.read(4)
    if len(head) < 4:
        return None
    (n,) = struct.unpack(">I", head)
    body = f.read(n)
    return body if len(body) == n else None


def _string(b: bytes, i: int) -> tuple[bytes, int]:
    (n,) = struct.unpack_from(">I", b, i)
    return b[i + 4:i + 4 + n], i + 4 + n


def _attrs_end(b: bytes, i: int) -> int:
    (flags,) = struct.unpack_from(">I", b, i)
    i += 4
    if flags & 0x1:
        i += 8  # size
    if flags & 0x2:
        i += 8  # uid, gid
    if flags & 0x4:
        i += 4  # permissions
    if flags & 0x8:
        i += 8  # atime, mtime
    if flags & 0x80000000:
        (count,) = struct.unpack_from(">I", b, i)
        i += 4
        for _ in range(2 * count):
            _, i = _string(b, i)
    return i


def rename_names(body: bytes, rename: dict[bytes, bytes]) -> bytes:
    """A NAME packet with its file names renamed (long names and attributes as they were)."""
    (count,) = struct.unpack_from(">I", body, 5)
    out = [body[:9]]
    i = 9
    for _ in range(count):
        name, i = _string(body, i)
        start = i
        _, i = _string(body, i)  # the long name
        i = _attrs_end(body, i)
        new = rename.get(name, name)
        out.append(struct.pack(">I", len(new)) + new + body[start:i])
    out.append(body[i:])
    return b"".join(out)


def main() -> int:
    with open(sys.argv[1], encoding="utf-8") as f:
        config = json.load(f)
    rename = {k.encode("utf-8", "surrogateescape"): v.encode("utf-8", "surrogateescape")
              for k, v in config["rename"].items()}
    server = subprocess.Popen([config["server"], *sys.argv[2:]], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE)
    assert server.stdin is not None and server.stdout is not None
    readdirs: set[bytes] = set()
    lock = threading.Lock()

    def upstream() -> None:  # client -> server, noting which request ids are READDIRs
        assert server.stdin is not None
        while (body := read_packet(sys.stdin.buffer)) is not None:
            if body[:1] == bytes([READDIR]):
                with lock:
                    readdirs.add(body[1:5])
            server.stdin.write(struct.pack(">I", len(body)) + body)
            server.stdin.flush()
        server.stdin.close()

    threading.Thread(target=upstream, daemon=True).start()
    out = sys.stdout.buffer
    while (body := read_packet(server.stdout)) is not None:
        if body[:1] == bytes([NAME]):
            with lock:
                ours = body[1:5] in readdirs
                readdirs.discard(body[1:5])
            if ours:
                body = rename_names(body, rename)
        out.write(struct.pack(">I", len(body)) + body)
        out.flush()
    return server.wait()


if __name__ == "__main__":
    sys.exit(main())
