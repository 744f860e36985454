"""decide/fabric/nccl_account.py: what issue 51's mutation round (docs/testing.md, "Mutation score")
found no test for (a first step; see there for what is left): each rank's account and the
summary as the JSON documents carry them, key by key."""

from __future__ import annotations

from launcher.decide.fabric import nccl_account as na
from tests.test_nccl_account import lines


def test_a_ranks_account_and_the_summary_as_json_key_by_key() -> None:
    # one rank whose log holds the RoCE lines, GDRDMA channels, a warning and the end of init
    rich = na.parse_lines(lines("roce_ib_nccl_tests_185.log") + lines("gdrdma_nccl_707.log")
                          + lines("warn_nccl_tests_188.log")
                          + lines("init_complete_nccl_1412.log"))
    doc = rich.json()
    assert doc == {"version": "2.19.3", "network": "IB", "transport": "gdr",
                   "ib_devices": ["mlx5_10:1/RoCE", "mlx5_11:1/RoCE"], "ib_none": False,
                   "socket_ifs": [], "gid": None, "gdr": None, "channels": ["IB/GDRDMA"],
                   "intra": [], "init_complete": True,
                   "warns": ["socketFinalizeAccept: wrong type 4 != 3",
                             "Call to ibv_modify_qp failed with error Network is unreachable"]}
    socket = na.parse_lines(lines("socket_lo_nccl_1053.log"))
    s = na.summarize({0: socket, 1: rich}, {0: "a", 1: "b"}, {})
    assert s.json() == {
        "version": "2.19.3", "line": s.line, "warnings": list(s.warnings),
        "differences": [], "refusal": None,
        "ranks": {"0": {**socket.json(), "host": "a"}, "1": {**doc, "host": "b"}}}
    assert s.line.startswith("NCCL 2.19.3: mixed: ")


def test_the_summary_of_missing_partial_and_refused_ranks() -> None:
    roce = na.parse_lines(lines("roce_ib_nccl_tests_185.log"))
    sock = na.parse_lines(lines("socket_lo_nccl_1053.log"))
    hosts = {0: "a", 1: "b", 2: "c", 3: "d"}
    s = na.summarize({0: roce, 1: sock}, hosts, {}, require="any")
    assert s.line == "NCCL 2.19.3: mixed: 1 RDMA, 1 NET/Socket (TCP)"
    assert s.warnings == ("WARNING: rank 1 (b) uses NET/Socket (TCP): NCCL_IB_DISABLE=1 "
                          "(set by environment)",
                          "WARNING: no NCCL account from ranks 2-3 (c, d)")
    assert s.refusal == "--require-fabric any: ranks 2-3 (c, d) use no account"
    s = na.summarize({0: roce, 1: sock}, hosts, {}, require="gdr")
    assert s.refusal == "--require-fabric gdr: ranks 0-1 (a, b) use rdma, socket"
    # more may come: nobody named missing, and the line says how many so far
    s = na.summarize({0: roce, 1: sock}, hosts, {}, require="rdma", partial=True)
    assert s.line == "NCCL 2.19.3: mixed: 1 RDMA, 1 NET/Socket (TCP) (2 of 4 ranks so far)"
    assert len(s.warnings) == 1 and s.refusal == "--require-fabric rdma: rank 1 (b) uses socket"
    full = na.summarize({0: roce, 1: sock}, {0: "a", 1: "b"}, {}, partial=True)
    assert not full.line.endswith("so far)")
    # no version anywhere; a single node (no warning for Socket); no account at all
    s = na.summarize({1: sock}, {1: "b"}, {}, multi_node=False)
    assert s.line == "NCCL: one node, NET/Socket (lo) unused between nodes"
    assert s.warnings == ()
    s = na.summarize({1: sock}, {1: "b"}, {})
    assert s.line == "NCCL: NET/Socket (TCP) on every rank (lo)" and len(s.warnings) == 1
    s = na.summarize({}, hosts, {})
    assert s.line == "NCCL: no account from any rank" and s.warnings == ()


