"""Issue 53 items 2-4: the incident store (job/incidents.py: private, bounded, versioned,
refusing another user's or a corrupt file with nothing lost), the policy's reading of it
(decide/outcome/incidents.py ``recall``, decide/outcome/restarts.py ``decide``), and `dtrain
incidents`
(its --json against launcher/output/schemas/incidents.schema.json)."""

from __future__ import annotations

import json
import os
import pwd
from pathlib import Path

import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.commands.incidents import remember
from launcher.decide.outcome import failures
from launcher.decide.outcome import incidents as inc
from launcher.decide.outcome.incidents import Incident
from launcher.decide.outcome.restarts import (
    NODE,
    USER,
    AttemptEnd,
    NodeCount,
    RestartPolicy,
    decide,
)
from launcher.job.incidents import Corrupt, IncidentStore, StoreRefused, commit_of

DAY = 86400.0
T0 = 1_800_000_000.0
C1 = "a" * 40


def rec(fp: str, host: str, run: str, t: float = T0, commit: str | None = C1,
        kind: str = "exception", fault: str = "process", attempt: int = 1) -> Incident:
    return Incident(fp, f"Err{fp[:2]} at train.py:step", kind, fault, host, run, attempt, t,
                    "train.py", commit, {"dtrain": "1"})


# -- the policy ------------------------------------------------------------------------------

def test_a_print_on_two_nodes_with_one_commit_is_the_codes() -> None:
    first = rec("3fa2c1d09e4b", "node2", "r1")
    now = rec("3fa2c1d09e4b", "node3", "r2", T0 + 60)
    assert inc.recall([first], now) == inc.Recall(code=(
        "stopping: fingerprint 3fa2c1d09e4b (Err3f at train.py:step) already failed on node2 "
        "and node3 with commit aaaaaaa; restarts would fail the same way"))
    # another commit, the same node again, no commit known, a kind that is not the code's
    assert inc.recall([rec("3fa2c1d09e4b", "node2", "r1", commit="b" * 40)], now) == \
        inc.Recall()
    assert inc.recall([first], rec("3fa2c1d09e4b", "node2", "r2", T0 + 60)) == inc.Recall()
    assert inc.recall([rec("3fa2c1d09e4b", "node2", "r1", commit=None)],
                      rec("3fa2c1d09e4b", "node3", "r2", commit=None)) == inc.Recall()
    sig = rec("3fa2c1d09e4b", "node3", "r2", kind="signal")
    assert inc.recall([rec("3fa2c1d09e4b", "node2", "r1", kind="signal")], sig).code is None


def test_two_prints_on_one_node_within_the_window_are_the_machines() -> None:
    a = rec("aaaaaaaaaaaa", "node2", "r1")
    b = rec("bbbbbbbbbbbb", "node2", "r2", T0 + DAY)
    got = inc.recall([a], b)
    assert got.fence is not None and got.fence[:2] == ("node2", "suspect")
    assert got.fence[2].startswith("2 different failures on node2 within 7 days "
                                   "(aaaaaaaaaaaa (Erraa at train.py:step, run r1), ")
    c = rec("cccccccccccc", "node2", "r3", T0 + 2 * DAY)
    assert inc.recall([a, b], c).fence[:2] == ("node2", "isolate")  # type: ignore[index]
    # outside the window; another node's; a user fault; a communication error; the same
    # print twice; a print that is the code's (seen on node3 too)
    assert inc.recall([a], rec("bbbbbbbbbbbb", "node2", "r2", T0 + 8 * DAY)) == inc.Recall()
    assert inc.recall([rec("aaaaaaaaaaaa", "node3", "r1")], b) == inc.Recall()
    assert inc.recall([rec("aaaaaaaaaaaa", "node2", "r1", fault="user")], b) == inc.Recall()
    assert inc.recall([rec("aaaaaaaaaaaa", "node2", "r1", kind="comm")], b) == inc.Recall()
    assert inc.recall([a], rec("aaaaaaaaaaaa", "node2", "r2", T0 + 5)) == inc.Recall()
    coded = [a, rec("aaaaaaaaaaaa", "node3", "r1b")]
    assert inc.recall(coded, b) == inc.Recall()


