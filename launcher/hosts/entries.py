"""The grammar every host source shares: one entry (``[user@]host[:port]`` plus keys such as
``slots=``, ``python=``, ``port=``, ``user=``) checked and expanded into ``Host`` objects.

The text hostfile, the YAML hostfile and ``-H`` (``hostfile.py``) all build a ``_Spec`` per
entry and hand it here, so a rule (a valid name, a port range, the range-size cap) holds the
same way whatever the user wrote it in. Errors carry the ``_Ctx`` (file:line or YAML path).
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any

from ClusterShell.NodeSet import (
    RESOLVER_NOGROUP,
    NodeSet,
    NodeSetException,
    NodeSetParseRangeError,
)

from launcher.errors import HostfileError
from launcher.models import Host

ENV_HOSTFILE = "DTRAIN_HOSTFILE"
TEXT_KEYS = ("port", "python", "segment", "slots", "switch", "user")
IGNORED_KEYS = ("max_slots", "max-slots")  # OpenMPI's; accepted so MPI hostfiles load unchanged
YAML_TOP_KEYS = ("defaults", "hosts")
YAML_DEFAULT_KEYS = ("env", "groups", "image", "port", "python", "segment", "slots", "switch",
                     "user")
YAML_HOST_KEYS = ("env", "groups", "host", "image", "port", "python", "segment", "slots",
                  "switch", "user")
# the cap on the hosts of one job, after all expansion (every entry of a hostfile, -H,
# --include/--exclude, `dtrain logs --host`): checked before each range is built, so a typo
# like node[1-100000000] fails at once instead of eating seconds and memory
MAX_HOSTS = 65536
# the cap on one host's slots (its processes): more than any node's GPUs or cores; a typo
# like slots=80000000 is refused with file:line instead of starting that many ranks
MAX_SLOTS = 4096
# digit strings longer than this are over every cap here (ports, slots) without reading
# them: int() refuses more than 4,300 digits, a traceback otherwise
_MAX_DIGITS = 20

_LABEL = r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)"
_HOSTNAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*", re.ASCII)
_PATTERN_CHARS = re.compile(r"[^A-Za-z0-9._\-\[\],]", re.ASCII)
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._@-]*", re.ASCII)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_NAME_HINT = "write [user@]host[:port], e.g. dtuser@node[1-4]:2222"


class _Budget:
    """The hosts expanded so far from one source, against MAX_HOSTS."""

    def __init__(self) -> None:
        self.used = 0

    def take(self, count: int, pattern: str, ctx: _Ctx) -> None:
        self.used += count
        if count > MAX_HOSTS:
            raise ctx.error(f"host range {pattern!r} expands to {count} hosts "
                            f"(more than {MAX_HOSTS})", hint="check the range bounds; "
                            f"{MAX_HOSTS} hosts is the cap on one job")
        if self.used > MAX_HOSTS:
            raise ctx.error(f"with {pattern!r} the hosts reach {self.used}, more than "
                            f"{MAX_HOSTS} (the cap on one job, after all expansion)",
                            hint="check the ranges and repeated entries")


@dataclass(frozen=True)
class _Ctx:
    """Where an entry came from, so every error can point at it."""

    source: str
    line: int | None = None
    path: str = ""  # YAML key path, e.g. hosts[3].slots
    # shared by every entry of one source (one _Budget per file or -H expression)
    budget: _Budget = field(default_factory=_Budget, compare=False, repr=False)

    def error(self, message: str, hint: str | None = None) -> HostfileError:
        text = f"{self.path}: {message}" if self.path else message
        return HostfileError(text, source=self.source, line=self.line, hint=hint)

    @property
    def label(self) -> str:
        return f"{self.source}:{self.line}" if self.line is not None else self.source


@dataclass
class _Spec:
    """One entry: its host names and settings (None: not given, so defaults/ssh config apply)."""

    names: list[str] = field(default_factory=list)  # the host pattern, expanded
    user: str | None = None
    port: int | None = None
    slots: int | None = None
    python: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    image: str | None = None  # YAML only: the container image for these hosts
    groups: tuple[str, ...] = ()  # YAML only: pdsh-style groups (-g/-X)
    switch: str | None = None  # the leaf switch (decide/runplan/placement.py)
    segment: str | None = None  # the segment above it

    def over(self, defaults: _Spec) -> _Spec:
        """This entry's values win over the defaults; env is merged, the entry's keys winning."""
        return _Spec(
            names=self.names,
            user=_first(self.user, defaults.user), port=_first(self.port, defaults.port),
            slots=_first(self.slots, defaults.slots), python=_first(self.python, defaults.python),
            env={**defaults.env, **self.env}, image=_first(self.image, defaults.image),
            groups=tuple(dict.fromkeys(defaults.groups + self.groups)),
            switch=_first(self.switch, defaults.switch),
            segment=_first(self.segment, defaults.segment),
        )


def _first(value: Any, default: Any) -> Any:
    return default if value is None else value


# --------------------------------------------------------------------------- values


def _integer(value: object) -> int | None:
    """An int, or a string of plain digits; never a bool (YAML's yes/no)."""
    if isinstance(value, str) and value.isascii() and value.isdigit():
        digits = value.lstrip("0") or "0"
        return int(digits) if len(digits) <= _MAX_DIGITS else 10 ** _MAX_DIGITS
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


def _port(value: object, ctx: _Ctx) -> int:
    """1..65535, as an int or a string of digits (from a text line or a quoted YAML value)."""
    number = _integer(value)
    if number is not None and 1 <= number <= 65535:
        return number
    raise ctx.error(f"bad port {value!r}: must be a number from 1 to 65535",
                    hint="e.g. node1:2222 or port=2222")


def _slots(value: object, ctx: _Ctx) -> int:
    """Processes per host: a positive integer, at most MAX_SLOTS."""
    number = _integer(value)
    if number is not None and 0 < number <= MAX_SLOTS:
        return number
    if number is not None and number > MAX_SLOTS:
        raise ctx.error(f"slots={_short(value)} is more than {MAX_SLOTS} (the cap on one "
                        "host's processes)", hint="slots is the processes on that host, "
                        "e.g. its GPU count: slots=8")
    raise ctx.error(f"slots must be a positive integer, got {value!r}", hint="e.g. slots=8")


def _short(value: object) -> str:
    """A value as written, its middle cut when it is long (a 5,000-digit typo)."""
    text = str(value)
    return text if len(text) <= 24 else f"{text[:10]}...{text[-10:]} ({len(text)} digits)"


def _user(value: object, ctx: _Ctx) -> str:
    """A login name; a leading '-' could be read by ssh as an option, so it is refused."""
    if isinstance(value, str) and _USER.fullmatch(value):
        return value
    raise ctx.error(f"invalid user name {value!r}",
                    hint="use letters, digits, '.', '-', '_', e.g. dtuser@node1")


def node_value_problem(value: str, *, python: bool = False) -> str | None:
    """Why a path or interpreter cannot go to a node (None: it can).

    The one rule for ``--workdir``, ``--python`` and a hostfile's ``python=``: no control
    characters; ``~`` only as the remote user's home (``~`` or ``~/...``); an interpreter
    neither empty nor starting with '-'.
    """
    bad = _CONTROL.search(value)
    if bad:
        return f"contains the control character {bad.group()!r}"
    if value.startswith("~") and value != "~" and not value.startswith("~/"):
        return "uses ~name: only ~ and ~/ (the remote user's own home) are understood"
    if python and not value.strip():
        return "is empty"
    if python and value.startswith("-"):
        return "starts with '-' (it would be read as an option)"
    return None


def _python(value: object, ctx: _Ctx) -> str:
    """The interpreter on that node: an absolute path or a command on its PATH."""
    problem = node_value_problem(value, python=True) if isinstance(value, str) \
        else "is not a string"
    if problem is None and isinstance(value, str):
        return value
    raise ctx.error(f"invalid python {value!r}: {problem}",
                    hint="give the interpreter's path on the node, e.g. "
                         "python=/opt/venv/bin/python")


def _image(value: object, ctx: _Ctx) -> str:
    """A container image name (docs/containers.md): no spaces, not an option."""
    if isinstance(value, str) and value and not value.startswith("-") and not any(
            c.isspace() or ord(c) < 32 for c in value):
        return value
    raise ctx.error(f"invalid image {value!r}: expected an image name",
                    hint="e.g. image: nvcr.io/nvidia/pytorch:24.05-py3")


def yaml_groups(value: object, ctx: _Ctx) -> tuple[str, ...]:
    """``groups: [gpu, rack1]`` (or one name, or ``gpu,rack1``): names pdsh's -g takes."""
    items = value if isinstance(value, list) else [value]
    out: list[str] = []
    for item in items:
        if not isinstance(item, str | int) or isinstance(item, bool):
            raise ctx.error(f"groups: expected group names, got {item!r}",
                            hint="e.g. groups: [gpu, rack1]")
        for name in str(item).split(","):
            name = name.strip()
            if not _GROUP.fullmatch(name):
                raise ctx.error(f"groups: {name!r} is not a group name",
                                hint="letters, digits and _ . : + - only, e.g. rack1")
            out.append(name)
    return tuple(dict.fromkeys(out))


_GROUP = re.compile(r"[A-Za-z0-9_.:+-]+")


def _topology(value: object, ctx: _Ctx) -> str:
    """A switch or segment name (decide/runplan/placement.py): letters, digits and _ . : + -."""
    text = str(value) if isinstance(value, str | int) and not isinstance(value, bool) else ""
    if _GROUP.fullmatch(text) and len(text) <= 128:
        return text
    raise ctx.error(f"invalid switch/segment name {value!r}",
                    hint="letters, digits and _ . : + - only, e.g. switch=leaf3 segment=pod1")


_SETTERS = {"port": _port, "python": _python, "slots": _slots, "user": _user,
            "image": _image, "switch": _topology, "segment": _topology}


def _set(spec: _Spec, key: str, value: object, ctx: _Ctx) -> None:
    """Set one key, refusing a second, different value (user@ vs user=, :port vs port=)."""
    new = _SETTERS[key](value, ctx)
    old = getattr(spec, key)
    if old is not None and old != new:
        raise ctx.error(f"{key} given twice: {old!r} and {new!r}", hint=f"keep one {key}")
    setattr(spec, key, new)


# --------------------------------------------------------------------------- names


def _name_problem(name: str) -> str | None:
    """Why ``name`` (already free of odd characters) is not an RFC 1123 host name."""
    if len(name) > 253:
        return "longer than 253 characters"
    for label in name.split("."):
        if not label:
            return "empty part between dots"
        if label.startswith("-") or label.endswith("-"):
            return "a part may not start or end with '-'"
        if len(label) > 63:
            return "a part is longer than 63 characters"
    return None if _HOSTNAME.fullmatch(name) else "only letters, digits, '.', '-' and '_'"


def _check_name(name: str, ctx: _Ctx) -> str:
    """RFC 1123 names (plus '_'), and dotted-quad IPv4 when every label is a number."""
    problem = _name_problem(name)
    if problem:
        raise ctx.error(f"invalid host name {name!r}: {problem}", hint=_NAME_HINT)
    if all(label.isdigit() for label in name.split(".")):
        try:
            ipaddress.IPv4Address(name)
        except ValueError:
            raise ctx.error(f"invalid host name {name!r}: not a valid IPv4 address",
                            hint="e.g. 198.18.0.11 or 198.18.0.[11-14]") from None
    return name


def _ipv6(text: str, ctx: _Ctx) -> str:
    """Normalized so that duplicates spelled differently are still caught."""
    try:
        return str(ipaddress.IPv6Address(text))
    except ValueError:
        raise ctx.error(f"invalid IPv6 address {text!r}", hint="e.g. [fe80::1]:22") from None


def _top_level_comma(pattern: str) -> bool:
    depth = 0
    for ch in pattern:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth <= 0:
            return True
    return False


def _range_size(pattern: str) -> int:
    """How many names the pattern's well-formed ranges make, before NodeSet builds them all
    (it takes seconds on node[1-9999999]); anything malformed is left to NodeSet to report."""
    size = 1
    for group in re.findall(r"\[([^\[\]]*)\]", pattern):
        count = 0
        for part in group.split(","):
            match = re.fullmatch(r"(\d+)(?:-(\d+)(?:/(\d+))?)?", part.strip())
            if match:
                low, high, step = match.group(1), match.group(2) or match.group(1), match.group(3)
                count += max(0, (int(high) - int(low)) // max(1, int(step or 1)) + 1)
        size *= max(count, 1)
    return size


def _split_top(expr: str, seps: str) -> list[str]:
    """``expr`` cut at the characters in ``seps`` that are outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(expr):
        depth += (ch == "[") - (ch == "]")
        if ch in seps and depth <= 0:
            parts.append(expr[start:i])
            start = i + 1
    parts.append(expr[start:])
    return parts


def expr_size(expr: str) -> int:
    """An upper bound on the names a NodeSet expression (``a[1-4],b[1-2]!a3``) makes,
    computed without building it."""
    return sum(_range_size(part) for part in _split_top(expr, ",!&^ \t\n") if part)


def check_expr_size(expr: str, option: str) -> None:
    """A host expression given to an option: refuse it before NodeSet builds it."""
    size = expr_size(expr)
    if size > MAX_HOSTS:
        raise HostfileError(f"{expr!r} makes {size} hosts, over the cap of {MAX_HOSTS} hosts "
                            "per job", source=option, hint="check the range bounds")


def nodeset(pattern: str) -> NodeSet:
    """``NodeSet(pattern)`` without node groups; what NodeSet fails on besides its own
    exceptions (an AssertionError on a folded range over 1e9, as node[1-4]9999999999 is;
    int()'s 4,300-digit limit) is a NodeSetException too, never a traceback."""
    try:
        return NodeSet(pattern, resolver=RESOLVER_NOGROUP)
    except (AssertionError, ValueError, OverflowError):
        raise NodeSetException("a number in it is too large") from None


def _why(exc: NodeSetException) -> str:
    """NodeSet's reason, without its 'bad range: "..."' wrapping."""
    detail = exc.part if isinstance(exc, NodeSetParseRangeError) else str(exc)
    return detail.replace(" : ", ": ")


def _expand(pattern: str, ctx: _Ctx) -> list[str]:
    """A host pattern -> names. Characters are checked first: NodeSet would read '!', '&',
    '^' and '@' as set operators and groups, and shells would read much more."""
    bad = _PATTERN_CHARS.search(pattern)
    if bad:
        raise ctx.error(f"invalid host name {pattern!r}: {bad.group()!r} is not allowed "
                        "in a host name", hint=_NAME_HINT)
    if _top_level_comma(pattern):
        raise ctx.error(f"one host entry at a time, got {pattern!r}",
                        hint="put each host on its own line, or use a range: node[1,3-4]")
    if "[" not in pattern and "]" not in pattern:
        ctx.budget.take(1, pattern, ctx)
        return [_check_name(pattern, ctx)]
    ctx.budget.take(_range_size(pattern), pattern, ctx)
    try:
        nodes = nodeset(pattern)
    except NodeSetException as exc:
        raise ctx.error(f"bad host range {pattern!r}: {_why(exc)}",
                        hint="write ranges as node[1-4], gpu[01-16] or node[1,3-5]") from None
    return [_check_name(name, ctx) for name in nodes]


def _address(token: str, spec: _Spec, ctx: _Ctx) -> None:
    """Parse ``[user@]host[:port]`` (host: a pattern, ``[v6addr]`` or a bare v6 address)."""
    if "@" in token:
        user, _, token = token.rpartition("@")
        _set(spec, "user", user, ctx)
    port: str | None = None
    if token.startswith("[") and ":" in token.partition("]")[0]:
        end = token.find("]")
        if end < 0:
            raise ctx.error(f"missing ']' in {token!r}", hint="e.g. [fe80::1]:22")
        rest = token[end + 1:]
        if rest and not rest.startswith(":"):
            raise ctx.error(f"unexpected {rest!r} after {token[:end + 1]!r}",
                            hint="e.g. [fe80::1]:22")
        spec.names = [_ipv6(token[1:end], ctx)]
        port = rest[1:] if rest else None
    elif token.count(":") > 1 and "[" not in token:
        spec.names = [_ipv6(token, ctx)]
    else:
        token, colon, port = token.partition(":")
        if not token:
            raise ctx.error("missing host name", hint=_NAME_HINT)
        spec.names = _expand(token, ctx)
        port = port if colon else None
    if port is not None:
        _set(spec, "port", port, ctx)


def _hosts(spec: _Spec, ctx: _Ctx) -> list[Host]:
    """One entry's Hosts, all tagged with the entry's file:line."""
    env = tuple(sorted(spec.env.items()))
    return [Host(name=name, user=spec.user, port=spec.port, slots=spec.slots,
                 python=spec.python, env=env, source=ctx.label, image=spec.image,
                 groups=spec.groups, switch=spec.switch, segment=spec.segment)
            for name in spec.names]


# --------------------------------------------------------------------------- text

