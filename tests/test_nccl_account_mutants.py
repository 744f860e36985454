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
