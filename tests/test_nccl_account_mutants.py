"""decide/nccl_account.py: what issue 51's mutation round (docs/testing.md, "Mutation score")
found no test for (a first step; see there for what is left): each rank's account and the
summary as the JSON documents carry them, key by key."""

from __future__ import annotations

from launcher.decide import nccl_account as na
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
