"""torchrun and DeepSpeed habits (issue 24 item 11): their option spellings, DeepSpeed's
per-host GPU selection (--include host:0,1@host2:1, --exclude host:2: CUDA_VISIBLE_DEVICES
per node, decided in launcher/decide/runplan/devices.py) and a .deepspeed_env file, shown by
--dry-run with its source. On the old main each spelling was "no such option", and
`--include node1:0,1` a bad host expression."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.decide.runplan.devices import DeviceSelection, selection, split_spec
from launcher.errors import UsageError
from tests.util import assert_exit, dtrain

# ------------------------------------------------------------------------------ decisions


def test_a_plain_hostlist_is_left_alone() -> None:
    assert split_spec("node[1-4],login2", "--include") == ("node[1-4],login2", {})
    assert selection(None, None) == (None, None, DeviceSelection())


def test_deepspeed_specs() -> None:
    inc, exc, sel = selection("node1:0,1@node2:2@node3", "node4@node3:0")
    assert inc == "node3,node1,node2" and exc == "node4"
    assert sel.gpus("node1", 8) == (0, 1) and sel.gpus("node2", 4) == (2,)
    assert sel.gpus("node3", 4) == (1, 2, 3) and sel.gpus("node5", 4) is None
    with pytest.raises(UsageError, match="both --include and --exclude"):
        selection("node1:0", "node1:1")
    _, _, sel = selection(None, "node2:0,3")
    assert sel.gpus("node2", 4) == (1, 2)


@pytest.mark.parametrize(("include", "exclude", "message"), [
    ("node1:x", None, "is not HOST or HOST:GPU"),
    (None, "node1:0", "shows no GPU to leave out"),
    ("node1:4", None, "no GPU 4"),
    (None, "node1:0,1", "no GPU left"),
])
def test_bad_selections(include: str | None, exclude: str | None, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        _, _, sel = selection(include, exclude)
        sel.gpus("node1", 2 if "GPU left" in message or "GPU 4" in message else 0)


def test_spec_forms_whole() -> None:
    # GPUs sorted and once each, spaces around an entry ignored; --include lists the bare
    # hosts first, then those with GPUs; --exclude filters by its bare hosts only
    assert split_spec("node1:2,0,2 @ node2", "--include") == ("node2,node1", {"node1": (0, 2)})
    assert split_spec("node1:0", "--include") == ("node1", {"node1": (0,)})
    assert split_spec("node1:0", "--exclude") == (None, {"node1": (0,)})
    assert split_spec("node4@node1:0@node6", "--exclude") == ("node4,node6", {"node1": (0,)})
    assert split_spec(None, "--exclude") == (None, {})
    assert not DeviceSelection() and DeviceSelection(include={"a": (0,)})
    assert DeviceSelection(exclude={"a": (0,)})


def _error(call) -> tuple[str, str | None]:  # type: ignore[no-untyped-def]
    with pytest.raises(UsageError) as err:
        call()
    return err.value.message, err.value.hint


def test_selection_errors_whole_with_their_hints() -> None:
    assert _error(lambda: split_spec("node1:", "--include")) == (
        "--include 'node1:': 'node1:' is not HOST or HOST:GPU,GPU",
        "DeepSpeed's form: --include node1:0,1@node2:2")
    assert _error(lambda: selection(None, "a:0@")) == (
        "--exclude 'a:0@': '' is not HOST or HOST:GPU,GPU",
        "DeepSpeed's form: --exclude node1:0,1@node2:2")
    assert _error(lambda: selection("node2:1@node1:0", "node2:0@node1:1")) == (
        "node1: GPUs given to both --include and --exclude",
        "name the GPUs to use in --include alone")
    sel = DeviceSelection(include={"n": (0, 3)}, exclude={"m": (1,)})
    assert _error(lambda: sel.gpus("n", 3)) == ("--include n:0,3: n shows 3 GPUs, no GPU 3",
                                                "GPUs are 0-2 there")
    assert _error(lambda: sel.gpus("n", 1)) == ("--include n:0,3: n shows 1 GPU, no GPU 3",
                                                "GPU 0 is the only one there")
    assert sel.gpus("n", 4) == (0, 3)
    assert sel.gpus("n", 0) == (0, 3)  # no GPU count known: the selection as given
    assert _error(lambda: sel.gpus("m", 0)) == ("--exclude m:...: m shows no GPU to leave out",
                                                "use --include m:0,1 to name the devices")
    assert sel.gpus("m", 3) == (0, 2)
    assert sel.gpus("m", 1) == (0,)
    assert _error(lambda: sel.gpus("m", -1)) == _error(lambda: sel.gpus("m", 0))
    last = DeviceSelection(exclude={"k": (0,)})
    assert _error(lambda: last.gpus("k", 1)) == ("no GPU left on k after --exclude",
                                                 "drop the whole host: --exclude k")


# ---------------------------------------------------------------------------- the command


def _plan(*args: str, home: Path) -> dict:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("DTRAIN_", "DS_"))}
    res = dtrain(["run", "-H", "localhost", "--dry-run", "--json", "--no-preflight", *args,
                  "examples/ddp_smoke.py"], env={**env, "HOME": str(home)})
    assert_exit(res, 0)
    return json.loads(res.stdout)


def _env(node: dict) -> dict[str, dict]:
    return {v["name"]: v for v in node["env"]}


@pytest.mark.parametrize("spelling", [["--nproc_per_node", "3"], ["--num_gpus", "3"],
                                      ["--nproc-per-node", "3"]])
def test_torchrun_and_deepspeed_spell_nproc(spelling: list[str], tmp_path: Path) -> None:
    plan = _plan(*spelling, home=tmp_path)
    assert plan["nodes"][0]["nproc"] == 3


def test_num_nodes_is_nnodes(tmp_path: Path) -> None:
    plan = _plan("--num_nodes", "1", "--nproc-per-node", "1", "--master_port", "29555",
                 home=tmp_path)
    assert plan["master_port"] == 29555 and len(plan["nodes"]) == 1


def test_include_with_gpus_sets_cuda_visible_devices(tmp_path: Path) -> None:
    plan = _plan("--include", "localhost:0,2", home=tmp_path)
    node = plan["nodes"][0]
    env = _env(node)
    assert env["CUDA_VISIBLE_DEVICES"]["value"] == "0,2" and node["nproc"] == 2
    assert "--include" in json.dumps(env["CUDA_VISIBLE_DEVICES"])


def test_exclude_host_port_is_a_host_not_a_gpu(tmp_path: Path) -> None:
    """Issue 55 item 1: run read --exclude 127.0.0.1:2299 as DeepSpeed's GPU 2299."""
    plan = _plan("-H", "localhost,127.0.0.1:2299", "--exclude", "127.0.0.1:2299",
                 "--nproc-per-node", "1", home=tmp_path)
    assert [n["host"] for n in plan["nodes"]] == ["localhost"]
    assert "CUDA_VISIBLE_DEVICES" not in _env(plan["nodes"][0])
    assert split_spec("localhost:0,1", "--exclude", []) == (None, {"localhost": (0, 1)})


