"""A run's evidence on the node: every rank's stacks, crash dumps, flight recorder dumps
and NCCL's own log lines, gathered on request and shipped back bounded.

Part of the supervisor program (launcher/nodeside/wire.py ``PROGRAMS``); runs on the nodes,
standard library only, Python >= 3.8. ``Supervisor`` inherits ``Evidence``.
"""

import _thread
import os
import time

if False:  # for mypy only: typing is not imported on the nodes
    from typing import Any  # noqa: F401

from launcher.nodeside.kernlog import (
    _status_kb,
    _uptime,
    kernel_lines,
    memory_events_path,
    oom_kills,
)
from launcher.nodeside.nodecommon import (
    from_json,
    hostname,
    now,
    peer_pid,
    start_time,
    to_json,
    which,
)
from launcher.nodeside.nodemessages import (
    MSG_FLIGHT,
    MSG_NCCL,
    MSG_RANK_RAISED,
    MSG_RANK_START,
    MSG_STACKS,
)
from launcher.nodeside.nodeprocs import (
    signal_pid,
)
from launcher.nodeside.rankshim import (
    FR_PREFIX,
    PTRACER_ENV,
    STACK_SIGNAL,
    flight_defaults,
)

STACK_WAIT_S = 2.0  # how long a dump may take to appear in a worker's file
PYSPY_TIMEOUT_S = 8.0
MAX_DUMP = 256 * 1024  # bytes of one worker's dump shipped back
MAX_CRASH = 64 * 1024
MAX_FLIGHT = 8 * 1024 * 1024  # one flight recorder dump shipped back


# NCCL's own account of the fabric (docs/fabric.md): its INIT and NET lines in one file per
# process in our private directory, only when nobody set NCCL_DEBUG; the lines that tell the
# transport are shipped as ``nccl`` messages (decide/fabric/nccl_account.py reads them)
NCCL_KEEP = (b"NCCL version", b"NET/IB", b"NET/Socket", b"Using network", b" via ",
             b"set by environment", b"Init COMPLETE", b"GPU Direct RDMA", b"NCCL WARN",
             b"Bootstrap")
NCCL_MAX_READ = 256 * 1024  # bytes read from one process's file, in all
NCCL_MAX_LINES = 400  # lines shipped for one process
NCCL_POLL_BYTES = 64 * 1024  # read in one poll, all files together (the rest: next poll)


def nccl_defaults(env, directory):
    """NCCL_DEBUG=INFO, SUBSYS=INIT,NET and a per-process file, unless the user set
    NCCL_DEBUG or NCCL_DEBUG_FILE (theirs wins, and we read nothing)."""
    if env.get("NCCL_DEBUG") or env.get("NCCL_DEBUG_FILE"):
        return {}
    add = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": os.path.join(directory, "nccl.%h.%p.log")}
    if not env.get("NCCL_DEBUG_SUBSYS"):
        add["NCCL_DEBUG_SUBSYS"] = "INIT,NET"
    return add


class NcclFiles:
    """Reads NCCL's per-process files as they grow (bounded: NCCL_MAX_READ per file)."""

    def __init__(self, directory):
        self.dir = directory
        self.files = {}  # name -> [offset, partial line, lines shipped]
        self.more = False  # the last poll spent its budget: there may be more to read

    def poll(self, pids):
        """{pid: [new kept lines]} since the last poll, from the files of ``pids``."""
        out = {}  # type: dict[int, list[str]]
        budget = NCCL_POLL_BYTES  # one poll stays a few ms: the main loop forwards output
        try:
            names = sorted(os.listdir(self.dir))
        except OSError:
            return out
        for name in names:
            if budget <= 0:
                break
            parts = name.split(".")
            if len(parts) < 4 or parts[0] != "nccl" or not parts[-2].isdigit() \
                    or int(parts[-2]) not in pids:
                continue
            st = self.files.setdefault(name, [0, b"", 0])
            if st[0] >= NCCL_MAX_READ:
                continue
            try:
                with open(os.path.join(self.dir, name), "rb") as f:
                    f.seek(st[0])
                    data = f.read(min(budget, NCCL_MAX_READ - st[0]))
            except OSError:
                continue
            budget -= len(data)
            if not data:
                continue
            st[0] += len(data)
            lines = (st[1] + data).split(b"\n")
            st[1] = lines.pop()
            keep = [ln.decode("utf-8", "replace")[:600] for ln in lines
                    if any(w in ln for w in NCCL_KEEP)][:max(0, NCCL_MAX_LINES - st[2])]
            st[2] += len(keep)
            if keep:
                out.setdefault(int(parts[-2]), []).extend(keep)
        self.more = budget <= 0
        return out


