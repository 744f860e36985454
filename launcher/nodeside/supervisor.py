"""dtrain node supervisor: THIS PROGRAM RUNS ON THE NODES, not on the login node.

Standard library only, Python >= 3.8. The launcher ships this file over the SSH channel
(see wire.py beside it: a length line, this source, then the job spec: marshal data after
a b"M", or JSON); nothing is installed on the nodes and no secret travels on a command line.

Start-up is paid by every node at every command, so the exec path imports only what is
built in or tiny (os, sys, select, struct, time, marshal, _thread, _signal, _json, _ctypes):
it forks and execs the job itself (``spawn``), polls with select.poll, writes JSON with
``to_json`` and decodes control lines with json only when one arrives. subprocess, json,
socket, tempfile and shutil are imported by run mode, the rank shim or a control line.
tests/test_supervisor_lean.py pins that import set; see launcher/nodeside/README.md.

Why it exists: OpenSSH ignores channel signals for root logins before 9.8, and a process
without a pty outlives its connection. So the supervisor owns the job:

- it becomes a child subreaper and starts the job in its own session, so every descendant
  (torchrun starts each worker in a session of its own) stays findable under our pid;
- it kills the whole descendant tree (TERM, grace, KILL) when told to (``stop``/``kill``),
  when its stdin reaches EOF (launcher or connection gone), on SIGTERM/SIGHUP/SIGINT, or when
  the launcher's heartbeats stop for ``launcher_timeout`` seconds (a partition TCP misses;
  three times the launcher's own ``heartbeat_timeout``, so a stalled launcher is waited for);
- it never kills by name: only processes descending from itself, each checked by pid AND
  start time (a pidfd where the kernel has them), so a recycled pid is never signalled;
- in ``run`` mode, once a stop is under way and every rank on the node has exited, what is
  left is torchrun's agent, which has nothing to save but its last log lines (its "Received
  15 death signal" and "Closing process" chatter): it gets ``agent_grace`` seconds (3) to exit
  by itself (it normally does in well under a second), then a TERM where it had none from us,
  then the KILL one second later, rather than the whole grace period, which is for the ranks.
  Whatever it printed meanwhile is drained to the launcher as any output is.

Threads: the main loop is the only writer of stdout (frames); a reader thread takes the
launcher's control lines from stdin (so a stdout write blocked by a slow or partitioned
launcher never delays a ``stop`` or the heartbeat bookkeeping); a watchdog thread enforces
the heartbeat timeout and the KILL deadline and, once the launcher is gone and the job tree
is empty, ends the supervisor even if the main loop is stuck writing to a dead channel.

Output goes to stdout as frames: ``struct "!BiI"`` (kind, rank, length) + payload, where kind
1 = job stdout bytes, 2 = job stderr bytes, 3 = a JSON control message. rank is the global
rank (-1 for the node-level program). Ranks are attributed at the source: in ``run`` mode the
job's workers are started through this same file in *shim* mode, which connects each rank's
stdout/stderr straight to the supervisor over a unix socket and reports its exit status.
"""

# signal.py only wraps _signal in enums, and importing enum costs ~3.5 ms of CPU per node
import _signal as signal  # type: ignore[import-not-found]  # (no stub: typeshed lacks it)
import _thread
import os
import select
import sys
import time

if False:  # for mypy only: typing is not imported on the nodes
    from typing import Any  # noqa: F401

from launcher.nodeside.nodecommon import (
    CHUNK,
    ERR,
    MAGIC,
    OUT,
    PROTOCOL,
    Writer,
    _stat_fields,
    from_json,
    hostname,
    load_spec,
    now,
    peer_pid,
    start_time,
)
from launcher.nodeside.nodecontainer import (
    Container,
)
from launcher.nodeside.nodeevidence import (
    Evidence,
)
from launcher.nodeside.nodemessages import MSG_EXIT, MSG_HB, MSG_HELLO, MSG_RANK_EXIT, MSG_STOPPING
from launcher.nodeside.nodeprocs import (
    TEARDOWN_SIGNALS,
    cmdline,
    descendants,
    exit_code,
    set_subreaper,
    signal_tree,
    start_error,
    zombie_status,
)
from launcher.nodeside.nodesession import session_main
from launcher.nodeside.nodetitle import set_title
from launcher.nodeside.rankshim import (
    ARM_ENV,
    RANK_TITLE,
    SHIM_ENV,
    TMPDIR_ENV,
    job_argv,
    rank_main,
    shim_main,
)
from launcher.nodeside.warm import ROLE_AGENT, WARM_FD_ENV, forked, warm_main
from launcher.nodeside.warmclient import WarmStart, agent_main

