"""--json and --junit of exec and run on the real-sshd cluster: one JSON document on stdout
that validates against its schema, JUnit XML that validates against the Jenkins/Ant XSD, and
GitHub ::error annotations naming host and rank."""

from __future__ import annotations

import re

import pytest

from tests.reports import one_json_document, validate_json, validate_junit
from tests.util import dtrain

pytestmark = [pytest.mark.ssh]


def _cases(root) -> dict[str, object]:
    return {c.get("name"): c for c in root.iter("testcase")}


def test_exec_json_and_junit_name_the_failed_node(cluster, tmp_path):
    junit = tmp_path / "exec.xml"
    res = dtrain(["exec", "-H", "node[1-3]", "--json", "--junit", str(junit), "--",
                  "echo hello; echo oops >&2; test $(hostname) != node2"],
                 env=cluster.client_env(GITHUB_ACTIONS="true"), timeout=60)
    assert res.returncode == 1, res.stderr
    doc = one_json_document(res.stdout)
    validate_json(doc, "exec")
    assert doc["schema"] == "dtrain.exec/1" and doc["exit_code"] == 1
    status = {n["host"]: (n["status"], n["exit_code"]) for n in doc["nodes"]}
    assert status == {"node1": ("passed", 0), "node2": ("failed", 1), "node3": ("passed", 0)}
    assert doc["root_cause"]["host"] == "node2"
    assert "node1: hello" in res.stderr  # the command's output went to stderr
    assert "::error title=dtrain%3A host node2::" in res.stderr
    root = validate_junit(junit.read_text())
    cases = _cases(root)
    assert set(cases) == {"node1", "node2", "node3"}
    assert cases["node2"].find("failure") is not None
    assert cases["node1"].find("failure") is None


@pytest.mark.torch
def test_run_json_and_junit_name_the_failed_rank(cluster, tmp_path):
    junit = tmp_path / "run.xml"
    res = dtrain(["run", "-H", "node[1-2]", "--python", cluster.python, "--nproc-per-node",
                  "2", "--archive-dir", str(tmp_path / "runs"), "--json", "--junit",
                  str(junit), "--timestamps", "-e", "WL_STEPS=50", "-e", "WL_FAIL_RANK=3", "-e",
                  "WL_STEP_SLEEP=0.05", "tests/workloads/train.py"],
                 env=cluster.client_env(GITHUB_ACTIONS="true"), timeout=150)
    assert res.returncode == 7, res.stderr[-3000:]
    doc = one_json_document(res.stdout)
    validate_json(doc, "run")
    assert doc["root_cause"]["host"] == "node2" and doc["root_cause"]["rank"] == 3
    assert doc["archive"] and doc["run"]["world_size"] == 4
    node2 = next(n for n in doc["nodes"] if n["host"] == "node2")
    rank3 = next(r for r in node2["ranks"] if r["rank"] == 3)
    assert rank3["status"] == "failed" and rank3["exit_code"] == 7
    assert rank3["role"] == "root cause"
    assert any("failing on purpose" in t for t in rank3["stderr_tail"])
    assert "step" in res.stderr  # the training output went to stderr
    stamped = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3} node[12] r[0-3]: .*step",
                         re.MULTILINE)
    assert stamped.search(res.stderr), res.stderr[-2000:]  # --timestamps on run's console
    assert "::error title=dtrain%3A host node2; rank 3::" in res.stderr
    root = validate_junit(junit.read_text())
    cases = _cases(root)
    assert {"node1", "node2", "node1 rank 0", "node2 rank 3"} <= set(cases)
    failure = cases["node2 rank 3"].find("failure")
    assert failure is not None and "exit code: 7" in failure.text
    assert cases["node1 rank 0"].find("failure") is not None  # stopped by dtrain, said so
    assert "stopped by dtrain" in cases["node1 rank 0"].find("failure").get("message")
