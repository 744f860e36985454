"""docs/ci.md's pipeline, step by step, on the real-sshd cluster (minus the CI system)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reports import one_json_document, validate_json, validate_junit
from tests.util import dtrain

pytestmark = [pytest.mark.ssh, pytest.mark.torch]


def test_the_ci_pipeline_steps(cluster, tmp_path):
    env = cluster.client_env(DTRAIN_HOSTFILE="", NO_COLOR="1",
                             DTRAIN_ARCHIVE_DIR=str(tmp_path / "dtrain-runs"))
    hosts = ["-H", "node[1-4]"]
    py = ["--python", cluster.python]
    reports = tmp_path / "reports"

    keys = dtrain(["keys", "check", *hosts, "--identity", str(cluster.identity), "--json",
                   "--junit", str(reports / "keys.xml")], env=env, timeout=60)
    assert keys.returncode == 0, keys.stderr
    doc = one_json_document(keys.stdout)
    validate_json(doc, "keys")
    assert {n["host"] for n in doc["nodes"]} == {f"node{i}" for i in range(1, 5)}
    validate_junit((reports / "keys.xml").read_text())

    doctor = dtrain(["doctor", *hosts, *py, "--json", "--junit", str(reports / "doctor.xml")],
                    env=env, timeout=120)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    doc = one_json_document(doctor.stdout)
    validate_json(doc, "doctor")
    assert doc["outcome"] == "ok"
    validate_junit((reports / "doctor.xml").read_text())

    # both thresholds at ~0: a speed is no assertion (a loaded 2-core box measures its own
    # load); which size and which pairs the verdict judged is checked below and in
    # tests/test_smoke.py
    smoke = dtrain(["smoke", *hosts, *py, "--min-busbw", "0.0001", "--pair-fraction", "0.0001",
                    "--junit",
                    str(reports / "smoke.xml"), "--json"], env=env, timeout=170)
    assert smoke.returncode == 0, smoke.stderr[-3000:]
    doc = one_json_document(smoke.stdout)
    validate_json(doc, "smoke")
    # --min-busbw was judged on the whole sweep's largest size (gloo: 1K ... 4M): a verdict
    # on another row, or a sweep that stopped short, would pass this threshold too
    sweep = doc["smoke"]["sweep"]
    sizes = [row["size"] for row in sweep]
    assert sizes[0] == 1024 and sizes[-1] == 4 << 20 and sizes == sorted(set(sizes)), sizes
    assert len(sizes) >= 3, sizes
    assert doc["smoke"]["busbw"] == sweep[-1]["busbw"], doc["smoke"]
    assert doc["smoke"]["backend"] == "gloo"
    assert len(doc["smoke"]["pairs"]) == 6, doc["smoke"]["pairs"]  # every pair of 4 nodes
    assert doc["summary"].endswith(" at 4M"), doc["summary"]
    validate_junit((reports / "smoke.xml").read_text())

    run = dtrain(["run", *hosts, *py, "--nproc-per-node", "1", "--timeout", "120",
                  "--junit", str(reports / "run.xml"), "--json", "examples/ddp_smoke.py"],
                 env=env, timeout=170)
    assert run.returncode == 0, run.stderr[-3000:]
    doc = one_json_document(run.stdout)
    validate_json(doc, "run")
    validate_junit((reports / "run.xml").read_text())
    assert Path(doc["archive"]).parent == tmp_path / "dtrain-runs"
    assert len(list((tmp_path / "dtrain-runs").iterdir())) == 2  # smoke's and run's
