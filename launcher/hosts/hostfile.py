"""Hostfiles, ``-H`` expressions and ``--include/--exclude``: what the user wrote -> list[Host].

Pure and strict on purpose: every mistake is a HostfileError naming ``file:line`` (or the YAML
key path) and what to do, raised before anything connects; a missing hostfile is an error,
never a silent fall-back to localhost. Host ranges are expanded by ClusterShell's NodeSet
(with node groups off), so ``gpu[01-16]`` means exactly what it means to pdsh and clush.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ClusterShell.NodeSet import (
    RESOLVER_NOGROUP,
    NodeSet,
    NodeSetException,
)

from launcher.errors import HostfileError
from launcher.hosts.entries import (
    ENV_HOSTFILE,
    IGNORED_KEYS,
    TEXT_KEYS,
    YAML_DEFAULT_KEYS,
    YAML_HOST_KEYS,
    YAML_TOP_KEYS,
    _address,
    _Budget,
    _Ctx,
    _hosts,
    _set,
    _Spec,
    _split_top,
    _why,
    check_expr_size,
    nodeset,
    yaml_groups,
)
from launcher.hosts.envfile import name_hint, name_problem
from launcher.hosts.slurm import NODELIST, allocation
from launcher.hosts.sources import HostSource, host_source
from launcher.models import Host

if TYPE_CHECKING:
    import yaml  # imported where a YAML hostfile is read: -H and text files never pay for it


def _strip_comment(line: str) -> str:
    return line.partition("#")[0].strip()


def _parse_line(text: str, ctx: _Ctx) -> _Spec:
    """``[user@]host[:port] [slots=N] [key=value ...]`` (already without its comment)."""
    first, *settings = text.split()
    if "=" in first:
        raise ctx.error(f"expected a host first, got {first!r}",
                        hint="write [user@]host[:port] [slots=N] [key=value ...]")
    spec = _Spec()
    _address(first, spec, ctx)
    seen: set[str] = set()
    for token in settings:
        key, eq, value = token.partition("=")
        if not eq:
            raise ctx.error(f"unexpected {token!r}: settings are key=value",
                            hint="one host per line, e.g. 'node1 slots=8'")
        if key in IGNORED_KEYS:
            continue
        if key not in TEXT_KEYS:
            raise ctx.error(f"unknown key {key!r}{did_you_mean(key, TEXT_KEYS + IGNORED_KEYS)}"
                            f"; known keys: {', '.join(TEXT_KEYS)}")
        if key in seen:
            raise ctx.error(f"{key} given twice", hint=f"keep one {key}=")
        seen.add(key)
        _set(spec, key, value, ctx)
    return spec


def parse_hostfile_text(text: str, source: str) -> list[Host]:
    """Parse the text format (one entry a line; also DeepSpeed and OpenMPI hostfiles)."""
    hosts: list[Host] = []
    budget = _Budget()
    for number, raw in enumerate(text.split("\n"), start=1):
        line = _strip_comment(raw)
        if line:
            ctx = _Ctx(source, number, budget=budget)
            hosts += _hosts(_parse_line(line, ctx), ctx)
    return _checked(hosts, source)


# --------------------------------------------------------------------------- YAML


class _Yaml:
    """A composed YAML document: values come with their line numbers, for the errors."""

    def __init__(self, text: str, source: str) -> None:
        import yaml

        self.source = source
        self.text = text
        self.budget = _Budget()
        try:
            self.loader = yaml.SafeLoader(text)
        except yaml.YAMLError as exc:  # the reader refuses control characters up front
            raise HostfileError(f"not valid YAML: {_problem(exc)}", source=source,
                                line=_yaml_line(exc, text)) from None

    def root(self) -> yaml.Node | None:
        import yaml

        try:
            return self.loader.get_single_node()
        except yaml.YAMLError as exc:
            raise HostfileError(f"not valid YAML: {_problem(exc)}", source=self.source,
                                line=_yaml_line(exc, self.text), hint="check the indentation and "
                                "quoting") from None
        except ValueError as exc:
            # PyYAML's parser converting a directive's number itself (`%YAML 1.999...`:
            # int()'s 4,300-digit limit; found by the third long fuzz run, seed 45)
            raise HostfileError(f"not valid YAML: {str(exc)[:120]}", source=self.source,
                                hint="check the %YAML directive") from None

    def ctx(self, node: yaml.Node, path: str) -> _Ctx:
        return _Ctx(self.source, node.start_mark.line + 1, path, budget=self.budget)

    def value(self, node: yaml.Node, path: str) -> Any:
        import yaml

        try:
            return self.loader.construct_object(node, deep=True)
        except yaml.YAMLError as exc:  # an unknown tag, a !!set of a list, ...
            raise self.ctx(node, path).error(f"bad value: {_problem(exc)}",
                                             hint=_TAG_HINT) from None
        except (ValueError, TypeError, LookupError, AttributeError, OverflowError):
            # a tag's own constructor refusing its text (`!!int x`, `!!bool maybe`, an
            # unquoted 2001-13-45 read as a timestamp, an empty `!!int`/`!!float`: IndexError,
            # found by the long fuzz run, seed 44): PyYAML raises these, not YAMLError
            what = (f"{node.value!r} is not a valid {_tag(node.tag)}"
                    if isinstance(node, yaml.ScalarNode) else "it holds a value its tag "
                    "cannot read")
            raise self.ctx(node, path).error(f"bad value: {what}", hint=_TAG_HINT) from None

    def mapping(self, node: yaml.Node, path: str, keys: Iterable[str]) -> dict[str, yaml.Node]:
        """The mapping's items by key; unknown and repeated keys are errors."""
        import yaml

        if not isinstance(node, yaml.MappingNode):
            raise self.ctx(node, path).error("expected a mapping of key: value")
        try:
            self.loader.flatten_mapping(node)  # resolves '<<' merge keys
        except yaml.YAMLError as exc:  # a merge of a scalar (&a <<: *a)
            raise self.ctx(node, path).error(f"bad merge key: {_problem(exc)}",
                                             hint="'<<:' merges a mapping or a list of "
                                                  "mappings") from None
        except RecursionError:  # a mapping that merges itself, deeper than Python recurses
            raise self.ctx(node, path).error("a merge key that merges itself") from None
        known = tuple(keys)
        items: dict[str, yaml.Node] = {}
        for key_node, value_node in node.value:
            key = self.value(key_node, path)
            where = self.ctx(key_node, _join(path, str(key)))
            if key not in known:
                raise where.error(f"unknown key {key!r}{did_you_mean(str(key), known)}; "
                                  f"known keys: {', '.join(known)}")
            if key in items:
                raise where.error("key given twice", hint="keep one")
            items[key] = value_node
        return items


