"""`dtrain stacks [RUN]`: every rank's Python stacks, folded, from any shell (docs/hangs.md).

A running run (foreground or detached) is asked through its launcher's control socket
(job/control.py): the launcher dumps every rank exactly as on a hang, archives the dump
under ``stacks/s<N>/`` and answers with the folded lines, which are printed here. A
finished run shows the last dump its archive holds (``stacks/<id>/folded.txt``, read with
the archive readers' checks). Stacks are the nodes' text: printed with every control
character inert.
"""

from __future__ import annotations

from pathlib import Path

from launcher.job.control import request_stacks
from launcher.output import render
from launcher.output.archive import read_meta, resolve_run
from launcher.output.evidence import STACKS_DIR, read_stack
from launcher.output.runstate import run_status
from launcher.text.termsafe import inert
from launcher.text.words import count


def stacks(archive_dir: Path, run: str | None) -> int:
    """Print the folded stacks of a run: 0 when shown, 1 when there are none to show."""
    run_dir = resolve_run(archive_dir, run)
    st = run_status(run_dir)
    if st.state != "finished" and st.alive:
        reply = request_stacks(run_dir)
        ranks = count(int(reply.get("ranks") or 0), "rank")
        _print(f"run {st.run_id}: stacks of {ranks} in "
               f"{float(reply.get('took') or 0):.1f} s")
        for line in reply.get("lines") or []:
            _print(f"  {line}")
        culprit = reply.get("culprit")
        if isinstance(culprit, dict):
            _print(f"likely culprit: {_who(culprit)}: {culprit.get('place')} "
                   f"({culprit.get('why')})")
        if reply.get("dir"):
            _print(f"every rank's stacks: {reply['dir']}")
        return 0
    dumps = read_meta(run_dir).get("stacks") or []
    last = dumps[-1] if isinstance(dumps, list) and dumps else None
    dump_id = str(last.get("id")) if isinstance(last, dict) else ""
    text = read_stack(run_dir, dump_id, "folded.txt") if dump_id else None
    if text is None:
        render.note(f"run {st.run_id} is not running ({st.label}) and its archive holds no "
                    "stack dump")
        return 1
    render.note(f"run {st.run_id} is not running ({st.label}); its last dump ({dump_id}) "
                f"in {run_dir / STACKS_DIR / dump_id}:")
    print(inert(text, "\n\t"), end="")
    return 0


def _print(text: object) -> None:
    print(inert(str(text), "\t"))


def _who(culprit: dict[str, object]) -> str:
    if culprit.get("rank") is not None:
        return f"rank {culprit['rank']} on {culprit.get('host')}"
    ranks = culprit.get("ranks")
    where = f" on {culprit['host']}" if culprit.get("host") else ""
    listed = ",".join(str(r) for r in ranks) if isinstance(ranks, list) else "?"
    return f"ranks {listed}{where}"
