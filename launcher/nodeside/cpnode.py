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
  unpack {"mode": "unpack", "timeout", "idle"} -> {"home", "pid"}, then one JSON op line
        in, one JSON line out, until EOF (see Unpacker below). The push of a tree as one
        stream: the node lists its tree (walk) or compares it with the source's rows and
        answers the differences only (diff), hashes (hash), and carries out the
        launcher's plan (apply), whose files' bytes follow the op line on stdin.
"""

import os
import sys

from launcher.nodeside.nodecommon import from_json, to_json
from launcher.nodeside.nodetitle import set_title

# hashlib, hmac and socket are imported where a hash or a relay needs them: the unpack mode
# of a re-push needs neither, and each node pays every import of this program (~6 ms)


def sha256_of(path):
    import hashlib
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
        return from_json(spec)
    # bytes, not sys.stdin's text layer: in relay mode raw data follows the lines, and a
    # text reader would swallow part of it into its own buffer
    line = sys.stdin.buffer.readline()
    return from_json(line) if line.strip() else {}


def say(obj):
    sys.stdout.write(to_json(obj) + "\n")
    sys.stdout.flush()


TOKEN_LEN = 32
COPY_CHUNK = 1 << 20


class _Pending:
    """A connection that has not presented its token yet."""

    def __init__(self, conn, addr, until):
        self.conn = conn
        self.addr = addr
        self.got = b""
        self.until = until


TOKEN_WAIT = 2.0  # a peer has this long to present the token (it sends it at once)
MAX_PENDING = 64  # connections waiting to present a token; the oldest goes when full
MAX_REFUSED = 16  # addresses kept of the refused peers (the count goes on)


def accept_upstream(lsock, token, deadline, refused):
    """The first connection that presents the token; others are closed and remembered.

    Connections are read at the same time, each for at most TOKEN_WAIT seconds: a few
    silent connections from anyone on the network cannot hold the chain up (reading them
    one at a time, three of them would). The token is compared with hmac.compare_digest
    (constant time) before a single byte of data is accepted from the connection.
    ``refused`` keeps the first MAX_REFUSED addresses, then "+N more".
    """
    import hmac
    import selectors
    import time

    sel = selectors.DefaultSelector()
    sel.register(lsock, selectors.EVENT_READ, None)
    pending = {}  # type: dict[int, _Pending]
    extra = [0]

    def refuse(fd):
        p = pending.pop(fd)
        sel.unregister(p.conn)
        p.conn.close()
        if len(refused) < MAX_REFUSED:
            refused.append(p.addr)
        else:
            extra[0] += 1
            refused[MAX_REFUSED:] = ["+%d more" % extra[0]]

    try:
        while True:
            now = time.monotonic()
            if now >= deadline:
                raise OSError("no upstream node connected within the timeout")
            for fd in [fd for fd, p in pending.items() if p.until <= now]:
                refuse(fd)
            wait = min([deadline - now] + [p.until - now for p in pending.values()])
            for key, _ in sel.select(max(0.0, wait)):
                if key.data is None:  # the listening socket
                    try:
                        conn, peer = lsock.accept()
                    except OSError:
                        continue
                    conn.setblocking(False)
                    if len(pending) >= MAX_PENDING:
                        refuse(min(pending, key=lambda fd: pending[fd].until))
                    pending[conn.fileno()] = _Pending(conn, peer[0],
                                                      time.monotonic() + TOKEN_WAIT)
                    sel.register(conn, selectors.EVENT_READ, conn.fileno())
                    continue
                fd = key.data
                p = pending[fd]
                try:
                    part = p.conn.recv(TOKEN_LEN - len(p.got))
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    part = b""
                if not part:
                    refuse(fd)
                    continue
                p.got += part
                if len(p.got) < TOKEN_LEN:
                    continue
                if hmac.compare_digest(p.got, token):
                    del pending[fd]
                    sel.unregister(p.conn)
                    p.conn.setblocking(True)
                    return p.conn
                refuse(fd)
    finally:
        for p in pending.values():
            sel.unregister(p.conn)
            p.conn.close()
        sel.close()


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
    import hashlib
    import socket
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
        order = from_json(line)
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
        # a new file, never one that is there (another user may have made it in a shared
        # DEST): the launcher names each temp at random
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(tmp, flags, int(params.get("mode_bits", 0o644)))
        h = hashlib.sha256()
        got = 0
        write_error = ""
        while got < size:
            try:
                chunk = src.recv(min(COPY_CHUNK, size - got))
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
        want = from_json(line).get("sha256")
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


# ---------------------------------------------------------------- unpack


class Truncated(Exception):
    """The launcher's stream ended (or went silent) in the middle of an op."""


