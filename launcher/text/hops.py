"""Where a one-shot command's time goes, hop by hop (``DTRAIN_HOPS=1``; docs/connections.md,
"Where a warm command's time goes").

Marks, each the wall-clock instant a hop was passed, in this order when they happen:

* ``process``: the kernel started this process (``/proc/self/stat``'s start time);
* ``entry``: the console script's first line (``launcher/start.py``);
* ``sent``: the request handed to the resident (a warm start only);
* ``forked``: the resident's child took on the client's state (a warm start only);
* ``command``: the command's body begins (the CLI parsed, its modules imported);
* ``connected``: the first node's connection is ready (the keeper's answer, or SSH's);
* ``first byte``: the first output from any node;
* ``exit status``: the last node's exit status arrived;
* ``end``: the command's body returned.

The marks made before the command's own process (the client's, when the resident's child
runs it) travel in its environment (``CARRY``). One line on stderr at the end, the time
between successive marks. Off (the default), a mark costs one environment lookup.
Standard library only: ``launcher/start.py`` imports this when the variable is set.
"""

from __future__ import annotations

import os
import sys
import time

TYPE_CHECKING = False  # typing is not imported: the client imports this before it sends
if TYPE_CHECKING:  # its request, where it would add to the very hops it measures
    from typing import TextIO

ENV = "DTRAIN_HOPS"
CARRY = "DTRAIN_HOPS_T"  # "name=t,name=t": the marks of the process that started this one
ORDER = ("process", "entry", "sent", "forked", "command", "connected", "first byte",
         "exit status", "end")
_marks: dict[str, float] = {}


def enabled() -> bool:
    return os.environ.get(ENV) == "1"


def mark(name: str, *, last: bool = False, t: float | None = None) -> None:
    """Note that ``name`` was passed now (the first time; the latest with ``last``)."""
    if enabled() and (last or name not in _marks):
        _marks[name] = time.time() if t is None else t


def process_start() -> float | None:
    """When the kernel started this process (wall clock, to the kernel's tick: 10 ms at
    USER_HZ 100), or None where /proc cannot say. Its age is measured on the clock the
    kernel counts it on (CLOCK_BOOTTIME), not from /proc/stat's btime (whole seconds)."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: after the ")"
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - started
        return time.time() - age if age >= 0 else None
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def carry(**marks: float | None) -> None:
    """Hand these marks to the process that runs the command next (the resident's child, or
    this one), through the environment."""
    have = parse(os.environ.get(CARRY, ""))
    have.update({k.replace("_", " "): v for k, v in marks.items() if v is not None})
    os.environ[CARRY] = ",".join(f"{k}={v:.6f}" for k, v in have.items())


def parse(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for item in text.split(","):
        name, _, value = item.partition("=")
        try:
            out[name] = float(value)
        except ValueError:
            continue
    return out


def spans(marks: dict[str, float]) -> list[tuple[str, float]]:
    """(``"a → b"``, seconds) between successive marks, in ORDER (a mark not passed is left
    out; a mark earlier than the one before it, from another clock, counts as 0)."""
    seen = [(name, marks[name]) for name in ORDER if name in marks]
    pairs = zip(seen, seen[1:], strict=False)
    return [(f"{a} → {b}", max(0.0, tb - ta)) for (a, ta), (b, tb) in pairs]


def line(marks: dict[str, float]) -> str:
    parts = spans(marks)
    total = sum(s for _, s in parts)
    return ("dtrain: hops (ms): " + " | ".join(f"{name} {s * 1e3:.1f}" for name, s in parts)
            + f" | total {total * 1e3:.1f}")


def report(stream: TextIO | None = None) -> None:
    """The command ended: its hops on stderr, once."""
    if not enabled() or "end" in _marks:
        return
    mark("end")
    marks = {**parse(os.environ.get(CARRY, "")), **_marks}
    out = stream or sys.stderr
    try:
        out.write(line(marks) + "\n")
        out.flush()
    except (OSError, ValueError):
        pass