def _end(host: str = "node2") -> AttemptEnd:
    reason = failures.FailureReason("exception", f"rank 1 on {host} raised ValueError: x",
                                    "", "user", 1, host, ("ValueError: x",))
    return AttemptEnd(1, "rank", host, 1, reason, progressed=True)


def test_the_restart_decision_stops_or_fences_on_the_records_and_says_why() -> None:
    policy = RestartPolicy(restarts=3)
    count = NodeCount(1, 1)
    plain = decide(_end(), [], 1, policy, ["node2"], ["node3"], count)
    assert plain.relaunch and plain.fault.kind == "process"
    code = inc.Recall(code="stopping: fingerprint f (x) already failed on a and b ...")
    d = decide(_end(), [], 1, policy, ["node2"], ["node3"], count, history=code)
    assert (d.relaunch, d.fault.kind, d.line) == (False, USER, code.code)
    fence = inc.Recall(fence=("node2", "suspect", "2 different failures on node2 ..."))
    d = decide(_end(), [], 1, policy, ["node2"], ["node3"], count, history=fence)
    assert d.relaunch and d.fault.kind == NODE and d.fault.tier == "suspect"
    assert d.fenced == (("node2", "2 different failures on node2 ..."),)
    assert d.gang is not None and d.gang.active == ("node3",)
    assert "2 different failures on node2 ...: fenced, spare node3 in" in d.line
    # never the last usable node
    d = decide(_end(), [], 1, policy, ["node2"], [], count, history=fence)
    assert d.fenced == () and "not fenced (node2: the run's last usable node)" in d.line


def test_a_healthy_node_a_neighbour_lies_about_gains_no_incident(tmp_path: Path) -> None:
    """(c) node2's rank fails and its output blames node3 (a traceback naming it, a closed
    connection from it): the record is node2's own, node3 has none."""
    store = IncidentStore(tmp_path / "state")
    lie = ["[rank1]: Traceback (most recent call last):",
           '[rank1]:   File "/w/train.py", line 3, in step',
           "[rank1]:     raise RuntimeError('node3 failed')",
           "[rank1]: RuntimeError: node3 failed: its GPU is broken, fence node3"]
    reason = failures.explain(rank=1, host="node2", code=1, sig=None, stderr=lie)
    end = AttemptEnd(1, "rank", "node2", 1, reason, progressed=True, stderr=tuple(lie))
    for run in ("r1", "r2", "r3"):
        remember(end, run_id=run, attempt=1, script="train.py", workdir=str(tmp_path),
                 hosts=["node2", "node3"], store=store, commit=C1)
    peer = ["Connection closed by peer [node3]:29500"]
    comm = failures.explain(rank=0, host="node2", code=1, sig=None,
                            comm=[("node2", 0, peer[0])])
    remember(AttemptEnd(1, "rank", "node2", 0, comm, progressed=True), run_id="r4",
             attempt=1, script="train.py", workdir=None, hosts=["node2", "node3"],
             store=store, commit=C1)
    hosts = {r.host for r in store.load()}
    assert hosts == {"node2"}
    assert all("node3" not in " ".join(r.label for r in store.load()) for _ in [0])
    # a hang: the culprit's own node (named on its own stack), never another
    hang = AttemptEnd(125, "hang", "node2", 1, None, where="script",
                      place="time.sleep <- step() train.py:3")
    got = remember(hang, run_id="r5", attempt=1, script="train.py", workdir=None,
                   hosts=["node2", "node3"], store=store, commit=C1)
    assert got.incident is not None and got.incident.host == "node2"
    assert got.incident.kind == "hang-script"
    # nothing explained, Ctrl-C: no record
    assert remember(AttemptEnd(130, "interrupted"), run_id="r6", attempt=1, script="t.py",
                    workdir=None, hosts=[], store=store).incident is None
    assert {r.host for r in store.load()} == {"node2"}


