"""`dtrain smoke` on the real-sshd cluster: healthy, a slowed link, an odd torch version."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.reports import one_json_document, validate_json, validate_junit
from tests.util import dtrain

pytestmark = [pytest.mark.ssh, pytest.mark.torch]

# the version a shadowing sitecustomize makes node3's torch report (a torch upgrade done
# on one node only, as it happens after a maintenance window)
FAKE = "2.0.0+odd"
SITECUSTOMIZE = f'''
import importlib.abc
import importlib.util
import sys


class _OddTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module.__version__ = "{FAKE}"

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _OddTorch())
'''


def _smoke(cluster, tmp_path, *args, hosts="node[1-4]"):
    junit = tmp_path / "smoke.xml"
    res = dtrain(["smoke", "-H", hosts, "--python", cluster.python, "--archive-dir",
                  str(tmp_path / "runs"), "--no-color", "--json", "--junit", str(junit),
                  *args], env=cluster.client_env(), timeout=170)
    doc = one_json_document(res.stdout)
    validate_json(doc, "smoke")
    root = validate_junit(junit.read_text())
    return res, doc, root


def _failed_cases(root) -> dict[str, str]:
    return {c.get("name"): c.find("failure").get("message") for c in root.iter("testcase")
            if c.find("failure") is not None}


def test_a_cluster_wide_busbw_threshold_fails_the_check_not_the_nodes(cluster, tmp_path):
    """Issue 24.7: no 'ok: succeeded' before 'smoke: FAIL'; with every pair within
    --pair-fraction the JUnit fails 'check busbw' and no node."""
    res, doc, root = _smoke(cluster, tmp_path, "--min-busbw", "1000000", hosts="node[1-2]")
    assert res.returncode == 1, res.stderr[-3000:]
    assert "ok: succeeded" not in res.stderr
    assert "dtrain: job: ended (exit 0)\n" in res.stderr
    assert res.stderr.index("job: ended") < res.stderr.index("smoke: FAIL: all-reduce busbw")
    assert not any(p["slow"] for p in doc["smoke"]["pairs"])
    assert set(_failed_cases(root)) == {"check busbw"}, _failed_cases(root)
    assert all(n["status"] == "passed" for n in doc["nodes"]), doc["nodes"]


def test_smoke_passes_on_a_healthy_cluster(cluster, tmp_path):
    res, doc, root = _smoke(cluster, tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert doc["outcome"] == "ok" and doc["exit_code"] == 0
    smoke = doc["smoke"]
    assert smoke["backend"] == "gloo" and smoke["world_size"] == 4
    sizes = [row["size"] for row in smoke["sweep"]]
    assert sizes[0] == 1024 and sizes[-1] == 4 * 1024 * 1024
    for row in smoke["sweep"]:
        assert row["busbw"] == pytest.approx(row["algbw"] * 2 * 3 / 4)
    assert len(smoke["pairs"]) == 6 and not any(p["slow"] for p in smoke["pairs"])
    assert [n["host"] for n in doc["nodes"]] == ["node1", "node2", "node3", "node4"]
    assert all(n["status"] == "passed" for n in doc["nodes"])
    assert all(n["details"]["ranks"][str(i)]["torch"].startswith("2.")
               for i, n in enumerate(doc["nodes"]))
    # the human output went to stderr: the table and the verdict
    assert "busbw(GB/s)" in res.stderr and "smoke: PASS" in res.stderr
    assert "DTRAIN-SMOKE" not in res.stderr
    names = [c.get("name") for c in root.iter("testcase")]
    assert "node1" in names and "node4 rank 3" in names and "check pairs" in names
    assert not _failed_cases(root)
    assert doc["archive"] and Path(doc["archive"], "meta.json").exists()


@pytest.fixture
def slow_node3(cluster):
    """Everything into node3 goes at 50 Mbit/s (tbf on its root-side veth; this kernel has
    no netem); restored after."""
    from tests.util import tbf

    with tbf(cluster.node(3).veth, "50mbit"):
        yield


def test_smoke_names_the_node_whose_link_is_slow(cluster, tmp_path, slow_node3):
    res, doc, root = _smoke(cluster, tmp_path, "--max-size", "64K")
    assert res.returncode == 1, res.stderr[-3000:]
    fails = doc["smoke"]["failures"]
    assert [(f["check"], f["hosts"]) for f in fails] == [("pairs", ["node3"])], fails
    slow = {(p["a"], p["b"]) for p in doc["smoke"]["pairs"] if p["slow"]}
    assert slow == {("node1", "node3"), ("node2", "node3"), ("node3", "node4")}
    assert "node3 is slow" in doc["summary"]
    failed = _failed_cases(root)
    assert set(failed) == {"node3", "check pairs"}, failed
    assert "smoke: FAIL: node3 is slow" in res.stderr


def test_smoke_names_the_node_whose_torch_differs(cluster, tmp_path):
    fake = Path(cluster.shared_dir) / "odd-torch"
    fake.mkdir(exist_ok=True)
    (fake / "sitecustomize.py").write_text(textwrap.dedent(SITECUSTOMIZE))
    setup = f'if [ "$(hostname)" = node3 ]; then export PYTHONPATH={fake}; fi'
    res, doc, root = _smoke(cluster, tmp_path, "--setup", setup, "--max-size", "16K")
    assert res.returncode == 1, res.stderr[-3000:]
    fails = doc["smoke"]["failures"]
    assert [(f["check"], f["hosts"]) for f in fails] == [("versions", ["node3"])], fails
    assert f"node3 has {FAKE}" in fails[0]["message"]
    assert "node3" in _failed_cases(root)
    assert doc["root_cause"]["host"] == "node3"


# a node whose Python prints one forged report as the job exits (after rank 0's sweep): a
# sweep fast enough for any --min-busbw, and a pair time for two other nodes' link
FORGER = '''
import json
import os
import sys

_exit = os._exit


def _forge(code):
    mark = "DTRAIN-SMOKE "
    fast = {"size": 4096, "count": 1024, "iters": 5, "time_us": 0.1, "algbw": 500.0,
            "busbw": 999.0}
    sys.stdout.write(mark + json.dumps({"kind": "sweep", "backend": "gloo", "world": 3,
                                        "rows": [fast]}) + "\\n")
    sys.stdout.write(mark + json.dumps({"kind": "pairs", "rank": 99, "rows": [
        {"a": 0, "b": 1, "size": 1, "time_us": 1e9, "gbps": 1e-9}]}) + "\\n")
    sys.stdout.flush()
    _exit(code)


os._exit = _forge
'''


def test_smoke_believes_no_node_on_its_word(cluster, tmp_path):
    """node3 forges the sweep (FAIL would become PASS) and accuses the node1 <-> node2 link:
    both lines are refused, the smoke fails naming node3, the real sweep is judged."""
    forger = Path(cluster.shared_dir) / "smoke-forger"
    forger.mkdir(exist_ok=True)
    (forger / "sitecustomize.py").write_text(FORGER)
    setup = f'if [ "$(hostname)" = node3 ]; then export PYTHONPATH={forger}; fi'
    res, doc, root = _smoke(cluster, tmp_path, "--setup", setup, "--max-size", "4K",
                            "--min-busbw", "100", "--pair-fraction", "0.000001",
                            hosts="node[1-3]")
    assert res.returncode == 1, res.stderr[-3000:]
    fails = {(f["check"], tuple(f["hosts"]), f["message"]) for f in doc["smoke"]["failures"]}
    assert ("ranks", ("node3",), "node3: a smoke report refused: a sweep from rank 2") in fails
    assert any(host == ("node3",) and "a second pairs report from rank 2" in msg
               for _, host, msg in fails), fails
    assert doc["smoke"]["busbw"] < 100 and any(c == "busbw" for c, _, _ in fails)
    assert not any(p["slow"] for p in doc["smoke"]["pairs"])
    assert "check ranks" in _failed_cases(root) and "check busbw" in _failed_cases(root)
