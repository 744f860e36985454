"""dtrain cp's node program: runs ON THE NODES (stdlib only, Python >= 3.8).

Shipped over the SSH channel like the probe (nodeside/wire.py); parameters arrive as one
JSON line on stdin, the answer is one JSON line on stdout.

Modes:
  hash  {"mode": "hash", "paths": [...]} -> {"sha256": {path: hexdigest or null}}
        sha256 of each regular file (null when missing or unreadable), so that
        `dtrain cp --checksum` compares content without reading files back.
  relay {"mode": "relay", "tmp", "final", "size", "mode_bits", "chmod", "mtime",
         "bind", "token", "timeout"} -> several lines, see relay() below.
        One node of a broadcast chain (docs/cp.md): receives a file once, writes it to
        its temp name and forwards every chunk to the next node as it arrives.
"""

import hashlib
import hmac
import json
import os
import socket
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
    # bytes, not sys.stdin's text layer: in relay mode raw data follows the lines, and a
    # text reader would swallow part of it into its own buffer
    line = sys.stdin.buffer.readline()
    return json.loads(line) if line.strip() else {}


def say(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


TOKEN_LEN = 32
CHUNK = 1 << 20


def read_exact(sock, n):
    data = b""
    while len(data) < n:
        part = sock.recv(n - len(data))
        if not part:
            break
        data += part
    return data


def accept_upstream(lsock, token, deadline, refused):
    """The first connection that presents the token; others are closed and remembered.

    The token is compared with hmac.compare_digest (constant time) before a single byte
    of data is accepted from the connection.
    """
    import time
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise OSError("no upstream node connected within the timeout") from None
        lsock.settimeout(left)
        try:
            conn, peer = lsock.accept()
        except socket.timeout:
            raise OSError("no upstream node connected within the timeout") from None
        conn.settimeout(min(left, 10.0))
        try:
            got = read_exact(conn, TOKEN_LEN)
        except OSError:
            got = b""
        if len(got) == TOKEN_LEN and hmac.compare_digest(got, token):
            return conn
        refused.append(peer[0])
        conn.close()


class StdinSource:
    """Node 1 of a chain: the launcher streams the file over the SSH channel's stdin."""

    def __init__(self):
        self.fd = sys.stdin.buffer

    def recv(self, n):
        return self.fd.read1(n) if hasattr(self.fd, "read1") else self.fd.read(n)

    def close(self):
        pass


def relay(params):
    """Receive one file, write it to the temp name, forward it to the next node.

    Lines on stdout: {"port": N, "pid": N} once listening on the node's cluster address
    ("bind", an ephemeral port), {"linked": bool, "error": str} once connected to the next
    node (or not; true when there is none), then the result {"ok": bool, "error": str,
    "forward_error": str, "refused": [addr], "received": N}. Lines on stdin: the spec,
    then {"stdin": bool, "next": {"addr", "port", "token"} or null} (stdin true: this node
    is the chain's first and exactly size bytes of data follow on stdin; false: they come
    from the previous node, over TCP, after the token of the spec), then {"sha256": hex}.
    EOF on stdin before the end means the launcher is gone: the temp is removed and
    nothing is renamed. The token is never printed.
    """
    import time
    tmp, final, size = params["tmp"], params["final"], int(params["size"])
    timeout = float(params.get("timeout", 60.0))
    lsock = socket.socket(socket.AF_INET6 if ":" in params["bind"] else socket.AF_INET)
    lsock.bind((params["bind"], 0))
    lsock.listen(4)
    say({"port": lsock.getsockname()[1], "pid": os.getpid()})
    result = {"ok": False, "error": "", "forward_error": "", "refused": [], "received": 0}
    fd = None
    src = nxt = None
    try:
        line = sys.stdin.buffer.readline()
        if not line:
            raise OSError("the launcher closed the channel before the transfer")
        order = json.loads(line)
        first = bool(order.get("stdin"))
        link = order.get("next")
        if link:
            try:
                nxt = socket.create_connection((link["addr"], int(link["port"])),
                                               timeout=min(timeout, 10.0))
                nxt.settimeout(timeout)
                nxt.sendall(bytes.fromhex(link["token"]))
            except OSError as exc:
                result["forward_error"] = "cannot connect to the next node %s:%s: %s" % (
                    link["addr"], link["port"], exc)
                nxt = None
        # told at once, so that the launcher can cut the chain here instead of letting the
        # nodes after this one wait out their timeout for an upstream that never comes
        say({"linked": not result["forward_error"], "error": result["forward_error"]})
        if first:
            src = StdinSource()
            lsock.close()  # closing again in finally is harmless
        else:
            token = bytes.fromhex(params["token"])
            src = accept_upstream(lsock, token, time.monotonic() + timeout, result["refused"])
            src.settimeout(timeout)
            lsock.close()  # closing again in finally is harmless
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(tmp, flags, int(params.get("mode_bits", 0o644)))
        h = hashlib.sha256()
        got = 0
        write_error = ""
        while got < size:
            try:
                chunk = src.recv(min(CHUNK, size - got))
            except socket.timeout:
                raise OSError("no data from upstream for %g s after %d of %d bytes" % (
                    timeout, got, size)) from None
            if not chunk:
                raise OSError("the upstream closed after %d of %d bytes" % (got, size))
            got += len(chunk)
            if nxt is not None:
                try:
                    nxt.sendall(chunk)
                except OSError as exc:
                    result["forward_error"] = "forwarding to the next node failed: %s" % exc
                    nxt.close()
                    nxt = None
            if not write_error:
                h.update(chunk)
                view = memoryview(chunk)
                try:
                    while view:
                        view = view[os.write(fd, view):]
                except OSError as exc:
                    write_error = "writing %s: %s" % (tmp, exc.strerror or exc)
        result["received"] = got
        if nxt is not None:
            nxt.shutdown(socket.SHUT_WR)
        if write_error:
            raise OSError(write_error)
        os.close(fd)
        fd = None
        line = sys.stdin.buffer.readline()
        if not line:
            raise OSError("the launcher closed the channel before sending the sha256")
        want = json.loads(line).get("sha256")
        if h.hexdigest() != want:
            raise OSError("sha256 mismatch: received %s, expected %s" % (h.hexdigest(), want))
        if params.get("chmod") is not None:
            os.chmod(tmp, int(params["chmod"]))
        os.utime(tmp, (int(params["mtime"]), int(params["mtime"])))
        os.rename(tmp, final)
        result["ok"] = True
    except (OSError, ValueError, KeyError) as exc:
        result["error"] = str(exc) or exc.__class__.__name__
    finally:
        if fd is not None:
            os.close(fd)
        for s in (src, nxt, lsock):
            if s is not None:
                try:
                    s.close()
                except OSError:
                    pass
        if not result["ok"]:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    say(result)
    return 0


def main():
    params = read_params()
    mode = params.get("mode")
    if mode == "relay":
        return relay(params)
    if mode != "hash":
        sys.stdout.write(json.dumps({"error": "unknown mode %r" % (mode,)}) + "\n")
        return 2
    sums = {p: sha256_of(p) for p in params.get("paths", [])}
    sys.stdout.write(json.dumps({"sha256": sums}) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