# run mode, during a stop: how long torchrun's agent may take to exit by itself once every
# rank has exited (it normally needs well under a second; its last log lines come then)
AGENT_GRACE = 3.0
# run mode, no stop under way, every rank here ended: a job root (torchrun) stopped this long
# (state T: SIGSTOP/SIGTSTP from someone) can never end; the supervisor stops the job and
# says so in these words (decide/outcome/failures.py agent_stopped reads them: the verdict's hang)
AGENT_STOPPED_S = 5.0
AGENT_STOPPED_REASON = "torchrun stopped (state T) for %d s after its ranks ended"
# why a supervisor stopped its job when the launcher went silent (decide/outcome/failures.py
# launcher_silent reads it back: the verdict is a lost node, exit 255)
LAUNCHER_SILENT_REASON = "no heartbeat from the launcher for %g s"


class Supervisor:
    """Runs one job, forwards its output as frames, and guarantees its teardown."""

    def __init__(self, spec, source):
        self.spec = spec
        self.source = source
        self.out = Writer(sys.stdout.fileno())
        self.poll = select.poll()
        self.watched = {}  # fd -> (kind, data, socket or None): what the main loop reads
        self.grace = float(spec.get("grace", 10))
        # how long without a line from the launcher before the job is torn down as orphaned:
        # the launcher sends more than its own --heartbeat-timeout (decide/outcome/liveness.py)
        self.hb_timeout = float(spec.get("launcher_timeout", spec.get("heartbeat_timeout", 30)))
        self.hb_interval = float(spec.get("heartbeat_interval", 2))
        self.last_hb = now()
        self.job = None  # its pid
        self.job_status = None  # raw wait status
        self.kill_at = None  # when set, KILL the tree at this time
        # every process this supervisor has sent SIGTERM, as (pid, start time): a stop is
        # one TERM per process however many times it is asked for (stop, then stdin EOF,
        # then SIGHUP ...); what follows is the KILL at the deadline
        self.termed = set()
        self.shim_path = None  # run mode: the rank shim's path (its argv names it)
        self.stopping = None  # reason
        self.stopping_sent = False
        self.orphaned = None  # why the launcher is gone (stdin EOF, heartbeat lost)
        self.rank_status = {}
        self.ctl_open = 0  # rank shims whose status connection is open
        self.ctl_seen = False
        # run mode, during a stop: when every rank had exited (the agent's grace runs from
        # there), and whether its TERM has gone out
        self.agent_grace = float(spec.get("agent_grace", AGENT_GRACE))
        self.ranks_gone_at = None
        self.agent_termed = False
        self.frozen_since = None  # when the job's root was first seen stopped (agent_frozen)
        self.frozen_check = 0.0
        self.open_streams = 0
        self.tmpdir = None  # type: Any  # (run mode: our private directory, mkdtemp)
        self.container = None  # --image: the runtime around the job (Container)
        self.sparing = False  # removing the container: no KILLs into our tree from now on
        self.start_code = 127  # the shell's code for a job that could not start
        self.done = False
        self.subreaper = False
        self.childless = False  # the last reap found no child at all
        self.evidence = Evidence(self)  # stacks, flight dumps, why a rank died (nodeevidence)
        self.warm = WarmStart(self)  # the warm process and the forked agent (warmclient)
        # re-entrant: a signal handler runs teardown on the main thread, maybe inside it
        self.lock = _thread.RLock()

    def watch(self, fd, kind, data, sock=None):
        self.watched[fd] = (kind, data, sock)
        self.poll.register(fd, select.POLLIN)

    def unwatch(self, fd):
        self.poll.unregister(fd)
        del self.watched[fd]

    # -- teardown ---------------------------------------------------------------------------
    def teardown(self, reason, grace=None):
        """TERM the tree now and schedule KILL after the grace period (idempotent).

        Never writes to stdout (any thread, or a signal handler, may call it): the main
        loop reports the stop; a blocked stdout must not delay a kill.
        """
        with self.lock:
            if grace is None:
                grace = self.grace
            grace = max(0.0, float(grace))
            if self.stopping is None:
                self.stopping = reason
            deadline = now() + grace
            if self.kill_at is None or deadline < self.kill_at:
                self.kill_at = deadline
            if grace > 0:
                self.term_tree()
        if self.container is not None:
            self.container.stop(grace)  # by name: a runtime's daemon is not in our tree
        if grace <= 0:
            if not self.sparing:  # our own runtime commands (container removal) live
                signal_tree(signal.SIGKILL)

    def term_tree(self):
        """SIGTERM every process of the tree that has not had one from us yet, except the
        ranks: each rank's shim forwards the first stop signal it gets (ours, or torchrun's
        killpg) to its rank and no other, so a rank sees exactly one TERM per stop."""
        with self.lock:
            return signal_tree(signal.SIGTERM, self.warm.pruned, self.termed)

    def is_shim(self, pid):
        """A rank shim (torchrun's worker: ``python -u <our dir>/dtrain_shim.py ...``)."""
        argv = cmdline(pid)
        if argv and argv[0].startswith(RANK_TITLE):  # its title (set_title)
            return b" shim: " in argv[0]
        return self.shim_path is not None and self.shim_path in argv[:3]

    def launcher_gone(self, why, grace=None):
        self.orphaned = self.orphaned or why
        self.teardown(why, grace)

    def watchdog(self):
        """Independent of the main loop: a blocked stdout write must not stop the kill."""
        empty_since = None
        while not self.done:  # (a node session's next attempt has a watchdog of its own)
            time.sleep(0.1)
            if self.hb_timeout > 0 and self.orphaned is None \
                    and now() - self.last_hb > self.hb_timeout:
                self.launcher_gone(LAUNCHER_SILENT_REASON % self.hb_timeout,
                                   grace=min(self.grace, 5.0))
            kill_at = self.kill_at
            if kill_at is not None and now() >= kill_at:
                if not self.sparing:  # our own runtime commands (container removal) live
                    signal_tree(signal.SIGKILL)
            if self.orphaned is not None and not self.done:
                # nobody reads our frames any more: once the job tree is gone, give the main
                # loop a moment to finish, then leave even if it is stuck on a dead channel
                if descendants(os.getpid()):
                    empty_since = None
                elif empty_since is None:
                    empty_since = now()
                elif now() - empty_since > 3.0:
                    self.cleanup_files()
                    os._exit(self.exit_code()[0] if self.job_status is not None else 255)

    def read_stdin(self):
        """Control lines from the launcher; EOF means it is gone (or dropped us)."""
        buf = b""
        while True:
            try:
                chunk = os.read(0, CHUNK)
            except InterruptedError:
                continue
            except BlockingIOError:  # a non-blocking stdin: wait for it instead
                select.select([0], [], [], 1.0)
                continue
            except OSError:
                chunk = b""
            if not chunk or self.done:
                if not self.done:
                    self.launcher_gone("launcher connection closed (stdin EOF)")
                return
            buf += chunk
            while b"\n" in buf and not self.done:  # (after it, the next attempt's stdin)
                line, buf = buf.split(b"\n", 1)
                self.on_control_line(line)

    # -- job --------------------------------------------------------------------------------
    def start(self):
        env = dict(os.environ)
        env.update(self.spec.get("env") or {})
        ctr = self.spec.get("container")
        if self.spec.get("rank_shim") or ctr:
            import tempfile  # only run mode needs it: exec's start-up stays lean

            self.tmpdir = tempfile.mkdtemp(prefix="dtrain-")
        if self.spec.get("rank_shim"):
            with open(os.path.join(self.tmpdir, "dtrain_shim.py"), "wb") as f:
                f.write(self.source)
            for name, text in sorted((self.spec.get("files") or {}).items()):
                # plain names only: the files live in our private directory and nowhere else
                if os.path.basename(name) != name or name in ("", ".", "..", "ranks.sock",
                                                              "dtrain_shim.py"):
                    raise ValueError("bad file name in the job spec: %r" % (name,))
                with open(os.path.join(self.tmpdir, name), "w") as f:
                    f.write(text)
            path = os.path.join(self.tmpdir, "ranks.sock")
            import socket  # run mode only, as tempfile

            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(path)
            listener.listen(256)
            listener.setblocking(False)
            self.watch(listener.fileno(), "listen", None, listener)
            env[SHIM_ENV] = path
            # TORCH_ELASTIC_SHUTDOWN_TIMEOUT (past the grace) comes in the spec's env: the
            # launcher's plan decides it (decide/runplan/plan.shutdown_timeout), --dry-run shows it
            self.evidence.evidence_env(env)
            env[TMPDIR_ENV] = env.get("TMPDIR", "")
            env["TMPDIR"] = self.tmpdir
        argv, self.shim_path = job_argv(self.spec, self.tmpdir)
        self.warm.start(env, argv)  # when the spec asks (warm.py): before torchrun, beside it
        try:
            if ctr:
                self.container = Container(ctr, self.tmpdir, self.grace)
                argv = self.container.argv(env, argv)
            self.job, out_fd, err_fd = self.warm.spawn_job(argv, env, ctr)
        except OSError as exc:
            error, self.start_code = start_error(argv[0], exc)
            self.out.control({"type": MSG_HELLO, "v": PROTOCOL, "error": error,
                              "code": self.start_code, "hostname": hostname()})
            return False
        for fd, kind in ((out_fd, OUT), (err_fd, ERR)):
            os.set_blocking(fd, False)
            self.watch(fd, "pipe", (kind, -1))
            self.open_streams += 1
        self.out.control({
            "type": MSG_HELLO, "v": PROTOCOL, "pid": self.job, "pgid": self.job,
            "supervisor_pid": os.getpid(), "hostname": hostname(), "t": now(),
        })
        return True

    def reap(self):
        """Reap every exited child (we are a subreaper); remember the job's own status."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                self.childless = True
                return
            if pid == 0:
                self.childless = False
                return
            if pid == self.job and self.warm.handoff is None:
                self.job_status = status
            else:  # a forked agent's starter (or the agent, ended before it): warmclient.py
                self.warm.reaped_other(pid, status)

    # -- main loop --------------------------------------------------------------------------
    def on_control_line(self, line):
        try:
            msg = from_json(line)
        except ValueError:
            return
        op = msg.get("op")
        if op == "hb":
            self.last_hb = now()
        elif op == "stop":
            self.teardown(msg.get("reason") or "stopped by dtrain", msg.get("grace"))
        elif op == "kill":
            self.teardown(msg.get("reason") or "killed by dtrain", 0)
        elif op == "signal":
            try:
                signal_tree(int(msg["sig"]))
            except (KeyError, TypeError, ValueError):
                pass
        elif op == "stacks":
            self.evidence.stacks_requested(msg)

    def handle(self, fd):
        kind, data, sock = self.watched[fd]
        if kind == "listen":
            conn, _ = sock.accept()
            conn.setblocking(False)
            self.open_streams += 1
            self.watch(conn.fileno(), "shim", {"buf": b"", "hdr": None}, conn)
        elif kind == "pipe":
            try:
                chunk = os.read(fd, CHUNK)
            except BlockingIOError:
                return
            if chunk:
                self.out.frame(data[0], data[1], chunk)
            else:
                self.unwatch(fd)
                os.close(fd)
                self.open_streams -= 1
        elif kind == "shim":
            self.on_shim(fd, sock, data)

    def on_shim(self, fd, sock, st):
        """One rank connection: a JSON header line, then raw bytes (out/err) or status (ctl)."""
        try:
            chunk = sock.recv(CHUNK)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.unwatch(fd)
            sock.close()
            if st["hdr"] is None or st["hdr"].get("stream") != "arm":
                self.open_streams -= 1  # (an arm stream stopped counting when it armed)
            if st["hdr"] is not None and st["hdr"].get("stream") == "ctl":
                self.ctl_open -= 1
                if not st.get("reported") and self.stopping is None:
                    self.shim_died(st)
            return
        if st["hdr"] is None:
            st["buf"] += chunk
            if b"\n" not in st["buf"]:
                return
            line, chunk = st["buf"].split(b"\n", 1)
            st["buf"] = b""
            try:
                st["hdr"] = from_json(line)
            except ValueError:
                st["hdr"] = {}
            if st["hdr"].get("stream") == "ctl":  # type: ignore[attr-defined]
                self.ctl_open += 1
                self.ctl_seen = True
                st["t0"] = now()
                pid = st["hdr"].get("pid")  # type: ignore[attr-defined]
                if type(pid) is int and pid > 0:
                    pid = st["hdr"]["pid"] = peer_pid(sock, pid)  # type: ignore[index]
                st["start"] = start_time(pid) if type(pid) is int and pid > 0 else None
                self.evidence.rank_started(st["hdr"])
            if st["hdr"].get("stream") in ("arm", "agent"):  # type: ignore[attr-defined]
                self.evidence.rank_armed(st["hdr"], sock)
            if not chunk:
                return
        rank = int(st["hdr"].get("rank", -1))
        stream = st["hdr"].get("stream")
        if stream == "arm":
            self.evidence.arm_reply(rank, chunk)
            return
        if stream == "ctl":
            st["buf"] += chunk
            while b"\n" in st["buf"]:
                line, st["buf"] = st["buf"].split(b"\n", 1)
                try:
                    msg = from_json(line)
                except ValueError:
                    continue
                st["reported"] = True
                msg.update({"type": MSG_RANK_EXIT, "rank": rank})
                evidence = self.evidence.death_evidence(rank, msg)
                self.rank_status[str(rank)] = msg
                if evidence:
                    msg = dict(msg, evidence=evidence)  # the exit report stays small
                self.out.control(msg)
        else:
            self.out.frame(OUT if stream == "out" else ERR, rank, chunk)

    def shim_died(self, st):
        """A rank's status connection closed without its exit report: the rank shim itself
        died (a kill -9 or the OOM killer hit the outer process, torchrun's child, not the
        rank), and the rank died with it (PR_SET_PDEATHSIG). Reported as the rank's exit,
        with the shim's own status, read from its zombie before torchrun reaps it (torchrun
        polls every 0.1 s); when torchrun was first, as the SIGKILL the rank got."""
        hdr = st["hdr"]
        try:
            rank, pid = int(hdr.get("rank", -1)), int(hdr["pid"])
        except (KeyError, TypeError, ValueError):
            return
        status = zombie_status(pid, st.get("start")) if st.get("start") is not None else None
        if status is None:
            code, sig = 128 + signal.SIGKILL, signal.SIGKILL
        else:
            code, sig = exit_code(status)
        msg = {"code": code, "signal": sig, "t": now(),
               "duration": now() - st.get("t0", now()), "pid": pid,
               "shim": {"pid": pid, "status": "known" if status is not None else "reaped"},
               "type": MSG_RANK_EXIT, "rank": rank}
        evidence = self.evidence.death_evidence(rank, msg)
        self.rank_status[str(rank)] = msg
        if evidence:
            msg = dict(msg, evidence=dict(evidence, shim_pid=pid))
        self.out.control(msg)

    def on_signal(self, signum, frame):
        self.teardown("supervisor got signal %d" % signum)

    def title(self):
        """``dtrain supervisor RUN node1`` (run mode), ``dtrain supervisor exec node1``."""
        run_id = (self.spec.get("env") or {}).get("DTRAIN_RUN_ID")
        what = run_id if self.spec.get("rank_shim") and run_id else "exec"
        return "dtrain supervisor %s %s" % (what, hostname())

    def run(self):
        os.write(self.out.fd, MAGIC)
        self.subreaper = set_subreaper()
        for sig in TEARDOWN_SIGNALS:
            signal.signal(sig, self.on_signal)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        if not self.start():
            return self.start_code
        for target in (self.read_stdin, self.watchdog):
            _thread.start_new_thread(target, ())  # never joined: as daemon threads
        next_hb = now() + self.hb_interval
        next_nccl = now() + 0.5
        drain_until = None
        tree_empty = False
        while True:
            for fd, _ in self.poll.poll(50):
                if fd in self.watched:
                    try:
                        self.handle(fd)
                    except OSError:
                        pass
            self.reap()
            if self.stopping is not None and not self.stopping_sent:
                self.stopping_sent = True
                self.out.control({"type": MSG_STOPPING, "reason": self.stopping, "t": now()})
            if self.stopping is not None and self.ctl_seen and self.ctl_open <= 0 \
                    and self.job_status is None:
                self.agent_left()
            elif self.stopping is None and self.ctl_seen and self.ctl_open <= 0 \
                    and self.job_status is None and self.job is not None:
                self.agent_frozen()
            if self.evidence.nccl is not None and now() >= next_nccl:
                self.evidence.ship_nccl()
                next_nccl = now() + 0.5
            if now() >= next_hb:
                self.evidence.sample_ranks()
                self.out.control({"type": MSG_HB, "t": now()})
                next_hb = now() + self.hb_interval
            if self.job_status is not None:
                if drain_until is None:
                    # the job is over: nothing of it may outlive it (background children too)
                    drain_until = now() + 2.0
                    # an empty tree cannot grow again (nobody is left to fork): remember it,
                    # and spare the final /proc scans (each reads every process's stat).
                    # A subreaper without children has no descendants at all (an orphan
                    # is reparented to us), so then not even one scan is needed.
                    tree_empty = (self.subreaper and self.childless) \
                        or not descendants(os.getpid())
                    if not tree_empty:
                        self.teardown_leftovers()
                if self.open_streams <= 0 or now() >= drain_until:
                    break
        self.drain_pipes()
        if not tree_empty:
            self.kill_all()
        return self.finish()

    def agent_left(self):
        """Every rank has exited during a stop: only the agent is left. It has nothing to save
        but its last log lines, so it does not get the ranks' grace: ``agent_grace`` seconds to
        exit by itself, then a TERM (to whatever has had none from us), then the KILL 1 s on."""
        t = now()
        if self.ranks_gone_at is None:
            self.ranks_gone_at = t
        if not self.agent_termed and t - self.ranks_gone_at >= self.agent_grace:
            self.agent_termed = True
            self.term_tree()
            with self.lock:
                if self.kill_at is None or t + 1.0 < self.kill_at:
                    self.kill_at = t + 1.0

    def agent_frozen(self):
        """Every rank here has ended and no stop is under way, but the job's root (torchrun)
        is still there. Stopped (state T: a SIGSTOP or SIGTSTP from someone else) it can
        never end, and the run would wait for ``--timeout``: after ``AGENT_STOPPED_S`` in
        that state the supervisor stops the job itself, saying why, and continues the root
        so that it takes the TERM. (A torchrun waiting in its exit barrier sleeps: state S.)"""
        t = now()
        if t < self.frozen_check:
            return
        self.frozen_check = t + 0.5
        fields = _stat_fields(self.job)
        if not fields or fields[0] != b"T":
            self.frozen_since = None
            return
        if self.frozen_since is None:
            self.frozen_since = t
        elif t - self.frozen_since >= AGENT_STOPPED_S:
            self.teardown(AGENT_STOPPED_REASON % round(t - self.frozen_since), self.agent_grace)
            job = self.job
            try:  # our own unreaped child: its pid cannot have been reused
                if job:
                    os.kill(job, signal.SIGCONT)
            except OSError:
                pass

    def teardown_leftovers(self):
        self.term_tree()
        with self.lock:
            if self.kill_at is None:
                self.kill_at = now() + 1.0

    def kill_all(self, wait=1.0):
        """KILL whatever is left of the tree and wait (briefly) until it is really gone."""
        deadline = now() + wait
        while True:
            if not self.sparing:  # our own runtime commands (container removal) live
                signal_tree(signal.SIGKILL)
            self.reap()
            if not descendants(os.getpid()) or now() >= deadline:
                return
            time.sleep(0.01)

    def drain_pipes(self):
        for fd, (kind, data, _) in list(self.watched.items()):
            if kind == "pipe":
                try:
                    chunk = os.read(fd, CHUNK)
                    while chunk:
                        self.out.frame(data[0], data[1], chunk)
                        chunk = os.read(fd, CHUNK)
                except OSError:
                    pass

    def exit_code(self):
        """(code, signal) of the job: its exit status, or 128+N when killed by signal N."""
        return exit_code(self.job_status or 0)

    def finish(self):
        self.evidence.ship_flight()
        self.evidence.ship_nccl()
        for _ in range(64):  # the rest of what a bounded poll left (at most 4 MiB)
            if self.evidence.nccl is None or not self.evidence.nccl.more:
                break
            self.evidence.ship_nccl()
        code, sig = self.exit_code()
        extra = {}
        if self.container is not None:
            self.remove_container()  # before the verdict: "nothing left" is part of it
            extra["container"] = {"name": self.container.spec.get("name"),
                                  "left": self.container.left,
                                  "remaining": self.container.remaining}
        self.out.control(dict({"type": MSG_EXIT, "code": code, "signal": sig, "t": now(),
                               "stopped": self.stopping, "ranks": self.rank_status}, **extra))
        self.done = True
        self.cleanup_files()
        return code

    def remove_container(self):
        """Remove the container by name once the job's tree is gone; the runtime's commands
        doing it are our children too, and a KILL mid-way would leave the container stuck
        (podman: "Stopping")."""
        self.sparing = True
        if self.container is not None:
            self.container.remove()

    def cleanup_files(self):
        if self.container is not None:
            self.remove_container()
        if self.tmpdir:
            import shutil  # run mode only; the dir is ours (mkdtemp), torchrun's temp dir too

            shutil.rmtree(self.tmpdir, ignore_errors=True)


def main():
    if os.environ.get(WARM_FD_ENV):  # warm_main returns only in a rank or agent forked
        role, argv = warm_main()  # from it (its environ set), which forked() ends
        forked(agent_main if role == ROLE_AGENT else rank_main, argv)
    if os.environ.get(SHIM_ENV) and len(sys.argv) > 1:
        sys.exit(shim_main(sys.argv[1:]))
    if os.environ.get(ARM_ENV) and len(sys.argv) > 1:
        rank_main(sys.argv[1:])  # never returns: the user's script ends the process
        return
    # shipped by launcher/nodeside/wire.py: the bootstrap hands us our source and the spec, having
    # read exactly their lengths from fd 0, so the rest of fd 0 is ours, unbuffered
    source = globals().get("DTRAIN_SOURCE")
    spec = globals().get("DTRAIN_SPEC")
    if source is None:
        with open(__file__, "rb") as f:
            source = f.read()
    if spec is None:
        line = b""
        while not line.endswith(b"\n"):
            c = os.read(0, 1)
            if not c:
                break
            line += c
        spec = line
    spec = load_spec(spec)
    if spec.get("session"):  # --restarts with the warm process kept: nodesession.py
        code = session_main(spec, source, Supervisor)
        if code is not None:
            os._exit(code)
    sup = Supervisor(spec, source)
    set_title(sup.title(), "dtrain-sup")
    code = sup.run()
    # Every frame is out (os.write, unbuffered) and the private files are gone: leave now.
    # A normal interpreter exit would tear down every module first, ~2.5 ms of CPU per node.
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


if __name__ == "__main__":
    main()
