"""`dtrain run` on the real-sshd cluster: DDP across per-node NIC names, env, dry run."""

from __future__ import annotations

import json
import re
import uuid

import pytest

from tests.util import assert_exit, dtrain

pytestmark = [pytest.mark.ssh, pytest.mark.torch]

TRICKY = 'quote " single \' dollar $HOME back `id` semi ; newline\nend é ✓'


def _reports(stdout: str) -> list[dict]:
    return [json.loads(line.split("REPORT ", 1)[1]) for line in stdout.splitlines()
            if "REPORT " in line]


def _run(cluster, tmp_path, *args):
    return dtrain(["run", "-H", "node[1-3]", "--python", cluster.python,
                   "--archive-dir", str(tmp_path / "runs"), "--no-color", *args],
                  env=cluster.client_env(), timeout=150)


def test_three_node_ddp_gets_each_nodes_own_interface(cluster, tmp_path):
    res = _run(cluster, tmp_path, "--nproc-per-node", "2", "--env", f"TRICKY={TRICKY}",
               "--env", "API_TOKEN=s3cr3t-value", "tests/workloads/env_report.py",
               "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TRICKY", "API_TOKEN",
               "PYTHONUNBUFFERED")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    reports = _reports(res.stdout)
    assert sorted(r["rank"] for r in reports) == list(range(6))
    ifname = {"node1": "ens1f0", "node2": "eth0", "node3": "enp3s0"}
    assert ifname == {cluster.node(k).name: cluster.node(k).ifname for k in (1, 2, 3)}
    for r in reports:
        assert r["sum"] == 6.0
        # each rank, on its own node, gets that node's interface, for gloo and for NCCL
        # (exact-match "=" form: "eth0" alone would also match eth0.100, eth01...)
        assert r["env"]["GLOO_SOCKET_IFNAME"] == ifname[r["host"]]
        assert r["env"]["NCCL_SOCKET_IFNAME"] == "=" + ifname[r["host"]]
        assert r["env"]["TRICKY"] == TRICKY
        assert r["env"]["API_TOKEN"] == "s3cr3t-value"
        assert r["env"]["PYTHONUNBUFFERED"] == "1"
    # the console tags each line with host and global rank, from the source
    for line in res.stdout.splitlines():
        if "REPORT " in line:
            r = json.loads(line.split("REPORT ", 1)[1])
            assert line.startswith(f"node{r['rank'] // 2 + 1} r{r['rank']}")
    runs = list((tmp_path / "runs").iterdir())
    meta = json.loads((runs[0] / "meta.json").read_text())
    assert meta["exit_code"] == 0
    assert "s3cr3t-value" not in (runs[0] / "meta.json").read_text()
    assert "s3cr3t-value" not in res.stderr


def test_dry_run_shows_each_nodes_interface_and_starts_nothing(cluster, tmp_path):
    marker = f"--marker-{uuid.uuid4().hex}"
    envfile = tmp_path / "site.env"
    envfile.write_text("FROM_FILE=1\nMY_PASSWORD=overridden\n")
    res = _run(cluster, tmp_path, "--nproc-per-node", "2", "--dry-run", "--env-file",
               str(envfile), "--env", "MY_PASSWORD=hunter2", "examples/ddp_smoke.py", "--lr",
               "3e-4", marker)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    # issue 24.7: a file's values name the file (they said [user: --env]); --env wins
    assert out.count(f"  FROM_FILE=1  [user: --env-file {envfile}]\n") == 3, out
    assert out.count("  MY_PASSWORD=***  [user: --env]\n") == 3, out
    # issue 24.8: the NCCL '=' explanation once, not per node
    assert out.count("the leading '=' makes NCCL use exactly") == 1, out
    # each node's own section names its own interface (not merely: each name appears)
    sections = re.split(r"^node (\d+)  (\S+)  ranks \S+$", out, flags=re.M)
    nodes = {int(sections[i]): (sections[i + 1], sections[i + 2])
             for i in range(1, len(sections), 3)}
    assert sorted(nodes) == [0, 1, 2], out
    for node_rank, (host, text) in nodes.items():
        k = node_rank + 1
        assert host == f"node{k}", out
        found = dict(re.findall(r"^  ([A-Z_]+_SOCKET_IFNAME)=(\S+)  \[", text, re.M))
        ifname = cluster.node(k).ifname
        assert found == {"NCCL_SOCKET_IFNAME": "=" + ifname, "GLOO_SOCKET_IFNAME": ifname}, (
            host, text)
    assert "route to 198.18.0.11 via eth0" in nodes[1][1]
    assert "hunter2" not in out and "MY_PASSWORD=***" in out
    assert "--master-addr 198.18.0.11" in out and "--lr 3e-4" in out
    assert "172.17.0.1" not in out and "127.0.1.1" not in out
    assert not (tmp_path / "runs").exists()
    for k in (1, 2, 3):
        assert not cluster.node_pids(k, user="dtuser", match=marker)


