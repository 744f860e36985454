"""NCCL's own account of the fabric: the parser on real logs from public issues
(tests/data/nccl/), the summary line, the warnings, the plan comparison, --require-fabric."""

from __future__ import annotations

from pathlib import Path

from launcher.decide.fabric import nccl_account as na
from launcher.nodeside import nodeevidence

DATA = Path(__file__).parent / "data" / "nccl"


def lines(name: str) -> list[str]:
    return (DATA / name).read_text().splitlines()


def test_roce_log_from_nccl_tests_185():
    acc = na.parse_lines(lines("roce_ib_nccl_tests_185.log"))
    assert acc.version == "2.19.3"
    assert acc.network == "IB"
    assert acc.ib_devices == ["mlx5_10:1/RoCE", "mlx5_11:1/RoCE"]
    assert acc.oob_if == "enp220s0np0" and acc.bootstrap_if == "enp220s0np0"
    assert na.transport(acc) == "rdma"


def test_no_ib_device_log_from_nccl_952_is_socket():
    acc = na.parse_lines(lines("no_ib_device_nccl_952.log"))
    assert acc.ib_none and acc.network == "Socket"
    assert acc.socket_ifs == ["ibp12s0"]
    assert acc.net_channels == {"Socket"} and acc.intra == {"P2P"}
    assert na.transport(acc) == "socket"


def test_gdrdma_channels_from_nccl_707():
    acc = na.parse_lines(lines("gdrdma_nccl_707.log"))
    assert acc.net_channels == {"IB/GDRDMA"}
    assert na.transport(acc) == "gdr"


def test_ib_disabled_by_env_from_nccl_1053():
    acc = na.parse_lines(lines("socket_lo_nccl_1053.log"))
    assert acc.env["NCCL_IB_DISABLE"] == "1"
    assert acc.socket_ifs == ["lo"] and acc.gdr is None
    assert na.transport(acc) == "socket"
    s = na.summarize({0: acc, 1: na.parse_lines(lines("roce_ib_nccl_tests_185.log"))},
                     {0: "a", 1: "b"}, {})
    assert s.warnings == ("WARNING: rank 0 (a) uses NET/Socket (TCP): NCCL_IB_DISABLE=1 "
                          "(set by environment)",)


def test_a_real_single_node_log_from_nccl_2_28_9_on_an_h200():
    """Our own log (bench/gpu/check.sh on an H200, NCCL 2.28.9, docs/gpu-check.md): NET/IB
    finds no device yet prints a `Using [RO]; OOB lo` line, and the GPUDirect line is
    NET/Socket's own; kept by the node's filter as the supervisor keeps them."""
    kept = [ln for ln in lines("single_node_h200_nccl_2_28_9.log")
            if any(w.decode() in ln for w in nodeevidence.NCCL_KEEP)]
    assert len(kept) < 15  # 64 channel lines and the rest are not shipped
    acc = na.parse_lines(kept)
    assert (acc.version, acc.network, acc.nranks) == ("2.28.9", "Socket", 1)
    assert acc.ib_none and acc.ib_devices == [] and acc.socket_ifs == ["lo"]
    assert acc.init_complete and acc.gdr is None and na.transport(acc) == "socket"
    assert na.compare("localhost", acc, {"NCCL_SOCKET_IFNAME": "=lo"}) == []
    s = na.summarize({0: acc}, {0: "localhost"}, {"localhost": {"NCCL_SOCKET_IFNAME": "=lo"}},
                     multi_node=False)
    assert s.line == "NCCL 2.28.9: one node, NET/Socket (lo) unused between nodes"
    assert s.warnings == () and s.differences == ()


def test_init_complete_and_warn_lines():
    acc = na.parse_lines(lines("init_complete_nccl_1412.log") + lines("warn_nccl_tests_188.log"))
    assert acc.init_complete and acc.nranks == 16
    assert acc.warns == ["socketFinalizeAccept: wrong type 4 != 3",
                         "Call to ibv_modify_qp failed with error Network is unreachable"]


def roce(version: str = "2.21.5") -> list[str]:
    return [f"NCCL version {version}+cuda12.4",
            "h:1:2 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/RoCE [RO]; "
            "OOB eth0:10.1.1.1<0>",
            "h:1:2 [0] NCCL INFO Using network IB",
            "h:1:2 [0] NCCL INFO NCCL_IB_GID_INDEX set by environment to 3.",
            "h:1:2 [0] NCCL INFO NET/IB : GPU Direct RDMA Enabled for HCA 0 'mlx5_0'",
            "h:1:3 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA",
            "h:1:3 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC",
            "h:1:2 [0] NCCL INFO ncclCommInitRank comm 0x55 rank 0 nranks 16 cudaDev 0 "
            "nvmlDev 0 busId 18000 commId 0x3f1e - Init COMPLETE"]


def socket_lines() -> list[str]:
    return ["h:1:2 [0] NCCL INFO NET/IB : No device found.",
            "h:1:2 [0] NCCL INFO NET/Socket : Using [0]eth0:10.1.1.2<0>",
            "h:1:2 [0] NCCL INFO Using network Socket"]


