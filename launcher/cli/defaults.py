"""The user's config file as option defaults (hosts/userconfig.py), and where each value came
from, for the dry run.

Click's parameter source tells a value typed on the command line (or taken from the
option's environment variable) from the option's default: only a default is replaced by
the config's value. The callbacks are on the shared options (groups.py): --python, --setup,
--workdir, --archive-dir; the hostfile is applied in ``groups.hosts`` (it depends on -H,
WCOLL and a Slurm allocation too). The file is read once per command, at the first
option that needs it; nothing is read for --help or completion.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from typer import Exit

# typer vendors its own click (typer._click): its contexts, sources and exits
from typer._click import core
from typer._click.globals import get_current_context

SOURCES = "dtrain.sources"
CONFIG = "dtrain.config"
FLAGS = {"python": "--python", "setup": "--setup", "workdir": "--workdir",
         "archive_dir": "--archive-dir", "hostfile": "-f/--hostfile", "image": "--image",
         "container_runtime": "--container-runtime", "notify": "--notify",
         "image_via": "--via", "preload": "--preload"}
BUILT_IN = "built-in default"


def _root(ctx: core.Context | None = None) -> core.Context | None:
    ctx = ctx or get_current_context(silent=True)
    return ctx.find_root() if ctx is not None else None


def user_config(ctx: core.Context | None = None) -> Any:
    """The user's config (read once per command); a bad file: its error, exit 2."""
    root = _root(ctx)
    if root is not None and CONFIG in root.meta:
        return root.meta[CONFIG]
    from launcher.errors import DtrainError
    from launcher.hosts.userconfig import load

    try:
        cfg = load()
    except DtrainError as exc:
        from launcher.output import render

        render.error(exc)
        raise Exit(exc.exit_code) from None
    if root is not None:
        root.meta[CONFIG] = cfg
    return cfg


def sources(ctx: core.Context | None = None) -> dict[str, str]:
    """Where each setting came from: ``--python``, ``DTRAIN_ARCHIVE_DIR``, ``config
    FILE:LINE`` or the built-in default (filled in as the options are parsed)."""
    root = _root(ctx)
    if root is None:
        return {}
    found: dict[str, str] = root.meta.setdefault(SOURCES, {})
    return found


def from_config(key: str) -> Any:
    """An option callback: the config's ``key`` when the option was not given."""
    def callback(ctx: core.Context, param: core.Parameter, value: Any) -> Any:
        if ctx.resilient_parsing or param.name is None:
            return value
        source = ctx.get_parameter_source(param.name)
        record = sources(ctx)
        if source is core.ParameterSource.COMMANDLINE:
            record[key] = FLAGS.get(key, key)
            return value
        if source is core.ParameterSource.ENVIRONMENT:
            envvar = param.envvar if isinstance(param.envvar, str) else "environment"
            record[key] = envvar
            return value
        cfg = user_config(ctx)
        if key in cfg.values:
            record[key] = cfg.where(key)
            value = cfg.values[key]
            # a local path: ~ is this user's home (python, workdir: the node's, as typed)
            return os.path.expanduser(value) if key == "archive_dir" else value
        record[key] = BUILT_IN
        if key == "archive_dir":
            from launcher.hosts.userconfig import default_archive_dir

            return str(default_archive_dir())
        return value
    return callback


def config_hostfile() -> str | None:
    """The config's hostfile (recorded as the hosts' source), or None."""
    cfg = user_config()
    if "hostfile" not in cfg.values:
        return None
    sources()["hostfile"] = cfg.where("hostfile")
    return os.path.expanduser(str(cfg.values["hostfile"]))


def config_env() -> tuple[list[tuple[str, str]], dict[str, str]]:
    """The config's [env] pairs and their sources (``config FILE:LINE``)."""
    cfg = user_config()
    return list(cfg.env), {name: cfg.where(f"env.{name}") for name, _ in cfg.env}


NAMES = {"python": "python", "setup": "setup", "workdir": "workdir",
         "archive_dir": "archive dir", "hostfile": "hostfile"}


def setting_sources(**values: object) -> tuple[tuple[str, str, str], ...]:
    """(setting, value, source) for the dry run: the given values with the sources the
    options recorded (a setting without one, e.g. a default never parsed: built-in)."""
    return setting_sources_from(sources(), **values)


def setting_sources_from(found: Mapping[str, str], **values: object
                         ) -> tuple[tuple[str, str, str], ...]:
    """``setting_sources`` with the recorded sources given (pure)."""
    return tuple((NAMES.get(k, k), str(v), found.get(k, BUILT_IN))
                 for k, v in values.items() if v is not None)
