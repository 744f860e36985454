"""Typer's value coercion without pydantic for the plain option types dtrain uses.

typer (>= 0.2x) turns every command-line value into its annotated type through a pydantic
TypeAdapter: importing pydantic and building one adapter per parameter costs ~0.2 s of CPU
on every dtrain command, more than the rest of the CLI together (docs/benchmarks.md,
issue 26). dtrain's options are strings, integers, floats, flags and lists of strings.
``install`` gives each such parameter of a command a cheap coercion that returns what
pydantic returns for the values it can judge at a glance (``"64"`` for an int, ``"0.5"``
for a float within its range, a tuple of strings for a list). Anything else (a typo such
as ``--fanout x``, a value out of range, ``1e3``, a Path, an Enum, a custom parser) goes to
typer's own pydantic coercion, built then, which produces the result and the error
message it always did. tests/test_cli_lean.py checks both paths against typer's on every
option of every command.

Relies on typer's internals (``_TyperParameter._runtime_param``, ``type_descriptor``): where
they are missing (another typer), nothing is installed and typer coerces as before.
"""

from __future__ import annotations

import re
from typing import Any, get_args, get_origin

_INT = re.compile(r"-?[0-9]+\Z")
_FLOAT = re.compile(r"-?[0-9]+(\.[0-9]+)?\Z")


class _Slow(Exception):
    """The value needs typer's own coercion (to be converted, or for its error message)."""


def _number(kind: type, value: Any) -> int | float:
    if isinstance(value, bool):
        raise _Slow
    if isinstance(value, str):
        if not value.isascii() or not (_INT if kind is int else _FLOAT).match(value):
            raise _Slow
        return kind(value)  # type: ignore[no-any-return]
    if kind is int and isinstance(value, int):
        return value
    if kind is float and isinstance(value, (int, float)):
        return float(value)
    raise _Slow


class CheapParam:
    """One parameter's coercion: the plain cases here, the rest through typer's own."""

    def __init__(self, param: Any, leaf: type, is_list: bool) -> None:
        self._param = param
        self._leaf = leaf
        self._list = is_list
        info = param.type_descriptor.parameter_info
        self._min, self._max = info.min, info.max

    def _one(self, value: Any) -> Any:
        if self._leaf is str:
            if not isinstance(value, str):
                raise _Slow
            return value
        if self._leaf is bool:
            if not isinstance(value, bool):
                raise _Slow
            return value
        number = _number(self._leaf, value)
        if (self._min is not None and number < self._min) or \
                (self._max is not None and number > self._max):
            raise _Slow  # typer's message names the bound
        return number

    def _typer(self) -> Any:
        from typer._coercion import build_runtime_param

        real = build_runtime_param(self._param.type_descriptor)
        self._param._runtime_param = real  # from now on typer's own, for this parameter
        return real

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        multi = param.multiple or param.nargs == -1
        if value is None:
            return () if multi else None
        try:
            if self._list:
                if not isinstance(value, (list, tuple)):
                    raise _Slow
                return [self._one(v) for v in value]
            if multi:
                raise _Slow
            return self._one(value)
        except _Slow:
            return self._typer().coerce(value, param=param, ctx=ctx)


def _plain(param: Any) -> tuple[type, bool] | None:
    """(leaf type, is a list) when the parameter is one CheapParam can coerce."""
    desc = getattr(param, "type_descriptor", None)
    if desc is None or desc.file_annotation is not None:
        return None
    info = desc.parameter_info
    if info.parser is not None or info.clamp:
        return None
    annotation, is_list = desc.annotation, False
    if get_origin(annotation) is list:
        (annotation,) = get_args(annotation) or (None,)
        is_list = True
    if annotation not in (str, int, float, bool):
        return None
    return annotation, is_list


def install(params: list[Any]) -> None:
    """Give every plain parameter not yet coerced a CheapParam (idempotent)."""
    for param in params:
        if not hasattr(param, "_runtime_param") or param._runtime_param is not None:
            continue
        plain = _plain(param)
        if plain is not None:
            param._runtime_param = CheapParam(param, *plain)
