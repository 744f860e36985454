"""Slurm's hostlist expressions (``SLURM_JOB_NODELIST``, ``scontrol show hostnames``) -> names,
in Slurm's order. Pure.

Not NodeSet: NodeSet sorts and de-duplicates inside a bracket (``node[3,1,2]`` iterates node1
first, so node 0, the master, would change) and refuses mixed padding. The rules below are
Slurm 22.05's (src/common/hostlist.c), checked against ``scontrol show hostnames`` on
generated expressions (tests/test_slurm_hostlist.py):

* entries are separated by commas, spaces or tabs outside brackets (runs of them count once);
* an entry is a plain name, or ``TEXT[RANGES]`` where that last bracket ends the entry; the
  text before it may hold more bracket groups (``rack[1-2]-n[1-2]``, ``n[1-2][3-4]``): every
  combination, the last bracket varying fastest (``expand_entry`` has the order of the rest);
* RANGES are comma-separated ``lo`` or ``lo-hi`` (decimal digits, ``lo <= hi``), expanded in
  the order written, repeats kept; each is padded to the width of its ``lo`` as written
  (``n[1-010]`` -> n1..n10, ``n[01-2,5]`` -> n01, n02, n5);
* numeric-only names (``[1-3]`` -> 1, 2, 3) are names like any other.

What dtrain refuses although Slurm expands it (docs/slurm.md): a name listed twice
(``node[1,1]``, ``n1,n1``: two node ranks on one machine), characters outside
``A-Z a-z 0-9 . _ -`` (``n@1``), and Slurm's lenient readings of broken ranges (``n[1-]``,
``n[ 1]``, ``n[+1]``, an unclosed ``[``). The size is counted before anything is built, so
``n[1-100000000]`` fails at once.
"""

from __future__ import annotations

import itertools
import re

# at most 18 digits a number: longer is no node's (int() refuses 4,300, a traceback)
_RANGE = re.compile(r"(\d{1,18})(?:-(\d{1,18}))?", re.ASCII)
_TEXT = re.compile(r"[A-Za-z0-9._-]*", re.ASCII)
_SEPARATORS = ", \t"

Ranges = list[tuple[int, int, int]]  # (lo, hi, width), in the order written


class HostlistError(ValueError):
    """An expression Slurm would refuse, or one dtrain refuses on purpose (the message says)."""


def split_entries(text: str) -> list[str]:
    """The entries of ``text``: cut at commas, spaces and tabs outside brackets."""
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += (ch == "[") - (ch == "]")
        if ch in _SEPARATORS and depth <= 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [part for part in parts if part]


def parse_ranges(body: str) -> Ranges:
    """``3,1-2,01`` -> [(3, 3, 1), (1, 2, 1), (1, 1, 2)]."""
    ranges: Ranges = []
    for part in body.split(","):
        match = _RANGE.fullmatch(part)
        if not match:
            raise HostlistError(f"bad range {part!r} in [{body}]: expected N or N-M "
                                "(decimal digits)")
        low = int(match.group(1))
        high = int(match.group(2) or low)
        if low > high:
            raise HostlistError(f"range {part!r} runs backwards")
        ranges.append((low, high, len(match.group(1))))
    return ranges


def _text(text: str, entry: str) -> str:
    if not _TEXT.fullmatch(text):
        bad = next(ch for ch in text if not _TEXT.fullmatch(ch))
        raise HostlistError(f"{bad!r} in {entry!r} is not allowed in a node name "
                            "(letters, digits, '.', '_', '-')")
    return text


def parse_entry(entry: str) -> tuple[list[str], list[Ranges]]:
    """``rack[1-2]-n[3,1]`` -> texts ``['rack', '-n', '']`` and the ranges of each bracket:
    a name is texts[0] + a number of groups[0] + texts[1] + ... + texts[-1]."""
    texts: list[str] = []
    groups: list[Ranges] = []
    rest = entry
    while "[" in rest:
        before, _, rest = rest.partition("[")
        body, close, rest = rest.partition("]")
        if not close or "[" in body:
            raise HostlistError(f"unclosed '[' in {entry!r}")
        texts.append(_text(before, entry))
        groups.append(parse_ranges(body))
    if groups and rest:
        raise HostlistError(f"{rest!r} after the last ']' in {entry!r} (Slurm refuses it too)")
    texts.append(_text(rest, entry))
    return texts, groups


def count(groups: list[Ranges]) -> int:
    """How many names the groups make, without making them."""
    total = 1
    for ranges in groups:
        total *= sum(high - low + 1 for low, high, _ in ranges)
    return total


def _numbers(ranges: Ranges) -> list[str]:
    return [f"{n:0{width}d}" for low, high, width in ranges for n in range(low, high + 1)]


def expand_entry(texts: list[str], groups: list[Ranges]) -> list[str]:
    """Every name of one parsed entry, in Slurm's order. The last bracket varies fastest;
    Slurm then walks the earlier ones from the one before it back to the first (outermost),
    so ``a[1-2]b[1-2]c[1-2]`` starts a1b1c1, a1b1c2, a2b1c1 (hostlist.c expands the text
    before the last bracket from its own last bracket, recursively)."""
    last = len(groups) - 1
    order = [*range(last - 1, -1, -1), last] if groups else []
    names = []
    for picked in itertools.product(*(_numbers(groups[i]) for i in order)):
        numbers = dict(zip(order, picked, strict=True))
        name = texts[0]
        for i, text in enumerate(texts[1:]):
            name += numbers[i] + text
        names.append(name)
    return names


def expand(text: str, cap: int) -> list[str]:
    """Every name of a hostlist expression, in Slurm's order, repeats kept; more than ``cap``
    names is refused before any is built."""
    parsed = [parse_entry(entry) for entry in split_entries(text)]
    total = sum(count(groups) for _, groups in parsed)
    if total > cap:
        raise HostlistError(f"{text!r} makes {total} nodes, more than {cap} "
                            "(the cap on one job)")
    return [name for texts, groups in parsed for name in expand_entry(texts, groups)]
