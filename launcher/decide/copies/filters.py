"""The console filters every command spells the same way (`--rank RANKS`, `--host HOSTS`)
and the few value checks the CLI used to make itself (`--rdzv`, `--backend`): pure
functions of the text typed, exit 2 (UsageError) with the value and what to type instead.

- ``parse_ranks("0-3,7")`` → ``{0, 1, 2, 3, 7}``
- ``select_hosts("node[1-2]", labels)`` → the labels of the run's hosts that expression
  names, matched on the label (``dtuser@node2:2222``) or the bare host name (``node2``,
  what the console prints); a name that is none of them is an error naming the known ones.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from launcher.errors import UsageError

MAX_RANK = 1 << 20  # a range past this is a typo, not a job (0-99999999 would fill memory)
_RANGE = re.compile(r"\s*([0-9]{1,9})\s*(?:-\s*([0-9]{1,9})\s*)?\Z")


def parse_ranks(text: str, option: str = "--rank") -> frozenset[int]:
    """``0,3`` / ``0-3,7`` / ``5`` as a set of ranks."""
    ranks: set[int] = set()
    for part in text.split(","):
        if not part.strip():
            continue
        m = _RANGE.match(part)
        if m is None:
            raise UsageError(f"{option} {text!r}: {part.strip()!r} is not a rank or a range",
                             hint=f"e.g. {option} 0-3,7")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo:
            raise UsageError(f"{option} {text!r}: the range {part.strip()} runs backwards",
                             hint=f"write it {hi}-{lo}")
        if hi > MAX_RANK:
            raise UsageError(f"{option} {text!r}: rank {hi} is beyond any job "
                             f"(at most {MAX_RANK})")
        ranks.update(range(lo, hi + 1))
    if not ranks:
        raise UsageError(f"{option} {text!r}: no rank given", hint=f"e.g. {option} 0-3,7")
    return frozenset(ranks)


def host_name(label: str) -> str:
    """``dtuser@node2:2222`` → ``node2`` (the name the console prints)."""
    name = label.rpartition("@")[2]
    if name.startswith("["):  # [::1]:22
        return name[1:].partition("]")[0]
    if name.count(":") == 1:
        name = name.partition(":")[0]
    return name


def expand(expr: str, option: str = "--host") -> list[str]:
    """A hostlist expression's names (ClusterShell NodeSet: node[1-4],login2)."""
    from launcher.hosts.entries import check_expr_size, nodeset

    check_expr_size(expr, option)
    from ClusterShell.NodeSet import NodeSetException

    try:
        return list(nodeset(",".join(expr.split())))
    except NodeSetException as exc:
        raise UsageError(f"{option} {expr!r}: not a host list ({exc})",
                         hint=f"e.g. {option} node[1-2],node4") from None


def select_hosts(expr: str, labels: Iterable[str], option: str = "--host") -> frozenset[str]:
    """The labels ``expr`` names among the run's hosts; an unknown name is exit 2."""
    labels = list(dict.fromkeys(labels))
    chosen: set[str] = set()
    unknown: list[str] = []
    for name in expand(expr, option):
        hits = [lb for lb in labels if name in (lb, host_name(lb))]
        if hits:
            chosen.update(hits)
        else:
            unknown.append(name)
    if unknown:
        from launcher.hosts.hostfile import fold

        known = fold(host_name(lb) for lb in labels) if labels else "none"
        raise UsageError(f"{option} {expr!r}: {fold(unknown)} is not one of the run's hosts",
                         hint=f"the hosts are {known}")
    return frozenset(chosen)


# a module name --preload takes: dotted identifiers (``transformers``, ``torch.nn``)
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def preload_modules(text: str | None, off: bool, default_on: bool) -> tuple[str, ...] | None:
    """The warm start (docs/warm-start.md) from ``--preload MODULES`` (comma-separated; the
    config's ``preload``) and ``--no-preload``: the modules besides torch the node's warm
    interpreter imports, or None (every rank starts cold). ``--no-preload`` wins; a name that
    is not a module name is exit 2."""
    if off or (text is None and not default_on):
        return None
    names = tuple(n.strip() for n in (text or "").split(",") if n.strip())
    for name in names:
        if not _MODULE.fullmatch(name):
            raise UsageError(f"--preload {name!r}: not a module name",
                             hint="--preload takes module names, comma-separated: "
                                  "--preload transformers,numpy")
    return names


def check_choice(option: str, value: str | None, choices: tuple[str, ...]) -> str | None:
    """``--rdzv static|c10d``, ``--backend nccl|gloo``: a value not listed is exit 2."""
    if value is not None and value not in choices:
        spelled = ", ".join(choices[:-1]) + f" or {choices[-1]}"
        raise UsageError(f"{option} {value!r}: use {spelled}")
    return value