def _read_from(path, offset, limit):
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(limit).decode("utf-8", "replace")
    except (OSError, TypeError):
        return ""


def _b64(path, limit=MAX_FLIGHT):
    """A file's bytes as base64 text (for a JSON message), or None."""
    import base64

    try:
        with open(path, "rb") as f:
            return base64.b64encode(f.read(limit)).decode()
    except OSError:
        return None


def _mtime(path):
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def _size(path):
    try:
        return os.stat(path).st_size
    except (OSError, TypeError):
        return 0


def frame_sources(text, limit=400):
    """``{"path:line": source line}`` for the two innermost frames of each thread of a
    faulthandler dump, read on the node (the launcher may not see these files)."""
    import linecache

    out = {}  # type: dict[str, str]
    depth = 0
    for line in text.splitlines():
        if not line.startswith("  File "):
            depth = 0
            continue
        depth += 1
        if depth > 2 or len(out) >= limit:
            continue
        # the last separator: a path may hold '", line ' (a name never holds a quote)
        head, sep, rest = line.rpartition('", line ')
        if not sep:
            continue
        path = head[len('  File "'):]
        number = rest.split(" ", 1)[0]
        if number.isdigit() and path + ":" + number not in out:
            out[path + ":" + number] = linecache.getline(path, int(number)).strip()[:200]
    return out


