"""Pure: why the root-cause rank died, in one line, with what to do next.

Evidence comes from two places, both recorded text: what the node's supervisor gathered when
the rank ended (``rank_exit``'s ``evidence``: faulthandler's crash dump, the rank's last
memory sample, its memory cgroup's ``memory.events``, the kernel log's OOM / Xid / segfault
records) and what the rank printed on stderr (a Python traceback, NCCL and gloo error
lines), kept by ``ErrorKeeper``. ``explain`` turns them into a ``FailureReason``: a typed
result (kind, rank, host, summary, evidence, advice, scope) that the summary, meta.json,
--json and JUnit show, and that a restart policy can classify: ``scope`` is ``node`` (the
machine: a GPU Xid, the fabric), ``process`` (this process, not its code: killed from
outside, a native crash), ``user`` (the script or its configuration: an exception, an OOM
at this batch size; a restart fails the same way) or ``unknown``.
"""

from __future__ import annotations

import re
import signal as _signal
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from launcher.decide.outcome.stacks import (
    SHIM_NAME,
    Frame,
    RankStack,
    parse_faulthandler,
    user_threads,
)
from launcher.models import OutputLine

NODE, PROCESS, USER, UNKNOWN = "node", "process", "user", "unknown"
CRASH_SIGNALS: dict[int, str] = {_signal.SIGSEGV: "segmentation fault", _signal.SIGBUS: "bus error",
                 _signal.SIGFPE: "floating-point exception", _signal.SIGILL: "illegal instruction",
                 _signal.SIGABRT: "aborted"}
_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]:\s?")  # torch's "[rank3]: " before each line
_FRAME = re.compile(r'^\s*File "(.*)", line (\d+), in (.*)$')
_EXC = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Warning|Failure)|"
                  r"[A-Za-z_][\w.]*Error[\w]*): ?(.*)$")
# the lines that quote a communication library's own error
_COMM = re.compile(
    r"NCCL WARN|ncclSystemError|ncclInternalError|ncclRemoteError|ncclUnhandledCudaError|"
    r"ncclInvalidUsage|Watchdog caught collective operation timeout|NCCL error|"
    r"gloo/transport|Connection closed by peer|Timed out waiting \d+ms|"
    r"ProcessGroupGloo|DistBackendError|Connection reset by peer", re.I)
# a rank's own words that a peer went away under it: it is a victim, not the cause
_PEER_GONE = re.compile(r"Connection closed by peer|Connection reset by peer|ncclRemoteError|"
                        r"remote process exited|peer .{0,40}(?:closed|went away|died)", re.I)
# NCCL's words for two ranks of one communicator on one GPU (init.cc), in its WARN line and
# in torch's ncclInvalidUsage message ("Last error:" then this line)
_DUPLICATE_GPU = re.compile(r"Duplicate GPU detected ?: rank \d{1,9} and rank \d{1,9} both on "
                            r"CUDA device \w{1,16}")
_XID = re.compile(r"NVRM: Xid \(([^)]*)\): (\d{1,9})(?!\d)(?:, (.*))?")
_OOM_PID = re.compile(r"(?:Killed process|oom-kill:.*?\bpid=)\s*(\d{1,10})(?!\d)")
_ANON_RSS = re.compile(r"anon-rss:(\d{1,15})kB")
_SEGFAULT = re.compile(r"segfault at \S+ ip \S+ sp \S+ error \S+(?: in (\S+))?")
# Xid codes of the driver's catalogue whose cause is usually the machine, not the program
NODE_XIDS = {48: "double-bit ECC error", 63: "ECC page retirement", 64: "ECC page retirement "
             "failure", 74: "NVLink error", 79: "GPU has fallen off the bus", 92: "high "
             "single-bit ECC rate", 94: "contained ECC error", 95: "uncontained ECC error",
             119: "GSP timeout", 120: "GSP error", 61: "internal micro-controller breakpoint",
             62: "internal micro-controller halt"}
APP_XIDS = {13: "graphics engine exception", 31: "GPU memory page fault", 43: "GPU stopped "
            "processing", 45: "preemptive cleanup"}


# exceptions that fail the same way on every run: the code or its environment (the restart
# policy, decide/outcome/restarts.py, stops on them; any other exception is restarted once after
# progress, and stops when the next attempt fails the same way at the same place)
DETERMINISTIC = ("SyntaxError", "IndentationError", "TabError", "ImportError",
                 "ModuleNotFoundError", "NameError")


