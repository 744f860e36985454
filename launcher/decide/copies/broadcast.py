"""Pure decisions of `dtrain cp`'s broadcast mode (docs/cp.md, "Broadcast of large files").

Which files go by broadcast, the order of the chain (who is fed by the launcher, who
connects to whom) and, once the chain has run, which nodes fall back to a direct send and
why. No I/O here; ``commands/cp/relay.py`` carries it out with ``nodeside/cpnode.py``'s relay.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

DEFAULT_MIN = 64 << 20
AUTO_MIN_NODES = 3  # the default turns broadcast on from this many receivers of one file
FORCED_MIN_NODES = 2  # --broadcast: a chain needs at least two nodes

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """'64M', '64MiB', '1g', '4096' → bytes (binary units); ValueError on anything else."""
    m = re.fullmatch(r"\s*(\d+)\s*([kmgt]?)(?:i?b)?\s*", text, re.IGNORECASE)
    if not m:
        raise ValueError(f"{text!r} is not a size (examples: 64M, 1G, 1048576)")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


def use_broadcast(size: int, receivers: int, *, mode: bool | None, min_size: int) -> bool:
    """Whether one file goes by broadcast: mode None is the default (auto), True forced."""
    if mode is False or size < min_size:
        return False
    return receivers >= (FORCED_MIN_NODES if mode else AUTO_MIN_NODES)


def relay_address(addr: str | None) -> str | None:
    """The address a node's relay listens on and the previous node connects to.

    It is the address the launcher's SSH connection reached (the node's own cluster
    address). None, a loopback address (a localhost entry: other nodes cannot reach it)
    or something that is not an IP address → the node cannot be in a chain.
    """
    if not addr:
        return None
    try:
        ip = ipaddress.ip_address(addr.split("%")[0])
    except ValueError:
        return None
    return None if ip.is_loopback or ip.is_unspecified else addr


@dataclass(frozen=True)
class Link:
    """One node's place in a chain: fed by the launcher (upstream None) or by a node."""

    label: str
    addr: str
    upstream: str | None
    downstream: str | None


def plan_chain(members: Sequence[tuple[str, str | None]]) -> tuple[list[Link], list[str]]:
    """(label, connected address) in host order → the chain, and the labels left out.

    The chain keeps the host order (a hostfile is usually in rack order, so neighbours
    are near); nodes without a usable relay address are left out (they get a direct send).
    The first node of the chain is fed by the launcher over its SSH channel; each other
    node is connected to by the node before it.
    """
    inside = [(label, a) for label, addr in members if (a := relay_address(addr)) is not None]
    out = [label for label, addr in members if relay_address(addr) is None]
    links = []
    for i, (label, addr) in enumerate(inside):
        links.append(Link(label, addr,
                          upstream=inside[i - 1][0] if i else None,
                          downstream=inside[i + 1][0] if i + 1 < len(inside) else None))
    return links, out


def cut_chain(chain: Sequence[str], linked: Mapping[str, str | None]
              ) -> tuple[list[str], dict[str, str]]:
    """Before any data: the part of the chain that is connected, and who falls back.

    ``linked[label]`` is "" when the node connected to its successor (or has none), the
    error when it could not, None when its relay did not answer (lost). The chain is cut at
    the first failure: a node that could not connect keeps its place (it receives, it just
    forwards nothing); a lost node and every node after the cut fall back at once instead
    of waiting out their timeouts.
    """
    for i, label in enumerate(chain):
        state = linked.get(label)
        if state is None:
            return list(chain[:i]), {label: "its relay was lost",
                                     **dict.fromkeys(chain[i + 1:], f"chain broken at {label}")}
        if state and i + 1 < len(chain):
            why = f"chain broken after {label} ({state})"
            return list(chain[:i + 1]), dict.fromkeys(chain[i + 1:], why)
    return list(chain), {}


@dataclass(frozen=True)
class Outcome:
    """What a node's relay reported (None in the mapping: no report, the relay was lost)."""

    ok: bool
    error: str = ""
    forward_error: str = ""


def fallbacks(chain: Sequence[str], outcomes: Mapping[str, Outcome | None]) -> dict[str, str]:
    """The nodes of a chain that did not get the file, each with why (for the direct send).

    A node that failed or was lost breaks the chain for the nodes after it: their reason
    names the first broken place, so the user sees the cause, not the echo.
    """
    reasons: dict[str, str] = {}
    cause: str | None = None  # where the chain first broke, as "at X" / "after X (why)"
    by_forward = False  # ... known only from the node before it failing to forward
    for label in chain:
        o = outcomes.get(label)
        if o is not None and o.ok:
            if o.forward_error and cause is None:
                cause, by_forward = f"after {label} ({o.forward_error})", True
            continue
        if o is None:  # lost: this explains its upstream's forward error
            if cause is None or by_forward:
                reasons[label] = "its relay was lost"
                cause, by_forward = f"at {label}", False
            else:
                reasons[label] = f"chain broken {cause}"
        else:
            own = o.error or "relay failed"
            reasons[label] = f"chain broken {cause} ({own})" if cause else own
            if cause is None:
                cause = f"at {label}"
    return reasons