def test_timestamps_stamp_the_lines_not_the_summary(cluster, tmp_path):
    """docs/cli.md: the summary printed after the job is not stamped (issue 24.7); the
    archive keeps the summary with a null node_rank."""
    res = _run(cluster, tmp_path, "--nproc-per-node", "1", "--timestamps",
               "examples/ddp_smoke.py")
    assert res.returncode == 0, res.stderr
    text = res.stdout + res.stderr
    assert re.search(r"^\S+T\S+ node1 r0: ", text, re.M), text
    assert re.search(r"^\S+T\S+ dtrain: run ", text, re.M), text  # in-stream: stamped
    assert re.search(r"^dtrain: ok: succeeded \(exit 0\)$", text, re.M), text
    assert re.search(r"^dtrain:   node1 \(node 0\): r0 exit 0", text, re.M), text
    (run,) = (tmp_path / "runs").iterdir()
    records = [json.loads(line) for line in (run / "output.jsonl").read_text().splitlines()]
    done = [r for r in records if r.get("line", "").startswith("ok: succeeded")]
    assert done and done[0]["node_rank"] is None and done[0]["stream"] == "dtrain"


def test_dry_run_json_is_machine_readable(cluster, tmp_path):
    res = _run(cluster, tmp_path, "--nproc-per-node", "1", "--dry-run", "--json",
               "examples/ddp_smoke.py")
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    assert plan["world_size"] == 3 and plan["master_addr"] == "198.18.0.11"
    assert [n["node_rank"] for n in plan["nodes"]] == [0, 1, 2]


def test_missing_workdir_names_the_node(cluster, tmp_path):
    res = _run(cluster, tmp_path, "--nproc-per-node", "1", "--workdir", "/nonexistent/dir",
               "examples/ddp_smoke.py")
    assert_exit(res, 1)
    assert "/nonexistent/dir" in res.stderr and "node[1-3]" in res.stderr


def test_bad_env_is_exit_2(cluster, tmp_path):
    res = _run(cluster, tmp_path, "--env", "NOEQUALS", "examples/ddp_smoke.py")
    assert_exit(res, 2)
    assert "NOEQUALS is not set in this environment" in res.stderr


def test_unreachable_master_is_a_preflight_error(cluster, tmp_path):
    res = _run(cluster, tmp_path, "--nproc-per-node", "1", "--master-addr", "198.18.0.200",
               "examples/ddp_smoke.py")
    assert_exit(res, 1)
    assert "198.18.0.200" in res.stderr and "master" in res.stderr
    assert not (tmp_path / "runs").exists()


def test_c10d_rendezvous_with_node0_hosting_the_store(cluster, tmp_path):
    res = _run(cluster, tmp_path, "--nproc-per-node", "1", "--rdzv", "c10d",
               "tests/workloads/env_report.py", "GLOO_SOCKET_IFNAME")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert sorted(r["rank"] for r in _reports(res.stdout)) == [0, 1, 2]


def test_console_rank_filter_keeps_the_archive_whole(cluster, tmp_path):
    res = _run(cluster, tmp_path, "--nproc-per-node", "2", "--ranks", "0,3",
               "tests/workloads/env_report.py")
    assert res.returncode == 0, res.stderr[-2000:]
    assert sorted(r["rank"] for r in _reports(res.stdout)) == [0, 3]
    run = next((tmp_path / "runs").iterdir())
    archived = [json.loads(ln) for ln in (run / "output.jsonl").read_text().splitlines()]
    assert sorted(o["rank"] for o in archived if "REPORT " in o["line"]) == list(range(6))


def test_preflight_refuses_a_node_without_torch(cluster, tmp_path):
    hostfile = tmp_path / "hosts.txt"
    hostfile.write_text(f"node1 python={cluster.python}\nnode2 python=/usr/bin/python3\n")
    res = dtrain(["run", "-f", str(hostfile), "--nproc-per-node", "1", "--archive-dir",
                  str(tmp_path / "runs"), "examples/ddp_smoke.py"],
                 env=cluster.client_env(), timeout=60)
    assert_exit(res, 1)
    assert "node2" in res.stderr and "torch" in res.stderr
    assert not (tmp_path / "runs").exists()


def test_a_chatty_bashrc_does_not_break_the_probe(cluster, tmp_path, chatty_bashrc):
    res = _run(cluster, tmp_path, "--nproc-per-node", "1", "--dry-run",
               "examples/ddp_smoke.py")
    assert res.returncode == 0, res.stderr
    assert "GLOO_SOCKET_IFNAME=enp3s0" in res.stdout
