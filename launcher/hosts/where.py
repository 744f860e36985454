"""Pointing back at what the user wrote: the hostfile lines hosts came from and the exact
``--exclude`` that leaves them out (for messages about unreachable or failing hosts)."""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence

from launcher.hosts.entries import _split_top
from launcher.hosts.hostfile import fold, spelled
from launcher.models import Host


def where(hosts: Iterable[Host]) -> str:
    """``hosts.txt:3`` or ``hosts.txt:3,5``: the lines these hosts came from ("" for -H)."""
    lines: dict[str, list[str]] = {}
    for host in hosts:
        source, _, line = host.source.rpartition(":")
        if source and line.isdigit() and line not in lines.setdefault(source, []):
            lines[source].append(line)
    return ", ".join(f"{source}:{','.join(nums)}" for source, nums in lines.items())


def exclude_option(hosts: Iterable[Host]) -> str:
    """``--exclude 'node[3,5]'``: the option that leaves exactly these hosts out, each
    spelled as the hostfile spells it (``dtuser@login1:2222``): a bare name would leave
    out every host on that name, whatever its port."""
    same: dict[tuple[str | None, int | None], list[str]] = {}
    for host in hosts:
        same.setdefault((host.user, host.port), []).append(host.name)
    words: list[str] = []
    for (user, port), names in same.items():
        if user is None and port is None:
            words.append(fold(names))
            continue
        plain = [n for n in names if ":" not in n]  # an IPv6 address is not folded
        parts = _split_top(fold(plain), ",") if plain else []
        parts += [n for n in names if ":" in n]
        words += [spelled(Host(part, user=user, port=port)) for part in parts]
    return "--exclude " + shlex.quote(",".join(words))


def failed_hosts_lines(hosts: Sequence[Host], errors: Mapping[str, str]) -> list[str]:
    """One line per distinct reason, hosts folded and in hostfile order, with their lines:
    ``node[3-4] (hosts.txt:3,4): connection refused``."""
    groups: dict[str, list[Host]] = {}
    for host in hosts:
        if host.label in errors:
            groups.setdefault(errors[host.label], []).append(host)
    out = []
    for why, group in groups.items():
        at = where(group)
        out.append(f"{fold(h.label for h in group)}{f' ({at})' if at else ''}: {why}")
    return out


def leave_out_hint(failed: Sequence[Host]) -> str:
    """``fix it, or leave it out: --exclude 198.18.0.15``."""
    it = "it" if len(failed) == 1 else "them"
    return f"fix {it}, or leave {it} out: {exclude_option(failed)}"
