"""srun transport: dtrain's node programs started through Slurm inside an allocation.

One ``srun`` per node and program (``--nodes=1 --ntasks=1 --nodelist=<node> --overlap``):
each is a job step whose single task runs the same bootstrap command line SSH would run, so
the framed channel, the supervisor, heartbeats and teardown are the same as over SSH. srun
carries stdin to the task and its stdout/stderr back (``--unbuffered``: frames are not lines,
and srun's line buffering would hold them).

* ``--overlap``: the probe, the port check and the job's own step share the allocation's
  CPUs, memory and GPUs (22.05: a step gets all of a node's non-GRES resources and all the
  job's GRES unless told otherwise).
* ``--export``: only PATH, HOME, USER, LOGNAME, SHELL, LANG, LC_ALL, TMPDIR, VIRTUAL_ENV and
  CONDA_PREFIX (where set) plus Slurm's own SLURM_* -- like SSH, nothing else of the launcher's
  environment reaches the ranks implicitly (``--env`` does, through the spec).
* srun runs in a session of its own: a Ctrl-C on the terminal reaches dtrain only, which
  stops the job through the supervisors; the step then ends by itself. Closing srun's stdin
  is a dropped channel (the supervisor sees EOF). Slurm's own kill (SIGTERM to srun, which
  cancels the step) is the second net, used when a step outlives ``aclose``.

``decide_transport`` is the pure rule for ``--transport auto``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from launcher.errors import ConnectError, UsageError
from launcher.hosts.slurm import Allocation, allocation, in_allocation
from launcher.models import Host
from launcher.text.words import count
from launcher.transports.base import Connection, Process, Transport
from launcher.transports.local import LocalProcess

EXPORTED = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LC_ALL", "TMPDIR",
            "VIRTUAL_ENV", "CONDA_PREFIX")
TRANSPORTS = ("auto", "ssh", "srun")
STOP_WAIT = 3.0  # aclose: how long a step may take to end after its channel closed
# srun's own reports about the step (the supervisor already reported the exit in a frame)
_SRUN_NOISE = re.compile(rb"^srun: (error: \S+: task \d+: (Exited with exit code \d+|"
                         rb"Killed|Terminated)|Job step aborted.*|.*CANCELLED AT .*|"
                         rb"launch/slurm: _step_signal: .*|Force Terminated .*)\n", re.M)


@dataclass(frozen=True)
class Choice:
    """The transport ``--transport`` resolved to, and why (shown by --dry-run)."""

    kind: str  # ssh | srun
    reason: str


def decide_transport(requested: str, hosts: Sequence[Host], environ: Mapping[str, str],
                     srun: str | None) -> Choice:
    """ssh|srun forced, or auto: srun inside an allocation, with srun on PATH, when every
    host is one of its nodes; SSH otherwise. Forcing srun where it cannot work is exit 2."""
    if requested not in TRANSPORTS:
        raise UsageError(f"--transport {requested!r}: use auto, ssh or srun")
    if requested == "ssh":
        return Choice("ssh", "--transport ssh")
    alloc = allocation(environ) if in_allocation(environ) else None
    missing = _outside(hosts, alloc)
    if requested == "srun":
        if alloc is None:
            raise UsageError("--transport srun: not inside a Slurm allocation "
                             "(SLURM_JOB_ID/SLURM_JOB_NODELIST are not set)",
                             hint="run dtrain inside salloc or an sbatch script, "
                                  "or use --transport ssh")
        if srun is None:
            raise UsageError("--transport srun: srun is not on PATH",
                             hint="load Slurm's module / add its bin directory to PATH, "
                                  "or use --transport ssh")
        if missing:
            raise UsageError(
                f"the allocation (job {alloc.job_id}: {count(len(alloc.nodes), 'node')}) "
                f"is smaller than asked: "
                f"{', '.join(missing)} not in it",
                hint=f"ask salloc/sbatch for those nodes (-N, -w), or leave out -f/-H to use "
                     f"the allocation's nodes ({','.join(alloc.nodes)})")
        return Choice("srun", f"--transport srun (job {alloc.job_id})")
    if alloc is None:
        return Choice("ssh", "auto: not inside a Slurm allocation")
    if srun is None:
        return Choice("ssh", f"auto: job {alloc.job_id}, but srun is not on PATH")
    if missing:
        return Choice("ssh", f"auto: {', '.join(missing)} not in job {alloc.job_id}")
    return Choice("srun", f"auto: inside Slurm job {alloc.job_id}")


def _outside(hosts: Sequence[Host], alloc: Allocation | None) -> list[str]:
    """Hosts srun cannot reach: not nodes of the allocation, or with ssh-only settings."""
    nodes = set(alloc.nodes) if alloc else set()
    return [h.label for h in hosts if h.name not in nodes or h.port is not None
            or h.user is not None]


def srun_argv(srun: str, node: str, command: str, environ: Mapping[str, str]) -> list[str]:
    """One step on one node running ``command`` under /bin/sh, as sshd would."""
    exported = ",".join(name for name in EXPORTED if name in environ) or "NONE"
    return [srun, "--nodes=1", "--ntasks=1", f"--nodelist={node}", "--overlap",
            "--unbuffered", "--quiet", "--job-name=dtrain", f"--export={exported}",
            "/bin/sh", "-c", command]


class SrunProcess(LocalProcess):
    """An srun child: its stdin is the task's stdin; srun's own step reports are dropped."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        super().__init__(proc)
        self._err_tail = b""

    async def read_stderr(self, n: int) -> bytes:
        while True:
            data = await super().read_stderr(n)
            if not data:
                rest, self._err_tail = self._err_tail, b""
                return rest
            data = self._err_tail + data
            cut = data.rfind(b"\n") + 1
            whole, self._err_tail = data[:cut], data[cut:]
            kept = _SRUN_NOISE.sub(b"", whole)
            if kept:
                return kept

    @property
    def running(self) -> bool:
        return self._proc.returncode is None

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            self._proc.send_signal(sig)

    async def ended(self, timeout: float) -> bool:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._proc.wait()
        return not self.running


