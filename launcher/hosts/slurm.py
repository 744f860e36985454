"""Hosts from a Slurm allocation: ``SLURM_JOB_NODELIST`` and the per-node counts -> list[Host].

Pure: it reads a mapping (the environment), never the scheduler. Used when neither ``-f`` nor
``-H`` (nor ``$DTRAIN_HOSTFILE``) names the hosts and ``SLURM_JOB_NODELIST`` is set, i.e. inside
``salloc``/``sbatch``.

Order matters: node 0 (the master) is the allocation's first node, in Slurm's own order, and
``SLURM_JOB_CPUS_PER_NODE`` lists its counts in that order. NodeSet sorts the patterns of a
multi-pattern set (``gpu[1-2],cpu1`` iterates cpu1 first), so each comma-separated piece is
expanded on its own (with node groups off) and the pieces are kept in the order written.

Slots (processes per node, the default of ``--nproc-per-node``), first found wins:

1. ``SLURM_NTASKS_PER_NODE`` (``--ntasks-per-node=N``): the user asked for N per node.
2. ``SLURM_GPUS_ON_NODE`` then ``SLURM_GPUS_PER_NODE`` (``4`` or ``a100:4``): one per GPU.
3. ``SLURM_JOB_CPUS_PER_NODE`` (``2(x3),1``: per node) -- only for a job that asked for no
   GPUs: on a GPU job a CPU count is not a process count, so slots stay unset there and
   ``--nproc-per-node`` falls back to ``gpu`` (the GPUs each node's probe finds).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from launcher.errors import HostfileError
from launcher.hosts.entries import _check_name, _Ctx, _expand
from launcher.models import Host

NODELIST = "SLURM_JOB_NODELIST"
_COUNTS = re.compile(r"(\d+)(?:\(x(\d+)\))?")


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


def in_allocation(environ: Mapping[str, str]) -> bool:
    """Inside salloc/sbatch/srun: a job id and a node list are set."""
    return bool(environ.get(NODELIST)) and bool(environ.get("SLURM_JOB_ID")
                                                 or environ.get("SLURM_JOBID"))


def split_top_commas(expr: str) -> list[str]:
    """Split at commas outside brackets: ``gpu[1,3],cpu1`` -> ``gpu[1,3]``, ``cpu1``."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(expr):
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth <= 0:
            parts.append(expr[start:i])
            start = i + 1
    parts.append(expr[start:])
    return [part.strip() for part in parts]


def expand_nodelist(text: str, source: str = NODELIST) -> list[str]:
    """Slurm's compressed list (``gpu[01-04,07],cpu-a[1-2]``) in Slurm's order."""
    ctx = _Ctx(source)
    names: list[str] = []
    for piece in split_top_commas(text):
        if not piece:
            raise ctx.error(f"empty entry in {text!r}", hint="e.g. node[1-4],login2")
        names += _expand(piece, ctx) if "[" in piece else [_check_name(piece, ctx)]
    if not names:
        raise ctx.error("empty node list", hint="are you inside salloc/sbatch?")
    if len(set(names)) != len(names):
        raise ctx.error(f"node listed twice in {text!r}")
    return names


def expand_counts(text: str, n_nodes: int, source: str) -> tuple[int, ...]:
    """``2(x3),1`` -> (2, 2, 2, 1): one count per node, checked against the node count."""
    counts: list[int] = []
    for part in text.split(","):
        match = _COUNTS.fullmatch(part.strip())
        if not match:
            raise HostfileError(f"cannot read {text!r}: expected counts like 2(x3),1",
                                source=source)
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    if len(counts) != n_nodes:
        raise HostfileError(f"{text!r} gives {len(counts)} counts for {n_nodes} nodes",
                            source=source, hint=f"does it match {NODELIST}?")
    return tuple(counts)


def _positive(text: str, source: str) -> int:
    """A per-node count: a positive integer (a GRES type prefix, ``a100:4``, is dropped)."""
    value = text.rpartition(":")[2].strip()
    if not (value.isascii() and value.isdigit() and int(value) > 0):
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
    key = "SLURM_JOB_CPUS_PER_NODE"
    if environ.get(key) and not _asks_for_gpus(environ):
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
