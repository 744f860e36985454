"""bench/soak.py's cross-run faults (issue 53; docs/incidents.md): a fault repeated across two
runs with one incident store, and the restart policy's decision scored against where the
campaign injected it.

* ``repeat-code``: the workload raises at one line on node A in a first run (no restarts),
  then on node B in a second run under ``--restarts 2`` with a spare. The fault is the
  code's: right is the second run stopping after its first attempt, naming the fingerprint,
  and fencing nobody.
* ``repeat-machine``: node K's rank is SIGKILLed from outside in a first run, then raises in
  the second (another way, under ``--restarts 2`` with a spare). The fault is the machine's:
  right is node K fenced, and K alone, the spare in, the run ending 0.

Each pair has its own store (``DTRAIN_STATE_DIR`` in the campaign's work directory), so no
other run's failures count. The code rule needs one commit in both runs: the repository's
HEAD (the workload is run from it), which stays put within a campaign unless someone commits
between the two runs of a pair.

Nothing here imports soak.py (it runs as ``__main__``): the campaign hands over what it has.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

CODE, MACHINE = "repeat-code", "repeat-machine"
KINDS = (CODE, MACHINE)
AT = 20  # the line the fault strikes at (every rank has printed by then)
STOPPED = re.compile(r"^dtrain: stopping: fingerprint [0-9a-f]{12} \(.*\) already failed on "
                     r".* with commit \S+; restarts would fail the same way$", re.M)


def lemons(state: Path) -> list[dict[str, Any]]:
    try:
        got = json.loads((state / "lemons.json").read_text()).get("lemons") or []
    except (OSError, ValueError):
        return []
    return [r for r in got if isinstance(r, dict)]


def run_pair(campaign: Any, kind: str, k: int, out: Any,
             kill_ranks: Callable[[int, str], bool]) -> None:
    """The two runs of ``kind`` with the fault on node ``k`` (``repeat-code``: then on
    another node); ``out`` (soak.Outcome) gets the second run's code, the score
    (``verdict_ok``: the policy decided right) and what broke. ``kill_ranks(k, run_id)``
    SIGKILLs the run's ranks on node k."""
    nodes = list(campaign.nodes)
    state = Path(campaign.work) / "state" / out.run_id
    env = {"DTRAIN_STATE_DIR": str(state)}
    other = campaign.rng.choice([n for n in nodes if n != k])
    where = f"node{k}" if kind == MACHINE else f"node{other}"
    first = campaign._start(out.run_id + "-1", False, client_env=env, extra=(
        [] if kind == MACHINE else ["-e", f"SOAK_RAISE_ON=node{k}", "-e", f"SOAK_RAISE_AT={AT}"]))
    if kind == MACHINE:
        if not campaign._wait_printing(first, AT) or not kill_ranks(k, first.run_id):
            out.broken.append(f"{kind}: no rank to kill on node{k} in the first run")
    code1 = first.wait()
    out.orphans += campaign._orphans(first, 10.0, out)
    if code1 in (0, None):
        out.broken.append(f"{kind}: the first run ended {code1}, expected a failure")
    hosts = f"{campaign.hosts},node{campaign.spare()}"
    second = campaign._start(out.run_id + "-2", False, hosts=hosts, client_env=env, extra=[
        "--nnodes", str(len(nodes)), "--restarts", "2", "--restart-backoff", "0.5",
        "-e", f"SOAK_RAISE_ON={where}", "-e", f"SOAK_RAISE_AT={AT}"])
    out.code = second.wait()
    out.orphans += campaign._orphans(second, 10.0, out, [*nodes, campaign.spare()])
    meta = second.meta()
    attempts = meta.get("attempts") or []
    fenced = sorted({str(r.get("host")) for r in lemons(state)})
    text = "\n".join(second.out)
    out.tail = second.out[-6:]
    if kind == CODE:
        stopped = len(attempts) == 1 and bool(STOPPED.search(text))
        out.root = {"kind": "stopped" if stopped else "not stopped",
                    "host": ",".join(fenced) or None}
        out.verdict_ok = stopped and not fenced and out.code == 1
        if not stopped:
            out.broken.append(f"{kind}: the second run made {len(attempts)} attempt(s), "
                              "expected to stop after its first (the same print on 2 nodes "
                              "with one commit)")
        if fenced:
            out.broken.append(f"{kind}: fenced {fenced} for the code's fault")
    else:
        out.root = {"kind": "fenced" if fenced else "not fenced",
                    "host": ",".join(fenced) or None}
        out.verdict_ok = fenced == [where] and out.code == 0 and len(attempts) >= 2
        if fenced != [where]:
            out.broken.append(f"{kind}: fenced {fenced or 'nothing'}, expected {where} alone "
                              "(2 different failures on it)")
        elif out.code != 0:
            out.broken.append(f"{kind}: the second run ended {out.code}, expected 0 on the "
                              "spare")


def score(outcomes: list[Any]) -> str:
    """The campaign's line: how often the policy was right on the cross-run faults."""
    def of(kind: str) -> str:
        got = [o.verdict_ok for o in outcomes if o.kind == kind and o.verdict_ok is not None]
        return f"{sum(got)}/{len(got)}"

    return (f"incident policy across runs: stopped on the code's fault {of(CODE)}, fenced "
            f"for the machine's fault {of(MACHINE)}")