class SrunConnection(Connection):
    """A node of the allocation; every ``start`` is one srun step on it."""

    def __init__(self, host: Host, srun: str, environ: Mapping[str, str]) -> None:
        self.host = host
        self._srun = srun
        self._environ = environ
        self._procs: list[SrunProcess] = []

    async def start(self, command: str) -> Process:
        argv = srun_argv(self._srun, self.host.name, command, self._environ)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, start_new_session=True,
                env=dict(self._environ))
        except OSError as exc:
            raise ConnectError(f"cannot start srun: {exc.strerror or exc}", host=self.host.label,
                               hint="is Slurm's srun installed here?") from exc
        process = SrunProcess(proc)
        self._procs.append(process)
        return process

    async def aclose(self) -> None:
        """Every step of this node ended: EOF first (the supervisor cleans up), then srun's
        own cancel (SIGTERM, twice: srun forwards it, then kills the step), then KILL."""
        for proc in self._procs:
            if not proc.running:
                continue
            proc.write_eof()
            if await proc.ended(STOP_WAIT):
                continue
            for sig in (signal.SIGTERM, signal.SIGTERM, signal.SIGKILL):
                proc.signal(sig)
                if await proc.ended(1.0):
                    break
        self._procs.clear()


class SrunTransport(Transport):
    """Connections to the nodes of the current allocation."""

    def __init__(self, environ: Mapping[str, str] | None = None,
                 srun: str | None = None) -> None:
        self._environ = dict(os.environ if environ is None else environ)
        self._srun = srun or shutil.which("srun", path=self._environ.get("PATH")) or "srun"

    async def connect(self, host: Host) -> Connection:
        return SrunConnection(host, self._srun, self._environ)