def exception_advice(kind: str) -> str:
    """What an exception of this type means for a rerun, in the words decide/outcome/restarts.py
    acts on."""
    if kind.rsplit(".", 1)[-1] in DETERMINISTIC:
        return f"an error in the script: a {kind} fails the same way on every run"
    return ("an error in the script or its input: with --restarts it is run again from the "
            "last checkpoint if it came after progress, and stops when it fails the same way "
            "at the same place")


@dataclass(frozen=True)
class FailureReason:
    """Why one rank (or node) died: what the summary says, and what #28's restart policy
    reads (``scope``)."""

    kind: str  # oom, xid, segfault, abort, signal, exception, comm, exit
    summary: str
    advice: str
    scope: str = UNKNOWN
    rank: int | None = None
    host: str | None = None
    evidence: tuple[str, ...] = ()
    details: Mapping[str, Any] = field(default_factory=dict)

    def json(self) -> dict[str, Any]:
        return {"kind": self.kind, "rank": self.rank, "host": self.host, "scope": self.scope,
                "summary": self.summary, "evidence": list(self.evidence),
                "advice": self.advice, **({"details": dict(self.details)} if self.details
                                          else {})}


class ErrorKeeper:
    """Per rank: the last stderr lines (for a traceback) and communication error lines; per
    (host, rank): the supervisor's evidence of how it ended. Fed with the output lines and
    the supervisors' messages."""

    def __init__(self, size: int = 40, errors: int = 5) -> None:
        self.tails: dict[tuple[str, int | None], deque[str]] = {}
        self.comm: dict[tuple[str, int | None], deque[str]] = {}
        self.evidence: dict[tuple[str, int], Mapping[str, Any]] = {}
        self.size, self.errors = size, errors

    def observe(self, lines: Sequence[OutputLine]) -> None:
        for line in lines:
            if line.stream != "err":
                continue
            key = (line.host, line.rank)
            tail = self.tails.get(key)
            if tail is None:
                tail = self.tails[key] = deque(maxlen=self.size)
            tail.append(line.text)
            if _COMM.search(line.text):
                comm = self.comm.get(key)
                if comm is None:
                    comm = self.comm[key] = deque(maxlen=self.errors)
                comm.append(line.text)

    def rank_exit(self, host: str, rank: int, evidence: Mapping[str, Any] | None) -> None:
        """A rank's exit report (job/events.py ``RankExit``): the node's evidence of it."""
        if evidence is not None:
            self.evidence[(host, rank)] = evidence

    def victim(self, host: str, rank: int | None, signal: int | None) -> bool:
        """Does this rank's failure look like a peer's victim (``looks_like_victim``)?"""
        return looks_like_victim(signal, self.tails.get((host, rank), ()))

    def comm_lines(self) -> list[tuple[str, int | None, str]]:
        """Every communication error line kept, as (host, rank, line)."""
        return [(h, r, text) for (h, r), lines in self.comm.items() for text in lines]


def looks_like_victim(signal: int | None, tail: Iterable[str]) -> bool:
    """A failed rank that probably died of another's failure: aborted (SIGABRT: the C++
    exception a broken gloo/NCCL connection throws ends in ``terminate``), or its last stderr
    lines say a peer went away ("Connection closed by peer"). The launcher then holds its
    stop for a moment, in case the culprit's own exit is still on its way
    (job/orchestrate.py ``Policy.peer_hold``)."""
    return signal == _signal.SIGABRT or any(_PEER_GONE.search(line) for line in tail)


# torchrun's agent turns a SIGTERM/SIGINT/SIGHUP it gets into this exception, then exits 1
_AGENT_SIGNAL = re.compile(r"SignalException: Process \d+ got signal: (\d{1,2})\s*$")


def agent_signal(tail: Iterable[str]) -> int | None:
    """The signal torchrun's elastic agent says it got (its last ``SignalException`` line in
    its stderr), or None: torchrun then exits 1, though a signal ended it."""
    found = None
    for line in tail:
        m = _AGENT_SIGNAL.search(line)
        if m:
            found = int(m.group(1))
    return found if found and 0 < found < 65 else None


# the supervisor's stop reason when a signal reached it (nodeside/supervisor.py on_signal)
_SUPERVISOR_SIGNAL = re.compile(r"^supervisor got signal (\d{1,2})$")


