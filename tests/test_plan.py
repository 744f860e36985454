"""The launch plan (``decide/runplan/plan.py``), pure: node ranks, global ranks, each node's
torchrun
command, its environment with sources and reasons, and the plan's JSON, compared whole.

Hand-made NodeFacts, no network. The plan is what `dtrain run` starts and what `--dry-run`
shows, so every word and argument is asserted (issue #25: the mutation score of plan.py).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from launcher.decide.runplan.devices import DeviceSelection
from launcher.decide.runplan.facts import Gid, RdmaPort, SiteVar
from launcher.decide.runplan.plan import (
    OFFLINE_FACTS,
    LaunchPlan,
    NodePlan,
    RunRequest,
    build_plan,
    dtrain_env,
    expand_home,
    nproc_for,
    offline_plan,
    plan_json,
    plan_warnings,
)
from launcher.decide.runplan.runoptions import NodeChecks, RunOptions
from launcher.errors import PreflightFailed, UsageError
from launcher.models import Host
from launcher.nodeside.wire import SHIM_PLACEHOLDER
from tests.test_netenv import MASTER_IP, iface, node, route

N0 = replace(node("node0", iface("eth0", "198.18.0.11/24"), default="eth0",
                  site=(SiteVar("NCCL_DEBUG", "WARN", "/etc/nccl.conf"),)),
             gpus=4, home="/home/u/")
N1 = replace(node("node1", iface("eth0", "198.18.0.12/24"), default="eth0",
                  routes={MASTER_IP: route(MASTER_IP, "eth0")}), gpus=8, home="/home/u")
TORCHRUN = ("-m", "torch.distributed.run")
OWN = [("DTRAIN_RUN_ID", "r1", "dtrain", "run archive id", True),
       ("DTRAIN_NODE_RANK", "0", "dtrain", "node rank", True),
       ("DTRAIN_NNODES", "2", "dtrain", "number of nodes", True)]
OMP = ("OMP_NUM_THREADS", "1", "dtrain", "torchrun's default, made explicit", True)
# torchrun's KILL of its workers after its TERM, past the default --grace 10
SHUTDOWN = ("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "30", "dtrain",
            "torchrun KILLs its workers this long after its TERM: past --grace 10", True)
UNBUFFERED = ("PYTHONUNBUFFERED", "1", "dtrain", "live logs: no pty on the node", True)


def env_rows(n: NodePlan) -> list[tuple[str, str, str, str, bool]]:
    return [(v.name, v.value, v.source, v.reason, v.exported) for v in n.env]


def rank_of(rows: list[tuple[str, str, str, str, bool]], rank: int
            ) -> list[tuple[str, str, str, str, bool]]:
    return [r if r[0] != "DTRAIN_NODE_RANK" else (*r[:1], str(rank), *r[2:]) for r in rows]


def two_node_plan(**kw: object) -> LaunchPlan:
    hosts = [Host("node0", slots=2, env=(("MY_VAR", "x"),), source="hosts.txt:1"),
             Host("node1", port=2222, python="~/venv/bin/python")]
    req = RunRequest(script="train.py", args=("--lr", "0.1", "--token=s3cret", "s3cret"),
                     env=(("TOKEN", "s3cret"), ("NCCL_DEBUG", "INFO")),
                     env_sources=(("TOKEN", "--env-file secrets.env"),),
                     hidden_env=frozenset({"TOKEN"}), run_id="r1", max_restarts=1, **kw)
    return build_plan(req, RunOptions(), hosts, {"node0": N0, "node1:2222": N1},
                      master_addr=MASTER_IP, master_port=29400, master_reason="the reason")


def test_a_static_plan_whole() -> None:
    plan = two_node_plan(restarts=2, attempt=2)
    assert (plan.master_addr, plan.master_port, plan.master_reason, plan.world_size,
            plan.rdzv, plan.hidden, plan.offline) == (
        MASTER_IP, 29400, "the reason", 10, "static", frozenset({"TOKEN"}), False)
    node0, node1 = plan.nodes
    static = ["--max-restarts", "1", "--monitor-interval", "0.2"]
    assert node0.argv == (
        "python3", *TORCHRUN, "--nnodes", "2", "--nproc-per-node", "2", *static,
        "--node-rank", "0", "--master-addr", MASTER_IP, "--master-port", "29400",
        SHIM_PLACEHOLDER, "train.py", "--lr", "0.1", "--token=s3cret", "s3cret")
    # no slots: one rank per GPU ("gpu", which torchrun reads); the node's ~ is its $HOME
    assert node1.argv == (
        "/home/u/venv/bin/python", *TORCHRUN, "--nnodes", "2", "--nproc-per-node", "gpu",
        *static, "--node-rank", "1", "--master-addr", MASTER_IP, "--master-port", "29400",
        SHIM_PLACEHOLDER, "train.py", "--lr", "0.1", "--token=s3cret", "s3cret")
    assert [(n.host.label, n.node_rank, n.nproc, n.first_rank, list(n.ranks), n.python,
             n.warnings) for n in plan.nodes] == [
        ("node0", 0, 2, 0, [0, 1], "python3", ()),
        ("node1:2222", 1, 8, 2, list(range(2, 10)), "/home/u/venv/bin/python", ())]
    attempt = ("DTRAIN_ATTEMPT", "2", "dtrain", "attempt of --restarts 2 (the shim adds "
               "attempt-1 to TORCHELASTIC_RESTART_COUNT)", True)
    token = ("TOKEN", "s3cret", "user", "--env-file secrets.env", True)
    debug = ("NCCL_DEBUG", "INFO", "user", "--env", True)
    assert env_rows(node0) == [
        *OWN, attempt, OMP, SHUTDOWN,
        ("GLOO_SOCKET_IFNAME", "eth0", "detected", "holds master address 198.18.0.11", True),
        ("MY_VAR", "x", "user", "hostfile hosts.txt:1", True),
        ("NCCL_DEBUG", "INFO", "user", "--env; forced over WARN (/etc/nccl.conf)", True),
        ("NCCL_SOCKET_IFNAME", "=eth0", "detected", "holds master address 198.18.0.11", True),
        UNBUFFERED, token]
    via = "route to 198.18.0.11 via eth0"
    assert env_rows(node1) == [
        *rank_of(OWN, 1), attempt, OMP, SHUTDOWN,
        ("GLOO_SOCKET_IFNAME", "eth0", "detected", via, True),
        debug, ("NCCL_SOCKET_IFNAME", "=eth0", "detected", via, True), UNBUFFERED, token]
    assert node0.exported_env() == {k: v for k, v, *_ in env_rows(node0)}
    doc = plan_json(plan)
    assert list(doc) == ["master_addr", "master_port", "master_reason", "world_size", "rdzv",
                         "nodes"]
    assert [doc[k] for k in list(doc)[:5]] == [MASTER_IP, 29400, "the reason", 10, "static"]
    first = doc["nodes"][0]  # type: ignore[index]
    assert {k: v for k, v in first.items() if k not in ("command", "env", "node_added")} == {
        "host": "node0", "source": "hosts.txt:1", "node_rank": 0, "nproc": 2, "ranks": [0, 1],
        "warnings": []}
    # the `+` lines of --dry-run: what the supervisor adds by itself, each with why
    assert first["node_added"] == [
        {"name": v.name, "value": v.value, "source": v.source, "reason": v.reason}
        for v in node0.node_added()]
    assert any(a["name"] == "TORCHELASTIC_RESTART_COUNT" or a["name"].startswith("TORCH_")
               for a in first["node_added"]), first["node_added"]
    assert first["command"] == [*node0.argv[:-2], "--token=***", "***"]
    assert first["env"][-1] == {"name": "TOKEN", "value": "***", "source": "user",
                                "reason": "--env-file secrets.env", "exported": True}
    assert [e["value"] for e in first["env"]][:-1] == [r[1] for r in env_rows(node0)][:-1]
    assert doc["nodes"][1]["source"] == ""  # type: ignore[index]


def test_site_values_are_shown_not_sent_and_a_shimless_command_is_shown_as_it_is() -> None:
    plan = two_node_plan()
    node0 = plan.nodes[0]
    # the node's own NCCL_DEBUG (site) is kept there: shown, not exported
    site = replace(node0, env=(*node0.env[:3], *[v for v in node0.env[3:]
                                                  if v.name != "NCCL_DEBUG"]))
    site_plan = build_plan(RunRequest("t.py", nproc_per_node="1", run_id="r1"), RunOptions(),
                           [Host("node0"), Host("node1")], {"node0": N0, "node1": N1},
                           master_addr=MASTER_IP, master_port=1, master_reason="")
    rows = env_rows(site_plan.nodes[0])
    assert ("NCCL_DEBUG", "WARN", "site", "already set by /etc/nccl.conf", False) in rows
    assert "NCCL_DEBUG" not in site_plan.nodes[0].exported_env()
    assert site_plan.shown_env(site_plan.nodes[0])["NCCL_DEBUG"] == "WARN"
    assert [r[0] for r in rows[:4]] == [*(r[0] for r in OWN), "OMP_NUM_THREADS"]
    # without the shim in the command there is nothing of the user's to hide
    bare = replace(site, argv=("python3", "s3cret"))
    assert plan.shown_argv(bare) == ("python3", "s3cret")
    # every word after the shim is the user's, the first one (the script) included
    first = replace(site, argv=("s3cret", SHIM_PLACEHOLDER, "s3cret", "x"))
    assert plan.shown_argv(first) == ("s3cret", SHIM_PLACEHOLDER, "***", "x")
    # a name given as --env NAME is hidden whatever it is called
    hidden = build_plan(RunRequest("t.py", args=("v4lue",), nproc_per_node="1",
                                   env=(("PLAIN", "v4lue"),), hidden_env=frozenset({"PLAIN"})),
                        RunOptions(), [Host("node0")], {"node0": N0}, master_addr="127.0.0.1",
                        master_port=1, master_reason="")
    assert hidden.shown_env(hidden.nodes[0])["PLAIN"] == "***"
    assert hidden.shown_argv(hidden.nodes[0])[-1] == "***"


def test_rendezvous_c10d_a_module_and_the_gpu_selection() -> None:
    n0 = replace(N0, gpus=0, site_env=())
    n2 = replace(node("node2", iface("eth0", "198.18.0.13/24"), default="eth0",
                      routes={MASTER_IP: route(MASTER_IP, "eth0")}), gpus=4)
    hosts = [Host("node0"), Host("node1", env=(("E", "1"),)), Host("node2", slots=3)]
    req = RunRequest(script="pkg.train", module=True, args=("-x",), nproc_per_node="auto",
                     rdzv="c10d", run_id="r2", python="/opt/py",
                     devices=DeviceSelection(include={"node1": (1, 3)}))
    opts = RunOptions(checks=NodeChecks(profile={"NCCL_P2P_DISABLE": "1"}, profile_name="aws",
                                        no_auto=frozenset({"GLOO_SOCKET_IFNAME"})))
    plan = build_plan(req, opts, hosts, {"node0": n0, "node1": N1, "node2": n2},
                      master_addr=MASTER_IP, master_port=29500, master_reason="m")
    c10d = ["--rdzv-backend", "c10d", "--rdzv-endpoint", "198.18.0.11:29500", "--rdzv-id", "r2"]
    head = ["/opt/py", *TORCHRUN, "--nnodes", "3", "--nproc-per-node"]
    tail = ["--max-restarts", "0", "--monitor-interval", "0.2", *c10d, "--rdzv-conf"]
    # auto: one rank per GPU, one without a GPU; per selected GPU where --include chose
    assert [n.argv for n in plan.nodes] == [
        (*head, "1", *tail, "is_host=1", SHIM_PLACEHOLDER, "-m", "pkg.train", "-x"),
        (*head, "2", *tail, "is_host=0", SHIM_PLACEHOLDER, "-m", "pkg.train", "-x"),
        (*head, "4", *tail, "is_host=0", SHIM_PLACEHOLDER, "-m", "pkg.train", "-x")]
    assert [(n.nproc, n.first_rank) for n in plan.nodes] == [(1, 0), (2, 1), (4, 3)]
    assert plan.world_size == 7 and plan.rdzv == "c10d"
    knob = "NCCL_P2P_DISABLE=1 (profile) is a debugging knob; do not keep it set in production"
    assert [n.warnings for n in plan.nodes] == [(f"node{i}: {knob}",) for i in range(3)]
    own = [("DTRAIN_RUN_ID", "r2", "dtrain", "run archive id", True),
           ("DTRAIN_NODE_RANK", "1", "dtrain", "node rank", True),
           ("DTRAIN_NNODES", "3", "dtrain", "number of nodes", True), OMP, SHUTDOWN]
    assert env_rows(plan.nodes[1]) == [
        *own,
        ("CUDA_VISIBLE_DEVICES", "1,3", "user", "--include/--exclude (GPU selection)", True),
        ("E", "1", "user", "hostfile env:", True),  # --no-auto GLOO_SOCKET_IFNAME
        ("NCCL_P2P_DISABLE", "1", "profile", "aws", True),
        ("NCCL_SOCKET_IFNAME", "=eth0", "detected", "route to 198.18.0.11 via eth0", True),
        UNBUFFERED]
    assert "CUDA_VISIBLE_DEVICES" not in plan.nodes[2].exported_env()


@pytest.mark.parametrize(("nproc", "want"), [(None, [2, 3]), ("gpu", [2, 3]), ("auto", [2, 3]),
                                             ("5", [5, 5])])
def test_a_gpu_selection_is_one_rank_per_selected_gpu_unless_a_number_is_given(
        nproc: str | None, want: list[int]) -> None:
    """--include/--exclude give a node CUDA_VISIBLE_DEVICES; 'auto' counted the node's every
    GPU (8 ranks on 2 visible devices) before, online and offline alike."""
    n2 = replace(N1, hostname="node2", routes={"198.18.0.12": route("198.18.0.12", "eth0")},
                 gpus=4)
    sel = DeviceSelection(include={"node1": (1, 3)}, exclude={"node2": (0,)})
    req = RunRequest("t.py", nproc_per_node=nproc, devices=sel)
    hosts = [Host("node1"), Host("node2", slots=4)]
    plan = build_plan(req, RunOptions(), hosts, {"node1": N1, "node2": n2},
                      master_addr="198.18.0.12", master_port=1, master_reason="")
    assert [n.nproc for n in plan.nodes] == want
    assert [n.argv[n.argv.index("--nproc-per-node") + 1] for n in plan.nodes] == \
        [str(w) for w in want]
    assert [n.exported_env()["CUDA_VISIBLE_DEVICES"] for n in plan.nodes] == ["1,3", "1,2,3"]
    offline = offline_plan(replace(req, devices=DeviceSelection(include={"node1": (1, 3)})),
                           RunOptions(), hosts[:1])
    assert offline.nodes[0].nproc == (5 if nproc == "5" else 2)


def test_rank_counts_and_their_errors() -> None:
    facts = N1
    assert nproc_for(Host("a", slots=3), facts, None) == ("3", 3)
    assert nproc_for(Host("a"), facts, None) == ("gpu", 8)
    assert nproc_for(Host("a", slots=3), facts, "2") == ("2", 2)
    assert nproc_for(Host("a"), facts, "gpu") == ("gpu", 8)
    assert nproc_for(Host("a"), facts, "auto") == ("8", 8)
    assert nproc_for(Host("a"), replace(facts, gpus=0), "auto") == ("1", 1)
    assert nproc_for(Host("a"), replace(facts, gpus=1), "gpu") == ("gpu", 1)
    with pytest.raises(UsageError) as err:
        nproc_for(Host("a", port=2), replace(facts, gpus=0), None)
    assert (err.value.message, err.value.hint) == (
        "a:2: --nproc-per-node gpu, but the node shows no GPU",
        "give slots=N in the hostfile or --nproc-per-node N (CPU jobs use gloo)")
    for bad in ("0", "x", "-1", "GPU"):
        with pytest.raises(UsageError) as err:
            nproc_for(Host("a"), facts, bad)
        assert err.value.message == f"--nproc-per-node {bad!r} is not a positive number, " \
                                    "'gpu' or 'auto'"


def test_dtrain_s_own_variables_and_the_attempt() -> None:
    names = [v.name for v in dtrain_env(RunRequest("t.py"), 0, 1)]
    assert names == ["DTRAIN_RUN_ID", "DTRAIN_NODE_RANK", "DTRAIN_NNODES", "OMP_NUM_THREADS",
                     "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"]
    for restarts, attempt in ((1, 1), (0, 2), (3, 4)):
        env = dtrain_env(RunRequest("t.py", restarts=restarts, attempt=attempt), 2, 5)
        assert [(v.name, v.value) for v in env][:4] == [
            ("DTRAIN_RUN_ID", "dtrain"), ("DTRAIN_NODE_RANK", "2"), ("DTRAIN_NNODES", "5"),
            ("DTRAIN_ATTEMPT", str(attempt))]
        assert env[3].reason == (f"attempt of --restarts {restarts} (the shim adds attempt-1 "
                                 "to TORCHELASTIC_RESTART_COUNT)")


def test_torchrun_s_shutdown_timeout_is_the_plan_s_past_the_grace() -> None:
    """TORCH_ELASTIC_SHUTDOWN_TIMEOUT is decided in the plan (the node set it alone before,
    so --dry-run never showed it): torchrun's own 30 s, or the grace and 5 s more."""
    for grace, want in ((0.0, "30"), (10.0, "30"), (25.0, "30"), (26.0, "31"), (120.5, "125")):
        env = {v.name: v for v in dtrain_env(RunRequest("t.py"), 0, 1, grace=grace)}
        assert env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"].value == want
        assert env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"].source == "dtrain"


