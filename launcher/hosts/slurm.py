"""Hosts from a Slurm allocation: ``SLURM_JOB_NODELIST`` and the per-node counts -> list[Host].

Pure: it reads a mapping (the environment), never the scheduler. Used when neither ``-f`` nor
``-H`` (nor ``$DTRAIN_HOSTFILE``) names the hosts and ``SLURM_JOB_NODELIST`` is set, i.e. inside
``salloc``/``sbatch``.

Order matters: node 0 (the master) is the allocation's first node, in Slurm's own order, and
``SLURM_JOB_CPUS_PER_NODE`` lists its counts in that order. The list is expanded exactly as
Slurm expands it (``slurm_hostlist.py``: order inside brackets kept, mixed padding, numeric
names), not with NodeSet, which sorts.

Slots (processes per node, the default of ``--nproc-per-node``), first found wins:

1. ``SLURM_NTASKS_PER_NODE`` (``--ntasks-per-node=N``): the user asked for N per node.
2. ``SLURM_GPUS_ON_NODE`` then ``SLURM_GPUS_PER_NODE`` (``4`` or ``a100:4``): one per GPU.
3. On a job that asked for no GPUs (on a GPU job a CPU count is not a process count, so
   slots stay unset there and ``--nproc-per-node`` falls back to ``gpu``, the GPUs each
   node's probe finds):
   a. ``SLURM_TASKS_PER_NODE`` (``4(x2)``) when the job asked for tasks or CPUs per task
      (``SLURM_NTASKS``/``SLURM_NPROCS``/``SLURM_CPUS_PER_TASK`` set, as ``-n8 -c4`` does):
      the tasks Slurm placed on each node, not its CPUs (16 per node for ``-n8 -c4`` on two);
   b. else ``SLURM_JOB_CPUS_PER_NODE`` (``2(x3),1``): one process per allocated CPU.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from launcher.errors import HostfileError
from launcher.hosts import slurm_hostlist
from launcher.hosts.entries import MAX_HOSTS, _Ctx, _name_problem
from launcher.models import Host

NODELIST = "SLURM_JOB_NODELIST"
# set when the job asked for tasks (-n) or CPUs per task (-c): slots are then its tasks
_TASK_REQUESTS = ("SLURM_NTASKS", "SLURM_NPROCS", "SLURM_CPUS_PER_TASK")
# a count of more than 18 digits is none (int() refuses 4,300 digits: a traceback)
_COUNTS = re.compile(r"(\d{1,18})(?:\(x(\d{1,18})\))?", re.ASCII)


@dataclass(frozen=True)
class Allocation:
    """The allocation as the environment describes it."""

    job_id: str | None
    nodes: tuple[str, ...]
    slots: tuple[int | None, ...]
    slots_from: str | None  # the variable the slots came from

    @property
    def source(self) -> str:
        """Where the hosts came from, for --dry-run and error messages."""
        job = f"job {self.job_id}, " if self.job_id else ""
        slots = f"slots from {self.slots_from}" if self.slots_from else "no slot count"
        return f"{NODELIST} ({job}{slots})"

    def hosts(self) -> list[Host]:
        """One Host per node, node 0 first."""
        return [Host(name=name, slots=slots, source=self.source)
                for name, slots in zip(self.nodes, self.slots, strict=True)]


SCONTROL_TIMEOUT = 5.0


def show_topology(environ: Mapping[str, str]) -> str | None:
    """``scontrol show topology`` inside an allocation (the controller's switches, in
    topology.conf's keys: decide/runplan/placement.parse_topology_conf), or None: not in an
    allocation, no scontrol, no topology plugin (nothing printed), or it failed or took
    longer than SCONTROL_TIMEOUT (the run goes on without it)."""
    import shutil
    import subprocess

    if not in_allocation(environ):
        return None
    scontrol = shutil.which("scontrol", path=environ.get("PATH"))
    if scontrol is None:
        return None
    try:
        res = subprocess.run([scontrol, "show", "topology"], capture_output=True, text=True,
                             timeout=SCONTROL_TIMEOUT, env=dict(environ), check=False,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    if res.returncode != 0 or "SwitchName=" not in res.stdout:
        return None
    return res.stdout[:4 << 20]


def in_allocation(environ: Mapping[str, str]) -> bool:
    """Inside salloc/sbatch/srun: a job id and a node list are set."""
    return bool(environ.get(NODELIST)) and bool(environ.get("SLURM_JOB_ID")
                                                 or environ.get("SLURM_JOBID"))


def expand_nodelist(text: str, source: str = NODELIST) -> list[str]:
    """Slurm's compressed list (``gpu[01-04,07],cpu-a[1-2]``) expanded as Slurm expands it
    (slurm_hostlist.py), each name checked; a node listed twice is refused."""
    ctx = _Ctx(source)
    try:
        names = slurm_hostlist.expand(text, MAX_HOSTS)
    except slurm_hostlist.HostlistError as exc:
        raise ctx.error(f"cannot read {text!r}: {exc}",
                        hint="e.g. node[1-4],login2 (as scontrol show hostnames reads it)") \
            from None
    if not names:
        raise ctx.error("empty node list", hint="are you inside salloc/sbatch?")
    for name in names:
        problem = _name_problem(name)
        if problem:
            raise ctx.error(f"invalid node name {name!r} in {text!r}: {problem}")
    twice = sorted(name for name, n in Counter(names).items() if n > 1)
    if twice:
        raise ctx.error(f"node listed twice in {text!r}: {', '.join(twice)}",
                        hint="each node once: Slurm never allocates a node twice")
    return names


def expand_counts(text: str, n_nodes: int, source: str) -> tuple[int, ...]:
    """``2(x3),1`` -> (2, 2, 2, 1): one positive count per node, checked against the node
    count before the repeats are built."""
    pieces: list[tuple[int, int]] = []
    for part in text.split(","):
        match = _COUNTS.fullmatch(part.strip())
        if not match:
            raise HostfileError(f"cannot read {text!r}: expected counts like 2(x3),1",
                                source=source)
        value, times = int(match.group(1)), int(match.group(2) or 1)
        if value == 0 or times == 0:
            raise HostfileError(f"cannot read {text!r}: {part.strip()!r} is a zero count",
                                source=source, hint="every node has at least one")
        pieces.append((value, times))
    total = sum(times for _, times in pieces)
    if total != n_nodes:
        raise HostfileError(f"{text!r} gives {total} counts for {n_nodes} nodes",
                            source=source, hint=f"does it match {NODELIST}?")
    return tuple(value for value, times in pieces for _ in range(times))


def _positive(text: str, source: str) -> int:
    """A per-node count: a positive integer (a GRES type prefix, ``a100:4``, is dropped)."""
    value = text.rpartition(":")[2].strip()
    if not (value.isascii() and value.isdigit() and len(value) <= 9 and int(value) > 0):
        raise HostfileError(f"expected a positive number, got {text!r}", source=source)
    return int(value)


def _asks_for_gpus(environ: Mapping[str, str]) -> bool:
    """The job requested GPUs: a SLURM_*GPU* variable (--gpus*, SLURM_JOB_GPUS), or gpu in
    a GRES/TRES request (--gres=gpu:4, --tres-per-node)."""
    for key, value in environ.items():
        if not key.startswith("SLURM_") or not value:
            continue
        if "GPU" in key or ("GRES" in key or "TRES" in key) and "gpu" in value.lower():
            return True
    return False


def _slots(environ: Mapping[str, str], n: int) -> tuple[tuple[int | None, ...], str | None]:
    for key in ("SLURM_NTASKS_PER_NODE", "SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE"):
        if environ.get(key):
            return (_positive(environ[key], key),) * n, key
    if _asks_for_gpus(environ):
        return (None,) * n, None
    key = "SLURM_TASKS_PER_NODE"
    if environ.get(key) and any(environ.get(asked) for asked in _TASK_REQUESTS):
        return expand_counts(environ[key], n, key), key
    key = "SLURM_JOB_CPUS_PER_NODE"
    if environ.get(key):
        return expand_counts(environ[key], n, key), key
    return (None,) * n, None


def allocation(environ: Mapping[str, str]) -> Allocation | None:
    """The allocation described by ``environ``, or None outside one."""
    text = environ.get(NODELIST, "").strip()
    if not text:
        return None
    nodes = expand_nodelist(text)
    slots, slots_from = _slots(environ, len(nodes))
    job_id = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    return Allocation(job_id, tuple(nodes), slots, slots_from)