def info(*msgs: str) -> list[str]:
    """NCCL INFO lines as NCCL writes them."""
    return [f"node1:4242:4250 [0] NCCL INFO {m}" for m in msgs]


def test_a_line_read_with_its_line_end() -> None:
    assert na.parse_line("node1:1:2 [0] NCCL INFO Using network IB\r\n") == (
        "INFO", "Using network IB")
    assert na.parse_line("NCCL version 2.21.5+cuda12.4\n") == (
        "VERSION", "NCCL version 2.21.5+cuda12.4")
    assert na.parse_line("\nNCCL version 2.21.5+cuda12.4") is None
    # only the line end is cut: a message's own last letters stay
    assert na.parse_line("node1:1:2 [0] NCCL INFO Using network NetX\n") == (
        "INFO", "Using network NetX")
    assert na.parse_lines(["NCCL version 2.21.5+cuda12.4\r\n"]).version == "2.21.5"


def test_each_kind_of_channel() -> None:
    def channels(via: str) -> tuple[str, list[str], list[str]]:
        acc = na.parse_lines(info(f"Channel 00/0 : 0[0] -> 8[0] [send] via {via}"))
        return na.transport(acc), sorted(acc.net_channels), sorted(acc.intra)

    assert channels("NET/IB/0/GDRDMA") == ("gdr", ["IB/GDRDMA"], [])
    assert channels("NET/IB/1") == ("rdma", ["IB"], [])
    assert channels("NET/IBext_v8/0/GDRDMA") == ("gdr", ["IB/GDRDMA"], [])  # SHARP: verbs
    assert channels("NET/Socket") == ("socket", ["Socket"], [])
    assert channels("NET/Socket/1") == ("socket", ["Socket"], [])
    assert channels("NET/AWS Libfabric/0") == ("plugin", ["AWS"], [])
    assert channels("P2P/IPC") == ("none", [], ["P2P"])
    assert channels("SHM/direct/direct") == ("none", [], ["SHM"])
    assert channels("NET") == ("none", [], ["NET"])  # no network named after NET/
    # some channels over RDMA with GPUDirect, some without: RDMA
    acc = na.parse_lines(info("Channel 00/0 : 0[0] -> 8[0] via NET/IB/0/GDRDMA",
                              "Channel 01/0 : 0[0] -> 8[0] via NET/IB/1"))
    assert na.transport(acc) == "rdma"
    # a plugin's channels beside IB's: neither RDMA nor TCP alone
    acc = na.parse_lines(info("Channel 00/0 : 0[0] -> 8[0] via NET/IB/0",
                              "Channel 01/0 : 0[0] -> 8[0] via NET/Libfabric/1"))
    assert na.transport(acc) == "plugin"


def test_warn_lines_are_cut_folded_and_bounded() -> None:
    warn = "node1:1:2 [0] misc/socket.cc:50 NCCL WARN "
    acc = na.parse_lines([warn + "x" * 400, warn + "x" * 400, warn + "a"])
    assert acc.warns == ["x" * 300, "a"]
    acc = na.parse_lines([warn + f"w{i}" for i in range(25)])
    assert acc.warns == [f"w{i}" for i in range(20)]
    # a WARN line is nothing else
    acc = na.parse_lines([warn + "Using network Socket"])
    assert acc.network is None and acc.warns == ["Using network Socket"]


