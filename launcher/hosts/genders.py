"""pdsh's node groups: ``-g GROUP`` picks hosts by group, ``-X GROUP`` drops a group's hosts
(docs/hosts.md, "Groups"). Pure apart from reading the genders file.

A host's groups come from the YAML hostfile (``groups: [gpu, rack1]`` per host or in
``defaults:``) and from a genders file, as pdsh's genders module reads it (``--genders
FILE``, else ``$DTRAIN_GENDERS``, else /etc/genders when it exists). The genders format
(libgenders(3)): one entry a line, ``nodes attr[=value],attr[=value],...``: the nodes a
name, a comma list or a host range (``slc[0-15]``), then blanks, then the comma-separated
attributes with no blank inside; ``%n`` in a value is the node's name; ``#`` starts a
comment anywhere; a node may be on several lines (its attributes add up), but one
attribute twice on one node is an error. Commas and ``=`` cannot be in names or values.

``-g``/``-X`` take ``attr`` or ``attr=value``, several separated by commas (any of them:
pdsh's union). With ``-g`` and no hosts named (no -f, -H, hostfile in the environment or
Slurm), the hosts are the genders file's nodes in that group, as ``pdsh -g`` does.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ClusterShell.NodeSet import NodeSetException

from launcher.errors import HostfileError, UsageError
from launcher.hosts.entries import _split_top, expr_size, nodeset
from launcher.models import Host

DEFAULT_GENDERS = "/etc/genders"
ENV_GENDERS = "DTRAIN_GENDERS"
MAX_BYTES = 16 * 1024 * 1024
MAX_NODES = 100_000  # one line's node list, expanded
_ATTR = re.compile(r"[^\s,=#]+")
_GROUP_NAME = re.compile(r"[A-Za-z0-9_.:+%/@-]+")


@dataclass
class Genders:
    """A parsed genders file: node -> {attr: value or None}, in the file's node order."""

    source: str
    nodes: dict[str, dict[str, str | None]] = field(default_factory=dict)

    def groups_of(self, node: str) -> dict[str, str | None]:
        return self.nodes.get(node, {})

    def attrs(self) -> list[str]:
        return sorted({a for attrs in self.nodes.values() for a in attrs})


def parse_genders(text: str, source: str) -> Genders:
    """The genders format (module doc); a bad line is exit 2 with ``file:line``."""
    out = Genders(source)
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.partition("#")[0].strip()
        if not line:
            continue
        nodes_text, *rest = line.split(None, 1)
        attrs_text = rest[0].strip() if rest else ""
        if any(c.isspace() for c in attrs_text):
            raise HostfileError("blank inside the attribute list (genders: `nodes attr,attr=v`,"
                                " no blanks between attributes)", source=source, line=number,
                                hint="join the attributes with commas: gpu,rack=1")
        names: list[str] = []
        for part in _split_top(nodes_text, ","):
            try:
                if expr_size(part) > MAX_NODES:
                    raise NodeSetException(f"more than {MAX_NODES} nodes")
                names += nodeset(part)  # in the file's order
            except NodeSetException as exc:
                raise HostfileError(f"bad node list {nodes_text!r}: {exc}", source=source,
                                    line=number, hint="e.g. node[1-4] or node1,node2") from None
        attrs: list[tuple[str, str | None]] = []
        for item in filter(None, attrs_text.split(",")) if attrs_text else ():
            name, eq, value = item.partition("=")
            if not _ATTR.fullmatch(name) or (eq and not value) or "=" in value:
                raise HostfileError(f"bad attribute {item!r}", source=source, line=number,
                                    hint="attr or attr=value, no blank, ',' or '=' inside")
            attrs.append((name, value if eq else None))
        for node in names:
            have = out.nodes.setdefault(node, {})
            for attr, val in attrs:
                if attr in have:
                    raise HostfileError(f"node {node} has attribute {attr!r} twice",
                                        source=source, line=number,
                                        hint="give each node an attribute once")
                have[attr] = val.replace("%n", node) if val is not None else None
    return out


