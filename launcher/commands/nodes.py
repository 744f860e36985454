"""`dtrain nodes`: the lemon list's records (decide/outcome/lemons.py) in the state directory's file
(job/lemons.py), listed, taken off, expired."""

from __future__ import annotations

import json
import math
import re
import sys
import time
from datetime import datetime

from launcher.decide.outcome import lemons as lm
from launcher.errors import UsageError
from launcher.job.lemons import LemonStore
from launcher.models import Host
from launcher.output import render
from launcher.text.termsafe import inert
from launcher.text.words import count

NODES_SCHEMA = "dtrain.nodes/1"
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd]?)")
_UNIT = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str, option: str = "--older-than") -> float:
    """``90s``, ``30m``, ``12h``, ``7d`` or plain seconds."""
    m = _DURATION.fullmatch(text.strip())
    if not m:
        raise UsageError(f"{option} {text!r}: give a duration like 90s, 30m, 12h or 7d")
    return float(m.group(1)) * _UNIT[m.group(2)]


def _when(t: float) -> str:
    """A time as the table shows it; one the file cannot mean (1e300, NaN) as "?"."""
    try:
        return datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M")
    except (OverflowError, OSError, ValueError):
        return "?"


def _finite(value: object) -> object:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def list_nodes(*, as_json: bool = False, store: LemonStore | None = None) -> int:
    store = store or LemonStore()
    now = time.time()
    records = sorted(store.load(), key=lm.by_time)
    if as_json:
        doc = {"schema": NODES_SCHEMA, "path": str(store.path),
               "nodes": [{**{k: _finite(v) for k, v in x.json().items()},
                          "fenced": lm.ends(x, now) > now} for x in records]}
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return 0
    if not records:
        sys.stdout.write(f"no fenced nodes ({store.path})\n")
        return 0
    rows: list[tuple[str, ...]] = [("HOST", "TIER", "COUNT", "STATE", "FENCED", "UNTIL",
                                    "RUN", "WHY")]
    for x in records:
        state = ("fenced" if x.tier == lm.ISOLATE else "left out") if lm.ends(x, now) > now \
            else "expired"
        # a time no dtrain wrote (-1e300, NaN, before 2000, far ahead): "time unknown"
        fenced = f"{_when(x.t)} ({lm.since(x.t, now)})" if lm.known_time(x.t, now) \
            else lm.UNKNOWN
        # the file's text is anyone's who could write it: inert (docs/security.md)
        rows.append(tuple(inert(c) for c in (x.host, x.tier, str(x.count), state,
                                             fenced, _when(x.until),
                                             x.run_id, x.why)))
    n = len(rows[0]) - 1
    widths = [max(len(r[i]) for r in rows) for i in range(n)]
    for r in rows:
        sys.stdout.write("  ".join(c.ljust(w) for c, w in zip(r[:n], widths, strict=True))
                         + "  " + r[n] + "\n")
    sys.stdout.write(f"{store.path}; `dtrain nodes unfence HOST` brings one back\n")
    return 0


def _record_host(label: str) -> Host:
    """A lemon record's host (its label: ``name`` or ``name:port``) as a Host."""
    name, colon, port = label.rpartition(":")
    if colon and name and ":" not in name and port.isdigit():
        return Host(name, port=int(port))
    return Host(label)


def _matching(hosts: list[str], labels: list[str]) -> tuple[list[str], list[str]]:
    """(the records' labels the HOSTS name, each host HOSTS name that is on no record).
    HOSTS are spelled as a hostfile spells hosts (``dtuser@node1:2222``, ``node[1-3]``); a
    record has no user, so ``user@`` is read and left aside; a name without a port names
    the host on any port."""
    from launcher.hosts.hostfile import host_patterns

    found: list[str] = []
    missing: list[str] = []
    for expr in hosts:
        for pattern in host_patterns(expr, "HOST"):
            for name in map(str, pattern.names):
                one = Host(name, port=pattern.port)
                named = [label for label in labels if _record_host(label).name == name
                         and pattern.port in (None, _record_host(label).port)]
                found += [label for label in named if label not in found]
                if not named:
                    missing.append(one.label)
    return found, missing


def unfence(hosts: list[str], store: LemonStore | None = None) -> int:
    store = store or LemonStore()
    names, missing = _matching(hosts, [x.host for x in store.load()])
    found = store.change(lambda old: lm.remove(old, names)) if names else []
    missing += [h for h in names if h not in found]
    if found:
        render.note(f"unfenced {', '.join(found)}: later runs use "
                    f"{'it' if len(found) == 1 else 'them'} again", sys.stdout)
    if missing:
        render.note(f"not on the list: {', '.join(missing)} (`dtrain nodes` lists it)",
                    sys.stdout)
    return 0 if found or not missing else 1


def expire(older_than: str | None, store: LemonStore | None = None) -> int:
    store = store or LemonStore()
    age = parse_duration(older_than) if older_than is not None else None
    now = time.time()
    dropped = store.change(lambda old: lm.expire(old, now, age))
    render.note(f"expired {count(len(dropped), 'record')}"
                + (f": {', '.join(x.host for x in dropped)}" if dropped else ""), sys.stdout)
    return 0


def fenced_notes(labels: list[str], store: LemonStore | None = None) -> list[str]:
    """`dtrain doctor`: a line for each checked host on the lemon list."""
    now = time.time()
    current = lm.current((store or LemonStore()).load(), now)
    return [f"{h} is on the lemon list: fenced by run {current[h].run_id} "
            f"{lm.since(current[h].t, now)} ({current[h].why}); runs with a spare host "
            f"leave it out (`dtrain nodes unfence {h}`)" for h in labels if h in current]