def test_a_leading_tilde_is_the_node_s_home() -> None:
    assert expand_home("~", "/home/u") == "/home/u"
    assert expand_home("~", "/home/u/") == "/home/u/"
    assert expand_home("~/venv/bin/python", "/home/u/") == "/home/u/venv/bin/python"
    assert expand_home("~/x", "/") == "/x"
    assert expand_home("~/x", "/home/X") == "/home/X/x"  # only slashes are stripped
    for kept in ("~bob/x", "/opt/~/x", "python3", "x~/y"):
        assert expand_home(kept, "/home/u") == kept
    assert expand_home("~/x", None) == "~/x" and expand_home("~/x", "") == "~/x"


def test_an_rdma_error_names_each_node_once_by_its_hostfile_name() -> None:
    """A RoCE port without an IPv4 GID stops the run. The message said "node0: node0: ..."
    before (the plan and the env decision both named the node), the second time by the
    node's own hostname ("node1: n1: ...")."""
    fe80 = "fe80:0000:0000:0000:0ac0:ebff:fe3d:ca54"
    port = RdmaPort("mlx5_1", 1, "4: ACTIVE", "5: LinkUp", "Ethernet", "100 Gb/sec", "mlx5_core",
                    "ens2f0", ("ens2f0",), (Gid(0, fe80, "IB/RoCE v1", "ens2f0"),
                                            Gid(1, fe80, "RoCE v2", "ens2f0")))
    n0 = replace(N0, interfaces=(*N0.interfaces, iface("ens2f0", "10.200.2.10/24")),
                 rdma=(port,))
    n1 = replace(N1, hostname="n1", interfaces=(*N1.interfaces, iface("ens2f0", "10.200.2.11/24")),
                 rdma=(port,))
    with pytest.raises(PreflightFailed) as err:
        build_plan(RunRequest("t.py", nproc_per_node="1"), RunOptions(),
                   [Host("node0"), Host("node1")], {"node0": n0, "node1": n1},
                   master_addr=MASTER_IP, master_port=1, master_reason="")
    why = ("mlx5_1:1: no RoCE v2 GID with a routable address on ens2f0; NCCL would fall back to "
           "index 0")
    assert err.value.message == f"node0: {why}; node1: {why}"


