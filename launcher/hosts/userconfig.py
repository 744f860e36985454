"""The user's defaults: ``$XDG_CONFIG_HOME/dtrain/config.toml`` (else ``~/.config/...``).

::

    hostfile = "~/clusters/a100.txt"
    python = "/opt/venv/bin/python"
    setup = "source /opt/venv/bin/activate"
    workdir = "~/proj"
    archive_dir = "~/dtrain-runs"

    [env]
    NCCL_DEBUG = "WARN"

Precedence: the command line > environment variables (DTRAIN_HOSTFILE, DTRAIN_ARCHIVE_DIR,
a Slurm allocation, WCOLL) > this file > dtrain's built-in defaults. ``DTRAIN_CONFIG``
names another file (``DTRAIN_CONFIG=`` empty: none). A missing file is no config; a bad
one is exit 2 with ``file:line`` (tomllib's own position, or the line of the bad key).

Also the per-user state directory (``state_dir``) and the run archive's default there
(``default_archive_dir``): ``$DTRAIN_STATE_DIR``, else ``$XDG_STATE_HOME/dtrain``, else
``~/.local/state/dtrain``; runs in its ``runs/``. Pure apart from reading the one file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from launcher.errors import ConfigError
from launcher.hosts.envfile import check_name, check_value

KEYS = ("hostfile", "python", "setup", "workdir", "archive_dir", "persist", "image",
        "container_runtime", "notify", "image_via", "preload")
MAX_BYTES = 1 << 20


def _home(env: Mapping[str, str]) -> Path:
    return Path(env.get("HOME") or Path.home())


def config_path(environ: Mapping[str, str] | None = None) -> Path | None:
    """Where the user's config is read from (None: DTRAIN_CONFIG set empty, no config)."""
    env = os.environ if environ is None else environ
    if "DTRAIN_CONFIG" in env:
        return Path(env["DTRAIN_CONFIG"]).expanduser() if env["DTRAIN_CONFIG"] else None
    base = env.get("XDG_CONFIG_HOME") or ""
    root = Path(base) if os.path.isabs(base) else _home(env) / ".config"
    return root / "dtrain" / "config.toml"


def state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """dtrain's per-user state directory (see the module doc)."""
    env = os.environ if environ is None else environ
    own = env.get("DTRAIN_STATE_DIR") or ""
    if os.path.isabs(own):
        return Path(own)
    state = env.get("XDG_STATE_HOME") or ""
    base = Path(state) if os.path.isabs(state) else _home(env) / ".local" / "state"
    return base / "dtrain"


def default_archive_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The run archive when nothing else names one: the state directory's ``runs``."""
    return state_dir(environ) / "runs"


@dataclass(frozen=True)
class UserConfig:
    """The values the file sets, each with the ``file:line`` it came from."""

    path: Path | None = None
    values: Mapping[str, str] = field(default_factory=dict)
    env: tuple[tuple[str, str], ...] = ()
    lines: Mapping[str, int] = field(default_factory=dict)  # key or "env.NAME" -> line

    def where(self, key: str) -> str:
        """``config ~/.config/dtrain/config.toml:3``: the source a dry run shows."""
        line = self.lines.get(key)
        return f"config {self.path}" + (f":{line}" if line else "")


def _line_of(text: str, key: str, section: str | None = None) -> int | None:
    """The line that sets ``key`` (in ``[section]``, or at the top level; a top-level key
    may also be a table's header: ``[other]``, ``[[other]]``, ``[ "other".x ]``)."""
    current: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        header = re.fullmatch(r"\[\[?\s*([^\]]+?)\s*\]\]?", stripped)
        if header:
            current = header.group(1)
            first = current.split(".")[0].strip().strip("\"'")
            if section is None and first == key:
                return number
            continue
        if current == section and re.match(rf"""["']?{re.escape(key)}["']?\s*=""", stripped):
            return number
    return None


def parse(text: str, path: Path) -> UserConfig:
    """The file's text -> its values; ConfigError ``path:line: what`` when it is wrong."""
    import tomllib  # here: a command without a config file does not pay for it

    try:
        data = tomllib.loads(text)
    except ValueError as exc:
        # TOMLDecodeError, and the ValueError tomllib lets out for an integer of more than
        # 4,300 digits (int()'s limit; found by the fuzz run, seed 42)
        where = re.search(r"\(at line (\d+), column \d+\)", str(exc))
        line = f":{where.group(1)}" if where else ""
        what = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(exc))
        raise ConfigError(f"{path}{line}: not valid TOML: {what}",
                          hint="fix the file (https://toml.io), or set DTRAIN_CONFIG= to "
                               "run without it") from None
    values: dict[str, str] = {}
    lines: dict[str, int] = {}
    env: list[tuple[str, str]] = []

    def bad(key: str, what: str, section: str | None = None) -> ConfigError:
        line = _line_of(text, key, section)
        return ConfigError(f"{path}{f':{line}' if line else ''}: {what}",
                           hint=f"the keys: {', '.join(KEYS)} and an [env] table of "
                                "NAME = \"value\"")

    for key, value in data.items():
        if key == "env":
            if not isinstance(value, dict):
                raise bad(key, "env must be a table: [env] then NAME = \"value\" lines")
            for name, val in value.items():
                if not isinstance(val, str):
                    raise bad(name, f"env.{name} must be a string", "env")
                try:
                    check_name(name, f"env.{name}")
                    check_value(val, f"env.{name}")
                except ConfigError:
                    raise
                except Exception as exc:  # UsageError: restate it at its line
                    raise bad(name, getattr(exc, "message", str(exc)), "env") from None
                env.append((name, val))
                lines[f"env.{name}"] = _line_of(text, name, "env") or 0
            continue
        if key not in KEYS:
            close = [k for k in KEYS if k.replace("_", "") == key.replace("-", "").replace(
                "_", "")]
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise bad(key, f"unknown key {key!r}{hint}")
        if not isinstance(value, str) or not value:
            raise bad(key, f"{key} must be a non-empty string")
        values[key] = value
        lines[key] = _line_of(text, key) or 0
    return UserConfig(path, values, tuple(env), lines)


def load(environ: Mapping[str, str] | None = None) -> UserConfig:
    """The user's config (empty when there is no file)."""
    path = config_path(environ)
    if path is None:
        return UserConfig()
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return UserConfig()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it: {exc.strerror or exc}",
                          hint="fix its permissions, or set DTRAIN_CONFIG= to run without "
                               "it") from None
    if len(raw) > MAX_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_BYTES >> 20} MiB: not a config file")
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    return parse(text, path)
