"""The launcher's side of the node protocol: how node programs are shipped and spoken to.

A node program (the supervisor, the probe) is never installed on the node. The remote
command is a short bootstrap given to the node's Python with ``-c``; it reads a header line
``"<source length> <spec length> <cache key>"`` from fd 0, then exactly that many bytes of
source and of spec, and executes the source. The spec is JSON, except the supervisor's:
marshal data after SPEC_MARSHAL (``supervisor_payload``), which the node decodes without
importing anything. Secrets travel inside the spec, over the encrypted
channel, never on a command line that ``ps`` would show. The rest of stdin is control lines.
"""

from __future__ import annotations

import hashlib
import json
import marshal
import shlex
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources

from launcher.errors import UsageError
from launcher.hosts.entries import node_value_problem

FRAME = struct.Struct("!BiI")
KIND_NOISE, KIND_OUT, KIND_ERR, KIND_CTL = 0, 1, 2, 3
# the supervisor's first bytes (launcher/nodeside/supervisor.py has the twin): anything before them
# is what the node's login shell printed (a chatty .bashrc), passed on as KIND_NOISE
MAGIC = b"\n\x00DTRAIN-FRAMES-1\x00\n"
SHIM_PLACEHOLDER = "{DTRAIN_SHIM}"
DIR_PLACEHOLDER = "{DTRAIN_DIR}"  # the supervisor's private directory (supervisor.py's twin)
# --image: the probe inside the image (probe.py's in_image op runs it): its params line,
# then its source, on stdin; run as the __main__ it is on the host
IN_IMAGE_BOOT = ("import sys;p=sys.stdin.buffer.readline();s=sys.stdin.buffer.read();"
                 "exec(compile(s,'dtrain-probe','exec'),"
                 "{'__name__':'__main__','DTRAIN_SPEC':p})")


# the supervisor's spec travels as marshal data after this byte (supervisor.py has the twin;
# a JSON spec starts with "{"): decoding it needs no import on the node, json costs ~3 ms
SPEC_MARSHAL = b"M"
# marshal's format 4 is read by every Python >= 3.4 (the nodes need >= 3.8)
MARSHAL_VERSION = 4

# The bootstrap compiles the program once per node and Python version and keeps the code
# object in ~/.cache/dtrain/<sha256 of the source>-<cache tag>.bin (the directory 0700, used
# only when it and the file are the user's own and not group/world-writable; written to a
# temp name and renamed). Compiling the supervisor costs ~17 ms of CPU on every node at
# every command; loading the cached code costs ~0.2 ms. Any problem with the cache (a
# read-only home, a foreign owner, a corrupt file) falls back to compiling.
BOOTSTRAP = (
    "import os, sys, marshal\n"
    # -c put the working directory first on sys.path: a json.py or types.py there would
    # shadow the standard library every node program imports (run isolated, as -I does)
    "if sys.path and sys.path[0] in ('', '.'):\n"
    "    del sys.path[0]\n"
    "def r(n):\n"
    "    d = b''\n"
    "    while len(d) < n:\n"
    "        c = os.read(0, n - len(d))\n"
    "        if not c:\n"
    "            raise SystemExit('dtrain: launcher closed the channel during start-up')\n"
    "        d += c\n"
    "    return d\n"
    "h = b''\n"
    "while not h.endswith(b'\\n'):\n"
    "    h += r(1)\n"
    "f = h.split()\n"
    "n, m = int(f[0]), int(f[1])\n"
    "s = r(n)\n"
    "g = {'__name__': '__main__', 'DTRAIN_SOURCE': s}\n"
    "if m:\n"
    "    g['DTRAIN_SPEC'] = r(m)\n"
    "x = p = None\n"
    "if len(f) > 2 and os.environ.get('HOME'):\n"
    "    d = os.path.join(os.environ['HOME'], '.cache', 'dtrain')\n"
    "    p = os.path.join(d, f[2].decode() + '-' + str(sys.implementation.cache_tag) + '.bin')\n"
    "    def mine(q):\n"
    "        t = os.stat(q)\n"
    "        return t.st_uid == os.getuid() and not t.st_mode & 0o022\n"
    "    try:\n"
    "        if mine(d) and mine(p):\n"
    "            with open(p, 'rb') as o:\n"
    "                x = marshal.loads(o.read())\n"
    "    except Exception:\n"
    "        x = None\n"
    "if x is None:\n"
    "    x = compile(s, 'dtrain-node-program', 'exec')\n"
    "    if p:\n"
    "        try:\n"
    "            os.makedirs(d, 0o700, exist_ok=True)\n"
    "            if mine(d):\n"
    "                t = p + '.%d.tmp' % os.getpid()\n"
    "                w = os.open(t, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)\n"
    "                with open(w, 'wb') as o:\n"
    "                    o.write(marshal.dumps(x))\n"
    "                os.replace(t, p)\n"
    "        except Exception:\n"
    "            pass\n"
    "del f, n, m, p\n"
    "exec(x, g)\n"
)


