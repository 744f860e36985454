"""Pure: --env K=V and --env-file (dotenv) -> ordered (name, value) pairs.

dotenv rules: `#` comment lines and trailing ` #` comments on unquoted values, an optional
`export ` prefix, CRLF tolerated, 'single quotes' literal, "double quotes" with \\n, \\t,
\\", \\\\ escapes and multi-line values. Names must be valid shell identifiers.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from launcher.errors import ConfigError, UsageError

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# variables that break or hijack a remote shell when forwarded (the ColossalAI failures)
FORBIDDEN = frozenset({"HOSTNAME", "UID", "EUID", "PPID", "SHELLOPTS", "BASHOPTS", "PWD",
                       "OLDPWD", "SHLVL", "SSH_CONNECTION", "SSH_CLIENT", "SSH_TTY",
                       "SSH_AUTH_SOCK", "_"})
ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "$": "$"}


def check_value(value: str, where: str) -> str:
    """A value a process can carry: no NUL byte (exec would refuse it on the node)."""
    if "\x00" in value:
        raise UsageError(f"{where}: the value contains a NUL byte, which no process "
                         "environment can carry", hint="remove it")
    return value


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be forwarded to a rank (None: it can). The one rule for --env,
    --env-file and a YAML hostfile's env:."""
    if not NAME.match(name):
        return f"{name!r} is not a valid environment variable name"
    if name in FORBIDDEN:
        return f"{name} is set by the node itself and cannot be forwarded"
    return None


def name_hint(name: object) -> str:
    """What to do about a name ``name_problem`` refused."""
    if isinstance(name, str) and name in FORBIDDEN:
        return "leave it out: each node sets its own"
    return "letters, digits and '_', not starting with a digit"


def check_name(name: str, where: str) -> str:
    problem = name_problem(name)
    if problem:
        raise UsageError(f"{where}: {problem}", hint=name_hint(name))
    return name


def parse_env_args(items: Iterable[str],
                   environ: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """--env K=V (the value is taken verbatim, '=' and all) and --env NAME (the value of NAME
    in the launcher's environment, as ``docker run -e NAME``: a secret then never has to be
    on dtrain's own command line, which every user of a login node sees in ``ps``)."""
    environ = os.environ if environ is None else environ
    pairs = []
    for item in items:
        name, sep, value = item.partition("=")
        check_name(name, "--env")
        if not sep:
            if name not in environ:
                raise UsageError(f"--env {name}: {name} is not set in this environment",
                                 hint=f"export {name}=... first, or give --env {name}=VALUE")
            value = environ[name]
        pairs.append((name, check_value(value, f"--env {name}")))
    return pairs


def from_environment(items: Iterable[str]) -> frozenset[str]:
    """The names given as --env NAME (their values come from the launcher's environment)."""
    return frozenset(item for item in items if "=" not in item)


def _double(body: str) -> str:
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
    if "\x00" in text:
        line = text.count("\n", 0, text.index("\x00")) + 1
        raise ConfigError(f"{source}:{line}: NUL byte in an env file",
                          hint="an environment value cannot carry NUL; is this a binary file?")
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
            # the line is not shown: a pasted secret must not end up in a terminal log
            raise ConfigError(f"{source}:{lineno}: expected NAME=VALUE (no '=' on this line)")
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
            inner, rest = body[:end], body[end + 1:]
            if rest.strip() and not re.match(r"\s+#", rest):
                # the text is not shown: it may be part of a secret
                raise ConfigError(f"{source}:{i}: {name}: text after the closing {quote} quote",
                                  hint="quote the whole value, or put a comment after ' #'")
            value = inner if quote == "'" else _double(inner)
        else:
            value = re.split(r"\s+#", value, maxsplit=1)[0].rstrip()
        pairs.append((name, check_value(value, f"{source}:{lineno}: {name}")))
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
    """Read a dotenv file: UTF-8 text; every way of not being one is a file:line error."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"env file {path} not found", hint="check the --env-file path")
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read env file {path}: {exc.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 text (byte {data[exc.start]:#04x})",
                          hint="save the file as UTF-8") from None
    return parse_env_text(text, path)