_TAG_HINT = "quote it, or drop the !!tag"


def _tag(tag: str) -> str:
    """``tag:yaml.org,2002:int`` -> ``!!int``, as it is written in the file."""
    return tag.replace("tag:yaml.org,2002:", "!!", 1)


def _problem(exc: yaml.YAMLError) -> str:
    return str(getattr(exc, "problem", None) or getattr(exc, "reason", None) or exc)


def _yaml_line(exc: yaml.YAMLError, text: str) -> int | None:
    """The line of a YAML error: its mark, or (a reader error) its character position."""
    mark = getattr(exc, "problem_mark", None)
    if mark is not None:
        return int(mark.line) + 1
    position = getattr(exc, "position", None)
    return text.count("\n", 0, position) + 1 if isinstance(position, int) else None


def _yaml_type(value: object) -> str:
    return "null" if value is None else type(value).__name__.replace("bool", "boolean")


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _yaml_env(doc: _Yaml, node: yaml.Node, path: str) -> dict[str, str]:
    """env: NAME: value; numbers become strings, booleans and nulls must be quoted."""
    import yaml

    if not isinstance(node, yaml.MappingNode):
        raise doc.ctx(node, path).error("expected a mapping of NAME: value",
                                        hint="e.g. env: {NCCL_DEBUG: INFO}")
    env: dict[str, str] = {}
    for key_node, value_node in node.value:
        name = doc.value(key_node, path)
        ctx = doc.ctx(key_node, _join(path, str(name)))
        problem = name_problem(name) if isinstance(name, str) else f"{name!r} is not a name"
        if problem:
            raise ctx.error(f"invalid environment variable: {problem}", hint=name_hint(name))
        value = doc.value(value_node, ctx.path)
        if isinstance(value, bool) or value is None or not isinstance(value, str | int | float):
            # the value is not shown: it may be a secret
            raise ctx.error(f"value must be a string, got a {_yaml_type(value)}",
                            hint="quote it, e.g. \"1\", \"true\" or \"\"")
        if "\x00" in str(value):
            raise ctx.error("the value contains a NUL byte, which no process environment "
                            "can carry", hint="remove the \\0")
        env[name] = str(value)
    return env


