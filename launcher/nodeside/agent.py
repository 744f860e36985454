"""The node agent: a warm start for the node programs a connection keeper's commands run.

THIS RUNS ON THE NODES: standard library only, Python >= 3.8, unannotated.

The keeper (launcher/transports/keeper/nodeagent.py) starts one agent per kept connection and
node-program command line, with that very command line, so the agent is the interpreter,
flags, environment and working directory a fresh channel's program would have. It then asks
the agent, instead of sshd, for each later program with the same command line: the agent
forks, the child takes three fresh pipes as its stdin, stdout and stderr, starts its own
session (as sshd's child does) and runs the same bootstrap (launcher/nodeside/wire.py) that
the command line would have run. What the child pays is a fork, not sshd's session, a shell,
an interpreter's start and its imports.

The wire, both ways, after ``MAGIC`` on stdout: frames of ``HEAD`` (type, job, length) and
the payload. From the keeper: SPAWN (a job id), IN (bytes for the job's stdin), EOF, DROP
(the job's channel is gone: its pipes are closed, as sshd closes a dropped channel's),
PAUSE and RESUME (stop and go on reading its output: the keeper's client is slow), SOURCE
(a node program's source, kept under its cache key) and IN_SOURCE (that kept source, as the
next bytes of the job's stdin: a program's source crosses the network once per connection,
not at every command). From the
agent: READY, STARTED (the child's pid), FAILED (no fork: the keeper opens a channel
instead), OUT, ERR, ACK (bytes of IN written to the child), EXIT (its status, once its
output ended; -1 for a signal, as sshd's exit-signal reads).

The agent's stdin at EOF (the keeper or the connection gone) drops every job, as sshd does
when a connection dies: each supervisor then sees EOF and tears its job down. A dead agent
closes the same pipes.
"""

import _signal as signal  # type: ignore[import-not-found]  # (not signal: its enum, every fork)
import errno
import marshal
import os
import select
import struct
import sys

from launcher.nodeside.nodetitle import set_title

MAGIC = b"\n\x00DTRAIN-AGENT-1\x00\n"  # nodeagent.py has the twin
HEAD = struct.Struct("!BII")
SPAWN, IN, EOF, DROP, PAUSE, RESUME, SOURCE, IN_SOURCE = 1, 2, 3, 4, 5, 6, 7, 8
READY, STARTED, FAILED, OUT, ERR, ACK, EXIT = 10, 11, 12, 13, 14, 15, 16
READ = 65536
OUT_HIGH = 1 << 18  # queued frames written at once when a turn queues this much
# what the supervisor's exec path imports (tests/test_supervisor_lean.py pins that set),
# loaded once here so that a child does not. Nothing heavier: every module here makes
# every fork dearer (page tables, copy-on-write), and most jobs are the exec path; the
# run path, cp and the sampler import the rest themselves (measured: preloading json,
# subprocess, threading and the like took a forked exec from ~8 to ~13 ms of CPU)
PRELOAD = ("_ctypes", "_json", "_thread", "time")


class Job:
    def __init__(self, jid, pid, inw, outr, errr):
        self.jid = jid
        self.pid = pid
        self.inw = inw
        self.out = {outr: OUT, errr: ERR}
        self.pending = bytearray()
        self.eof = False
        self.paused = False
        self.dropped = False
        self.status = None