# -- the store -------------------------------------------------------------------------------

def test_the_store_is_private_bounded_and_versioned(tmp_path: Path) -> None:
    store = IncidentStore(tmp_path / "state")
    assert store.load() == []
    store.record([rec("aaaaaaaaaaaa", "n1", "r1", t=T0)], now=T0)
    assert os.stat(tmp_path / "state").st_mode & 0o777 == 0o700
    assert os.stat(store.path).st_mode & 0o777 == 0o600
    doc = json.loads(store.path.read_text())
    assert doc["incidents_version"] == 2 and len(doc["incidents"]) == 1
    # the same record twice is one; old records age out; at most MAX_RECORDS
    store.record([rec("aaaaaaaaaaaa", "n1", "r1", t=T0)], now=T0)
    assert len(store.load()) == 1
    many = [rec(f"{i:012x}", "n1", f"r{i}", t=T0 + i) for i in range(inc.MAX_RECORDS + 5)]
    kept = store.record(many, now=T0 + 10_000)
    assert len(kept) == inc.MAX_RECORDS and kept[0].run_id == "r5"
    assert store.record([], now=T0 + 91 * DAY + 10_000) == []


def test_a_corrupt_store_is_refused_and_kept_aside_never_overwritten(tmp_path: Path) -> None:
    store = IncidentStore(tmp_path)
    store.path.write_text("{not json")
    store.path.chmod(0o600)
    with pytest.raises(Corrupt, match="is not JSON"):
        store.load()
    assert store.path.read_text() == "{not json"
    res = CliRunner().invoke(app, ["incidents"], env={"DTRAIN_STATE_DIR": str(tmp_path)})
    assert res.exit_code == 1 and "is not JSON" in res.output, res.output
    store.record([rec("aaaaaaaaaaaa", "n1", "r1")], now=T0)
    assert store.kept_aside is not None
    assert Path(store.kept_aside).read_text() == "{not json"
    assert [r.run_id for r in store.load()] == ["r1"]
    # another version: refused, left as it is, not moved aside
    newer = json.dumps({"incidents_version": 3, "incidents": []})
    store.path.write_text(newer)
    with pytest.raises(StoreRefused, match="incidents_version 3"):
        store.record([rec("bbbbbbbbbbbb", "n1", "r2")], now=T0)
    assert store.path.read_text() == newer
    # a remember() in a run says so and goes on
    got = remember(_end(), run_id="r3", attempt=1, script="t.py", workdir=None,
                   hosts=["node2"], store=store, commit=C1)
    assert got.recall is None and got.notes[0].startswith("warning: incident not recorded")