class Evidence:
    """The supervisor's half of stacks and death evidence: a part of each ``Supervisor``
    (``sup.evidence``), holding its own state (the armed ranks, the flight dumps shipped,
    py-spy, NCCL's files, the agent's start) and reading the supervisor's spec, private
    directory, frame writer and rank results through ``sup``."""

    def __init__(self, sup):
        self.sup = sup
        self.armed = {}  # rank -> what its wrapper reported (pid, stack file, signal ...)
        self.boot_start = None  # type: Any  # the job's start in kernel-log time (s since boot)
        self.pyspy = None  # type: Any  # its path, where the node has it (run mode)
        self.fr_shipped = {}  # rank -> mtime of the flight dump a stacks message carried
        self.nccl = None  # NcclFiles (run mode, when NCCL's account was asked for)
        self.agent_t = None  # torchrun's agent up (the start-up split)
        self._kmsg = None  # (when, the kernel's lines since the job's start) read last

    def evidence_env(self, env):
        """Run mode: the flight recorder's defaults and, where py-spy can only read our
        ranks through PR_SET_PTRACER (Yama ptrace_scope 1), the pid to allow."""
        self.boot_start = _uptime()
        self.pyspy = which("py-spy", env.get("PATH"))
        flight = os.path.join(self.sup.tmpdir, "flight")
        os.mkdir(flight, 0o700)
        if self.sup.spec.get("flight_recorder"):
            env.update(flight_defaults(env, flight, self.sup.spec["flight_recorder"]))
        if self.sup.spec.get("nccl_account"):
            nccl = os.path.join(self.sup.tmpdir, "nccl")
            os.mkdir(nccl, 0o700)
            added = nccl_defaults(env, nccl)
            env.update(added)
            self.nccl = NcclFiles(nccl) if added else None
        if self.pyspy:
            try:
                with open("/proc/sys/kernel/yama/ptrace_scope") as f:
                    if f.read().strip() == "1":
                        env[PTRACER_ENV] = str(os.getpid())
            except OSError:
                pass

    def ship_nccl(self):
        """NCCL's new lines, one ``nccl`` message per rank (a pid no rank armed: skipped)."""
        if self.nccl is None:
            return
        pids = {info["pid"]: rank for rank, info in self.armed.items()}
        for pid, lines in sorted(self.nccl.poll(pids).items()):
            if pid in pids:
                self.sup.out.control({"type": MSG_NCCL, "rank": pids[pid], "lines": lines,
                                  "t": now()})

    def rank_started(self, hdr):
        """A rank's shim is up (its status connection): the hang watch counts the ranks
        alive only once every one has started (a slow start is not a hang)."""
        try:
            msg = {"type": MSG_RANK_START, "rank": int(hdr.get("rank", -1)), "t": now()}
        except (TypeError, ValueError):
            return
        agent = self.agent_t
        if agent is not None:  # torchrun's agent was up then (the start-up split)
            msg["agent_t"] = agent
        self.sup.out.control(msg)

    def rank_armed(self, hdr, sock):
        if hdr.get("stream") == "agent":  # torchrun's agent imported (rankshim's line)
            t = hdr.get("t")
            if isinstance(t, (int, float)) and self.agent_t is None:
                self.agent_t = float(t)
            return
        try:
            rank, pid = int(hdr["rank"]), int(hdr["pid"])
        except (KeyError, TypeError, ValueError):
            return
        pid = peer_pid(sock, pid)  # the kernel's word: a rank in a container claims its own
        events = memory_events_path(pid)
        self.armed[rank] = {
            "pid": pid, "start": start_time(pid), "stacks": hdr.get("stacks"),
            "crash": hdr.get("crash"), "signal": int(hdr.get("signal") or STACK_SIGNAL),
            "sock": sock, "buf": b"", "replies": [], "events": events,
            "oom_before": oom_kills(_read_from(events, 0, 4096)) if events else None,
            "mem": _status_kb(pid),
            "t": hdr.get("t") if isinstance(hdr.get("t"), (int, float)) else None,
        }
        self.sup.open_streams -= 1  # not output: the job's end does not wait for it

    def arm_reply(self, rank, chunk):
        info = self.armed.get(rank)
        if info is None:
            return
        info["buf"] += chunk
        while b"\n" in info["buf"]:
            line, info["buf"] = info["buf"].split(b"\n", 1)
            try:
                reply = from_json(line)
            except ValueError:
                continue
            if isinstance(reply, dict) and reply.get("op") == "raised":
                # unasked: the rank is failing of its own (rankshim._tell_raised), told
                # once, at once (the launcher holds a peer's abort for it)
                if not info.get("raised"):
                    info["raised"] = True
                    self.sup.out.control({"type": MSG_RANK_RAISED, "rank": rank,
                                      "exc": str(reply.get("exc"))[:120], "t": now()})
                continue
            info["replies"].append(reply)

    def sample_ranks(self):
        """Each armed rank's memory, at the heartbeat: the last value is what it had when
        it died (read only while it lives)."""
        for rank, info in list(self.armed.items()):
            if str(rank) not in self.sup.rank_status:
                mem = _status_kb(info["pid"])
                if mem:
                    info["mem"] = dict(mem, t=now())
                    events = memory_events_path(info["pid"])  # moved to another cgroup?
                    if events != info["events"]:
                        info["events"] = events
                        info["oom_before"] = oom_kills(_read_from(events, 0, 4096)) \
                            if events else None

    def stacks_requested(self, msg):
        _thread.start_new_thread(self.collect_stacks, (msg,))

    def collect_stacks(self, msg):
        """Every live armed rank's stacks (faulthandler, py-spy where the node has it, the
        flight recorder when asked), as one ``stacks`` message. Runs in its own thread."""
        try:
            self._collect_stacks(msg)
        except Exception as exc:  # never the supervisor's end
            self.sup.out.control({"type": MSG_STACKS, "id": msg.get("id"), "ranks": {},
                              "error": repr(exc), "host": hostname(), "t": now()})

    def _collect_stacks(self, msg):
        t0 = now()
        ranks, waiting = {}, {}
        want_fr = bool(msg.get("fr")) and self.sup.tmpdir is not None
        for rank, info in sorted(self.armed.items()):
            if str(rank) in self.sup.rank_status:
                continue  # exited: its exit report tells the rest
            before = _size(info["stacks"])
            if not signal_pid(info["pid"], info["start"], info["signal"]):
                ranks[str(rank)] = {"pid": info["pid"], "error": "exited"}
                continue
            waiting[rank] = before
            if want_fr:
                info["replies"] = []
                path = os.path.join(self.sup.tmpdir, "flight", FR_PREFIX + str(rank))
                try:
                    info["sock"].sendall(to_json({"op": "fr", "path": path}).encode() + b"\n")
                except OSError:
                    pass
        spies = self._start_pyspy(waiting) if msg.get("pyspy", True) and self.pyspy else {}
        seen = {}  # type: dict[int, int]
        deadline = t0 + float(msg.get("wait") or STACK_WAIT_S)
        while waiting and now() < deadline:
            time.sleep(0.02)
            for rank in list(waiting):
                size = _size(self.armed[rank]["stacks"])
                if size > waiting[rank] and seen.get(rank) == size:
                    text = _read_from(self.armed[rank]["stacks"], waiting[rank], MAX_DUMP)
                    ranks[str(rank)] = {"pid": self.armed[rank]["pid"], "text": text,
                                        "sources": frame_sources(text)}
                    del waiting[rank]
                seen[rank] = size
        for rank in waiting:
            ranks[str(rank)] = {"pid": self.armed[rank]["pid"],
                                "error": "no dump within %g s" % (deadline - t0)}
        if want_fr:
            fr_deadline = now() + 2.0
            while now() < fr_deadline and any(
                    not self.armed[int(r)]["replies"] for r, e in ranks.items() if "text" in e):
                time.sleep(0.02)
            for r, e in ranks.items():
                replies = self.armed[int(r)]["replies"]
                e["fr"] = replies[-1] if replies else {"error": "no answer"}
                if e["fr"].get("ok"):
                    self.fr_shipped[r] = _mtime(os.path.join(self.sup.tmpdir, "flight",
                                                             FR_PREFIX + r))
                    e["fr"]["data"] = _b64(os.path.join(self.sup.tmpdir, "flight",
                                                        FR_PREFIX + r))
        self.sup.out.control({"type": MSG_STACKS, "id": msg.get("id"), "ranks": ranks,
                          "host": hostname(), "t": now(), "took": now() - t0,
                          "pyspy": bool(spies)})
        if spies:  # native frames follow: the fold does not wait for py-spy
            native = {}
            for rank, proc in spies.items():
                native[str(rank)] = {"pyspy": self._pyspy_result(proc, t0 + PYSPY_TIMEOUT_S)}
            self.sup.out.control({"type": MSG_STACKS, "id": msg.get("id"), "native": True,
                              "ranks": native, "host": hostname(), "t": now(),
                              "took": now() - t0})

    def _start_pyspy(self, ranks):
        import subprocess

        procs = {}
        for rank in ranks:
            try:
                procs[rank] = subprocess.Popen(
                    [self.pyspy, "dump", "--native", "--pid", str(self.armed[rank]["pid"])],
                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT)
            except OSError:
                pass
        return procs

    def _pyspy_result(self, proc, deadline):
        import subprocess

        try:
            out, _ = proc.communicate(timeout=max(0.1, deadline - now()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return {"error": "py-spy did not answer within %g s" % PYSPY_TIMEOUT_S}
        text = out.decode("utf-8", "replace")[:MAX_DUMP]
        return {"text": text} if proc.returncode == 0 else {
            "error": "py-spy exited %s" % proc.returncode, "text": text}

    def ship_flight(self):
        """Flight recorder dumps the ranks left (NCCL's dump on timeout), before the private
        directory goes: one ``flight`` message."""
        if not self.sup.tmpdir:
            return
        folder = os.path.join(self.sup.tmpdir, "flight")
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            return
        files = {}
        for name in names:
            rank = name[len(FR_PREFIX):]
            if name.startswith(FR_PREFIX) and rank.isdigit() and \
                    self.fr_shipped.get(rank) != _mtime(os.path.join(folder, name)):
                files[rank] = _b64(os.path.join(folder, name))
        if files:
            self.sup.out.control({"type": MSG_FLIGHT, "files": files, "host": hostname(),
                              "t": now()})

    def death_evidence(self, rank, msg):
        """What the node knows about a rank that did not exit 0: its faulthandler crash
        dump, its last memory, the cgroup OOM counter, the kernel log's OOM/Xid lines.
        Every exit report gets the rank's hand-over to its script (``script_t``, the arm's
        time: the start-up split, docs/goodput.md)."""
        info = self.armed.get(rank) or {}
        if info.get("t") is not None:
            msg["script_t"] = info["t"]
        if msg.get("code") in (0, None):
            return None
        evidence = {}
        crash = _read_from(info.get("crash"), 0, MAX_CRASH)
        if crash.strip():
            evidence["crash"] = crash
        if info.get("mem"):
            evidence["memory"] = info["mem"]
        if info.get("events"):
            evidence["memory_events"] = _read_from(info["events"], 0, 4096)
            evidence["oom_kill_before"] = info.get("oom_before")
        if self.boot_start is not None:
            cached = self._kmsg
            if cached is None or now() - cached[0] > 1.0:
                cached = self._kmsg = (now(), kernel_lines(self.boot_start))
            evidence["kernel"] = cached[1]
        return evidence