class Input:
    """Bytes and lines from an fd (stdin), each wait bounded by a timeout.

    select + os.read, never sys.stdin's buffered layers: the data of an apply op follows
    its line, and a buffered reader would swallow part of it. The buffer is consumed by
    moving an offset (slicing the rest off for every small file would copy it each time).
    """

    def __init__(self, fd):
        self.fd = fd
        self.buf = b""
        self.pos = 0
        self.eof = False

    def _fill(self, timeout, what):
        import select
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            raise Truncated("nothing from the launcher for %g s (%s)" % (timeout, what))
        data = os.read(self.fd, 1 << 20)
        if not data:
            self.eof = True
        self.buf = self.buf[self.pos:] + data
        self.pos = 0

    def line(self, timeout):
        """The next line (without its newline), None at EOF."""
        while True:
            at = self.buf.find(b"\n", self.pos)
            if at >= 0:
                line = self.buf[self.pos:at]
                self.pos = at + 1
                return line
            if self.eof:
                return None
            self._fill(timeout, "waiting for the next operation")

    def chunks(self, n, timeout):
        """Exactly n bytes, as pieces; Truncated when the stream ends first."""
        left = n
        while left:
            if self.pos >= len(self.buf):
                if self.eof:
                    raise Truncated("the launcher's stream ended %d bytes early" % left)
                self._fill(timeout, "in the middle of a file")
                continue
            piece = self.buf[self.pos:self.pos + left]
            self.pos += len(piece)
            left -= len(piece)
            yield piece


def kind_of(st_mode):
    import stat
    if stat.S_ISLNK(st_mode):
        return "link"
    if stat.S_ISDIR(st_mode):
        return "dir"
    if stat.S_ISREG(st_mode):
        return "file"
    return "other"


def walk_tree(root):
    """The tree at root as [rel, kind, size, mtime, mode, target] rows (lstat, links never
    followed); [] when root does not exist."""
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        return []
    rows = []

    def row(rel, path, st):
        kind = kind_of(st.st_mode)
        target = os.readlink(path) if kind == "link" else ""
        rows.append([rel, kind, st.st_size if kind == "file" else 0, int(st.st_mtime),
                     st.st_mode & 0o7777, target])
        return kind

    todo = [""] if row("", root, st) == "dir" else []
    while todo:
        d = todo.pop()
        with os.scandir(os.path.join(root, d) if d else root) as it:
            for ent in it:
                rel = d + "/" + ent.name if d else ent.name
                if row(rel, ent.path, ent.stat(follow_symlinks=False)) == "dir":
                    todo.append(rel)
    return rows


def is_temp(name):
    """A dtrain cp temp name (decide/copies/copyplan.py has the twin)."""
    base = name.rsplit("/", 1)[-1]
    return base.startswith(".dtrain-cp-") and base.endswith(".tmp")


def diff_rows(have, rows, all_extras):
    """This node's rows (walk_tree) against the launcher's manifest rows ([rel, kind, size,
    mtime, mode, target], None: anything matches there): {"differ": this node's rows that
    do not match theirs, "missing": manifest paths absent here, "extra": rows the manifest
    lacks, all of them or (all_extras false) only dtrain cp temps}."""
    want = {}
    for r in rows:
        want[r[0]] = r
    differ, extra = [], []
    for row in have:
        w = want.pop(row[0], None)
        if w is None:
            if all_extras or is_temp(row[0]):
                extra.append(row)
        elif any(w[i] is not None and w[i] != row[i] for i in range(6)):
            differ.append(row)
    return {"differ": differ, "missing": list(want), "extra": extra}


class Unsafe(ValueError):
    """A path of the manifest that would land outside the destination root."""


