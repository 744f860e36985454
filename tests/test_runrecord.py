"""The run record (launcher/runrecord.py, issue 35 item 2): meta.json described once, typed
for its one writer, its bytes unchanged.

- an old run's meta.json, reopened and rewritten by the writer, is the same bytes;
- the vocabulary (states, root kinds) is the one the docs promise;
- every field the hand-made archives of the report's tests carry is described;
- the types bite: mypy refuses a writer that records a state that is not a RunState.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import get_args

from launcher.output.archive import RunArchive, meta_bytes, read_meta
from launcher.runrecord import Attempt, NodeResult, RootCause, RootKind, RunMeta, RunState
from tests import report_archives
from tests.util import REPO, need_module

# an older run's record, in the order its writers added the fields, with a field this
# version does not know (a reader keeps it, the writer writes it back)
OLD = {
    "archive_version": 1, "run_id": "20261101-101010-ab12",
    "created": "2026-11-01T10:10:10.000001+00:00", "created_ts": 1793527810.5,
    "dtrain_version": "0.1.0", "command": ["dtrain", "run", "-H", "node[1-2]", "train.py"],
    "script": "train.py", "args": [], "module": False, "workdir": None,
    "torch_versions": {"node1": "2.4.0", "node2": None}, "start": 1793527811.25,
    "plan": {"nodes": []}, "hosts": ["node1", "node2"], "world_size": 2,
    "layout": [{"host": "node1", "node_rank": 0, "ranks": [0]}],
    "state": "finished", "transport": "ssh",
    "launcher": {"pid": 4242, "uid": 1000, "host": "login1", "detached": False,
                 "heartbeat_timeout": 30.0, "launcher_timeout": 90.0, "grace": 10.0},
    "an_old_field": {"kept": [1, 2.5, None, "é"]},
    "end": 1793527900.0, "exit_code": 137, "outcome": "rank 1 on node2 was killed by SIGKILL",
    "root_cause": {"kind": "rank", "host": "node2", "rank": 1, "exit_code": 137,
                   "summary": "rank 1 on node2 was killed by SIGKILL", "signal": 9},
    "nodes": [{"host": "node2", "node_rank": 1, "exit_code": 137,
               "ranks": {"1": {"exit_code": 137, "signal": 9, "role": "root cause"}}}],
    "console_skipped": 0,
}


def test_an_old_record_is_rewritten_byte_for_byte(tmp_path: Path) -> None:
    run = tmp_path / OLD["run_id"]  # type: ignore[operator]
    run.mkdir(mode=0o700)
    (run / "hosts").mkdir()
    old = meta_bytes(OLD)  # type: ignore[arg-type]
    (run / "meta.json").write_bytes(old)
    archive = RunArchive(run, str(OLD["run_id"]))
    try:
        archive.write_meta(archive.meta)
    finally:
        archive.close()
    assert (run / "meta.json").read_bytes() == old
    assert read_meta(run) == OLD


def test_an_update_keeps_the_order_and_appends_new_fields(tmp_path: Path) -> None:
    archive = RunArchive.create(tmp_path / "archive", "r1")
    try:
        archive.update_meta(state="starting", start=1.0)
        archive.update_meta(state="running")
        archive.update_meta(end=2.0, exit_code=0, outcome="ok", state="finished")
    finally:
        archive.close()
    meta = json.loads((tmp_path / "archive" / "r1" / "meta.json").read_text())
    assert list(meta) == ["archive_version", "run_id", "created", "created_ts", "state",
                          "start", "end", "exit_code", "outcome"]
    assert meta["state"] == "finished"


def test_the_vocabulary_is_the_documented_one() -> None:
    docs = (REPO / "docs").resolve()
    exit_codes = (docs / "exit-codes.md").read_text()
    kinds = re.search(r"`root_cause` \(`kind`: ([a-z,\s]+);", exit_codes)
    assert kinds is not None
    assert set(get_args(RootKind)) == {k.strip() for k in kinds.group(1).split(",")}
    archive_doc = (docs / "output-and-archive.md").read_text()
    states = re.search(r"records `state` \(([a-z, ]+)\)", archive_doc)
    assert states is not None
    assert set(get_args(RunState)) == {s.strip() for s in states.group(1).split(",")}


def test_the_report_archives_fields_are_described(tmp_path: Path) -> None:
    run = report_archives.synthetic(tmp_path / "big", nodes=4, per_node=2, seconds=60)
    meta = json.loads((run / "meta.json").read_text())
    described = set(RunMeta.__annotations__)
    assert set(meta) <= described, set(meta) - described
    for node in meta.get("nodes", []):
        assert set(node) <= set(NodeResult.__annotations__)
    for attempt in meta.get("attempts", []):
        assert set(attempt) <= set(Attempt.__annotations__)
    assert set(meta.get("root_cause", {})) <= set(RootCause.__annotations__)


def test_a_writer_with_a_state_that_is_not_one_does_not_type_check(tmp_path: Path) -> None:
    need_module("mypy")
    snippet = tmp_path / "writer.py"
    snippet.write_text("from launcher.output.archive import RunArchive\n\n\n"
                       "def record(archive: RunArchive) -> None:\n"
                       "    archive.update_meta(state='running')\n"
                       "    archive.update_meta(state='paused')\n"
                       "    archive.update_meta(exit_cod=1)\n")
    res = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                          "--follow-imports=silent", str(snippet)], cwd=REPO,
                         capture_output=True, text=True, timeout=170)
    assert res.returncode == 1, res.stdout + res.stderr
    errors = [line for line in res.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 2, res.stdout
    assert "writer.py:6:" in errors[0] and "paused" in errors[0]
    assert "writer.py:7:" in errors[1] and "exit_cod" in errors[1]