def test_deepspeed_env_file_is_loaded_and_shown_with_its_source(tmp_path: Path) -> None:
    (tmp_path / ".deepspeed_env").write_text("DS_TEST_VAR=from-home\n")
    plan = _plan("--nproc-per-node", "1", home=tmp_path)
    env = _env(plan["nodes"][0])
    assert env["DS_TEST_VAR"]["value"] == "from-home"
    assert "~/.deepspeed_env" in json.dumps(env["DS_TEST_VAR"])
    # --env wins over it
    plan = _plan("--nproc-per-node", "1", "-e", "DS_TEST_VAR=cli", home=tmp_path)
    assert _env(plan["nodes"][0])["DS_TEST_VAR"]["value"] == "cli"


SCRIPT = """\
import os
print("seen", os.environ["RANK"], os.environ.get("CUDA_VISIBLE_DEVICES", "-"),
      os.environ.get("DS_TEST_VAR", "-"), flush=True)
"""


def test_each_rank_sees_its_nodes_gpus(cluster, tmp_path: Path) -> None:
    """On the cluster: node1 gets GPUs 0,1 (two ranks), node2 GPU 1 (one rank); the
    .deepspeed_env of the launching user's home reaches every rank."""
    script = cluster.shared_dir / f"ds_env_{tmp_path.name}.py"
    script.write_text(SCRIPT)
    home_file = cluster.client_home / ".deepspeed_env"
    home_file.write_text("DS_TEST_VAR=everywhere\n")
    try:
        res = dtrain(["run", "-H", "node[1-2]", "--python", cluster.python, "--no-color",
                      "--archive-dir", str(tmp_path / "runs"), "--workdir", "/tmp",
                      "--include", "node1:0,1@node2:1", str(script)],
                     env=cluster.client_env(), timeout=150)
    finally:
        home_file.unlink()
    assert_exit(res, 0)
    seen = sorted(line.split("seen ", 1)[1] for line in res.stdout.splitlines()
                  if "seen " in line)
    assert seen == ["0 0,1 everywhere", "1 0,1 everywhere", "2 1 everywhere"], res.stdout


def test_more_ranks_than_a_nodes_gpus_is_warned_once_before_the_start(cluster,
                                                                       tmp_path: Path) -> None:
    """On the cluster: --include leaves node1 and node2 one GPU each; two ranks a node are
    warned on stderr once, folded, before the run, which still runs (a gloo or CPU job may
    mean it). The DeepSpeed launcher takes a node's GPU count as its slots; dtrain keeps the
    user's number and says what NCCL would do with it. (The test nodes' probe counts no GPU
    of its own: the fake nvidia-smi has no /proc/driver/nvidia.)"""
    script = cluster.shared_dir / f"ds_env_{tmp_path.name}.py"
    script.write_text(SCRIPT)
    res = dtrain(["run", "-H", "node[1-2]", "--python", cluster.python, "--no-color",
                  "--archive-dir", str(tmp_path / "runs"), "--workdir", "/tmp",
                  "--include", "node1:1@node2:0", "--nproc-per-node", "2", str(script)],
                 env=cluster.client_env(), timeout=150)
    assert_exit(res, 0)
    warned = [ln for ln in res.stderr.splitlines() if ln.startswith("dtrain: warning: ")]
    assert warned == ["dtrain: warning: node[1-2]: 2 ranks on 1 GPU: ranks will share a GPU, "
                      "which NCCL refuses (\"Duplicate GPU detected\"); fine for gloo. One rank "
                      "per GPU: --nproc-per-node gpu"], res.stderr
    seen = sorted(line.split("seen ", 1)[1] for line in res.stdout.splitlines()
                  if "seen " in line)
    assert seen == ["0 1 -", "1 1 -", "2 0 -", "3 0 -"], res.stdout
