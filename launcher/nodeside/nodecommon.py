"""What every part of the supervisor's bundle shares: THIS RUNS ON THE NODES.

Part of the supervisor program (launcher/nodeside/wire.py ``PROGRAMS``): the modules are
shipped as one source, concatenated in order, each one's imports of the earlier ones left
out. Standard library only, Python >= 3.8, unannotated (launcher/nodeside/README.md).

Here: the frame format, JSON without importing json (``to_json``), the spec and small
helpers to run a command and read /proc.
"""

import _thread
import marshal
import os
import struct
import time

if False:  # for mypy only: typing is not imported on the nodes
    from typing import Any  # noqa: F401

try:
    from _json import encode_basestring_ascii as _json_string
    from _json import make_scanner as _make_scanner
except ImportError:  # an interpreter without the accelerator: to_json falls back to json
    _json_string = None  # type: ignore[assignment]
    _make_scanner = None  # type: ignore[assignment,misc]

PROTOCOL = 1
FRAME = struct.Struct("!BiI")
# written before the first frame: whatever the login shell printed before us (a chatty
# .bashrc) is told apart from the frames by the launcher (launcher/nodeside/wire.py has the twin)
MAGIC = b"\n\x00DTRAIN-FRAMES-1\x00\n"
OUT, ERR, CTL = 1, 2, 3
CHUNK = 65536
# in argv, replaced by the private directory holding the spec's ``files`` (dtrain smoke's job)
DIR_PLACEHOLDER = "{DTRAIN_DIR}"
# the first byte of a spec in marshal form (launcher/nodeside/wire.py has the twin); a JSON
# spec starts with "{" or white space
SPEC_MARSHAL = b"M"


def now():
    return time.time()


def hostname():
    return os.uname().nodename  # what socket.gethostname() returns, without socket (~1 ms)


def to_json(value):
    """``json.dumps(value, separators=(",", ":"))``, the same text, without importing json.

    ``import json`` costs ~3 ms of CPU per node (it imports re): the control messages
    (hello, hb, exit ...) are dicts of str, int, float, bool, None, lists and dicts, which
    this writes with json's own C string encoder and int/float repr, as json does. Anything
    else (another type, a non-str key, inf/nan, no _json) goes to json itself.
    """
    parts = []  # type: list[str]
    if _json_string is not None and _json_parts(value, parts):
        return "".join(parts)
    import json

    return json.dumps(value, separators=(",", ":"))


def _json_parts(value, parts):
    """Append value's JSON text to parts; False for what only json.dumps may write."""
    kind = type(value)
    if value is None:
        parts.append("null")
    elif value is True:
        parts.append("true")
    elif value is False:
        parts.append("false")
    elif kind is str:
        parts.append(_json_string(value))
    elif kind is int:
        parts.append(int.__repr__(value))
    elif kind is float:
        if value != value or value in (float("inf"), float("-inf")):
            return False
        parts.append(float.__repr__(value))
    elif kind is dict:
        parts.append("{")
        for i, (key, item) in enumerate(value.items()):
            if type(key) is not str:
                return False
            parts.append(("," if i else "") + _json_string(key) + ":")
            if not _json_parts(item, parts):
                return False
        parts.append("}")
    elif kind is list or kind is tuple:
        parts.append("[")
        for i, item in enumerate(value):
            if i:
                parts.append(",")
            if not _json_parts(item, parts):
                return False
        parts.append("]")
    else:
        return False
    return True


class _Decoding(object):
    """What _json's C scanner reads of a ``json.JSONDecoder()``: its defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int

    @staticmethod
    def parse_constant(name):
        return {"NaN": float("nan"), "Infinity": float("inf"),
                "-Infinity": float("-inf")}[name]


_scan = []  # type: list[Any]  # the scanner, made on first use


def _json_where(what, text, pos):
    """json's own error text: ``Expecting value: line 1 column 1 (char 0)``."""
    line = text.count("\n", 0, pos) + 1
    return "%s: line %d column %d (char %d)" % (what, line, pos - text.rfind("\n", 0, pos),
                                                pos)