def test_another_users_store_or_a_link_is_refused(tmp_path: Path,
                                                   intruder: pwd.struct_passwd) -> None:
    """(d) dtrain-intruder's file where the store should be, a link to theirs, a file
    others may write: refused with who owns it, nothing written, nothing lost."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    store = IncidentStore(state)
    theirs = json.dumps({"incidents_version": 1, "incidents": []})
    store.path.write_text(theirs)
    os.chown(store.path, intruder.pw_uid, intruder.pw_gid)
    with pytest.raises(StoreRefused, match=r"belongs to dtrain-intruder \(uid \d+\), not to "
                                           "you: refused"):
        store.load()
    with pytest.raises(StoreRefused):
        store.record([rec("aaaaaaaaaaaa", "n1", "r1")])
    assert store.path.read_text() == theirs and os.stat(store.path).st_uid == intruder.pw_uid
    store.path.unlink()
    elsewhere = tmp_path / "theirs.json"
    elsewhere.write_text(theirs)
    store.path.symlink_to(elsewhere)
    with pytest.raises(StoreRefused, match="is a symbolic link"):
        store.record([rec("aaaaaaaaaaaa", "n1", "r1")])
    assert elsewhere.read_text() == theirs and store.path.is_symlink()
    store.path.unlink()
    store.path.write_text(theirs)
    store.path.chmod(0o666)
    with pytest.raises(StoreRefused, match="writable by others"):
        store.load()
    # another user's state directory
    os.chown(state, intruder.pw_uid, intruder.pw_gid)
    with pytest.raises(StoreRefused, match="not by you"):
        store.load()


def test_the_commit_is_the_repositorys_or_the_scripts_hash(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    c = commit_of(str(tmp_path), "train.py")
    assert c is not None and c.startswith("sha256:") and len(c) == 19
    assert commit_of(str(tmp_path), "missing.py") is None
    repo = Path(__file__).resolve().parent.parent
    head = commit_of(str(repo), "x.py")
    assert head is not None and len(head) == 40


# -- dtrain incidents ------------------------------------------------------------------------

def test_dtrain_incidents_lists_and_shows_one_print_with_its_logs_lines(tmp_path: Path) -> None:
    from tests.reports import validate_json

    store = IncidentStore(tmp_path)
    now = __import__("time").time()
    store.record([rec("3fa2c1d09e4b", "node2", "r1", t=now - 3 * DAY),
                  rec("3fa2c1d09e4b", "node3", "r2", t=now - DAY, attempt=2),
                  rec("bbbbbbbbbbbb", "node2", "r3", t=now - 10 * DAY)], now=now)
    env = {"DTRAIN_STATE_DIR": str(tmp_path)}
    run = CliRunner().invoke
    res = run(app, ["incidents"], env=env)
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].split()[:5] == ["FINGERPRINT", "TIME", "LOST", "COUNT", "NODES"]
    assert lines[1].startswith("3fa2c1d09e4b  -          2      node2, node3  2")
    assert "aaaaaaa" in lines[1] and "Err3f at train.py:step" in lines[1]
    res = run(app, ["incidents", "--since", "7d", "--json"], env=env)
    doc = json.loads(res.stdout)
    validate_json(doc, "incidents")
    assert [f["fingerprint"] for f in doc["fingerprints"]] == ["3fa2c1d09e4b"]
    res = run(app, ["incidents", "3fa2"], env=env)
    assert res.exit_code == 0, res.output
    assert "dtrain logs r1 --attempt 1" in res.output
    assert "dtrain logs r2 --attempt 2" in res.output
    res = run(app, ["incidents", "3fa2c1d09e4b", "--json"], env=env)
    doc = json.loads(res.stdout)
    validate_json(doc, "incidents")
    assert [i["logs"] for i in doc["incidents"]] == ["dtrain logs r1 --attempt 1",
                                                      "dtrain logs r2 --attempt 2"]
    assert run(app, ["incidents", "ffff"], env=env).exit_code == 1
    assert run(app, ["incidents", "xyz"], env=env).exit_code == 2
    empty = run(app, ["incidents", "--json"], env={"DTRAIN_STATE_DIR": str(tmp_path / "no")})
    validate_json(json.loads(empty.stdout), "incidents")


# -- the time lost (item 4) ------------------------------------------------------------------

LEDGER = {"schema": 1, "attempts": [
    {"n": 1, "seconds": {"startup": 10.0, "productive": 50.0, "lost": 4.5, "detection": 0.5,
                         "hang": 0.0, "restart": 2.0, "backoff": 1.0, "winddown": 0.0}},
    {"n": 2, "seconds": {"startup": 8.0, "productive": 80.0, "lost": None, "detection": 0.0,
                         "hang": 0.0, "restart": 0.0, "backoff": 0.0, "winddown": 3.0}}]}


def test_an_incident_is_charged_its_attempts_lost_detection_restart_and_startup() -> None:
    got = inc.costs(LEDGER)
    assert got[1] == {"lost": 4.5, "detection": 0.5, "hang": 0.0, "restart": 2.0,
                      "startup": 10.0, "winddown": 0.0}
    assert got[2]["lost"] is None and got[2]["winddown"] == 3.0
    assert inc.costs(None) == {} and inc.costs({"attempts": "x"}) == {}
    records = [rec("aaaaaaaaaaaa", "n1", "r1"), rec("bbbbbbbbbbbb", "n1", "r1", attempt=2),
               rec("aaaaaaaaaaaa", "n2", "r0")]
    charged = inc.charge(records, "r1", got)
    assert [r.time_lost for r in charged] == [17.0, 11.0, None]
    # a record already charged keeps its seconds
    again = inc.charge(charged, "r1", {1: {"lost": 999.0}})
    assert again[0].time_lost == 17.0


def test_the_store_charges_a_runs_records_and_reads_version_1(tmp_path: Path) -> None:
    """A version 1 store (no seconds) is read, its records uncharged; the next write is
    version 2 with the old records kept; ``charge`` fills in one run's records only."""
    store = IncidentStore(tmp_path)
    old = {"incidents_version": 1, "incidents": [
        {"fingerprint": "aaaaaaaaaaaa", "label": "ValueError at t.py:f", "kind": "exception",
         "fault": "process", "host": "n1", "run_id": "r0", "attempt": 1, "t": T0,
         "script": "t.py", "commit": C1, "versions": {"dtrain": "0.9"}}]}
    store.path.write_text(json.dumps(old))
    store.path.chmod(0o600)
    (first,) = store.load()
    assert first.seconds is None and first.time_lost is None
    store.record([rec("aaaaaaaaaaaa", "n2", "r1", t=T0 + 5),
                  rec("bbbbbbbbbbbb", "n2", "r1", t=T0 + 6, attempt=2)], now=T0 + 10)
    assert json.loads(store.path.read_text())["incidents_version"] == 2
    assert store.charge("r1", inc.costs(LEDGER)) == 2
    assert [(r.run_id, r.time_lost) for r in store.load()] == [
        ("r0", None), ("r1", 17.0), ("r1", 11.0)]
    before = store.path.read_bytes()
    assert store.charge("r1", inc.costs(LEDGER)) == 0  # charged once
    assert store.charge("r9", inc.costs(LEDGER)) == 0
    assert store.path.read_bytes() == before
    # a record whose seconds are not seconds: the store is corrupt, not misread
    bad = json.loads(before)
    bad["incidents"][1]["seconds"] = {"lost": "a lot"}
    store.path.write_text(json.dumps(bad))
    with pytest.raises(Corrupt):
        store.load()