def _yaml_spec(doc: _Yaml, node: yaml.Node, path: str, keys: tuple[str, ...]) -> _Spec:
    """defaults: or one hosts: mapping -> _Spec (host: takes [user@]name[:port] too)."""
    items = doc.mapping(node, path, keys)
    spec = _Spec()
    if "host" in items:
        host_node = items["host"]
        ctx = doc.ctx(host_node, _join(path, "host"))
        value = doc.value(host_node, ctx.path)
        if not isinstance(value, str) or not value.strip() or len(value.split()) > 1:
            raise ctx.error(f"expected one host name or range, got {value!r}",
                            hint='e.g. host: "gpu[01-16]"')
        _address(value.strip(), spec, ctx)
    elif "host" in keys:
        raise doc.ctx(node, path).error("missing 'host:'", hint='e.g. {host: "gpu[1-2]", slots: 8}')
    for key, value_node in items.items():
        ctx = doc.ctx(value_node, _join(path, key))
        if key == "env":
            spec.env = _yaml_env(doc, value_node, ctx.path)
        elif key == "groups":
            spec.groups = yaml_groups(doc.value(value_node, ctx.path), ctx)
        elif key != "host":
            _set(spec, key, doc.value(value_node, ctx.path), ctx)
    return spec


def _yaml_entry(doc: _Yaml, node: yaml.Node, path: str) -> _Spec:
    """A hosts: item: a text-format line as a string, or a mapping."""
    import yaml

    if isinstance(node, yaml.ScalarNode):
        ctx = doc.ctx(node, path)
        value = doc.value(node, path)
        line = _strip_comment(value) if isinstance(value, str) else ""
        if not line:
            raise ctx.error(f"expected a host entry, got {value!r}", hint='e.g. "node1 slots=8"')
        return _parse_line(line, ctx)
    return _yaml_spec(doc, node, path, YAML_HOST_KEYS)


def parse_hostfile_yaml(text: str, source: str) -> list[Host]:
    """Parse the YAML format: ``defaults:`` then ``hosts:`` (strings or mappings)."""
    import yaml

    doc = _Yaml(text, source)
    try:
        root = doc.root()
        if root is None:
            return _checked([], source)
        top = doc.mapping(root, "", YAML_TOP_KEYS)
        defaults = _yaml_spec(doc, top["defaults"], "defaults", YAML_DEFAULT_KEYS) \
            if "defaults" in top else _Spec()
        if "hosts" not in top:
            raise doc.ctx(root, "").error("missing 'hosts:'", hint="add hosts: [node1, node2]")
        seq = top["hosts"]
        if not isinstance(seq, yaml.SequenceNode):
            raise doc.ctx(seq, "hosts").error("expected a list of hosts",
                                              hint='e.g. hosts: ["gpu[01-04] slots=8"]')
        hosts: list[Host] = []
        for index, item in enumerate(seq.value):
            path = f"hosts[{index}]"
            hosts += _hosts(_yaml_entry(doc, item, path).over(defaults), doc.ctx(item, path))
    finally:
        doc.loader.dispose()
    return _checked(hosts, source)


# --------------------------------------------------------------------------- files, -H