# A node program is one source on the wire, but may be several modules here: its modules,
# concatenated in this order, each one's imports of the earlier ones (top-level
# ``from launcher.nodeside.X import ...`` lines) left out, so their names are globals of the
# one namespace. The last module is the one that runs (its ``if __name__ == "__main__"``).
# A program not listed is its one file. tests/test_node_bundles.py keeps the rules: stdlib
# and earlier modules only, no top-level name defined twice, the bundle compiles under 3.8.
PROGRAMS: dict[str, tuple[str, ...]] = {
    "supervisor": ("nodetitle", "nodemessages", "nodecommon", "nodeprocs", "warm",
                   "warmclient", "rankshim",
                   "kernlog", "nodeevidence", "nodecontainer", "nodesession", "supervisor"),
    "probe": ("nodetitle", "probenet", "runscan", "probe"),
    "sampler": ("nodetitle", "nodemessages", "nodecommon", "nodeprocs", "sampler"),
    "cpnode": ("nodetitle", "nodecommon", "cpnode"),
    "agent": ("nodetitle", "agent"),
}
SIBLING_IMPORT = b"from launcher.nodeside."
FUTURE = b"from __future__ import annotations\n"  # first in the bundle when a module has it


def program_modules(name: str) -> tuple[str, ...]:
    """The modules of node program ``name``, in the order they are shipped."""
    return PROGRAMS.get(name, (name,))


def strip_sibling_imports(source: bytes) -> bytes:
    """A bundle module's source without its top-level imports of its bundle's siblings
    (``from launcher.nodeside.X import a`` or ``... import (`` up to the line ``)``) and
    without ``from __future__ import annotations`` (``program_source`` puts it first)."""
    out: list[bytes] = []
    skipping = False
    for line in source.splitlines(keepends=True):
        if skipping:
            skipping = line.strip() != b")"
            continue
        if line.startswith(SIBLING_IMPORT):
            skipping = line.rstrip().endswith(b"(")
            continue
        if line == FUTURE:
            continue
        out.append(line)
    return b"".join(out)


@cache
def program_source(name: str) -> bytes:
    """The source of a node program shipped from this package (supervisor, probe ...): its
    one file, or its modules bundled (``PROGRAMS``)."""
    files = resources.files("launcher.nodeside")
    mods = program_modules(name)
    if len(mods) == 1:
        return files.joinpath(f"{mods[0]}.py").read_bytes()
    parts = [files.joinpath(f"{m}.py").read_bytes() for m in mods]
    source = b"\n".join(strip_sibling_imports(p) for p in parts)
    if any(FUTURE in p for p in parts):
        # a __future__ import must open the file (after its docstring): one for the bundle,
        # annotations unevaluated there as in the module that asked (the unannotated
        # modules do not notice)
        doc = source.index(b'"""\n', 3) + 4 if source.startswith(b'"""') else 0
        source = source[:doc] + FUTURE + source[doc:]
    return source