def test_the_hcas_gid_and_gpudirect_nccl_said() -> None:
    acc = na.parse_lines(info(
        "NET/IB: Using [0]mlx5_0:1/IB ; OOB ib0:10.0.0.1<0>",  # no blank before the colon
        "NET/IB : GID 3 (fe80::1), local address 10.0.0.1",
        "NET/IB : GID 5 (fe80::2)",  # the first GID said is the one kept
        "NCCL_IB_GID_INDEX set by environment to 7.",
        "NCCL_SOCKET_NTHREADS set by environment to 4."))
    assert (acc.ib_devices, acc.oob_if, acc.gid) == (["mlx5_0:1/IB"], "ib0", 3)
    assert acc.env == {"NCCL_IB_GID_INDEX": "7", "NCCL_SOCKET_NTHREADS": "4"}
    # the environment's GID when no line said one; no other variable is a GID
    assert na.parse_lines(info("NCCL_SOCKET_NTHREADS set by environment to 4.")).gid is None
    assert na.parse_lines(info("NCCL_IB_GID_INDEX set by environment to 7.")).gid == 7
    assert na.parse_lines(info("NCCL_IB_GID_INDEX set by environment to x.")).gid is None
    on = "NET/IB : GPU Direct RDMA Enabled for HCA 0 'mlx5_0'"
    off = "NET/IB : GPU Direct RDMA Disabled for HCA 1 'mlx5_1' (no module)"
    assert na.parse_lines(info(on)).gdr is True
    assert na.parse_lines(info(off)).gdr is False
    assert na.parse_lines(info(off, on)).gdr is False  # one HCA without: not everywhere
    assert na.parse_lines(info(on, off)).gdr is False
    assert na.parse_lines(info("GPU Direct RDMA Disabled for GPU 0")).gdr is None  # no HCA
    assert na.parse_lines(info("NET/Socket : GPU Direct RDMA Disabled for HCA 0")).gdr is None
    assert na.parse_lines(info("NET/IB : Using [0]mlx5_0:1/RoCE",
                               "NET/IB : Using interface")).ib_devices == ["mlx5_0:1/RoCE"]


def test_the_transport_from_the_network_alone() -> None:
    def kind(*msgs: str) -> str:
        return na.transport(na.parse_lines(info(*msgs)))

    assert kind() == "none"
    assert kind("Using network Socket") == "socket"
    assert kind("Using network IB") == "rdma"
    assert kind("Using network IB", "NET/IB : GPU Direct RDMA Enabled for HCA 0 'm'") == "gdr"
    assert kind("Using network AWS Libfabric") == "plugin"


def test_what_each_require_fabric_accepts() -> None:
    kinds = ("gdr", "rdma", "plugin", "socket", "none")
    assert {r: [k for k in kinds if na.meets(k, r)] for r in na.REQUIRE} == {
        "gdr": ["gdr"], "rdma": ["gdr", "rdma", "plugin"],
        "any": ["gdr", "rdma", "plugin", "socket"]}


def test_when_a_rank_can_be_judged() -> None:
    def settled(require: str | None, *msgs: str) -> bool:
        return na.settled(na.parse_lines(info(*msgs)), require)

    done = "ncclCommInitRank comm 0x1 rank 0 nranks 2 cudaDev 0 - Init COMPLETE"
    for require in (None, "any", "rdma", "gdr"):
        assert settled(require, "Using network Socket")  # final at once
        assert settled(require, "Channel 00/0 : 0[0] -> 8[0] via NET/IB/0")
        assert settled(require, done)
        assert not settled(require)
    # IB chosen: GPUDirect is known only once init is complete
    assert settled(None, "Using network IB") and settled("rdma", "Using network IB")
    assert not settled("gdr", "Using network IB")


def test_why_a_rank_is_on_tcp() -> None:
    def why(*msgs: str) -> str:
        s = na.summarize({0: na.parse_lines(info(*msgs))}, {0: "a"}, {})
        return s.warnings[0]

    head = "WARNING: rank 0 (a) uses NET/Socket (TCP): "
    assert why("NET/IB : No device found.", "Using network Socket") == (
        head + "NET/IB found no device")
    assert why("NCCL_NET set by environment to Socket.", "Using network Socket") == (
        head + "NCCL_NET=Socket (set by environment)")
    assert why("Using network Socket") == head + "NCCL chose the Socket network"
    assert why("Using network IB", "Channel 00/0 : 0[0] -> 8[0] via NET/Socket/0") == (
        head + "its channels between nodes go over NET/Socket")