def _looks_like_yaml(text: str) -> bool:
    for raw in text.split("\n"):
        line = raw.strip()
        if line and not line.startswith("#"):
            return line.startswith(("defaults:", "hosts:", "---"))
    return False


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean slots?)`` for a close match, else "" (no irrelevant hints)."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def _near_file(path: str) -> str | None:
    """A file beside a missing one whose name is a likely typo of it (hosts.tx: hosts.txt)."""
    parent, name = os.path.split(path)
    try:
        names = [n for n in os.listdir(parent or ".")
                 if os.path.isfile(os.path.join(parent or ".", n))]
    except OSError:
        return None
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.8)
    return os.path.join(parent, close[0]) if close else None


def _read(path: str | os.PathLike[str], via: str) -> str:
    """The file's text; each way of not having one is its own clear error."""
    source = os.fspath(path)
    origin = f" (from {via})" if via else ""
    try:
        return Path(path).read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        where = f"check {via}" if via else "check the path given to -f"
        near = _near_file(source)
        raise HostfileError(f"hostfile not found: {source}{origin}"
                            + (f" (did you mean {near}?)" if near else ""),
                            hint=None if near else f"{where}, or use -H HOSTS") from None
    except IsADirectoryError:
        raise HostfileError(f"hostfile is a directory: {source}{origin}") from None
    except UnicodeDecodeError as exc:
        raise HostfileError(f"hostfile is not UTF-8 text: {source}{origin} ({exc.reason})") \
            from None
    except OSError as exc:
        raise HostfileError(f"cannot read hostfile {source}{origin}: {exc.strerror}") from None


def _load(path: str | os.PathLike[str], via: str = "") -> list[Host]:
    text = _read(path, via)
    source = os.fspath(path)
    if Path(path).suffix.lower() in (".yaml", ".yml") or _looks_like_yaml(text):
        return parse_hostfile_yaml(text, source)
    return parse_hostfile_text(text, source)


def load_hostfile(path: str | os.PathLike[str]) -> list[Host]:
    """Read a hostfile: YAML by extension (.yaml/.yml) or content, else the text format."""
    return _load(path)


def parse_host_expr(expr: str, source: str = "-H") -> list[Host]:
    """pdsh-style ``[user@]host[:port]`` entries separated by commas, ranges allowed."""
    ctx = _Ctx(source)  # one budget for the whole expression
    hosts: list[Host] = []
    for entry in filter(None, (part.strip() for part in _split_top(expr, ","))):
        if len(entry.split()) > 1:
            raise ctx.error(f"unexpected space in {entry!r}",
                            hint="separate hosts with commas: -H 'dtuser@node[1-4],login2:2222'")
        spec = _Spec()
        _address(entry, spec, ctx)
        hosts += _hosts(spec, ctx)
    if not hosts:
        raise ctx.error("empty host expression", hint="e.g. -H 'node[1-4]'")
    return _checked(hosts, source)


# --------------------------------------------------------------------------- filters, checks


def _nodeset(expr: str, option: str) -> NodeSet:
    """A --include/--exclude expression: NodeSet syntax, without node groups."""
    if "@" in expr:
        raise HostfileError(f"node groups are not supported: {expr!r}", source=option,
                            hint="list hosts or ranges, e.g. node[1-4],login2")
    check_expr_size(expr, option)
    try:
        return nodeset(",".join(expr.split()))
    except NodeSetException as exc:
        raise HostfileError(f"bad host expression {expr!r}: {_why(exc)}", source=option,
                            hint="e.g. node[1-4] or node[1-8]!node3") from None


@dataclass(frozen=True)
class HostPattern:
    """One entry of --include/--exclude: names (a NodeSet or a set), and the user and port
    when the entry wrote them (``dtuser@node[1-2]:2222``): a host matches on its name, and
    on the user and port only where the entry gives them."""

    text: str
    names: NodeSet | frozenset[str]
    user: str | None = None
    port: int | None = None

    def matches(self, host: Host) -> bool:
        return host.name in self.names and self.user in (None, host.user) \
            and self.port in (None, host.port)