def test_dtrain_incidents_ranks_by_the_time_lost(tmp_path: Path) -> None:
    """--since 7d: the print that cost the most time first, though another is more
    frequent; TIME LOST in the table, time_lost_s in --json; one older than 7 days out."""
    from dataclasses import replace

    from tests.reports import validate_json

    store = IncidentStore(tmp_path)
    now = __import__("time").time()
    cheap = [replace(rec("cccccccccccc", f"node{i}", f"c{i}", t=now - DAY - i),
                     seconds={"lost": 1.0, "startup": 2.0}) for i in range(3)]
    dear = replace(rec("dddddddddddd", "node1", "d1", t=now - 2 * DAY),
                   seconds={"lost": 600.0, "detection": 30.0, "restart": None})
    unknown = rec("eeeeeeeeeeee", "node1", "e1", t=now - DAY)  # no seconds: ranked last
    old = replace(rec("ffffffffffff", "node1", "f1", t=now - 10 * DAY),
                  seconds={"lost": 9999.0})
    store.record([*cheap, dear, unknown, old], now=now)
    env = {"DTRAIN_STATE_DIR": str(tmp_path)}
    res = CliRunner().invoke(app, ["incidents", "--since", "7d"], env=env)
    assert res.exit_code == 0, res.output
    rows = [ln.split()[:4] for ln in res.output.splitlines()[1:4]]
    assert rows == [["dddddddddddd", "10.5", "min", "1"], ["cccccccccccc", "9.0", "s", "3"],
                    ["eeeeeeeeeeee", "-", "1", "node1"]], res.output
    assert "ranked by the time lost" in res.output
    doc = json.loads(CliRunner().invoke(app, ["incidents", "--since", "7d", "--json"],
                                        env=env).stdout)
    validate_json(doc, "incidents")
    assert [(f["fingerprint"], f["time_lost_s"], f["time_lost_measured"])
            for f in doc["fingerprints"]] == [("dddddddddddd", 630.0, 1),
                                              ("cccccccccccc", 9.0, 3),
                                              ("eeeeeeeeeeee", None, 0)]
    one = json.loads(CliRunner().invoke(app, ["incidents", "dddd", "--json"], env=env).stdout)
    validate_json(one, "incidents")
    assert one["incidents"][0]["seconds"] == {"lost": 600.0, "detection": 30.0,
                                              "restart": None}
    res = CliRunner().invoke(app, ["incidents", "dddd"], env=env)
    assert "10.5 min" in res.output, res.output