class Agent:
    def __init__(self, boot):
        self.boot = boot
        self.jobs = {}
        self.by_fd = {}
        self.inbuf = bytearray()
        self.outbuf = bytearray()
        self.sources = {}  # a node program's cache key -> its source (SOURCE)
        self.poll = select.poll()
        self.gone = False
        self.wake_r, self.wake_w = os.pipe()
        for fd in (self.wake_r, self.wake_w):
            os.set_blocking(fd, False)

    # ------------------------------------------------------------------ to the keeper
    def send(self, kind, jid, data=b""):
        """Queue a frame; the loop writes what a turn queued at once (``flush``): one SSH
        packet for many small frames (STARTED, ACK, EXIT ...) instead of one each."""
        if not self.gone:
            self.outbuf += HEAD.pack(kind, jid, len(data)) + data
            if len(self.outbuf) >= OUT_HIGH:
                self.flush()

    def flush(self):
        if self.gone or not self.outbuf:
            return
        try:
            view = memoryview(bytes(self.outbuf))
            while view:
                n = os.write(1, view)
                view = view[n:]
        except OSError:
            self.gone = True
        self.outbuf = bytearray()

    # ------------------------------------------------------------------ the poll set
    def watch(self, job):
        for fd in job.out:
            self.by_fd[fd] = job
        self.by_fd[job.inw] = job
        self.rewatch(job)

    def rewatch(self, job):
        for fd in job.out:
            if job.paused:
                self.unregister(fd)
            else:
                self.poll.register(fd, select.POLLIN)
        if job.inw >= 0:
            if job.pending:
                self.poll.register(job.inw, select.POLLOUT)
            else:
                self.unregister(job.inw)

    def unregister(self, fd):
        try:
            self.poll.unregister(fd)
        except KeyError:
            pass

    def close_fd(self, job, fd):
        self.unregister(fd)
        self.by_fd.pop(fd, None)
        try:
            os.close(fd)
        except OSError:
            pass
        if fd == job.inw:
            job.inw = -1
        job.out.pop(fd, None)

    # ------------------------------------------------------------------ jobs
    def spawn(self, jid):
        pipes = []
        try:
            for _ in range(3):
                pipes.append(os.pipe())
            pid = os.fork()
        except OSError as exc:
            for r, w in pipes:
                os.close(r)
                os.close(w)
            self.send(FAILED, jid, str(exc).encode("utf-8", "replace"))
            return
        (in_r, in_w), (out_r, out_w), (err_r, err_w) = pipes
        if pid == 0:
            self.child(in_r, out_w, err_w)  # never returns
        for fd in (in_r, out_w, err_w):
            os.close(fd)
        for fd in (in_w, out_r, err_r):
            os.set_blocking(fd, False)
        job = Job(jid, pid, in_w, out_r, err_r)
        self.jobs[jid] = job
        self.watch(job)
        self.send(STARTED, jid, str(pid).encode())

    def child(self, in_r, out_w, err_w):
        code = 1
        try:
            os.setsid()
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.dup2(in_r, 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            close_others()
            g = {"__name__": "__main__"}
            exec(self.boot, g)
            code = 0
        except SystemExit as exc:
            code = exit_code(exc.code)
        except KeyboardInterrupt:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        except BaseException:
            try:
                import traceback

                traceback.print_exc()
            except BaseException:
                pass
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        os._exit(code)

    def drop(self, job):
        job.dropped = True
        for fd in list(job.out) + [job.inw]:
            if fd >= 0:
                self.close_fd(job, fd)
        job.pending = bytearray()
        self.finish(job)

    def finish(self, job):
        """The job ended once its child was reaped and its output read to the end."""
        if job.status is None or job.out:
            return
        if job.inw >= 0:
            self.close_fd(job, job.inw)
        self.jobs.pop(job.jid, None)
        if not job.dropped:
            self.send(EXIT, job.jid, str(job.status).encode())

    def reap(self):
        while True:
            try:
                pid, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            for job in list(self.jobs.values()):
                if job.pid == pid:
                    job.status = os.WEXITSTATUS(st) if os.WIFEXITED(st) else -1
                    self.finish(job)

    def write_in(self, job):
        while job.pending and job.inw >= 0:
            try:
                n = os.write(job.inw, job.pending[:READ])
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                    break
                # the child closed its stdin: what is left is dropped, as sshd drops it
                n = len(job.pending)
                self.send(ACK, job.jid, struct.pack("!I", n))
                job.pending = bytearray()
                self.close_fd(job, job.inw)
                break
            del job.pending[:n]
            self.send(ACK, job.jid, struct.pack("!I", n))
        if job.eof and not job.pending and job.inw >= 0:
            self.close_fd(job, job.inw)
        if job.inw >= 0:
            self.rewatch(job)

    def read_out(self, job, fd):
        try:
            data = os.read(fd, READ)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                return
            data = b""
        if data:
            self.send(job.out[fd], job.jid, data)
            return
        self.close_fd(job, fd)
        self.finish(job)

    # ------------------------------------------------------------------ from the keeper
    def request(self, kind, jid, data):
        if kind == SPAWN:
            if jid not in self.jobs:
                self.spawn(jid)
            return
        if kind == SOURCE:
            key, _, source = data.partition(b"\n")
            self.sources[key] = source
            return
        if kind == IN_SOURCE:
            # the kept source goes in as if it had come over the wire; a key never sent (not
            # the keeper's way) drops the job: its bootstrap sees EOF mid-source and says so
            data = self.sources.get(data)
            if data is None:
                job = self.jobs.get(jid)
                if job is not None:
                    self.drop(job)
                return
            kind = IN
        job = self.jobs.get(jid)
        if job is None or job.dropped:
            if kind == IN:  # a job already gone: its bytes are acknowledged, not kept
                self.send(ACK, jid, struct.pack("!I", len(data)))
            return
        if kind == IN:
            if job.inw < 0 or job.eof:
                self.send(ACK, jid, struct.pack("!I", len(data)))
                return
            job.pending += data
            self.write_in(job)
        elif kind == EOF:
            job.eof = True
            self.write_in(job)
        elif kind == DROP:
            self.drop(job)
        elif kind in (PAUSE, RESUME):
            job.paused = kind == PAUSE
            self.rewatch(job)

    def read_keeper(self):
        try:
            data = os.read(0, 4 * READ)
        except OSError:
            data = b""
        if not data:
            self.gone = True
            return
        buf = self.inbuf
        buf += data
        pos = 0
        while len(buf) - pos >= HEAD.size:
            kind, jid, size = HEAD.unpack_from(buf, pos)
            if len(buf) - pos - HEAD.size < size:
                break
            start = pos + HEAD.size
            self.request(kind, jid, bytes(buf[start:start + size]))
            pos = start + size
        del buf[:pos]

    # ------------------------------------------------------------------ the loop
    def run(self):
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.poll.register(0, select.POLLIN)
        self.poll.register(self.wake_r, select.POLLIN)
        self.send(READY, 0, str(os.getpid()).encode())
        while not self.gone:
            self.flush()
            try:
                events = self.poll.poll(5000)
            except InterruptedError:
                events = []
            for fd, _ev in events:
                if fd == 0:
                    self.read_keeper()
                elif fd == self.wake_r:
                    try:
                        while os.read(self.wake_r, 512):
                            pass
                    except OSError:
                        pass
                else:
                    job = self.by_fd.get(fd)
                    if job is None:
                        self.unregister(fd)
                    elif fd == job.inw:
                        self.write_in(job)
                    elif fd in job.out:
                        self.read_out(job, fd)
            self.reap()
        self.flush()
        # the keeper or the connection is gone: every job's channel with it
        for job in list(self.jobs.values()):
            self.drop(job)


def exit_code(code):
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        sys.stderr.write(str(code) + "\n")
    except BaseException:
        pass
    return 1


def close_others():
    """Close every descriptor but 0, 1 and 2 (the agent's channel, other jobs' pipes)."""
    try:
        fds = [int(n) for n in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 1024))
    for fd in fds:
        if fd > 2:
            try:
                os.close(fd)
            except OSError:
                pass


def load_spec(raw):
    """The agent's spec: marshal data after b"M" (wire.agent_payload), no json import."""
    spec = marshal.loads(raw[1:])
    return spec["boot"], spec.get("preload", [])


def main():
    raw = globals().get("DTRAIN_SPEC")
    if raw is None:
        sys.stderr.write("dtrain agent: no spec\n")
        os._exit(2)
    boot, preload = load_spec(raw)
    code = compile(boot, "dtrain-bootstrap", "exec")
    for name in list(PRELOAD) + [str(m) for m in preload]:
        try:
            __import__(name)
        except Exception:
            pass
    peer = os.environ.get("SSH_CLIENT", "?").split(" ")[0]
    set_title("dtrain-agent (node programs of the connection keeper at " + peer + ")",
              "dtrain-agent")
    os.write(1, MAGIC)
    Agent(code).run()
    os._exit(0)


if __name__ == "__main__":
    main()