def from_json(data):
    """``json.loads(data)`` for one JSON text (bytes in UTF-8, or str), without importing
    json: json imports re, ~3 ms of CPU at every start of a node program that reads a
    parameters or control line. json's own C scanner does the work; anything not JSON is
    ValueError, as json's. Without the accelerator: json itself."""
    if _make_scanner is None:
        import json

        return json.loads(data)
    if isinstance(data, (bytes, bytearray)):
        data = bytes(data).decode("utf-8-sig", "surrogatepass")  # as json.loads decodes
    space = " \t\n\r"
    start = len(data) - len(data.lstrip(space))
    if not _scan:
        _scan.append(_make_scanner(_Decoding()))  # type: ignore[arg-type]
    try:
        value, end = _scan[0](data, start)
    except StopIteration as exc:
        raise ValueError(_json_where("Expecting value", data, exc.value)) from None
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    end += len(data[end:]) - len(data[end:].lstrip(space))
    if end != len(data):
        raise ValueError(_json_where("Extra data", data, end))
    return value


def load_spec(data):
    """The job spec: marshal after SPEC_MARSHAL (what dtrain sends), else JSON.

    marshal is read with the interpreter's builtins (json would cost ~3 ms per node); it
    comes from our own launcher, over the same authenticated channel as this program's
    source, so it is trusted exactly as much as the code that runs it.
    """
    if data[:1] == SPEC_MARSHAL:
        return marshal.loads(data[1:])
    return from_json(data)


class Writer:
    """Frame writer for stdout (only the main loop writes; the lock keeps frames whole)."""

    def __init__(self, fd):
        self.fd = fd
        self.lock = _thread.allocate_lock()
        self.dead = False

    def frame(self, kind, rank, payload):
        if self.dead:
            return
        data = FRAME.pack(kind, rank, len(payload)) + payload
        with self.lock:
            try:
                view = memoryview(data)
                while view:
                    n = os.write(self.fd, view)
                    view = view[n:]
            except OSError:
                self.dead = True

    def control(self, msg):
        self.frame(CTL, -1, to_json(msg).encode())


def _prctl():
    """libc's prctl through _ctypes, as ``ctypes.CDLL(None).prctl`` builds it (int result,
    int arguments) without importing ctypes itself, which costs ~1.5 ms of CPU per node.
    Any difference in _ctypes raises, and set_subreaper then goes through ctypes."""
    import _ctypes

    class Int(_ctypes._SimpleCData):  # type: ignore[type-arg]  # ctypes.c_int
        _type_ = "i"

    class Function(_ctypes.CFuncPtr):  # ctypes.CDLL's _FuncPtr
        _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
        _restype_ = Int

    class Program:  # ctypes.CDLL(None): the running program and the libraries it loaded
        _handle = _ctypes.dlopen(None, _ctypes.RTLD_LOCAL)  # type: ignore[arg-type]

    prctl = Function(("prctl", Program))  # type: ignore[arg-type]
    return lambda *args: int(prctl(*args))


def _stat_fields(pid):
    """The fields of /proc/<pid>/stat after the comm field (state first), or None."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # the comm field may contain spaces and parentheses: split after the last ')'
    return stat[stat.rfind(b")") + 2:].split()


def start_time(pid):
    """The process's start time (stat field 22, clock ticks since boot), or None if gone.

    A pid plus its start time names one process for good: a recycled pid has a later one.
    """
    fields = _stat_fields(pid)
    if not fields or len(fields) < 20 or fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])




def peer_pid(sock, claimed):
    """The pid of a unix socket's peer as this process sees it, else what the peer claimed.

    SO_PEERCRED is the kernel's word, translated into our pid namespace: a rank inside a
    container (--image) knows itself by the container's pid, which names another process
    (or none) here, so signalling the claimed pid for a stack dump reached nobody. It is
    also a claim checked (docs/security.md): a process cannot name another as itself.
    ``socket`` is imported only when a rank connects (run mode), never on exec's path."""
    try:
        import socket
        pid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                  struct.calcsize("3i")))[0]
    except (OSError, AttributeError, ValueError, struct.error):
        pid = 0
    return pid if pid > 0 else claimed


def which(name, path):
    for folder in (path or "").split(os.pathsep):
        candidate = os.path.join(folder or ".", name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def run_quiet(argv, timeout=60.0):
    """Run a runtime's command to its end (output dropped); its exit code, or None."""
    import subprocess  # container mode only

    try:
        return subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, timeout=timeout).returncode
    except (OSError, subprocess.SubprocessError):
        return None


def run_output(argv, timeout=30.0):
    return run_status_output(argv, timeout)[1]


def run_status_output(argv, timeout=30.0):
    """(exit status, stdout); status None when it could not run or timed out."""
    import subprocess

    try:
        res = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None, ""
    return res.returncode, res.stdout.decode("utf-8", "replace")


def sh_quote(value):
    return "'" + value.replace("'", "'\"'\"'") + "'"