class Unpacker:
    """Carries out the launcher's ops against this node's files, confined to each root.

    Every relative path of an op is checked before use (Unsafe otherwise): not absolute,
    no '', '.' or '..' component, no NUL, and every directory above it, below the root,
    is a real directory (lstat), never a symlink: nothing is written, made or removed
    through a link, so nothing lands outside the root. A symlink of the manifest is made
    as a link (its target is data, as in cp), and nothing is ever written below it.
    """

    def __init__(self, inp, idle=60.0):
        self.inp = inp
        self.idle = idle
        self.temps = set()  # in flight: removed on any failure

    def path(self, root, rel, dirs):
        if not root.startswith("/") or "\0" in root:
            raise Unsafe("%s: the root must be an absolute path" % root)
        if rel == "":
            return root
        parts = rel.split("/")
        if rel.startswith("/") or "\0" in rel or any(p in ("", ".", "..") for p in parts):
            raise Unsafe("%s: refused: the path leaves %s" % (rel, root))
        here = root
        for part in parts[:-1]:
            here = here + "/" + part
            if here in dirs:
                continue
            try:
                st = os.lstat(here)
            except OSError as exc:
                raise Unsafe("%s: %s" % (here, (exc.strerror or str(exc)).lower())) from None
            if kind_of(st.st_mode) != "dir":
                raise Unsafe("%s: refused: %s is not a directory (a symlink is never "
                             "followed)" % (rel, here))
            dirs.add(here)
        return root + "/" + rel

    def temp(self, final, tmp_rel_name):
        """The temp of final: in its own directory, with dtrain cp's temp name."""
        base = tmp_rel_name
        if "/" in base or not (base.startswith(".dtrain-cp-") and base.endswith(".tmp")):
            raise Unsafe("%s: refused: not a dtrain cp temp name" % base)
        return os.path.join(os.path.dirname(final), base)

    def apply(self, op):
        """The plan for one root; the files' bytes (and one status byte each) on stdin."""
        root = op["root"]
        dirs = {root}
        counts = {"sent": 0, "sent_bytes": 0, "deleted": 0, "stale": 0}
        errors = []

        def each(rows, fn):
            for r in rows:
                rel = r[0] if isinstance(r, list) else r
                try:
                    fn(self.path(root, rel, dirs), r)
                except Unsafe as exc:
                    errors.append(["", str(exc)])
                except OSError as exc:
                    errors.append([root + "/" + rel if rel else root,
                                   (exc.strerror or str(exc)).lower()])
                else:
                    yield r

        for _ in each(op.get("stale", []), lambda p, r: os.unlink(p)):
            counts["stale"] += 1
        for _ in each(op.get("delete", []),
                      lambda p, r: os.rmdir(p) if r[1] == "dir" else os.unlink(p)):
            counts["deleted"] += 1
        for _ in each(op.get("unlink_first", []), lambda p, r: os.unlink(p)):
            pass
        for _ in each(op.get("mkdirs", []),
                      lambda p, r: os.makedirs(p) if r == "" else os.mkdir(p)):
            pass
        for f in op.get("files", []):
            self.receive(root, f, dirs, counts, errors)
        for _ in each(op.get("links", []), lambda p, r: self.link(p, r)):
            counts["sent"] += 1

        def attrs(p, r):
            if kind_of(os.lstat(p).st_mode) == "link":
                raise Unsafe("%s: refused: a symlink on this node" % p)
            if r[1] is not None:
                os.chmod(p, r[1])
            os.utime(p, (r[2], r[2]))

        for _ in each(op.get("fix_attrs", []), attrs):
            pass
        for _ in each(op.get("dir_attrs", []), attrs):
            pass
        return {"sent": counts["sent"], "sent_bytes": counts["sent_bytes"],
                "deleted": counts["deleted"], "stale": counts["stale"], "errors": errors}

    def link(self, final, r):
        tmp = self.temp(final, r[2])
        self.temps.add(tmp)
        try:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            os.symlink(r[1], tmp)
            os.rename(tmp, final)
        finally:
            self.drop(tmp)

    def receive(self, root, f, dirs, counts, errors):
        """One file: [rel, size, create mode, chmod or None, mtime, temp name]; its bytes
        and a status byte (1: complete; 0: the launcher could not read it) are consumed
        from the stream whatever happens here, so the next file stays in step."""
        rel, size, bits, chmod, mtime, tmpname = f
        fd = None
        final = tmp = ""
        err = None
        try:
            final = self.path(root, rel, dirs)
            tmp = self.temp(final, tmpname)
            self.temps.add(tmp)
            # a new file (O_EXCL), never one someone else made: a random name per file
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
            fd = os.open(tmp, flags, bits)
        except Unsafe as exc:
            err = ["", str(exc)]
        except OSError as exc:
            err = [tmp or final or root, (exc.strerror or str(exc)).lower()]
        try:
            for piece in self.inp.chunks(size, self.idle):
                view = memoryview(piece)
                while fd is not None and view:
                    try:
                        view = view[os.write(fd, view):]
                    except OSError as exc:
                        err = [tmp, (exc.strerror or str(exc)).lower()]
                        os.close(fd)
                        fd = None
            ok = b"".join(self.inp.chunks(1, self.idle)) == b"\x01"
            if fd is not None:
                if ok and err is None:  # on the open file: no path lookup
                    if chmod is not None:
                        os.fchmod(fd, chmod)
                    os.utime(fd, (mtime, mtime))
                os.close(fd)
                fd = None
            if err is not None:
                errors.append(err)
            elif ok:
                os.rename(tmp, final)
                counts["sent"] += 1
                counts["sent_bytes"] += size
        except OSError as exc:
            errors.append([final, (exc.strerror or str(exc)).lower()])
        finally:
            if fd is not None:
                os.close(fd)
            if tmp:
                self.drop(tmp)

    def drop(self, tmp):
        """Forget a temp, removing it when it is still there (renamed: nothing to do)."""
        self.temps.discard(tmp)
        try:
            os.unlink(tmp)
        except OSError:
            pass

    def cleanup(self):
        for tmp in list(self.temps):
            self.drop(tmp)

    def handle(self, op):
        kind = op.get("op")
        if kind == "walk":
            return {"tree": walk_tree(op["root"])}
        if kind == "diff":
            return diff_rows(walk_tree(op["root"]), op.get("rows", []),
                             bool(op.get("all_extras")))
        if kind == "stat":
            try:
                return {"kind": kind_of(os.stat(op["path"]).st_mode)}
            except OSError:
                return {"kind": None}
        if kind == "mkdir":
            os.makedirs(op["path"], exist_ok=True)
            return {}
        if kind == "hash":
            return {"sha256": {p: sha256_of(p) for p in op.get("paths", [])}}
        if kind == "apply":
            return self.apply(op)
        if kind == "drop":  # the launcher's cleanup after an interruption: temps only
            gone = 0
            for p in op.get("paths", []):
                base = os.path.basename(p)
                if p.startswith("/") and base.startswith(".dtrain-cp-") and base.endswith(".tmp"):
                    try:
                        os.unlink(p)
                        gone += 1
                    except OSError:
                        pass
            return {"dropped": gone}
        raise ValueError("unknown op %r" % (kind,))

    def serve(self, timeout):
        """Ops until EOF. A stream that ends or stalls inside an op: temps removed, the
        error said, exit status 1."""
        try:
            while True:
                line = self.inp.line(timeout)
                if line is None:
                    return 0
                if not line.strip():
                    continue
                try:
                    out = self.handle(from_json(line))
                except Truncated:
                    raise
                except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
                    out = {"error": str(exc) or exc.__class__.__name__}
                say(out)
        except Truncated as exc:
            self.cleanup()
            say({"fatal": str(exc)})
            return 1
        finally:
            self.cleanup()


def unpack(params):
    say({"home": os.path.expanduser("~"), "pid": os.getpid()})
    inp = Input(0)
    return Unpacker(inp, float(params.get("idle", 60.0))).serve(
        float(params.get("timeout", 3600.0)))




def main():
    params = read_params()
    mode = params.get("mode")
    set_title("dtrain cp %s %s" % (mode, os.uname().nodename), "dtrain-cp")
    if mode == "relay":
        return relay(params)
    if mode == "unpack":
        return unpack(params)
    if mode != "hash":
        sys.stdout.write(to_json({"error": "unknown mode %r" % (mode,)}) + "\n")
        return 2
    sums = {p: sha256_of(p) for p in params.get("paths", [])}
    sys.stdout.write(to_json({"sha256": sums}) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