def test_the_plans_hcas_against_nccls() -> None:
    acc = na.parse_lines(info("NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:2/IB",
                              "Channel 00/0 : 0[0] -> 8[0] via NET/IB/0"))

    def diff(hca: str) -> list[str]:
        return na.compare("n1", acc, {"NCCL_IB_HCA": hca})

    opened = "n1: NCCL opened mlx5_0:1, mlx5_1:2, the plan chose "
    assert diff("mlx5_0,mlx5_1:2") == []  # a port defaults to 1
    assert diff("=mlx5_0:1, mlx5_1:2") == []
    assert diff("mlx5_0:,mlx5_1:2,:3") == []  # an empty port is 1, an empty name skipped
    assert diff("^mlx5_2") == []  # an exclusion names no HCA to compare
    assert diff("") == []
    assert diff("mlx5_0") == [opened + "mlx5_0:1"]
    assert diff("=mlx5_1:2,mlx5_0:1,mlx5_3") == [opened + "mlx5_0:1, mlx5_1:2, mlx5_3:1"]
    sock = na.parse_lines(info("Using network Socket"))
    assert na.compare("n1", sock, {"NCCL_IB_HCA": "mlx5_0,mlx5_1"}) == [
        "n1: the plan chose RDMA (mlx5_0:1, mlx5_1:1), NCCL uses NET/Socket"]


def test_the_plan_disabled_ib_and_the_gid() -> None:
    rdma = na.parse_lines(info("Using network IB", "NET/IB : GID 3 (fe80::1)"))
    gdr = na.parse_lines(info("Channel 00/0 : 0[0] -> 8[0] via NET/IB/0/GDRDMA"))
    said = "n1: the plan disabled IB (NCCL_IB_DISABLE=1), NCCL uses RDMA"
    assert na.compare("n1", rdma, {"NCCL_IB_DISABLE": "1"}) == [said]
    assert na.compare("n1", gdr, {"NCCL_IB_DISABLE": "1"}) == [said]
    assert na.compare("n1", rdma, {"NCCL_IB_DISABLE": "0"}) == []
    assert na.compare("n1", na.parse_lines(info("Using network Socket")),
                      {"NCCL_IB_DISABLE": "1"}) == []
    assert na.compare("n1", rdma, {"NCCL_IB_GID_INDEX": " 3 "}) == []
    assert na.compare("n1", rdma, {"NCCL_IB_GID_INDEX": "0"}) == [
        "n1: NCCL uses GID 3, the plan chose 0"]
    assert na.compare("n1", gdr, {"NCCL_IB_GID_INDEX": "0"}) == []  # no GID said


def test_the_plans_socket_interface_against_nccls() -> None:
    def diff(ifname: str, *msgs: str) -> list[str]:
        return na.compare("n1", na.parse_lines(info(*msgs)), {"NCCL_SOCKET_IFNAME": ifname})

    sock = "NET/Socket : Using [0]eth0:10.0.0.1<0> [1]eth1:10.0.1.1<0>"
    oob = "NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.0.0.1<0>"
    boot = "Bootstrap : Using ens3:10.0.0.1<0>"
    assert diff("eth", sock) == []  # a prefix
    assert diff("=eth", sock) == ["n1: NCCL's socket interface is eth0, eth1, the plan chose eth"]
    assert diff("=eth1", sock) == []
    assert diff("ens", sock) == ["n1: NCCL's socket interface is eth0, eth1, the plan chose ens"]
    assert diff("^eth", sock) == []  # an exclusion: nothing to compare
    assert diff("ib", oob) == [] and diff("eth", oob) == [
        "n1: NCCL's socket interface is ib0, the plan chose eth"]
    assert diff("ens3", boot) == [] and diff("eth", boot) == [
        "n1: NCCL's socket interface is ens3, the plan chose eth"]
    assert diff("eth", sock, oob, boot) == []  # NET/Socket's interfaces first
    assert diff("ib", oob, boot) == []  # then NET/IB's out-of-band one
    assert diff("eth") == []  # no interface said


