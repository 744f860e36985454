"""Hosts from a Slurm allocation (launcher/hosts/slurm.py): pure, no Slurm needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.errors import HostfileError, UsageError
from launcher.hosts.hostfile import host_sources, resolve_hosts
from launcher.hosts.slurm import allocation, expand_counts, expand_nodelist, in_allocation

JOB = {"SLURM_JOB_ID": "42"}


@pytest.mark.parametrize(("text", "names"), [
    pytest.param("node1", ["node1"], id="single"),
    pytest.param("node[1-3]", ["node1", "node2", "node3"], id="range"),
    pytest.param("gpu[01-04,07],cpu-a[1-2]",
                 ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "cpu-a1", "cpu-a2"],
                 id="mixed-order-kept"),
    pytest.param("zeta,alpha[1-2]", ["zeta", "alpha1", "alpha2"], id="first-is-node0"),
    pytest.param("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"],
                 id="two-dimensions"),
    pytest.param("node[1-2],,x", ["node1", "node2", "x"], id="empty-entry-skipped-as-slurm"),
])
def test_nodelist_expands_in_slurm_order(text: str, names: list[str]) -> None:
    assert expand_nodelist(text) == names


@pytest.mark.parametrize("text", ["node[1-", "@group", "node1,node1",
                                  "bad!name"])
def test_bad_nodelist_is_a_usage_error(text: str) -> None:
    with pytest.raises(HostfileError) as exc:
        expand_nodelist(text)
    assert exc.value.exit_code == 2
    assert "SLURM_JOB_NODELIST" in str(exc.value)


@pytest.mark.parametrize(("text", "n", "counts"), [
    ("2(x3),1", 4, (2, 2, 2, 1)),
    ("8", 1, (8,)),
    ("4(x2)", 2, (4, 4)),
    ("1,2,3", 3, (1, 2, 3)),
])
def test_counts(text: str, n: int, counts: tuple[int, ...]) -> None:
    assert expand_counts(text, n, "SLURM_JOB_CPUS_PER_NODE") == counts


@pytest.mark.parametrize(("text", "n"), [("2(x3)", 4), ("x", 1), ("2(x)", 2)])
def test_counts_must_match_the_nodes(text: str, n: int) -> None:
    with pytest.raises(HostfileError, match="SLURM_JOB_CPUS_PER_NODE"):
        expand_counts(text, n, "SLURM_JOB_CPUS_PER_NODE")


BASE = {**JOB, "SLURM_JOB_NODELIST": "gpu[1-3],cpu1", "SLURM_JOB_CPUS_PER_NODE": "2(x3),1"}


@pytest.mark.parametrize(("extra", "slots", "source"), [
    pytest.param({}, (2, 2, 2, 1), "SLURM_JOB_CPUS_PER_NODE", id="cpus-per-node"),
    pytest.param({"SLURM_GPUS_ON_NODE": "4"}, (4,) * 4, "SLURM_GPUS_ON_NODE", id="gpus-on-node"),
    pytest.param({"SLURM_GPUS_PER_NODE": "a100:8"}, (8,) * 4, "SLURM_GPUS_PER_NODE",
                 id="gpus-per-node-typed"),
    pytest.param({"SLURM_NTASKS_PER_NODE": "3", "SLURM_GPUS_ON_NODE": "4"}, (3,) * 4,
                 "SLURM_NTASKS_PER_NODE", id="ntasks-wins"),
    pytest.param({"SLURM_JOB_GPUS": "0,1"}, (None,) * 4, None, id="gpu-job-cpus-not-slots"),
    pytest.param({"SLURM_TRES_PER_NODE": "gres:gpu:2"}, (None,) * 4, None, id="tres-gpu"),
])
def test_slots_precedence(extra: dict[str, str], slots: tuple[int | None, ...],
                          source: str | None) -> None:
    alloc = allocation({**BASE, **extra})
    assert alloc is not None
    assert alloc.slots == slots
    assert alloc.slots_from == source
    hosts = alloc.hosts()
    assert [h.name for h in hosts] == ["gpu1", "gpu2", "gpu3", "cpu1"]
    assert [h.slots for h in hosts] == list(slots)


def test_outside_an_allocation() -> None:
    assert allocation({}) is None
    assert not in_allocation({"SLURM_JOB_NODELIST": "n1"})
    assert in_allocation({"SLURM_JOB_NODELIST": "n1", "SLURM_JOB_ID": "1"})


def test_resolve_uses_the_allocation_when_no_hosts_given() -> None:
    hosts = resolve_hosts(hostfile=None, hosts=None, environ=BASE)
    assert [h.name for h in hosts] == ["gpu1", "gpu2", "gpu3", "cpu1"]
    assert host_sources(hosts) == ("SLURM_JOB_NODELIST (job 42, slots from "
                                   "SLURM_JOB_CPUS_PER_NODE)")


def test_hosts_options_win_over_the_allocation(tmp_path: Path) -> None:
    assert [h.name for h in resolve_hosts(hostfile=None, hosts="x1", environ=BASE)] == ["x1"]
    path = tmp_path / "hosts"
    path.write_text("y1\n")
    hosts = resolve_hosts(hostfile=str(path), hosts=None, environ=BASE)
    assert [h.name for h in hosts] == ["y1"]
    assert host_sources(hosts) == str(path)
    env = {**BASE, "DTRAIN_HOSTFILE": str(path)}
    assert [h.name for h in resolve_hosts(hostfile=None, hosts=None, environ=env)] == ["y1"]


def test_include_exclude_apply_to_the_allocation() -> None:
    hosts = resolve_hosts(hostfile=None, hosts=None, exclude="gpu2", environ=BASE)
    assert [h.name for h in hosts] == ["gpu1", "gpu3", "cpu1"]


def test_no_hosts_anywhere_says_salloc() -> None:
    with pytest.raises(UsageError, match="salloc"):
        resolve_hosts(hostfile=None, hosts=None, environ={})


def test_the_old_job_id_variable_counts_too() -> None:
    """SLURM_JOBID (Slurm's older name) where SLURM_JOB_ID is not set."""
    env = {"SLURM_JOBID": "77", "SLURM_JOB_NODELIST": "n1"}
    assert in_allocation(env)
    alloc = allocation(env)
    assert alloc is not None and alloc.job_id == "77"
    assert alloc.source == "SLURM_JOB_NODELIST (job 77, no slot count)"
    assert not in_allocation({"SLURM_JOB_NODELIST": "n1", "SLURM_JOBID": ""})


@pytest.mark.parametrize(("value", "slots"), [("1", 1), ("8", 8), ("a100:4", 4)])
def test_a_per_node_count_is_a_positive_number(value: str, slots: int) -> None:
    alloc = allocation({**JOB, "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NTASKS_PER_NODE": value})
    assert alloc is not None and alloc.slots == (slots, slots)


@pytest.mark.parametrize("value", ["0", "x", "-1", "４", "a100:0", ""])
def test_a_per_node_count_that_is_not_positive_is_refused(value: str) -> None:
    env = {**JOB, "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_GPUS_ON_NODE": value or " "}
    with pytest.raises(HostfileError) as exc:
        allocation(env)
    assert exc.value.source == "SLURM_GPUS_ON_NODE"
    assert "expected a positive number" in str(exc.value)


@pytest.mark.parametrize("key", ["SLURM_TASKS_PER_NODE", "SLURM_JOB_CPUS_PER_NODE"])
def test_a_bad_count_list_names_its_variable(key: str) -> None:
    env = {**JOB, "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NTASKS": "2", key: "2(x3)"}
    with pytest.raises(HostfileError) as exc:
        allocation(env)
    assert exc.value.source == key


@pytest.mark.parametrize(("extra", "gpu_job"), [
    pytest.param({"SLURM_GRES": "gpu:2"}, True, id="gres-gpu"),
    pytest.param({"SLURM_GRES": "nvme:1"}, False, id="gres-not-gpu"),
    pytest.param({"SLURM_JOB_GPUS": ""}, False, id="empty-gpu-variable"),
    pytest.param({"CUDA_GPU_COUNT": "2", "MY_TRES": "gpu:1"}, False, id="not-slurm-s"),
])
def test_what_makes_a_gpu_job(extra: dict[str, str], gpu_job: bool) -> None:
    alloc = allocation({**BASE, **extra})
    assert alloc is not None
    assert alloc.slots == ((None,) * 4 if gpu_job else (2, 2, 2, 1)), extra


def test_a_gpu_request_counts_wherever_it_is_in_the_environment() -> None:
    """Variables of other programs before the job's own do not stop the scan."""
    env = {"AAA": "1", "PATH": "/bin", **BASE, "ZZZ": "", "SLURM_JOB_GPUS": "0"}
    alloc = allocation(env)
    assert alloc is not None and alloc.slots == (None,) * 4


def test_the_allocations_topology_comes_from_scontrol(tmp_path, monkeypatch) -> None:
    """``scontrol show topology`` only inside an allocation; nothing when it prints no
    switch (no topology plugin), fails, or hangs past its bound."""
    import stat

    from launcher.hosts import slurm as sl

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "scontrol"

    def scontrol(body: str) -> None:
        fake.write_text("#!/bin/sh\n" + body + "\n")
        fake.chmod(fake.stat().st_mode | stat.S_IXUSR)

    env = {"PATH": str(bin_dir), "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[1-4]"}
    text = ("SwitchName=s0 Level=0 LinkSpeed=1 Nodes=node[1,3]\n"
            "SwitchName=s1 Level=0 LinkSpeed=1 Nodes=node[2,4]\n"
            "SwitchName=top Level=1 LinkSpeed=1 Switches=s[0-1]\n")
    scontrol(f'[ "$1 $2" = "show topology" ] || exit 9\nprintf "%s" "{text}"')
    assert sl.show_topology(env) == text
    assert sl.show_topology({k: v for k, v in env.items() if k != "SLURM_JOB_ID"}) is None
    from launcher.decide.runplan.placement import Place, parse_topology_conf

    assert parse_topology_conf(text, "scontrol show topology")["node3"] == Place(
        "s0", "top", None, "scontrol show topology")
    scontrol("exit 0")  # no topology plugin: nothing printed
    assert sl.show_topology(env) is None
    scontrol("echo 'slurm_load_topo error: Unable to contact slurm controller' >&2; exit 1")
    assert sl.show_topology(env) is None
    monkeypatch.setattr(sl, "SCONTROL_TIMEOUT", 0.3)
    scontrol("exec sleep 5")
    assert sl.show_topology(env) is None
    assert sl.show_topology({**env, "PATH": str(tmp_path / "none")}) is None
