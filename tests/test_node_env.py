"""A node's whole environment comes from one pure call (``build_plan`` → ``netenv.decide_env``
→ ``netenv.merge_env``): user > site > profile > detection > dtrain's own (docs/network-env.md).

Hand-made NodeFacts, no network. Each layer sets the same few keys over the one below it.
"""

from __future__ import annotations

from launcher.decide.runplan.facts import SiteVar
from launcher.decide.runplan.plan import RunRequest, build_plan
from launcher.decide.runplan.runoptions import NodeChecks, RunOptions
from launcher.models import Host
from tests.test_netenv import MASTER_IP, iface, node, route

NODE0 = node("node0", iface("eth0", "198.18.0.11/24"), default="eth0",
             site=(SiteVar("NCCL_IB_HCA", "mlx5_0", "/etc/nccl.conf"),
                   SiteVar("NCCL_DEBUG", "WARN", "/etc/nccl.conf")))
NODE1 = node("node1", iface("eth0", "198.18.0.12/24"), default="eth0",
             routes={MASTER_IP: route(MASTER_IP, "eth0")})


def plan_env(*, user: dict[str, str], host_env: dict[str, str], profile: dict[str, str]
             ) -> list[dict[str, tuple[str, str]]]:
    hosts = [Host("node0", env=tuple(host_env.items())), Host("node1")]
    req = RunRequest(script="train.py", nproc_per_node="1", env=tuple(user.items()),
                     run_id="r1")
    plan = build_plan(req, RunOptions(checks=NodeChecks(profile=profile)), hosts,
                      {"node0": NODE0, "node1": NODE1}, master_addr=MASTER_IP,
                      master_port=29500, master_reason="test")
    return [{v.name: (v.value, v.source) for v in n.env} for n in plan.nodes]


def test_every_layer_in_its_place() -> None:
    node0, node1 = plan_env(
        user={"NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "8"},
        host_env={"NCCL_DEBUG": "TRACE", "MY_VAR": "from-hostfile"},
        profile={"NCCL_IB_HCA": "mlx5_9", "NCCL_SOCKET_IFNAME": "=eth9",
                 "DTRAIN_NNODES": "99"})
    # user (--env over the hostfile's env) over site
    assert node0["NCCL_DEBUG"] == ("INFO", "user")
    assert node0["MY_VAR"] == ("from-hostfile", "user")
    assert node1["NCCL_DEBUG"] == ("INFO", "user")
    # site over profile
    assert node0["NCCL_IB_HCA"] == ("mlx5_0", "site")
    assert node1["NCCL_IB_HCA"] == ("mlx5_9", "profile")
    # profile over detection
    assert node0["NCCL_SOCKET_IFNAME"] == ("=eth9", "profile")
    # detection where nothing above sets it
    assert node0["GLOO_SOCKET_IFNAME"] == ("eth0", "detected")
    # dtrain's own is the floor: the profile and --env win over it
    assert node0["DTRAIN_NNODES"] == ("99", "profile")
    assert node0["OMP_NUM_THREADS"] == ("8", "user")
    assert node0["DTRAIN_RUN_ID"] == ("r1", "dtrain")
    assert node1["DTRAIN_NODE_RANK"] == ("1", "dtrain")


def test_dtrain_s_own_variables_come_first_then_the_rest_by_name() -> None:
    node0, _ = plan_env(user={"OMP_NUM_THREADS": "8", "A_VAR": "1"}, host_env={}, profile={})
    names = list(node0)
    assert names[:5] == ["DTRAIN_RUN_ID", "DTRAIN_NODE_RANK", "DTRAIN_NNODES",
                         "OMP_NUM_THREADS", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"]
    assert names[5:] == sorted(names[5:])
