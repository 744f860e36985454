"""Everything dtrain itself prints (errors, summaries, tables) is drawn here.

Plain text when stderr is not a terminal or NO_COLOR is set, so CI logs stay clean.
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

from launcher.errors import DtrainError


def _color(stream: TextIO) -> bool:
    return not os.environ.get("NO_COLOR") and bool(getattr(stream, "isatty", lambda: False)())


def count(n: int, noun: str) -> str:
    """``1 node``, ``3 nodes``: a number with its noun (regular plurals only)."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def error(exc: DtrainError, stream: TextIO | None = None) -> None:
    """One line (two with a hint): what failed, where, and what to try."""
    stream = stream or sys.stderr
    where = f"{exc.host}: " if exc.host else ""
    red, dim, reset = ("\x1b[1;31m", "\x1b[2m", "\x1b[0m") if _color(stream) else ("", "", "")
    stream.write(f"{red}dtrain: error:{reset} {where}{exc.message}\n")
    if exc.hint:
        stream.write(f"{dim}  hint: {exc.hint}{reset}\n")
    stream.flush()


def note(text: str, stream: TextIO | None = None) -> None:
    """A line of dtrain's own on stderr (summaries, warnings)."""
    stream = stream or sys.stderr
    bold, reset = ("\x1b[1m", "\x1b[0m") if _color(stream) else ("", "")
    stream.write(f"{bold}dtrain:{reset} {text}\n")
    stream.flush()