SETUP_FAILED = 95  # the remote shell's exit status when the user's --setup ended non-zero
WORKDIR_DENIED = 96  # ... when the working directory exists but the user may not enter it
WORKDIR_MISSING = 97  # ... when the working directory is missing
PYTHON_MISSING = 98  # ... and when the interpreter is not found
# the line the shell prints (to stderr) when the setup failed; its status follows
SETUP_MARK = "dtrain: --setup failed with exit status "


def check_value(value: str, origin: str, *, python: bool = False) -> str:
    """A path or interpreter bound for a node's command line, or UsageError naming its origin.

    Control characters (newline, NUL, ESC ...) are refused: they would end a shell line,
    truncate a C string or drive the user's terminal. ``~`` and ``~/...`` mean the remote
    user's home; ``~name`` is refused (whose home it is differs from node to node). An
    interpreter may not start with '-' (it would be read as an option).
    """
    problem = node_value_problem(value, python=python)
    if problem:
        raise UsageError(f"{origin}: {value!r} {problem}",
                         hint="give a plain path (absolute, or ~/ for the remote home)")
    return value


def shell_word(value: str) -> str:
    """``value`` as one shell word; a leading ``~`` or ``~/`` becomes ``"$HOME"``, which is
    what the remote shell's own tilde expansion means and what the probe's expanduser sees."""
    if value == "~":
        return '"$HOME"'
    if value.startswith("~/"):
        rest = value[2:]
        return '"$HOME"/' + (shlex.quote(rest) if rest else "")
    return shlex.quote(value)


def _say(template: str, value: str) -> str:
    """A printf line to stderr with ``value`` as data: never expanded, never shell code."""
    return f"printf {shlex.quote(template)} {shell_word(value)} >&2"


def remote_command(python: str = "python3", *, workdir: str | None = None,
                   setup: str | None = None, stdlib_only: bool = False,
                   no_site: bool = False) -> str:
    """The shell command line that starts a node program under the remote user's shell.

    Remote shells are non-login shells: nothing may depend on .bashrc, so the setup snippet
    (``source venv/bin/activate``, ``module load``) runs first, in the same shell, and the
    program is exec'd so no shell lingers between sshd and the supervisor.
    ``stdlib_only`` is for the supervisor, which needs nothing from site-packages (the probe
    does: it reads installed package versions). ``no_site`` is for the probe's facts: it
    starts without site and runs site itself, minus the .pth files' import lines unless it
    needs them (nodeside/probe.py load_site).

    Every value (workdir, python) is one quoted word, also in the error messages, which
    print it with ``printf '%s'``. The only shell code on the line is the fixed text here
    and the user's own ``--setup``.
    """
    check_value(python, "python", python=True)
    parts = []
    if workdir:
        check_value(workdir, "workdir")
        word = shell_word(workdir)
        missing = "dtrain: working directory %s does not exist on this node\n"
        denied = "dtrain: working directory %s: permission denied on this node\n"
        parts.append(f"cd -- {word} 2>/dev/null || {{ if [ -d {word} ]; then "
                     f"{_say(denied, workdir)}; exit {WORKDIR_DENIED}; fi; "
                     f"{_say(missing, workdir)}; exit {WORKDIR_MISSING}; }}")
    if setup:
        # the user's shell code, in this shell (it may change the environment); its final
        # status is checked, so a failed `source venv/bin/activate` is reported as itself
        # and not as what is missing after it (torch)
        parts.append(f"{{\n{setup}\n}} || {{ _dtrain_s=$?; printf '{SETUP_MARK}%s\\n' "
                     f"\"$_dtrain_s\" >&2; exit {SETUP_FAILED}; }}")
    py = shell_word(python)
    message = "dtrain: %s not found on this node (set --python or the hostfile's python=)\n"
    parts.append(f"command -v {py} >/dev/null 2>&1 || "
                 f"{{ {_say(message, python)}; exit {PYTHON_MISSING}; }}")
    # -S skips site (.pth files, site-packages): ~50 ms per node for a stdlib-only program;
    # -I (isolated: -E -s, and no '' on sys.path) keeps PYTHONPATH and the working
    # directory's files from shadowing the standard library it needs (a select.py there)
    flags = "-u -I -S" if stdlib_only else "-u -S" if no_site else "-u"
    parts.append(f"exec {py} {flags} -c {shlex.quote(BOOTSTRAP)}")
    return "\n".join(parts)