def supervisor_signal(stopped: str | None) -> int | None:
    """The signal a node's supervisor says it got and stopped its job for, or None."""
    m = _SUPERVISOR_SIGNAL.match(stopped or "")
    return int(m.group(1)) if m and 0 < int(m.group(1)) < 65 else None


# the supervisor's stop reason when its torchrun stayed stopped after every rank there ended
# (nodeside/supervisor.py AGENT_STOPPED_REASON)
_AGENT_STOPPED = re.compile(r"^torchrun stopped \(state T\) for (\d{1,6}) s after its ranks ended$")


def agent_stopped(stopped: str | None) -> int | None:
    """How long (s) a node's supervisor saw its torchrun stopped before it ended the job
    itself (every rank there had ended; a stopped agent never can), or None."""
    m = _AGENT_STOPPED.match(stopped or "")
    return int(m.group(1)) if m else None


# the supervisor's stop reason when it heard nothing from the launcher for 3 heartbeat
# timeouts (nodeside/supervisor.py LAUNCHER_SILENT_REASON: "%g" of the seconds)
_LAUNCHER_SILENT = re.compile(r"^no heartbeat from the launcher for (\d{1,7}(?:\.\d{1,6})?) s$")


def launcher_silent(stopped: str | None) -> float | None:
    """How long (s) a node's supervisor heard nothing from the launcher before it stopped
    its job as orphaned, or None."""
    m = _LAUNCHER_SILENT.match(stopped or "")
    return float(m.group(1)) if m else None


def _strip(line: str) -> str:
    return _PREFIX.sub("", line)


def python_exception(lines: Iterable[str]) -> tuple[str, str, str | None] | None:
    """(type, message, "func() file:line" of the last frame) of the last traceback in
    lines, or None."""
    text = [_strip(line) for line in lines]
    last = None
    for i, line in enumerate(text):
        if line.startswith("Traceback (most recent call last)"):
            last = i
    if last is None:
        return _syntax_error(text)
    frame, exc = None, None
    for line in text[last + 1:]:
        f = _FRAME.match(line)
        if f:
            frame = f"{f.group(3)}() {f.group(1).rsplit('/', 1)[-1]}:{f.group(2)}"
            continue
        m = _EXC.match(line)
        if m and not line.startswith(" "):
            exc = (m.group(1), m.group(2))
    if exc is None:
        return None
    return exc[0], exc[1], frame


_SYNTAX = re.compile(r"^(SyntaxError|IndentationError|TabError): (.*)$")
_SYNTAX_AT = re.compile(r'^\s*File "([^"]+)", line (\d+)$')


def _syntax_error(text: list[str]) -> tuple[str, str, str | None] | None:
    """A script that does not compile: Python prints no "Traceback" line, only the place
    (``File "train.py", line 3``), the line, a caret and ``SyntaxError: ...``."""
    for i in range(len(text) - 1, -1, -1):
        m = _SYNTAX.match(text[i])
        if m:
            for j in range(i - 1, max(-1, i - 8), -1):
                at = _SYNTAX_AT.match(text[j])
                if at:
                    return m.group(1), m.group(2), \
                        f"{at.group(1).rsplit('/', 1)[-1]}:{at.group(2)}"
            return None
    return None


def crash_place(text: str) -> tuple[str | None, tuple[Frame, ...]]:
    """From faulthandler's crash dump: the fatal error line and the crashing thread's frames
    (innermost first, the rank wrapper's left out)."""
    fatal = next((line[len("Fatal Python error:"):].strip() for line in text.splitlines()
                  if line.startswith("Fatal Python error:")), None)
    threads = user_threads(parse_faulthandler(text))
    crashed = next((t for t in threads if t.current), None)
    frames = list(crashed.frames) if crashed is not None else []
    while frames and frames[-1].basename == SHIM_NAME:
        frames.pop()
    return fatal, tuple(frames)


def _gib(kb: int) -> str:
    return f"{kb / 1024 / 1024:.1f} GiB" if kb >= 1024 * 1024 else f"{kb / 1024:.0f} MiB"


