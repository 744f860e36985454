"""dtrain's own variables are decided once, in the plan (issue 54 item 5):
TORCH_ELASTIC_SHUTDOWN_TIMEOUT was set by the node's supervisor alone, so `--dry-run` never
showed it; now the plan decides it from --grace, the spec carries it, the dry run shows it
and the node's job gets exactly that value (the supervisor adds none of its own).
PYTHONUNBUFFERED and TORCH_ELASTIC_SHUTDOWN_TIMEOUT are each written once in launcher/."""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

from launcher.decide.runplan.plan import RunRequest, offline_plan, shutdown_timeout
from launcher.decide.runplan.runoptions import Limits, RunOptions
from launcher.job.node import JobSpec
from launcher.models import Host
from launcher.nodeside import rankshim
from tests.test_supervisor import py, sups  # noqa: F401 (the fixture)
from tests.util import assert_exit, dtrain

ROOT = Path(__file__).resolve().parent.parent
NAME = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"


def _dry_run(*args: str) -> tuple[dict[str, dict], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DTRAIN_", "DS_"))}
    env["DTRAIN_CONFIG"] = ""
    base = ["run", "-H", "localhost", "--dry-run", "--offline", "--nproc-per-node", "1", *args]
    doc = dtrain([*base, "--json", "examples/ddp_smoke.py"], env=env)
    assert_exit(doc, 0)
    text = dtrain([*base, "examples/ddp_smoke.py"], env=env)
    assert_exit(text, 0)
    return {v["name"]: v for v in json.loads(doc.stdout)["nodes"][0]["env"]}, text.stdout


def test_the_dry_run_shows_torchrun_s_shutdown_timeout_past_the_grace() -> None:
    env, text = _dry_run("--grace", "40")
    assert env[NAME]["value"] == "45" and env[NAME]["source"] == "dtrain"
    assert env[NAME]["exported"] is True
    assert f"{NAME}=45" in text, text
    assert env["PYTHONUNBUFFERED"]["value"] == "1"
    # --env wins over it, as over every dtrain default
    env, _ = _dry_run("--grace", "40", "-e", f"{NAME}=7")
    assert (env[NAME]["value"], env[NAME]["source"]) == ("7", "user")


def _plan(grace: float):  # type: ignore[no-untyped-def]
    return offline_plan(RunRequest("t.py", nproc_per_node="1", run_id="r1"),
                        RunOptions(limits=Limits(grace=grace)), [Host("localhost")])


PRINT_IT = f"import os; print('seen', os.environ.get({NAME!r}, 'unset'), flush=True)"


def test_the_node_s_job_gets_the_plan_s_value(sups) -> None:  # noqa: F811
    """The spec the launcher sends (JobSpec from the plan's node) runs under the real
    supervisor in run mode: its job sees the plan's value, 45 for a grace of 40 (the spec's
    own grace says 5: the node does not decide it)."""
    node = _plan(40.0).nodes[0]
    assert node.exported_env()[NAME] == str(shutdown_timeout(40.0)) == "45"
    spec = JobSpec(argv=(*py(PRINT_IT), rankshim.SHIM_PLACEHOLDER), env=node.exported_env(),
                   rank_shim=True, grace=5.0).wire()
    s = sups(spec)
    assert s.wait() == 0
    assert s.output() == b"seen 45\n"


def test_the_node_adds_no_shutdown_timeout_of_its_own(sups) -> None:  # noqa: F811
    """Without it in the spec, the job's environment has none (torchrun's own default
    applies): the old supervisor set max(30, grace + 5) by itself, unseen by --dry-run."""
    s = sups({"argv": [*py(PRINT_IT), rankshim.SHIM_PLACEHOLDER], "rank_shim": True,
              "grace": 40.0})
    assert s.wait() == 0
    assert s.output() == b"seen unset\n"


def _literals(value: str) -> list[str]:
    found = []
    for path in sorted((ROOT / "launcher").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value == value:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_each_of_dtrain_s_own_variables_is_written_once() -> None:
    assert [p.split(":")[0] for p in _literals("PYTHONUNBUFFERED")] == [
        "launcher/decide/runplan/netenv.py"]
    assert [p.split(":")[0] for p in _literals(NAME)] == ["launcher/decide/runplan/plan.py"]