def test_an_offline_plan_whole() -> None:
    hosts = [Host("198.18.0.99", user="dtuser", slots=2, env=(("H", "1"),), source="hosts:1"),
             Host("node-b", python="/opt/py", slots=1, env=(("H", "2"),))]
    req = RunRequest("t.py", args=("--key", "abc"), env=(("K", "abc"),),
                     hidden_env=frozenset({"K"}), run_id="r3")
    opts = RunOptions(checks=NodeChecks(profile={"NCCL_DEBUG": "INFO"}, profile_name="dev"))
    plan = offline_plan(req, opts, hosts)
    doc = plan_json(plan)
    assert {k: v for k, v in doc.items() if k != "nodes"} == {
        "offline": True, "facts": OFFLINE_FACTS, "master_addr": "198.18.0.99",
        "master_port": 29500, "master_reason": "node 0's name from the hostfile; not checked: "
        "--offline", "world_size": 3, "rdzv": "static"}
    assert OFFLINE_FACTS == ("not connected (--offline): interfaces, GPUs, RDMA, the Python and "
                             "torch and the node's site config are unknown; NCCL/GLOO variables "
                             "are detected when the run connects")
    assert [n.argv for n in plan.nodes] == [
        ("python3", *TORCHRUN, "--nnodes", "2", "--nproc-per-node", "2", "--max-restarts", "0",
         "--monitor-interval", "0.2", "--node-rank", "0", "--master-addr", "198.18.0.99",
         "--master-port", "29500", SHIM_PLACEHOLDER, "t.py", "--key", "abc"),
        ("/opt/py", *TORCHRUN, "--nnodes", "2", "--nproc-per-node", "1", "--max-restarts", "0",
         "--monitor-interval", "0.2", "--node-rank", "1", "--master-addr", "198.18.0.99",
         "--master-port", "29500", SHIM_PLACEHOLDER, "t.py", "--key", "abc")]
    assert doc["nodes"][0]["command"][-2:] == ["--key", "***"]  # type: ignore[index]
    assert [(n.node_rank, n.nproc, n.first_rank, n.python, n.warnings) for n in plan.nodes] == [
        (0, 2, 0, "python3", ()), (1, 1, 2, "/opt/py", ())]
    own = [("DTRAIN_RUN_ID", "r3", "dtrain", "run archive id", True),
           ("DTRAIN_NODE_RANK", "1", "dtrain", "node rank", True),
           ("DTRAIN_NNODES", "2", "dtrain", "number of nodes", True), OMP, SHUTDOWN]
    assert env_rows(plan.nodes[1]) == [
        *own, ("H", "2", "user", "hostfile env:", True), ("K", "abc", "user", "--env", True),
        ("NCCL_DEBUG", "INFO", "profile", "dev", True), UNBUFFERED]
    assert env_rows(plan.nodes[0])[5] == ("H", "1", "user", "hostfile hosts:1", True)
    given = offline_plan(replace(req, master_addr="10.0.0.9", master_port=1234,
                                 nproc_per_node="gpu",
                                 devices=DeviceSelection(include={"198.18.0.99": (0, 2)})),
                         RunOptions(), hosts[:1])
    assert (given.master_addr, given.master_port, given.master_reason, given.world_size) == (
        "10.0.0.9", 1234, "--master-addr; not checked: --offline", 2)
    assert env_rows(given.nodes[0])[5] == (
        "CUDA_VISIBLE_DEVICES", "0,2", "user", "--include/--exclude (GPU selection)", True)


