"""~/.ssh/config for many hosts: the host-independent half of asyncssh's parse done once.

asyncssh evaluates ssh_config separately for every host (``Host``/``Match`` apply while it
reads), and so reads, strips and splits every line of the file again for each host: with a
generated config of a block or two per node that is O(hosts x nodes), ~3-5 ms of CPU per
host at 128 nodes on the 2-CPU box, a third or more of dtrain's client CPU per host (issue
26). Splitting a line into its option and arguments does not depend on the host, so
``ReplayConfig`` does it once per file (keyed by path, size and mtime) and replays the
split lines through asyncssh's own handlers, in asyncssh's order, for each host: matching,
handlers, %-expansion and every error message stay asyncssh's. Two shortcuts, both exact:
the rest of a block that does not apply is skipped in one step (asyncssh reads and drops
its lines), and a ``Host`` line without ``*``, ``?`` or ``!`` is a set membership (what
asyncssh's fnmatch of each name amounts to; ``[`` and ``]`` are literal there).

The replay mirrors ``asyncssh.config.SSHConfig.parse`` of the asyncssh versions in
``CHECKED`` (tests/test_ssh_config_replay.py compares both parsers' options and errors on
tricky configs); with any other asyncssh, asyncssh's own parse runs (``config_class``).
"""

from __future__ import annotations

import functools
import os
import re
import shlex
from pathlib import Path
from typing import Any

import asyncssh
from asyncssh.config import SSHClientConfig
from asyncssh.pattern import WildcardPatternList

CHECKED = {"2.24.1"}  # asyncssh versions whose SSHConfig.parse the replay mirrors

# one tokenized line: (line number, lowercased option, args, a Host line's literal names or
# None), or (line number, None, error, None)
_Line = tuple[int, str | None, Any, frozenset[str] | None]

# shlex.split (posix, whitespace_split, no commenters) splits on these four and nothing else;
# a line without a quote or a backslash splits to the same words ~15x faster this way
_SHLEX_SPACE = re.compile(r"[ \t\r\n]+")
_SHLEX_SPECIAL = re.compile(r"[\"'\\]")


def _words(line: str) -> list[str]:
    if _SHLEX_SPECIAL.search(line):
        return shlex.split(line)
    return [w for w in _SHLEX_SPACE.split(line) if w]


def _split(line: str, conditionals: frozenset[str], no_split: frozenset[str]
           ) -> tuple[str, list[str]]:
    """asyncssh's split of one stripped, non-comment line into (option, args)."""
    split_args = _words(line)
    args: list[str] = []
    loption = ""
    allow_equal = True
    for i, arg in enumerate(split_args, 1):
        if arg.startswith("="):
            if len(arg) > 1:
                args.append(arg[1:])
        elif not allow_equal:
            args.extend(split_args[i - 1:])
            break
        elif arg.endswith("="):
            args.append(arg[:-1])
        elif "=" in arg:
            arg, val = arg.split("=", 1)
            args.append(arg)
            args.append(val)
        else:
            args.append(arg)
        if i == 1:
            loption = args.pop(0).lower()
            allow_equal = loption in conditionals
    if loption in no_split:
        args = [line.lstrip()[len(loption):].strip()]
    return loption, args


@functools.lru_cache(maxsize=64)
def _tokenized(path: str, size: int, mtime_ns: int, conditionals: frozenset[str],
               no_split: frozenset[str], handlers: frozenset[str]
               ) -> tuple[tuple[_Line, ...], tuple[int, ...]]:
    """The lines of one config file that can do anything, split (size and mtime in the key:
    an edited file is read again), and for each the index of the next conditional or
    unreadable line: where a block that does not apply ends."""
    out: list[_Line] = []
    with open(path) as file:
        for number, raw in enumerate(file, 1):
            line = raw.strip()
            if not line or line[0] == "#":
                continue
            try:
                loption, args = _split(line, conditionals, no_split)
            except ValueError as exc:
                out.append((number, None, str(exc), None))
                continue
            if loption in handlers:  # asyncssh skips an option it has no handler for
                out.append((number, loption, tuple(args), _literal(loption, args)))
    skip_to = [len(out)] * len(out)
    nxt = len(out)
    for i in range(len(out) - 1, -1, -1):
        skip_to[i] = nxt
        if out[i][1] is None or out[i][1] in conditionals:
            nxt = i
    return tuple(out), tuple(skip_to)


@functools.lru_cache(maxsize=16384)
def _patterns(pattern: str) -> WildcardPatternList:
    return WildcardPatternList(pattern)


def _literal(loption: str, args: list[str]) -> frozenset[str] | None:
    """A ``Host`` line's names when none is a pattern: asyncssh's match (fnmatch of each
    comma-separated name, ``[`` and ``]`` escaped, only ``*`` and ``?`` wild, ``!``
    negating) is then membership."""
    if loption != "host" or not args:
        return None
    names = ",".join(args).split(",")
    if any("*" in n or "?" in n or n.startswith("!") for n in names):
        return None
    return frozenset(names)


def _match_host(config: Any, option: str, args: list[str]) -> None:
    """asyncssh's Host handler with the pattern list compiled once per pattern."""
    config._matching = _patterns(",".join(args)).matches(config._orig_host)
    args.clear()


class ReplayConfig(SSHClientConfig):
    """SSHClientConfig whose ``parse`` replays the file's cached split lines."""

    _handlers = {**SSHClientConfig._handlers, "host": ("Host", _match_host)}

    def parse(self, path: Path) -> None:
        self._path = path
        self._line_no = 0
        self._matching = True
        self._tokens = {"%": "%"}
        st = os.stat(path)
        lines, skip_to = _tokenized(str(path), st.st_size, st.st_mtime_ns,
                                    frozenset(self._conditionals), frozenset(self._no_split),
                                    frozenset(self._handlers))
        i = 0
        while i < len(lines):
            number, loption, args, names = lines[i]
            self._line_no = number
            if loption is None:
                self._error(args)
            if not self._matching and loption not in self._conditionals:
                i = skip_to[i]  # the rest of a block that does not apply
                continue
            i += 1
            if names is not None:  # Host without patterns: what _match_host would say
                self._matching = self._orig_host in names
                continue
            option, handler = self._handlers[loption]
            todo = list(args)
            if not todo:
                self._error(f"Missing {option} value")
            handler(self, option, todo)
            if todo:
                self._error(f'Extra data at end: {" ".join(todo)}')
        self._set_tokens()
        for option in self._percent_expand:
            try:
                value = self._options[option]
            except KeyError:
                pass
            else:
                if isinstance(value, list):
                    value = [self._expand_val(item) for item in value]
                elif isinstance(value, str):
                    value = self._expand_val(value)
                self._options[option] = value


def config_class() -> type[SSHClientConfig]:
    """ReplayConfig where the installed asyncssh is one the replay mirrors."""
    return ReplayConfig if asyncssh.__version__ in CHECKED else SSHClientConfig
