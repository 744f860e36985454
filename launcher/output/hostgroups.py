"""Rows that are the same on many nodes, said once: ``node[1-64]: ok`` (issue 24.8).

At 16 nodes and more a line per node buries the one that differs: doctor, cp and the run
summary fold identical rows by hostlist (ClusterShell's NodeSet, as ``exec --gather``),
the failures first and the totals last.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import TypeVar

from launcher.hosts.hostfile import fold
from launcher.text.words import FOLD_AT as FOLD_AT  # its home: the verdict (decide/) folds too

K = TypeVar("K", bound=Hashable)


def group(items: Iterable[tuple[str, K]]) -> list[tuple[list[str], K]]:
    """(hosts, key) groups of equal keys, in the order of each group's first host."""
    groups: dict[K, list[str]] = {}
    for host, key in items:
        groups.setdefault(key, []).append(host)
    return [(hosts, key) for key, hosts in groups.items()]


def folded(items: Iterable[tuple[str, K]], failed: Callable[[K], bool] = lambda _: False
           ) -> list[tuple[str, K]]:
    """(folded hostlist, key) for each group of equal keys; groups whose key ``failed``
    come first, each part in the order of its first host."""
    groups = [(fold(hosts), key) for hosts, key in group(items)]
    return [g for g in groups if failed(g[1])] + [g for g in groups if not failed(g[1])]
