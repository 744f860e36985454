"""Ranks forked from the node's warm interpreter (issue 52 step 2, docs/warm-start.md) on the
real-sshd cluster: each rank gets its own RANK, LOCAL_RANK, CUDA_VISIBLE_DEVICES, working
directory and argv, and no other rank's, in os.environ and in /proc/PID/environ (what the
sampler reads); its parent is the warm process, it had torch before its script imported
anything, and it runs in a session of its own. A rank SIGKILLed is reported exactly as on
the cold path (--no-preload). A module that cannot be preloaded, or one that leaves a thread
running, makes that node's ranks start cold: one note, the run succeeds."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import tests.cluster as tc
from tests.test_failures import Dtrain, JobWatch, meta, new_id, run_args
from tests.util import REPO

PROBE = "tests/workloads/warm_probe.py"
pytestmark = [pytest.mark.ssh, pytest.mark.torch, pytest.mark.timeout(240)]
CVD = {1: "0,1", 2: "2,3"}  # each node's CUDA_VISIBLE_DEVICES, from the hostfile


def _hosts(tmp_path: Path) -> str:
    path = tmp_path / "hosts.yaml"
    path.write_text("hosts:\n" + "".join(
        f"  - host: node{k}\n    env: {{CUDA_VISIBLE_DEVICES: \"{v}\"}}\n" for k, v in CVD.items()))
    return str(path)


def _args(cluster: tc.Cluster, tmp_path: Path, run_id: str, *extra: str,
          script_args: tuple[str, ...] = ("--tag", "x y"), nodes: int = 2) -> list[str]:
    args = run_args(cluster, tmp_path, run_id, PROBE, *extra, hosts="node1", nproc=2,
                    script_args=script_args)
    i = args.index("-H")
    if nodes == 2:
        args[i:i + 2] = ["-f", _hosts(tmp_path)]
    return args


def _probes(out: str) -> dict[int, tuple[str, dict]]:
    """rank -> (the node its line came from, what the rank said of itself)."""
    found = {}
    for m in re.finditer(r"^(node\d) r(\d+): PROBE (\{.*\})$", out, re.M):
        rank = int(m.group(2))
        assert rank not in found, out  # one line per rank
        found[rank] = (m.group(1), json.loads(m.group(3)))
    return found


def _run(cluster: tc.Cluster, tmp_path: Path, jobs: list, run_id: str, args: list[str],
         nodes: list[int]) -> tuple[int, str]:
    job = Dtrain(cluster, args)
    jobs.append(job)
    with JobWatch(cluster, nodes, run_id=run_id) as watch:
        rc = job.wait(150)
        watch.assert_clean(5.0, since=job.ended)  # the warm process and its ranks gone too
    return rc, job.output


def test_each_forked_rank_is_its_own(cluster: tc.Cluster, tmp_path: Path, jobs) -> None:
    run_id = new_id("warm")
    rc, out = _run(cluster, tmp_path, jobs, run_id,
                   _args(cluster, tmp_path, run_id, "--preload", "json"), [1, 2])
    assert rc == 0, out
    assert "warm start off" not in out, out
    # the agent forked from the warm process too, and nothing said on stderr about it
    # (runpy's warning, were torch.distributed.run itself preloaded, is one such line);
    # torch's own c10d line about the cluster's unnamed addresses is there cold as well
    said = [line for line in out.splitlines() if "[err]" in line
            and "[c10d] The hostname of the client socket cannot be retrieved" not in line]
    assert said == [], out
    probes = _probes(out)
    assert sorted(probes) == [0, 1, 2, 3], out
    pids = set()
    for rank, (node, p) in probes.items():
        k = 1 + rank // 2
        assert node == f"node{k}", (rank, node)
        assert p["env"]["RANK"] == str(rank) and p["env"]["LOCAL_RANK"] == str(rank % 2), p
        assert p["env"]["CUDA_VISIBLE_DEVICES"] == CVD[k], p
        # nothing of the warm process's own environment is left
        assert p["env"]["DTRAIN_WARM_PAD"] is None and p["env"]["DTRAIN_WARM_FD"] is None, p
        # /proc/PID/environ, which the sampler reads, says the same as os.environ
        assert p["proc_env"] == {"RANK": str(rank), "LOCAL_RANK": str(rank % 2),
                                 "DTRAIN_RUN_ID": run_id}, p
        assert p["argv"] == [PROBE, "--tag", "x y"], p
        assert p["cwd"] == str(REPO), p
        # forked: torch was there before the script's first line; its parent is the warm
        # process of its own node and run; a session (and process group) of its own
        assert p["warm"] is True, p
        assert p["parent"] == f"dtrain warm {run_id} node{k}", p
        assert p["sid"] == p["pid"], p
        # the rank's thread count is the cold rank's: torchrun's OMP_NUM_THREADS=1
        assert (p["omp"], p["threads"]) == ("1", 1), p
        pids.add(p["pid"])
    assert len(pids) == 4
    parents = {p["ppid"] for _, p in probes.values()}
    assert len(parents) == 2, probes  # one warm process per node


def test_the_cold_path_is_still_cold(cluster: tc.Cluster, tmp_path: Path, jobs) -> None:
    """--no-preload: no warm process, each rank a fresh interpreter under its shim."""
    run_id = new_id("cold")
    rc, out = _run(cluster, tmp_path, jobs, run_id,
                   _args(cluster, tmp_path, run_id, "--no-preload", nodes=1), [1])
    assert rc == 0, out
    probes = _probes(out)
    assert sorted(probes) == [0, 1], out
    for rank, (_, p) in probes.items():
        assert p["warm"] is False and p["parent"].startswith(f"dtrain rank {rank} shim: "), p
        assert p["env"]["RANK"] == str(rank) and p["proc_env"]["RANK"] == str(rank), p
        assert (p["omp"], p["threads"]) == ("1", 1), p


def _summary(out: str, rank: int) -> str:
    m = re.search(rf"r{rank} SIGKILL \(137\) after [0-9.]+s \(ROOT CAUSE\)", out)
    assert m, out
    return re.sub(r"after [0-9.]+s", "after Ts", m.group(0))


def test_a_forked_rank_killed_is_a_signal_death_as_cold(cluster: tc.Cluster, tmp_path: Path,
                                                       jobs) -> None:
    """Rank 1 SIGKILLs itself: exit 137, the rank and its node the root cause, the same
    words and meta.json root cause with and without the warm start."""
    seen = {}
    for mode in ("--preload=json", "--no-preload"):
        run_id = new_id("warmkill")
        rc, out = _run(cluster, tmp_path, jobs, run_id,
                       _args(cluster, tmp_path, run_id, mode, script_args=("--kill", "1"),
                             nodes=1), [1])
        assert rc == 137, out
        assert "FAILED: rank 1 on node1 was killed by SIGKILL (exit 137)" in out, out
        assert "was killed by SIGKILL, not by dtrain" in out, out
        root = meta(tmp_path, run_id)["root_cause"]
        seen[mode] = (_summary(out, 1), root["host"], root["rank"], root["signal"],
                      root.get("code", root.get("exit_code")))
    assert seen["--preload=json"] == seen["--no-preload"], seen
    assert seen["--no-preload"][1:4] == ("node1", 1, 9), seen


@pytest.mark.parametrize(("module", "why"), [
    ("dtrain_no_such_module", "import dtrain_no_such_module failed: ModuleNotFoundError"),
    ("warm_thread", "2 threads running before fork"),
], ids=["unimportable", "thread"])
def test_a_node_that_cannot_warm_starts_cold_and_says_so_once(
        cluster: tc.Cluster, tmp_path: Path, jobs, module: str, why: str) -> None:
    run_id = new_id("warmcold")
    rc, out = _run(cluster, tmp_path, jobs, run_id,
                   _args(cluster, tmp_path, run_id, "--preload", module, "-e",
                         f"PYTHONPATH={REPO / 'tests' / 'workloads'}", nodes=1), [1])
    assert rc == 0, out
    notes = [line for line in out.splitlines() if "warm start off" in line]
    assert len(notes) == 1, out
    assert why in notes[0] and "its ranks start cold, as with --no-preload" in notes[0], out
    probes = _probes(out)
    assert sorted(probes) == [0, 1], out
    assert all(p["warm"] is False for _, p in probes.values()), out


def _ending(out: str) -> tuple[list[str], list[str], str]:
    """The rank's stdout lines, its stderr lines and its summary. A traceback's frames in
    dtrain's own file are left out: a rank enters the script through them by another road
    when forked (warm.forked, not the module's main); the script's frames and the error
    stay, without line numbers."""
    out_lines, err_lines, skip = [], [], False
    for line in out.splitlines():
        if line.startswith("node1 r0: "):
            out_lines.append(line)
        elif line.startswith("node1 r0 [err]: "):
            text = line[len("node1 r0 [err]: "):]
            if text.startswith('  File "'):
                skip = "dtrain_shim.py" in text
            elif not text.startswith("    "):
                skip = False
            if not skip:
                err_lines.append(re.sub(r"line \d+", "line N", line))
    summary = re.search(r"^dtrain:   node1 \(node 0\): (r0 [^;]*);", out, re.M)
    assert summary, out
    return out_lines, err_lines, re.sub(r"after [0-9.]+s", "after Ts", summary.group(1))


@pytest.mark.parametrize(("mode", "code"), [
    ("thread", 0), ("exitmsg", 1), ("raise", 1), ("kbd", 130), ("segv", 139)])
def test_a_forked_rank_ends_as_a_cold_one(cluster: tc.Cluster, tmp_path: Path, jobs,
                                          mode: str, code: int) -> None:
    """The interpreter's end, mirrored without its teardown (warm.forked): a non-daemon
    thread joined and atexit run, sys.exit's message and 1, an uncaught exception's
    traceback and 1, KeyboardInterrupt's death by SIGINT, a crash's signal: the same
    lines, codes and summary as with --no-preload."""
    seen = {}
    for how in ("--preload=json", "--no-preload"):
        run_id = new_id(f"warmexit-{mode}")
        args = run_args(cluster, tmp_path, run_id, "tests/workloads/warm_exitprobe.py", how,
                        hosts="node1", script_args=(mode,))
        rc, out = _run(cluster, tmp_path, jobs, run_id, args, [1])
        assert rc == code, out
        seen[how] = _ending(out)
    assert seen["--preload=json"] == seen["--no-preload"], seen