def test_offline_rank_counts_that_need_the_gpus_and_bad_values() -> None:
    """A count only the GPUs give is refused as unknown; a value that is no count at all
    gets nproc_for's message (it said "depends on its GPUs" for 0 and x before)."""
    for nproc, host in ((None, Host("a")), ("gpu", Host("a", slots=2)), ("auto", Host("a"))):
        with pytest.raises(UsageError) as err:
            offline_plan(RunRequest("t.py", nproc_per_node=nproc), RunOptions(), [host])
        assert (err.value.message, err.value.hint) == (
            f"--offline: a's rank count depends on its GPUs, unknown without connecting "
            f"(--nproc-per-node {nproc or 'gpu'})",
            "give slots=N in the hostfile or --nproc-per-node N")
    for bad in ("0", "x"):
        with pytest.raises(UsageError) as err:
            offline_plan(RunRequest("t.py", nproc_per_node=bad), RunOptions(), [Host("a")])
        assert err.value.message == f"--nproc-per-node {bad!r} is not a positive number, " \
                                    "'gpu' or 'auto'"
    assert offline_plan(RunRequest("t.py"), RunOptions(), [Host("a", slots=2)]).world_size == 2


def test_the_nodes_warnings_print_once_each_with_their_hosts_folded() -> None:
    """What a run prints before it starts (docs/network-env.md): each node's warning with
    its hostname prefix replaced by its label, the same text on several nodes once."""
    plan = two_node_plan()
    same = "NCCL_SOCKET_IFNAME: /etc/nccl.conf sets =bond0, which stays in effect"
    nodes = (replace(plan.nodes[0], warnings=(f"gpu-a.example: {same}", "node0: own one")),
             replace(plan.nodes[1], warnings=(f"gpu-b.example: {same}",)))
    folded = plan_warnings(replace(plan, nodes=nodes),
                           {"node0": "gpu-a.example", "node1:2222": "gpu-b.example"})
    assert folded == [f"node0,node1:2222: {same}", "node0: node0: own one"]
    assert plan_warnings(plan, {}) == []


