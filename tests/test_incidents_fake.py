"""Issue 53: the incidents across runs, with `dtrain run` driven in-process over
transports/fake.py (one fake node per run, as tests/test_fake_run.py explains), one store in
tmp_path (DTRAIN_STATE_DIR) across the runs of a test:

(a) a bug at one line fails on node2, then in a second run on node3: the second run stops
    after its first failure, whatever --restarts says, and says why;
(b) node2 fails in two different ways in two runs: the second run fences it (a spare in
    its place), the third leaves it out from the start and says why.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.job.incidents import IncidentStore
from launcher.transports.fake import FakeTransport
from tests.util import need_root

pytestmark = [pytest.mark.torch]


@pytest.fixture(autouse=True)
def _root() -> None:
    need_root("a fake node's own hostname (a UTS namespace)")

# rank 1 fails on the nodes in WL_FAIL_ON (after a progress line), with WL_BUG's exception
WORKLOAD = """\
import os, socket, sys, time
rank = int(os.environ["RANK"])
print(f"rank {rank} step 1", flush=True)


def step(n):
    if os.environ["WL_BUG"] == "value":
        raise ValueError(f"bad batch at step {n}")
    raise KeyError(f"shard-{n}")


if rank == 1 and socket.gethostname() in os.environ["WL_FAIL_ON"].split(","):
    time.sleep(0.5)
    step(7)
print(f"rank {rank} done", flush=True)
"""


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv("DTRAIN_STATE_DIR", str(d))
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "wl.py").write_text(WORKLOAD)
    return d


def _run(tmp_path: Path, run_id: str, hosts: str, *args: str) -> tuple[int, str, dict]:
    fake = FakeTransport(own_hostname=True)
    with fake.installed():
        res = CliRunner().invoke(app, [
            "run", "-H", hosts, "--nproc-per-node", "2", "--archive-dir",
            str(tmp_path / "runs"), "--no-color", "--run-id", run_id, "--grace", "3",
            "--workdir", str(tmp_path / "work"), "--restart-backoff", "0.2", *args])
    meta = json.loads((tmp_path / "runs" / run_id / "meta.json").read_text())
    return res.exit_code, res.stdout + res.stderr, meta


def test_a_bug_seen_on_two_nodes_stops_the_run_after_its_first_failure(
        tmp_path: Path, state: Path) -> None:
    code, out, _ = _run(tmp_path, "a1", "node2", "-e", "WL_BUG=value", "-e",
                        "WL_FAIL_ON=node2,node3", "wl.py")
    assert code == 1, out[-3000:]
    (first,) = IncidentStore(state).load()
    assert (first.host, first.label) == ("node2", "ValueError at wl.py:step"), first
    assert first.commit is not None and first.commit.startswith("sha256:")
    code, out, meta = _run(tmp_path, "a2", "node3", "--restarts", "3", "-e", "WL_BUG=value",
                           "-e", "WL_FAIL_ON=node2,node3", "wl.py")
    assert code == 1, out[-3000:]
    assert [a["n"] for a in meta["attempts"]] == [1], meta["attempts"]
    line = (f"dtrain: stopping: fingerprint {first.fingerprint} (ValueError at wl.py:step) "
            f"already failed on node2 and node3 with commit {first.commit}; restarts would "
            "fail the same way")
    assert re.search("^" + re.escape(line) + "$", out, re.M), out[-3000:]
    assert meta["attempts"][0]["cause"] == "user"
    records = IncidentStore(state).load()
    assert [(r.host, r.run_id, r.fingerprint) for r in records] == [
        ("node2", "a1", first.fingerprint), ("node3", "a2", first.fingerprint)]
    res = CliRunner().invoke(app, ["incidents", first.fingerprint])
    assert "dtrain logs a1 --attempt 1" in res.output and "dtrain logs a2 --attempt 1" in \
        res.output, res.output


def test_a_node_failing_two_ways_is_fenced_and_left_out_of_the_next_run(
        tmp_path: Path, state: Path) -> None:
    code, out, _ = _run(tmp_path, "b1", "node2", "-e", "WL_BUG=value", "-e",
                        "WL_FAIL_ON=node2", "wl.py")
    assert code == 1, out[-3000:]
    # the second way, on node2 again: fenced (a suspect), node3 takes its place and finishes
    code, out, meta = _run(tmp_path, "b2", "node2,node3", "--nnodes", "1", "--restarts", "1",
                           "-e", "WL_BUG=key", "-e", "WL_FAIL_ON=node2", "wl.py")
    assert code == 0, out[-3000:]
    assert [(a["n"], a["hosts"]) for a in meta["attempts"]] == [(1, ["node2"]),
                                                                (2, ["node3"])]
    assert re.search(r"^dtrain: .*; 2 different failures on node2 within 7 days \(\w{12} "
                     r"\(ValueError at wl\.py:step, run b1\), \w{12} \(KeyError at "
                     r"wl\.py:step, run b2\)\): the machine's, not the code's \(tier suspect\)"
                     r": fenced, spare node3 in; attempt 2 from the last checkpoint",
                     out, re.M), out[-3000:]
    lemons = json.loads((state / "lemons.json").read_text())["lemons"]
    assert [(x["host"], x["tier"]) for x in lemons] == [("node2", "suspect")], lemons
    # the third run leaves node2 out from the start, and says why
    code, out, meta = _run(tmp_path, "b3", "node2,node3", "--nnodes", "1", "-e", "WL_BUG=key",
                           "-e", "WL_FAIL_ON=", "wl.py")
    assert code == 0, out[-3000:]
    assert re.search(r"^dtrain: node2 .*2 different failures on node2", out, re.M), \
        out[-3000:]
    assert "node3 r1: rank 1 done" in out and "node2 r" not in out
