"""Where a command's hosts come from: every host source in one order, decided here alone
(issue 54 item 5). Every command reads its hosts through ``hostfile.resolve_hosts``, which
asks ``host_source`` which source names them and then reads that one; nothing else looks
at ``WCOLL``, ``DTRAIN_HOSTFILE``, a Slurm allocation or the config's hostfile to pick
hosts (tests/test_host_sources.py).

Highest first (``SOURCES``):

* ``-H`` (also pdsh's ``-w ^FILE`` and ``-w -``): the command line's hosts;
* ``-f``: the command line's hostfile (``-f`` and ``-H`` together: exit 2);
* ``DTRAIN_HOSTFILE``: a hostfile the environment names;
* ``WCOLL``: pdsh's hostfile variable;
* ``Slurm``: inside an allocation, ``SLURM_JOB_NODELIST`` (``hosts/slurm.py``);
* ``genders``: with ``-g GROUP`` and a genders file, its nodes in the group (``pdsh -g``);
* ``config``: the user config's ``hostfile =`` (docs/config.md).

With ``-g`` and a genders file, ``WCOLL`` and the config's hostfile are not read (pdsh's
``-g`` names the hosts itself); without them, ``-g`` filters whatever the sources above
named. Pure: the environment is given, and the config's hostfile is asked for (a callable)
only when every source above it is empty.

The hosts' places come from sources too (``topology_source``): the hostfile's
``switch=``/``segment=`` keys (read with the hosts), then ``--topology FILE``'s
topology.conf, else inside a Slurm allocation ``scontrol show topology`` (docs/fabric.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from launcher.errors import UsageError
from launcher.hosts.entries import ENV_HOSTFILE
from launcher.hosts.slurm import in_allocation, show_topology

WCOLL = "WCOLL"
SOURCES = ("-H", "-f", ENV_HOSTFILE, WCOLL, "Slurm", "genders", "config")


@dataclass(frozen=True)
class HostSource:
    """The one source that names a command's hosts: its kind (one of ``SOURCES``) and its
    value (-H's expression, or the hostfile's path; None for Slurm and genders)."""

    kind: str
    value: str | None = None


def host_source(*, hostfile: str | None, hosts: str | None, environ: Mapping[str, str],
                genders_group: bool = False,
                config_hostfile: Callable[[], str | None] | None = None) -> HostSource | None:
    """Which source names the hosts (None: none does). ``hostfile``/``hosts``: ``-f``/``-H``
    as typed; ``genders_group``: ``-g GROUP`` was given and a genders file exists."""
    if hostfile is not None and hosts is not None:
        raise UsageError("both -f/--hostfile and -H/--hosts given",
                         hint="pick one: -f FILE or -H EXPR")
    if hosts is not None:
        return HostSource("-H", hosts)
    if hostfile is not None:
        return HostSource("-f", hostfile)
    if environ.get(ENV_HOSTFILE):
        return HostSource(ENV_HOSTFILE, environ[ENV_HOSTFILE])
    if environ.get(WCOLL) and not genders_group:
        return HostSource(WCOLL, environ[WCOLL])
    if in_allocation(environ):
        return HostSource("Slurm")
    if genders_group:
        return HostSource("genders")
    found = config_hostfile() if config_hostfile is not None else None
    if found is not None:
        return HostSource("config", found)
    return None


SCONTROL_TOPOLOGY = "scontrol show topology"


def topology_source(given: str | None, given_from: str, environ: Mapping[str, str], *,
                    offline: bool = False,
                    scontrol: Callable[[Mapping[str, str]], str | None] = show_topology
                    ) -> tuple[str | None, str]:
    """The switches' topology.conf text and where it came from: ``--topology FILE``'s
    (``given``, read by the CLI), else inside a Slurm allocation its controller's
    (``scontrol``, run only then and never with ``--offline``), else None."""
    if given is not None:
        return given, given_from
    if offline or not in_allocation(environ):
        return None, given_from
    found = scontrol(environ)
    return (found, SCONTROL_TOPOLOGY) if found is not None else (None, given_from)