def test_more_ranks_than_gpus_is_warned_before_the_start() -> None:
    """A node given more ranks than it shows GPUs (or than --include left it) is named before
    anything starts, once, folded with its peers: under NCCL the ranks would meet at the
    first collective only to fail with "Duplicate GPU detected" on every node. No GPU at all
    is a CPU job: no warning; as many ranks as GPUs: none either."""
    n2 = replace(N1, hostname="node2", routes={"198.18.0.12": route("198.18.0.12", "eth0")},
                 gpus=2)
    n3 = replace(n2, hostname="node3", gpus=0)
    hosts = [Host("node1"), Host("node2"), Host("node3")]
    facts = {"node1": N1, "node2": n2, "node3": n3}

    def warned(nproc: str, sel: DeviceSelection | None = None) -> list[str]:
        plan = build_plan(RunRequest("t.py", nproc_per_node=nproc, devices=sel), RunOptions(),
                          hosts, facts, master_addr="198.18.0.12", master_port=1,
                          master_reason="")
        return plan_warnings(plan, {"node1": "node1", "node2": "node2", "node3": "node3"})

    shared = ("ranks will share a GPU, which NCCL refuses (\"Duplicate GPU detected\"); fine "
              "for gloo. One rank per GPU: --nproc-per-node gpu")
    assert [w for w in warned("2") if "GPU" in w] == []
    assert [w for w in warned("3") if "GPU" in w] == [f"node2: 3 ranks on 2 GPUs: {shared}"]
    assert [w for w in warned("9") if "GPU" in w] == [f"node1: 9 ranks on 8 GPUs: {shared}",
                                                      f"node2: 9 ranks on 2 GPUs: {shared}"]
    assert [w for w in warned("2", DeviceSelection(include={"node1": (5,)})) if "GPU" in w] \
        == [f"node1: 2 ranks on 1 GPU: {shared}"]
    plan = build_plan(RunRequest("t.py", nproc_per_node="3"), RunOptions(), hosts, facts,
                      master_addr="198.18.0.12", master_port=1, master_reason="")
    assert plan_json(plan)["nodes"][1]["warnings"][-1] == f"node2: 3 ranks on 2 GPUs: {shared}"
