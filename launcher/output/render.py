"""Everything dtrain itself prints (errors, notes, GitHub annotations), and the one colour
rule every printer follows (``should_color``: the console, exec's fast path, the tables).

Plain text when stderr is not a terminal or NO_COLOR is set, so CI logs stay clean. A
message may quote what a node or an archive supplied (an error a node sent, a host name, a
run's outcome): ``error`` and ``note`` pass it through ``termsafe.inert``, so no control
sequence in it reaches the terminal (or a CI log that renders ANSI).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import TextIO

from launcher.errors import DtrainError
from launcher.text.termsafe import inert

_KEEP = "\n\t"  # a message may span lines; every other control is shown, inert


def should_color(stream: TextIO, env: Mapping[str, str] | None = None) -> bool:
    """Colour only a terminal, and never when NO_COLOR is set (https://no-color.org);
    FORCE_COLOR (non-empty, not 0) colours a pipe too (CI logs that render ANSI)."""
    env = os.environ if env is None else env
    if env.get("NO_COLOR"):
        return False
    if env.get("FORCE_COLOR", "") not in ("", "0"):
        return True
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def _color(stream: TextIO) -> bool:
    return should_color(stream)


def error(exc: DtrainError, stream: TextIO | None = None) -> None:
    """One line (two with a hint): what failed, where, and what to try."""
    stream = stream or sys.stderr
    where = f"{inert(exc.host)}: " if exc.host else ""
    red, dim, reset = ("\x1b[1;31m", "\x1b[2m", "\x1b[0m") if _color(stream) else ("", "", "")
    stream.write(f"{red}dtrain: error:{reset} {where}{inert(exc.message, _KEEP)}\n")
    if exc.hint:
        stream.write(f"{dim}  hint: {inert(exc.hint, _KEEP)}{reset}\n")
    stream.flush()


def note(text: str, stream: TextIO | None = None) -> None:
    """A line of dtrain's own on stderr (summaries, warnings)."""
    stream = stream or sys.stderr
    bold, reset = ("\x1b[1m", "\x1b[0m") if _color(stream) else ("", "")
    stream.write(f"{bold}dtrain:{reset} {inert(text, _KEEP)}\n")
    stream.flush()


def _gh_escape(text: str, *, prop: bool = False) -> str:
    """GitHub workflow-command escaping (data: % CR LF; properties also : and ,)."""
    text = inert(text, "\r\n").replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    if prop:
        text = text.replace(":", "%3A").replace(",", "%2C")
    return text


def github_error(message: str, *, hosts: Sequence[str] = (), ranks: Sequence[int] = (),
                 stream: TextIO | None = None) -> None:
    """A GitHub Actions ``::error`` annotation naming the host(s) and rank(s)."""
    stream = stream or sys.stderr
    where = []
    if hosts:
        where.append(f"host {', '.join(hosts)}")
    if ranks:
        where.append(f"rank {', '.join(str(r) for r in ranks)}")
    title = "dtrain: " + ("; ".join(where) if where else "failure")
    stream.write(f"::error title={_gh_escape(title, prop=True)}::{_gh_escape(message)}\n")
    stream.flush()
