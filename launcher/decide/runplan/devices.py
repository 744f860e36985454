"""DeepSpeed's per-host GPU selection: ``--include worker-0:0,1@worker-1:2`` and
``--exclude worker-1:0`` (pure; the CLI splits the options, build_plan applies them).

A spec without ``:`` is a plain hostlist expression (``node[1-4],login2``) and filters hosts
as always. With ``:`` it is DeepSpeed's: ``@``-separated entries, each ``HOST`` (the whole
host) or ``HOST:GPU,GPU`` (those GPUs). ``--include`` keeps the hosts it names and, for an
entry with GPUs, uses only those; ``--exclude`` drops a bare host and, for an entry with
GPUs, leaves those out of that host's. A node with a selection gets
``CUDA_VISIBLE_DEVICES`` = its GPUs and, unless ``--nproc-per-node N`` is given, one rank
per selected GPU.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from launcher.errors import HostfileError, UsageError
from launcher.hosts.hostfile import host_patterns
from launcher.models import Host

_ENTRY = re.compile(r"([^:@,\s]+)(?::([0-9]+(?:,[0-9]+)*))?\Z")


@dataclass(frozen=True)
class DeviceSelection:
    """The hosts a DeepSpeed spec names and the GPUs it gives or takes per host name."""

    include: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    exclude: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.include or self.exclude)

    def gpus(self, name: str, count: int) -> tuple[int, ...] | None:
        """The GPUs node ``name`` (showing ``count``) uses; None: no selection for it."""
        if name in self.include:
            chosen = self.include[name]
            if count > 0 and (beyond := [g for g in chosen if g >= count]):
                raise UsageError(f"--include {name}:{','.join(map(str, chosen))}: {name} "
                                 f"shows {count} GPU{'s' if count != 1 else ''}, no GPU "
                                 f"{beyond[0]}", hint=f"GPUs are 0-{count - 1} there" if count > 1
                                 else "GPU 0 is the only one there")
        elif name in self.exclude:
            if count <= 0:
                raise UsageError(f"--exclude {name}:...: {name} shows no GPU to leave out",
                                 hint=f"use --include {name}:0,1 to name the devices")
            chosen = tuple(g for g in range(count) if g not in self.exclude[name])
        else:
            return None
        if not chosen:
            raise UsageError(f"no GPU left on {name} after --exclude",
                             hint=f"drop the whole host: --exclude {name}")
        return chosen


def names_hosts(spec: str, option: str, hosts: Sequence[Host]) -> bool:
    """Whether ``spec`` names hosts as the hostfile spells them (``node1:2222``,
    ``dtuser@node1:2222``) rather than DeepSpeed's GPUs: every entry with a port is a host
    of ``hosts`` with that port."""
    try:
        patterns = host_patterns(spec, option)
    except HostfileError:
        return False
    return all(p.port is None or any(p.matches(h) for h in hosts) for p in patterns)


def split_spec(spec: str | None, option: str, known: Sequence[Host] = (),
               ) -> tuple[str | None, dict[str, tuple[int, ...]]]:
    """(the hostlist expression to filter hosts with, the per-host GPUs) of one option;
    ``HOST:PORT`` of a host in ``known`` is that host, not DeepSpeed's GPU PORT."""
    if spec is None or ":" not in spec or (known and names_hosts(spec, option, known)):
        return spec, {}
    hosts: list[str] = []
    gpus: dict[str, tuple[int, ...]] = {}
    for part in spec.split("@"):
        m = _ENTRY.match(part.strip())
        if m is None:
            raise UsageError(f"{option} {spec!r}: {part!r} is not HOST or HOST:GPU,GPU",
                             hint=f"DeepSpeed's form: {option} node1:0,1@node2:2")
        name, devices = m.groups()
        if devices is None:
            hosts.append(name)
        else:
            gpus[name] = tuple(sorted({int(d) for d in devices.split(",")}))
    if option == "--include":
        return ",".join([*hosts, *gpus]), gpus
    return (",".join(hosts) or None), gpus


def selection(include: str | None, exclude: str | None, hosts: Sequence[Host] = (),
              ) -> tuple[str | None, str | None, DeviceSelection]:
    """--include and --exclude split: (host include, host exclude, the GPU selection);
    ``hosts``: the hostfile's, whose ``HOST:PORT`` spellings are hosts, not GPUs."""
    inc_hosts, inc = split_spec(include, "--include", hosts)
    exc_hosts, exc = split_spec(exclude, "--exclude", hosts)
    if both := sorted(set(inc) & set(exc)):
        raise UsageError(f"{both[0]}: GPUs given to both --include and --exclude",
                         hint="name the GPUs to use in --include alone")
    return inc_hosts, exc_hosts, DeviceSelection(inc, exc)