def test_ranks_without_a_host_and_warnings_in_rank_order() -> None:
    sock = na.parse_lines(info("Using network Socket"))
    ib = na.parse_lines(info("Using network IB"))
    s = na.summarize({5: sock, 0: sock, 2: ib, 9: sock}, {0: "b", 2: "a", 5: "a"},
                     {"?": {"NCCL_IB_HCA": "mlx5_0"}}, require="rdma")
    assert s.warnings == (
        "WARNING: rank 0 (b) uses NET/Socket (TCP): NCCL chose the Socket network",
        "WARNING: rank 5 (a) uses NET/Socket (TCP): NCCL chose the Socket network",
        "WARNING: rank 9 (?) uses NET/Socket (TCP): NCCL chose the Socket network")
    assert s.differences == ("?: the plan chose RDMA (mlx5_0:1), NCCL uses NET/Socket",)
    assert s.refusal == "--require-fabric rdma: ranks 0,5,9 (?, a, b) use socket"
    assert s.per_rank["9"]["host"] is None


def test_the_one_line_for_each_fabric() -> None:
    def line(*accounts: tuple[str, ...], multi_node: bool = True) -> str:
        return na.summarize({i: na.parse_lines(info(*a)) for i, a in enumerate(accounts)},
                            dict.fromkeys(range(len(accounts)), "h"), {},
                            multi_node=multi_node).line

    gdr = ("NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/RoCE",
           "Channel 00/0 : 0[0] -> 8[0] via NET/IB/0/GDRDMA",
           "Channel 00/0 : 0[0] -> 1[1] via P2P/IPC")
    rdma = ("NET/IB : Using [0]mlx5_2:2/IB", "Channel 00/0 : 0[0] -> 8[0] via NET/IB/0",
            "Channel 00/0 : 0[0] -> 1[1] via SHM/direct/direct", "NET/IB : GID 3 (x)")
    assert line(gdr, gdr) == "NCCL: RoCE on every rank (mlx5_0, mlx5_1, GPUDirect); intra-node P2P"
    assert line(gdr, rdma) == ("NCCL: IB/RoCE on every rank (mlx5_0:1, mlx5_1:1, mlx5_2:2, GID 3,"
                               " GPUDirect on some ranks); intra-node P2P/SHM")
    assert line(rdma) == "NCCL: IB on every rank (mlx5_2:2, GID 3); intra-node SHM"
    assert line(("Using network IB",)) == "NCCL: IB/RoCE on every rank"
    assert line(("Using network IB", "NET/IB : GID 3 (x)"),
                ("Using network IB", "NET/IB : GID 1 (x)")) == (
        "NCCL: IB/RoCE on every rank (GID 1/3)")
    assert line(("Using network AWS Libfabric",),
                ("Using network Foo", "Channel 00/0 : 0[0] -> 1[1] via P2P/IPC")) == (
        "NCCL: net plugin AWS Libfabric, Foo on every rank; intra-node P2P")
    assert line(("Channel 00/0 : 0[0] -> 8[0] via NET/Plug/0",)) == (
        "NCCL: net plugin ? on every rank")
    assert line(("Channel 00/0 : 0[0] -> 1[1] via P2P/IPC",), ()) == (
        "NCCL: no network named; intra-node P2P")
    socket = ("NET/Socket : Using [0]eth1:10.0.0.2<0> [1]eth0:10.0.0.1<0>",
              "Using network Socket")
    assert line(socket) == "NCCL: NET/Socket (TCP) on every rank (eth0, eth1)"
    assert line(("Using network Socket",)) == "NCCL: NET/Socket (TCP) on every rank"
    assert line(("Using network Socket",), multi_node=False) == (
        "NCCL: one node, NET/Socket unused between nodes")
    assert line(("Using network Socket",), gdr, rdma, ("Using network Socket",),
                ("Using network X",), ()) == (
        "NCCL: mixed: 1 RDMA+GPUDirect, 1 no network, 1 net plugin, 1 RDMA,"
        " 2 NET/Socket (TCP); intra-node P2P/SHM")