def test_the_one_line_on_the_fabric():
    accounts = {r: na.parse_lines(roce()) for r in range(16)}
    hosts = {r: "node1" if r < 8 else "node2" for r in range(16)}
    s = na.summarize(accounts, hosts, {})
    assert s.line == ("NCCL 2.21.5: RoCE on every rank (mlx5_0, mlx5_1, GID 3, GPUDirect); "
                      "intra-node P2P")
    assert s.warnings == () and s.refusal is None


def test_a_node_on_socket_is_warned_and_refused_under_rdma():
    accounts = {r: na.parse_lines(roce() if r < 8 else socket_lines()) for r in range(16)}
    hosts = {r: "node1" if r < 8 else "node2" for r in range(16)}
    env = {"node2": {"NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1"}}
    s = na.summarize(accounts, hosts, env, require="rdma")
    assert s.warnings == ("WARNING: ranks 8-15 (node2) use NET/Socket (TCP): NET/IB found "
                          "no device",)
    assert s.refusal == "--require-fabric rdma: ranks 8-15 (node2) use socket"
    assert s.differences == ("node2: the plan chose RDMA (mlx5_0:1, mlx5_1:1), NCCL uses "
                             "NET/Socket",)
    assert "mixed" in s.line
    # only warned without --require-fabric; gdr refuses RDMA without GPUDirect too
    assert na.summarize(accounts, hosts, env).refusal is None
    assert na.meets("rdma", "rdma") and not na.meets("rdma", "gdr")
    assert not na.meets("none", "any") and na.meets("socket", "any")


def test_differences_from_the_plan_hca_gid_and_socket_interface():
    acc = na.parse_lines(roce())
    env = {"NCCL_IB_HCA": "=mlx5_2:1", "NCCL_IB_GID_INDEX": "5",
           "NCCL_SOCKET_IFNAME": "=ens1"}
    assert na.compare("n1", acc, env) == [
        "n1: NCCL opened mlx5_0:1, mlx5_1:1, the plan chose mlx5_2:1",
        "n1: NCCL uses GID 3, the plan chose 5",
        "n1: NCCL's socket interface is eth0, the plan chose ens1"]
    assert na.compare("n1", acc, {"NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1",
                                  "NCCL_SOCKET_IFNAME": "=eth0"}) == []


def test_settled_and_wants_account():
    assert na.settled(na.parse_lines(socket_lines()), "rdma")
    assert not na.settled(na.parse_lines(["NCCL version 2.21.5+cuda12.4"]), "rdma")
    assert not na.wants_account(["NCCL_DEBUG", "PATH"])
    assert not na.wants_account(["NCCL_DEBUG_FILE"])
    assert na.wants_account(["NCCL_IB_HCA"])


def test_other_lines_are_ignored_and_ranges():
    acc = na.parse_lines(["hello", "NCCL INFO half", "", "x:y:z [0] NCCL INFO Using network IB"])
    assert acc.lines == 0 and acc.network is None
    assert na.ranges([8, 9, 10, 12, 14, 15]) == "8-10,12,14-15"


def test_the_node_asks_only_when_nobody_set_nccl_debug(tmp_path):

    add = nodeevidence.nccl_defaults({}, str(tmp_path))
    assert add == {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET",
                   "NCCL_DEBUG_FILE": str(tmp_path / "nccl.%h.%p.log")}
    assert nodeevidence.nccl_defaults({"NCCL_DEBUG": "WARN"}, str(tmp_path)) == {}
    assert nodeevidence.nccl_defaults({"NCCL_DEBUG_FILE": "/x"}, str(tmp_path)) == {}
    assert "NCCL_DEBUG_SUBSYS" not in nodeevidence.nccl_defaults({"NCCL_DEBUG_SUBSYS": "ALL"}, "/d")


def test_the_node_reads_its_ranks_files_as_they_grow(tmp_path):

    files = nodeevidence.NcclFiles(str(tmp_path))
    mine, other = tmp_path / "nccl.h.100.log", tmp_path / "nccl.h.200.log"
    mine.write_text("h:100:1 [0] NCCL INFO cudaDriverVersion 12040\n"
                    "h:100:1 [0] NCCL INFO Using network IB\nh:100:1 [0] NCCL INFO NET/IB : Us")
    other.write_text("h:200:1 [0] NCCL INFO Using network Socket\n")
    assert files.poll({100}) == {100: ["h:100:1 [0] NCCL INFO Using network IB"]}
    with mine.open("a") as f:
        f.write("ing [0]mlx5_0:1/IB ; OOB eth0:10.0.0.1<0>\n")
    assert files.poll({100}) == {
        100: ["h:100:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB eth0:10.0.0.1<0>"]}
    assert files.poll({100}) == {}
    # a pid that is no rank yet is not consumed: read once it is
    assert files.poll({100, 200}) == {200: ["h:200:1 [0] NCCL INFO Using network Socket"]}


def test_one_poll_reads_a_bounded_amount_and_the_rest_follows(tmp_path):

    line = "h:100:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA\n"
    n = (nodeevidence.NCCL_POLL_BYTES // len(line)) * 2
    (tmp_path / "nccl.h.100.log").write_text(line * n)
    files = nodeevidence.NcclFiles(str(tmp_path))
    got = files.poll({100})[100]
    assert files.more and len(got) < n
    while files.more:
        got += files.poll({100}).get(100, [])
    assert len(got) == min(n, nodeevidence.NCCL_MAX_LINES)