_OPERATORS = re.compile(r"[!&^]")


def host_patterns(expr: str, option: str) -> list[HostPattern]:
    """``--exclude`` as written: a NodeSet expression of names (``node[1-8]!node3``), or
    entries spelled as a hostfile spells hosts (``dtuser@node1:2222,[fe80::1]:22``)."""
    words = [w for w in _split_top(expr.strip(), ", \t\n") if w]
    if not any("@" in w[1:] or ":" in w for w in words) or expr.lstrip().startswith("@"):
        whole = _nodeset(expr, option)
        if len(words) < 2 or _OPERATORS.search(expr):
            return [HostPattern(expr.strip(), whole)]
        return [HostPattern(w, _nodeset(w, option)) for w in words]
    check_expr_size(expr, option)
    ctx = _Ctx(option)
    patterns = []
    for word in words:
        spec = _Spec()
        _address(word, spec, ctx)
        patterns.append(HostPattern(word, frozenset(spec.names), spec.user, spec.port))
    return patterns


def with_user(hosts: Iterable[Host], user: str | None) -> list[Host]:
    """``-l USER``: the user of every host that names none (the others keep theirs)."""
    return [h if h.user or not user else replace(h, user=user) for h in hosts]


def filter_hosts(hosts: Iterable[Host], include: str | None,
                 exclude: str | None, *,
                 warn: Callable[[str], None] | None = None) -> list[Host]:
    """Keep hosts ``include`` names, then drop those ``exclude`` names (order kept); an
    --exclude entry that matches no host is told to ``warn``, once (a typo, or a name
    the hostfile spells otherwise)."""
    given = kept = list(hosts)
    for option, expr, keep in (("--include", include, True), ("--exclude", exclude, False)):
        if expr is None:
            continue
        patterns = host_patterns(expr, option)
        before = kept
        kept = [host for host in kept if any(p.matches(host) for p in patterns) == keep]
        if before and not kept:
            raise HostfileError(f"no hosts left after {option} {expr!r}",
                                hint=f"the hosts are {fold(h.name for h in before)}")
        if not keep and warn is not None:
            unmatched = [p.text for p in patterns if not any(p.matches(h) for h in given)]
            for text in dict.fromkeys(unmatched):
                near = did_you_mean(text, [spelled(h) for h in given])
                warn(f"{option} {text} matched no host{near}")
    return kept


def spelled(host: Host) -> str:
    """The host as a hostfile writes it: ``dtuser@node1:2222``, ``[fe80::1]:22``."""
    name = f"[{host.name}]" if ":" in host.name and host.port else host.name
    return f"{host.user + '@' if host.user else ''}{name}{f':{host.port}' if host.port else ''}"


def _split_source(label: str) -> tuple[str, int | None]:
    source, _, line = label.rpartition(":")
    return (source, int(line)) if source and line.isdigit() else (label, None)


def _checked(hosts: list[Host], source: str) -> list[Host]:
    """No empty list, and no host (same name and port) listed twice."""
    if not hosts:
        raise HostfileError("no hosts listed", source=source,
                            hint="add one host a line, e.g. 'node1 slots=8'")
    seen: dict[tuple[str, int | None], Host] = {}
    for host in hosts:
        first = seen.setdefault((host.name, host.port), host)
        if first is not host:
            where, line = _split_source(host.source)
            also = f" (first at {first.source})" if first.source != host.source else ""
            raise HostfileError(f"duplicate host {host.label!r}{also}", source=where, line=line,
                                hint="list each host once; use slots=N for more processes")
    return hosts