def _oom(pid: int | None, evidence: Mapping[str, Any]) -> tuple[bool, list[str], str | None]:
    """(OOM-killed?, the records that say so, its memory at the end)."""
    kernel = evidence.get("kernel")
    lines = [str(x) for x in kernel] if isinstance(kernel, list) else []
    said = []
    rss = None
    for line in lines:
        m = _OOM_PID.search(line)
        if m and pid is not None and int(m.group(1)) == pid:
            said.append(line)
            r = _ANON_RSS.search(line)
            if r:
                rss = _gib(int(r.group(1)))
    events = evidence.get("memory_events")
    before = evidence.get("oom_kill_before")
    count = None
    for line in str(events or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "oom_kill" and parts[1].isdigit():
            count = int(parts[1])
    if count is not None and isinstance(before, int) and count > before:
        said.append(f"memory cgroup: oom_kill {before} -> {count}")
    memory = evidence.get("memory")
    if rss is None and isinstance(memory, dict) and isinstance(memory.get("rss_kb"), int):
        rss = _gib(memory["rss_kb"]) + " resident at its last sample"
    return bool(said), said, rss


def _xids(evidence: Mapping[str, Any]) -> list[tuple[int, str, str]]:
    kernel = evidence.get("kernel")
    out = []
    for line in kernel if isinstance(kernel, list) else []:
        m = _XID.search(str(line))
        if m:
            out.append((int(m.group(2)), m.group(1), str(line)))
    return out


def explain(*, rank: int | None, host: str, code: int | None, sig: int | None,
            pid: int | None = None, evidence: Mapping[str, Any] | None = None,
            stderr: Sequence[str] = (),
            comm: Sequence[tuple[str, int | None, str]] = ()) -> FailureReason:
    """The root cause's reason, most specific evidence first: OOM killer, GPU Xid, a native
    crash, another signal, a communication library's error, a Python exception, the code.

    ``evidence["shim_pid"]``: what died was the rank's shim (torchrun's child, the outer of
    the rank's two processes), and the rank with it: the summary says so."""
    reason = _explain(rank=rank, host=host, code=code, sig=sig, pid=pid, evidence=evidence,
                      stderr=stderr, comm=comm)
    shim = (evidence or {}).get("shim_pid")
    if isinstance(shim, int) and not isinstance(shim, bool):
        return replace(reason, summary=f"{reason.summary}; it hit the rank's shim (pid "
                                       f"{shim}, torchrun's child) and the rank died with it")
    return reason


def _explain(*, rank: int | None, host: str, code: int | None, sig: int | None,
             pid: int | None, evidence: Mapping[str, Any] | None,
             stderr: Sequence[str], comm: Sequence[tuple[str, int | None, str]]
             ) -> FailureReason:
    ev = evidence or {}
    who = f"rank {rank} on {host}" if rank is not None else host
    xids = _xids(ev)
    node_xid = next(((n, dev, line) for n, dev, line in xids if n in NODE_XIDS), None)
    if node_xid is not None:
        n, dev, line = node_xid
        return FailureReason(
            "xid", f"{who}: GPU fault on {host}: Xid {n} ({NODE_XIDS[n]}) on {dev}",
            f"drain {host} and run its GPU diagnostics (nvidia-smi -q, dcgmi diag); rerun "
            f"without it (--exclude {host})", NODE, evidence=(line,), rank=rank, host=host)
    if sig == _signal.SIGKILL:
        oom, said, rss = _oom(pid, ev)
        if oom:
            mem = f" ({rss})" if rss else ""
            return FailureReason(
                "oom", f"{who} was killed by the kernel's OOM killer{mem}",
                "the rank needs more memory than the node (or its cgroup) gives: lower the "
                "batch size, the data loader's workers or prefetch, or use nodes with more "
                "memory", USER, evidence=tuple(said), rank=rank, host=host)
        kernel = ev.get("kernel")
        counted = isinstance(ev.get("oom_kill_before"), int)
        if isinstance(kernel, list) or counted:
            return FailureReason(
                "signal", f"{who} was killed by SIGKILL, not by dtrain and not by the OOM "
                          "killer (no OOM record)",
                "something outside the job killed it: a user's kill -9, a scheduler's "
                f"preemption or a watchdog; look at {host}'s logs (journalctl) around then",
                PROCESS, rank=rank, host=host)
        why = f"the kernel log is not readable: {kernel}" if isinstance(kernel, str) else \
            "no kernel log"
        return FailureReason(
            "signal", f"{who} was killed by SIGKILL, not by dtrain; whether the OOM killer did "
                      f"it cannot be told on {host} ({why}; no memory cgroup counter)",
            f"look at `dmesg` on {host} (as root) for 'Killed process {pid}': the OOM killer, "
            "or something outside the job (a kill -9, a scheduler's preemption)",
            UNKNOWN, rank=rank, host=host)
    if sig in CRASH_SIGNALS:
        fatal, frames = crash_place(str(ev.get("crash") or ""))
        name = _signal.Signals(sig).name
        where = f" in {RankStack(rank or 0, host, main=frames).place()}" if frames else ""
        kernel = ev.get("kernel")
        lib = None
        for line in kernel if isinstance(kernel, list) else []:
            m = _SEGFAULT.search(str(line))
            if m and m.group(1):
                lib = m.group(1)
        native = f" (native code: {lib})" if lib else ""
        tail = [_strip(t) for t in stderr if t.strip()][-1:] if sig == _signal.SIGABRT else []
        shown = tuple(f"  {f.where()}" for f in frames[:8]) + tuple(tail)
        head: tuple[str, ...] = (f"Fatal Python error: {fatal}",) if fatal else ()
        return FailureReason(
            "abort" if sig == _signal.SIGABRT else "segfault",
            f"{who} crashed: {name} ({CRASH_SIGNALS[sig]}){where}{native}",
            "a native extension or library crashed under the Python line shown: check its "
            "build against this torch and CUDA, and reproduce with that rank alone (gdb, or "
            "`python -X faulthandler`)", PROCESS,
            evidence=head + shown,
            details={"frames": [f.where() for f in frames]}, rank=rank, host=host)
    if sig is not None:
        try:
            name = _signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return FailureReason(
            "signal", f"{who} was killed by {name} (not by dtrain)",
            f"another process sent {name}: a scheduler, a user, a watchdog on {host}",
            PROCESS, rank=rank, host=host)
    exc = python_exception(stderr)
    own = [text for h, r, text in comm if (h, r) == (host, rank)]
    dup = next((_strip(t) for t in [*own, *stderr] if _DUPLICATE_GPU.search(t)), None)
    if dup is not None:
        return FailureReason(
            "comm", f"{who}: two ranks on one GPU: {dup[:300]}",
            "NCCL needs a GPU per rank: each rank must call torch.cuda.set_device(LOCAL_RANK) "
            "(or init_process_group(device_id=...)) before its first collective, and a node "
            "needs as many GPUs as ranks (--nproc-per-node gpu)",
            USER, evidence=(dup[:500],), rank=rank, host=host)
    if own:
        line = _strip(own[-1])
        peer = re.search(r"Connection closed by peer|Connection reset by peer", line)
        timeout = re.search(r"Timed out waiting|Watchdog caught collective", line)
        if peer:
            advice = ("a peer rank went away first: its own failure is the cause; if none "
                      "failed, a node or the network dropped it (dtrain doctor, dtrain smoke)")
            scope = UNKNOWN
        elif timeout:
            advice = ("a collective timed out: one rank stopped taking part; set "
                      "--hang-timeout below the collective timeout to see where every rank "
                      "stood")
            scope = UNKNOWN
        else:
            advice = "check the fabric between the nodes (dtrain doctor, dtrain smoke)"
            scope = NODE
        return FailureReason("comm", f"{who}: communication error on {host}: {line[:300]}",
                             advice, scope, evidence=tuple(_strip(t) for t in own),
                             rank=rank, host=host)
    if exc is not None:
        kind, message, frame = exc
        at = f" in {frame}" if frame else ""
        return FailureReason(
            "exception", f"{who} raised {kind}: {message[:300]}{at}",
            f"{exception_advice(kind)}; the whole traceback: dtrain logs --rank {rank}"
            if rank is not None else
            f"{exception_advice(kind)}; the whole output is in the archive", USER,
            evidence=(f"{kind}: {message}"[:500],), rank=rank, host=host)
    last = [_strip(t) for t in stderr if t.strip()][-1:]
    return FailureReason(
        "exit", f"{who} exited {code}" + (f": {last[0][:200]}" if last else ""),
        "its last output says why (dtrain logs" + (f" --rank {rank}" if rank is not None
                                                   else "") + ")",
        UNKNOWN, evidence=tuple(last), rank=rank, host=host)