@cache
def plain_program(command: str) -> bool:
    """Whether ``command`` is ``remote_command(python)`` with neither a working directory
    nor a --setup (any of its three flag sets): a line that only starts a node program, the
    same for every program, which the keeper's node agent may start instead by a fork
    (launcher/transports/keeper/nodeagent.py). Pure; anything else is False."""
    try:  # `command -v PYTHON ...` first: no workdir, no setup
        words = shlex.split(command)
    except ValueError:
        return False
    if len(words) < 3 or words[:2] != ["command", "-v"]:
        return False
    python = words[2]
    if python.startswith("$HOME/"):  # shell_word's "$HOME"/... for ~/...
        python = "~/" + python[len("$HOME/"):]
    try:
        return any(remote_command(python, stdlib_only=a, no_site=b) == command
                   for a, b in ((True, False), (False, True), (False, False)))
    except UsageError:
        return False


@dataclass(frozen=True)
class StartFailure:
    """Why a node program never answered, read from its shell's status and stderr."""

    message: str
    hint: str | None = None
    kind: str = "start"  # "setup", "python", "workdir", or "start" (anything else)


SETUP_HINT = ("--setup runs in the node's shell before dtrain's program and must end with "
              "status 0: fix the command (try it by hand: dtrain exec -f HOSTS -- 'SETUP'), "
              "or end an optional step with `|| true`")


def start_failure(status: int | None, stderr: str, what: str = "probe") -> StartFailure:
    """What the user sees when a node program printed no answer: the setup's own failure
    (its stderr, its exit status), the missing interpreter or working directory, or the
    program's last stderr line. Pure: the caller read the status and the stderr."""
    lines = [ln.rstrip() for ln in stderr.splitlines() if ln.strip()]
    mark = next((i for i in range(len(lines) - 1, -1, -1)
                 if lines[i].startswith(SETUP_MARK)), None)
    if status == SETUP_FAILED and mark is not None:
        code = lines[mark][len(SETUP_MARK):].strip()
        said = "; ".join(lines[max(0, mark - 3):mark])
        return StartFailure(f"--setup failed (exit {code})" + (f": {said}" if said else ""),
                            SETUP_HINT, "setup")
    last = lines[-1] if lines else ""
    if last.startswith("dtrain: "):  # the shell line's own messages (python, workdir)
        last = last[len("dtrain: "):]
        for suffix in (" on this node (set --python or the hostfile's python=)",
                       " on this node"):
            last = last.removesuffix(suffix)
    if status == PYTHON_MISSING:
        return StartFailure(last or "the interpreter was not found", None, "python")
    if status in (WORKDIR_MISSING, WORKDIR_DENIED):
        return StartFailure(last or "the working directory is not usable",
                            "create it there (readable by the remote user), or pass --workdir",
                            "workdir")
    tail = f" (exit {status})" if status not in (None, 0) else ""
    return StartFailure(f"{what} failed: {last or 'no output'}{tail}")


def payload(source: bytes, spec: Mapping[str, object] | None = None) -> bytes:
    """Header + source + spec: what is written to the channel's stdin first."""
    body = json.dumps(spec, separators=(",", ":")).encode() if spec is not None else b""
    return _framed(source, body)


def _framed(source: bytes, body: bytes) -> bytes:
    """The bootstrap's header line, then the source and the spec's bytes."""
    return f"{len(source)} {len(body)} {source_key(source)}\n".encode() + source + body