def resolve_hosts(*, hostfile: str | None, hosts: str | None, include: str | None = None,
                  exclude: str | None = None, group: str | None = None,
                  exclude_group: str | None = None, genders: str | None = None,
                  environ: Mapping[str, str] = os.environ, user: str | None = None,
                  warn: Callable[[str], None] | None = None,
                  config_hostfile: Callable[[], str | None] | None = None) -> list[Host]:
    """The job's hosts from the one source ``hosts/sources.host_source`` picks (-H, -f,
    $DTRAIN_HOSTFILE, $WCOLL, a Slurm allocation's SLURM_JOB_NODELIST, with -g the genders
    file's group, the config's hostfile: that order), filtered and checked. ``user``
    (``-l``) is every host's that names none before the filters read them, so ``--exclude
    alice@node1`` means the same with ``-l alice``; ``warn`` hears of an --exclude entry
    that matched no host; ``config_hostfile`` gives the user config's hostfile, asked only
    when nothing above it names hosts."""
    gfile = None
    if group is not None or exclude_group is not None:
        from launcher.hosts.genders import genders_path, load_genders

        path = genders_path(genders, environ)
        gfile = load_genders(path) if path else None
    chosen = host_source(hostfile=hostfile, hosts=hosts, environ=environ,
                         genders_group=group is not None and gfile is not None,
                         config_hostfile=config_hostfile)
    if chosen is not None and chosen.kind == "genders":
        from launcher.hosts.genders import genders_hosts, select

        assert gfile is not None and group is not None  # host_source's genders_group
        found = with_user(genders_hosts(gfile, group), user)  # pdsh -g GROUP: its nodes
        return _checked(filter_hosts(select(found, None, exclude_group, gfile), include,
                                     exclude, warn=warn), gfile.source)
    named = _resolve(chosen, include, exclude, environ, user, warn)
    if group is None and exclude_group is None:
        return named
    from launcher.hosts.genders import select

    return _checked(select(named, group, exclude_group, gfile), "-g")


def _resolve(chosen: HostSource | None, include: str | None, exclude: str | None,
             environ: Mapping[str, str], user: str | None = None,
             warn: Callable[[str], None] | None = None) -> list[Host]:
    """Read the source ``host_source`` chose."""
    if chosen is None:
        raise HostfileError("no hosts given: use -f FILE or -H EXPR",
                            hint=f"or set {ENV_HOSTFILE}=FILE, or run inside salloc/sbatch")
    value = chosen.value or ""
    if chosen.kind == "-H" and value.startswith("^"):  # pdsh's -w ^FILE: a file of hosts
        source, found = value[1:], _load(value[1:], via=f"-w {value}")
    elif chosen.kind == "-H" and value == "-":  # pdsh's -w -: the hosts from stdin
        import sys

        source, found = "-w -", parse_hostfile_text(sys.stdin.read(), "-w -")
    elif chosen.kind == "-H":
        source, found = "-H", parse_host_expr(value)
    elif chosen.kind == "Slurm":
        alloc = allocation(environ)
        assert alloc is not None  # host_source checked in_allocation
        source, found = NODELIST, alloc.hosts()
    else:  # -f, DTRAIN_HOSTFILE, WCOLL, the config's hostfile
        via = chosen.kind if chosen.kind in (ENV_HOSTFILE, "WCOLL") else ""
        source, found = value, _load(value, via=via)
    return _checked(filter_hosts(with_user(found, user), include, exclude, warn=warn), source)


def fold(names: Iterable[str]) -> str:
    """Folded display for summaries: ``node[1-3]``, ``198.18.0.[11-14]``.

    Names NodeSet would misread (operators, groups, brackets) are listed as they are.
    """
    plain: list[str] = []
    odd: list[str] = []
    for name in dict.fromkeys(names):
        (plain if re.fullmatch(r"[A-Za-z0-9._:%-]+", name) else odd).append(name)
    try:
        folded = str(NodeSet.fromlist(plain, resolver=RESOLVER_NOGROUP)) if plain else ""
    except (NodeSetException, AssertionError, ValueError, OverflowError):  # see nodeset()
        folded = ",".join(plain)
    return ",".join(filter(None, [folded, *odd]))


def host_sources(hosts: Iterable[Host]) -> str:
    """Where the hosts came from, for --dry-run: ``hosts.txt``, ``-H``, or the allocation."""
    sources = dict.fromkeys(_split_source(h.source)[0] for h in hosts if h.source)
    return ", ".join(sources) or "unknown"
