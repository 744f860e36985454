"""Pure: --env K=V and --env-file (dotenv) -> ordered (name, value) pairs.

dotenv rules: `#` comment lines and trailing ` #` comments on unquoted values, an optional
`export ` prefix, CRLF tolerated, 'single quotes' literal, "double quotes" with \\n, \\t,
\\", \\\\ escapes and multi-line values. Names must be valid shell identifiers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from launcher.errors import ConfigError, UsageError

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# variables that break or hijack a remote shell when forwarded (the ColossalAI failures)
FORBIDDEN = frozenset({"HOSTNAME", "UID", "EUID", "PPID", "SHELLOPTS", "BASHOPTS", "PWD",
                       "OLDPWD", "SHLVL", "SSH_CONNECTION", "SSH_CLIENT", "SSH_TTY",
                       "SSH_AUTH_SOCK", "_"})
ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "$": "$"}


def check_name(name: str, where: str) -> str:
    if not NAME.match(name):
        raise UsageError(f"{where}: {name!r} is not a valid environment variable name")
    if name in FORBIDDEN:
        raise UsageError(f"{where}: {name} is set by the node itself and cannot be forwarded")
    return name


def parse_env_args(items: Iterable[str]) -> list[tuple[str, str]]:
    """--env K=V (the value is taken verbatim, '=' and all)."""
    pairs = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--env {item!r}: expected NAME=VALUE")
        pairs.append((check_name(name, "--env"), value))
    return pairs


def _double(body: str, path: str, line: int) -> str:
    out, i = [], 0
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body):
            out.append(ESCAPES.get(body[i + 1], "\\" + body[i + 1]))
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def parse_env_text(text: str, source: str) -> list[tuple[str, str]]:
    """dotenv text -> pairs; errors carry file:line."""
    text = text.replace("\r\n", "\n")
    pairs: list[tuple[str, str]] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        lineno, raw = i + 1, lines[i].strip()
        i += 1
        if not raw or raw.startswith("#"):
            continue
        if raw.startswith("export "):
            raw = raw[len("export "):].lstrip()
        name, sep, value = raw.partition("=")
        name = name.strip()
        if not sep:
            raise ConfigError(f"{source}:{lineno}: expected NAME=VALUE, got {raw!r}")
        check_name(name, f"{source}:{lineno}")
        value = value.lstrip()
        if value[:1] in ("'", '"'):
            quote = value[0]
            body = value[1:]
            while not _closes(body, quote):
                if i >= len(lines):
                    raise ConfigError(f"{source}:{lineno}: unterminated {quote} quote")
                body += "\n" + lines[i]
                i += 1
            end = _close_index(body, quote)
            inner = body[:end]
            value = inner if quote == "'" else _double(inner, source, lineno)
        else:
            value = re.split(r"\s+#", value, maxsplit=1)[0].rstrip()
        pairs.append((name, value))
    return pairs


def _close_index(body: str, quote: str) -> int:
    i = 0
    while i < len(body):
        if quote == '"' and body[i] == "\\":
            i += 2
            continue
        if body[i] == quote:
            return i
        i += 1
    return -1


def _closes(body: str, quote: str) -> bool:
    return _close_index(body, quote) >= 0


def load_env_file(path: str) -> list[tuple[str, str]]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"env file {path} not found")
    return parse_env_text(p.read_text(encoding="utf-8"), path)