def load_genders(path: str) -> Genders:
    """Read and parse one genders file (a missing or unreadable one: exit 2)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise HostfileError(f"genders file not found: {path}",
                            hint="give --genders FILE, or a groups: key in a YAML hostfile"
                            ) from None
    except OSError as exc:
        raise HostfileError(f"cannot read genders file {path}: {exc.strerror}") from None
    if len(data) > MAX_BYTES:
        raise HostfileError(f"genders file {path} is larger than 16 MiB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HostfileError(f"genders file is not UTF-8 text: {path} ({exc.reason})") from None
    return parse_genders(text, path)


def genders_path(given: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    """--genders, else $DTRAIN_GENDERS, else /etc/genders when it exists, else None."""
    if given:
        return given
    if environ.get(ENV_GENDERS):
        return environ[ENV_GENDERS]
    return DEFAULT_GENDERS if os.path.exists(DEFAULT_GENDERS) else None


def parse_selector(text: str, option: str) -> list[tuple[str, str | None]]:
    """``gpu,rack=1`` -> [("gpu", None), ("rack", "1")]; bad text is exit 2."""
    out = []
    for item in text.split(","):
        name, eq, value = item.strip().partition("=")
        if not _GROUP_NAME.fullmatch(name) or (eq and not _GROUP_NAME.fullmatch(value)):
            raise UsageError(f"{option} {text!r}: {item.strip()!r} is not a group name",
                             hint=f"{option} GROUP or {option} attr=value, several "
                                  "separated by commas")
        out.append((name, value if eq else None))
    return out


def host_groups(host: Host, genders: Genders | None) -> dict[str, str | None]:
    """Every group of one host: its hostfile's ``groups:`` and its genders attributes."""
    found: dict[str, str | None] = dict.fromkeys(host.groups)
    if genders is not None:
        found.update(genders.groups_of(host.name))
    return found


def _matches(groups: Mapping[str, str | None], wanted: Iterable[tuple[str, str | None]]
             ) -> bool:
    return any(name in groups and (value is None or groups[name] == value)
               for name, value in wanted)


def select(hosts: list[Host], group: str | None, exclude_group: str | None,
           genders: Genders | None) -> list[Host]:
    """Keep the hosts in any ``-g`` group, then drop those in any ``-X`` group (order
    kept). A group no host has, or a selection that leaves nothing, is exit 2."""
    known = {n for h in hosts for n in host_groups(h, genders)}
    kept = hosts
    for option, text, keep in (("-g", group, True), ("-X", exclude_group, False)):
        if text is None:
            continue
        wanted = parse_selector(text, option)
        missing = [n for n, _ in wanted if n not in known]
        if missing and keep and len(missing) == len(wanted):
            where = _where(genders)
            raise HostfileError(
                f"{option} {text}: no host is in group {missing[0]!r} ({where})",
                hint=f"known groups: {', '.join(sorted(known)) or 'none'}")
        before = kept
        kept = [h for h in kept if _matches(host_groups(h, genders), wanted) == keep]
        if before and not kept:
            raise HostfileError(f"no hosts left after {option} {text}",
                                hint="the hosts are " + ",".join(h.name for h in before[:8]))
    return kept


def genders_hosts(genders: Genders, group: str) -> list[Host]:
    """``pdsh -g GROUP`` without hosts: the genders file's nodes in the group."""
    wanted = parse_selector(group, "-g")
    hosts = [Host(name=node, source=genders.source)
             for node, attrs in genders.nodes.items() if _matches(attrs, wanted)]
    if not hosts:
        raise HostfileError(f"-g {group}: no node of {genders.source} is in that group",
                            hint=f"its groups: {', '.join(genders.attrs()) or 'none'}")
    return hosts


def _where(genders: Genders | None) -> str:
    return f"the hostfile's groups: and {genders.source}" if genders is not None else \
        "the hostfile's groups:; no genders file given: --genders FILE"