# -- one opener for the state files (job/statefile.py) -----------------------------------------

def test_the_lemon_list_and_the_store_share_one_opener_and_its_refusals(
        tmp_path: Path, intruder: pwd.struct_passwd) -> None:
    """A link, another user's file and a file others may write: statefile.read_state_file
    refuses each (Untrusted, why), the lemon list reads it as empty and leaves it, the
    incident store refuses it with the reason; both open the directory through it."""
    from launcher.decide.outcome.lemons import Lemon
    from launcher.job.lemons import LemonStore
    from launcher.job.statefile import Untrusted, open_state_dir, read_state_file

    state = tmp_path / "state"
    lemons, store = LemonStore(state), IncidentStore(state)
    lemons.remember([Lemon("n1", "lost", "r1", T0, T0 + 3600)])
    store.record([rec("aaaaaaaaaaaa", "n1", "r1")], now=T0)
    assert [x.host for x in lemons.load()] == ["n1"] and len(store.load()) == 1
    elsewhere = tmp_path / "elsewhere.json"
    for path, attack, why in [
            (lemons.path, "link", "link"), (store.path, "link", "link"),
            (lemons.path, "owner", "owner"), (store.path, "owner", "owner"),
            (lemons.path, "mode", "mode"), (store.path, "mode", "mode")]:
        saved = path.read_bytes()
        if attack == "link":
            elsewhere.write_bytes(saved)
            path.unlink()
            path.symlink_to(elsewhere)
        elif attack == "owner":
            os.chown(path, intruder.pw_uid, intruder.pw_gid)
        else:
            path.chmod(0o666)
        held = open_state_dir(state, create=False)
        assert held is not None
        try:
            with pytest.raises(Untrusted) as got:
                read_state_file(held, path.name, 1 << 20)
            assert got.value.why == why, (path.name, attack)
        finally:
            held.close()
        if path == lemons.path:
            assert lemons.load() == []
        else:
            with pytest.raises(StoreRefused):
                store.load()
        assert (elsewhere if attack == "link" else path).read_bytes() == saved
        path.unlink()
        path.write_bytes(saved)
        path.chmod(0o600)
    assert open_state_dir(tmp_path / "none", create=False) is None


def test_the_nccl_version_beside_a_record_is_the_probes_else_nccls_own_else_unknown(
        ) -> None:
    from types import SimpleNamespace

    from launcher.commands.restarts import versions_of

    def result(meta: dict[str, object], fabric: dict[str, object] | None) -> object:
        return SimpleNamespace(versions={"torch": meta.get("torch_versions") or {},
                                         "nccl": meta.get("nccl_versions") or {}},
                               fabric=fabric)

    probed = {"torch_versions": {"node2": "2.5.1"}, "nccl_versions": {"node2": "2.21.5"}}
    assert versions_of(result(probed, {"version": "2.19.3"}), "node2") == {  # type: ignore[arg-type]
        "torch": "2.5.1", "nccl": "2.21.5"}
    unprobed = {"torch_versions": {"node2": "2.5.1"}, "nccl_versions": {"node2": None}}
    assert versions_of(result(unprobed, {"version": "2.19.3"}), "node2")["nccl"] == \
        "2.19.3"  # type: ignore[arg-type]
    assert versions_of(result({}, None), "node2") == {"nccl": "unknown"}  # type: ignore[arg-type]