def payload_header(line: bytes) -> tuple[int, bytes] | None:
    """The source length and cache key of a header line ``_framed`` wrote (the keeper reads
    them to keep a source on the node: transports/keeper/nodeagent.py); None for anything
    else."""
    fields = line.split()
    if len(fields) != 3 or not fields[0].isdigit() or not fields[1].isdigit():
        return None
    key = fields[2]
    if not (8 <= len(key) <= 64 and all(c in b"0123456789abcdef" for c in key)):
        return None
    return int(fields[0]), key


def supervisor_payload(spec: Mapping[str, object]) -> bytes:
    """payload() of the supervisor, with the spec as marshal data (SPEC_MARSHAL): the node
    decodes it with builtins only. JSON stays the format of everything else (the probe's
    parameters, control lines, the frames' messages)."""
    body = SPEC_MARSHAL + marshal.dumps(dict(spec), MARSHAL_VERSION)
    return _framed(program_source("supervisor"), body)


def agent_payload() -> bytes:
    """payload() of the node agent (launcher/nodeside/agent.py): its spec, the bootstrap it
    runs in every fork, as marshal data after SPEC_MARSHAL (the agent imports no json)."""
    body = SPEC_MARSHAL + marshal.dumps({"boot": BOOTSTRAP}, MARSHAL_VERSION)
    return _framed(program_source("agent"), body)


@cache
def source_key(source: bytes) -> str:
    """The name of a program's compiled-code cache entry on the nodes: its content's hash."""
    return hashlib.sha256(source).hexdigest()[:32]


def control(op: str, **fields: object) -> bytes:
    """One control line for the supervisor's stdin."""
    return json.dumps({"op": op, **fields}, separators=(",", ":")).encode() + b"\n"


@dataclass(frozen=True)
class Frame:
    """One frame from a supervisor: output bytes of a rank/stream, or a control message."""

    kind: int
    rank: int
    data: bytes

    def message(self) -> dict[str, object]:
        """The decoded control message (kind 3); FrameError when it is not a JSON object."""
        try:
            msg = json.loads(self.data)
        except ValueError:
            msg = None
        if not isinstance(msg, dict):
            raise FrameError("a control message that is not a JSON object")
        return msg


MAX_FRAME = 256 * 1024 * 1024  # the largest a supervisor sends: a flight message of 8 ranks


class FrameError(ValueError):
    """The stream is not the supervisor's: a frame over MAX_FRAME, a control message that is
    not a JSON object (that node's error, never the launcher's memory or a traceback)."""


class FrameDecoder:
    """Incremental decoder for the supervisor's stdout; a frame longer than ``max_frame``
    raises FrameError as soon as its header is read (nothing of it is buffered)."""

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self._buf = bytearray()
        self._synced = False
        self.max_frame = max_frame

    def _sync(self) -> list[Frame]:
        """Skip to the MAGIC marker; what precedes it is shell noise."""
        at = self._buf.find(MAGIC)
        if at < 0:
            # keep a possible partial marker at the end; hand out the rest
            keep = len(MAGIC) - 1
            noise = bytes(self._buf[:-keep]) if len(self._buf) > keep else b""
            del self._buf[:len(noise)]
            return [Frame(KIND_NOISE, -1, noise)] if noise else []
        noise = bytes(self._buf[:at])
        del self._buf[:at + len(MAGIC)]
        self._synced = True
        return [Frame(KIND_NOISE, -1, noise)] if noise else []

    def feed(self, data: bytes) -> list[Frame]:
        """Frames completed by this chunk."""
        self._buf += data
        frames: list[Frame] = []
        if not self._synced:
            frames += self._sync()
            if not self._synced:
                return frames
        pos, buf, size = 0, self._buf, FRAME.size
        while len(buf) - pos >= size:
            kind, rank, length = FRAME.unpack_from(buf, pos)
            if length > self.max_frame:
                raise FrameError(f"a frame of {length} bytes (more than {self.max_frame})")
            if len(buf) - pos - size < length:
                break
            start = pos + size
            frames.append(Frame(kind, rank, bytes(buf[start:start + length])))
            pos = start + length
        del buf[:pos]
        return frames

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame (non-zero at EOF means a truncated stream)."""
        return len(self._buf)
