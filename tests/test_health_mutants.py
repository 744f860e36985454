"""decide/fabric/health.py: what issue 51's mutation round (docs/testing.md, "Mutation score") found
no test for: the kernel log's new lines as a multiset, ``nvidia-smi -q`` as older drivers
print it (the bug it found: a Volta/Pascal GPU's volatile double-bit ECC errors were not
counted), its sections by indent, and the gate's counts and lemon line."""

from __future__ import annotations

from launcher.decide.fabric import health as h

# nvidia-smi -q of a driver that refuses the remapped-rows query fields, on a GPU before
# Ampere: the volatile double-bit errors are a section of their own, parts and a total
Q_VOLTA = """
==============NVSMI LOG==============
GPU 00000000:3B:00.0
    Product Name                          : Tesla V100-SXM2-32GB
    ECC Errors
        Volatile
            Single Bit
                Device Memory             : 4
                Register File             : 0
                Total                     : 4
            Double Bit
                Device Memory             : 2
                Register File             : 1
                L1 Cache                  : 0
                Total                     : 3
        Aggregate
            Single Bit
                Device Memory             : 9
                Total                     : 9
            Double Bit
                Device Memory             : 7
                Total                     : 7
    Retired Pages
        Single Bit ECC                    : 0
        Double Bit ECC                    : 5
        Pending Page Blacklist            : Yes
    Temperature
        GPU Current Temp                  : 41 C
""".replace(" Bit\n", " Bit            \n")  # (the headings' trailing blanks, as printed)


def test_older_drivers_volatile_double_bit_errors_are_counted() -> None:
    assert h.q_to_csv(Q_VOLTA) == "0, 3, [N/A], [N/A], Yes, [N/A], 41\n"
    f = h.node_findings({"gpu_csv": None, "gpu_error": "Field ... is not a valid field",
                         "gpu_q": Q_VOLTA})
    assert [(x.tier, x.message) for x in f] == [
        ("reset", "GPU 0: uncorrected ECC errors (volatile): 3"),
        ("reset", "GPU 0: page retirement pending (1)")]


def test_the_uncorrectable_lines_of_the_volatile_section_are_summed() -> None:
    q = """GPU 00000000:18:00.0
    ECC Errors
        Volatile
            SRAM Uncorrectable Parity     : 1
            SRAM Uncorrectable SEC-DED    : 2
            DRAM Uncorrectable            : 4
            SRAM Uncorrectable Total      : 3
"""
    assert h.q_to_csv(q).split(", ")[1] == "7"


def test_a_sections_lines_are_the_ones_indented_below_it() -> None:
    q = """GPU 00000000:18:00.0
    Remapped Rows:
        Pending                           : Yes
    Remapping Failure Occurred            : Yes
    Temperature
        GPU Current Temp                  : 50 C
    GPU Current Temp                      : 99 C
"""
    # a heading may end in a colon; a line at the heading's own indent is not in it
    assert h.q_to_csv(q) == "0, [N/A], Yes, [N/A], [N/A], [N/A], 50\n"


def test_new_kernel_lines_are_counted_as_a_multiset() -> None:
    assert h.new_lines(["a", "a"], ["a", "a", "a"]) == ["a"]
    assert h.new_lines(["a"], ["a", "a"]) == ["a"]
    assert h.new_lines(["a", "a"], ["a", "a"]) == []
    assert h.new_lines(["a", "b"], ["b", "c", "a", "a"]) == ["c", "a"]


def test_the_documents_counts_and_the_lemon_line() -> None:
    nodes = [{"host": "n1", "verdict": "isolate"}, {"host": "n2", "verdict": "ok"},
             {"host": "n3", "verdict": "ok"}, {"host": "n4", "verdict": "monitor"}]
    doc = h.document(nodes, 1.23456)
    assert doc["counts"] == {"isolate": 1, "reset": 0, "monitor": 1, "ok": 2,
                             "unreachable": 0}
    assert doc["isolated"] == ["n1"] and doc["elapsed_s"] == 1.235
    f = [h.Finding("isolate", "gpu", "GPU 0", "GPU 0: row remapping failed (1)"),
         h.Finding("reset", "gpu", "GPU 1", "GPU 1: page retirement pending (1)"),
         h.Finding("isolate", "xid", "PCI:0000:18:00", "Xid 79 on PCI:0000:18:00")]
    assert h.isolate_reason(f) == ("health gate: GPU 0: row remapping failed (1); "
                                   "Xid 79 on PCI:0000:18:00")


def test_dcgm_documents_of_odd_shapes() -> None:
    fail = {"name": "memory", "results": [{"gpu_ids": "1", "status": "FAIL"}]}
    # the categories at the top (no root key), odd entries skipped, not stopped at
    top = {"test_categories": [None, {"category": "Hardware", "tests": [
        None, {"name": "pcie", "results": [None, {"gpu_ids": "0", "status": "Fail"}]}, fail]}]}
    f = h.dcgm_findings(top, 3)
    assert [(x.tier, x.where) for x in f] == [("isolate", "GPU 0"), ("isolate", "GPU 1")]
    assert f[0].message == "dcgmi diag -r 3: Hardware/pcie FAIL on GPU 0"
    assert h.dcgm_findings({"DCGM GPU Diagnostic": [fail]}, 1) == []
    assert h.dcgm_findings({"DCGM Diagnostic": "x"}, 1) == []
    # no category named; a failure outside the hardware categories is reset, not isolate
    g = h.dcgm_findings({"test_categories": [{"tests": [fail]},
                                             {"category": "Deployment", "tests": [fail]}]}, 2)
    assert [(x.tier, x.message) for x in g] == [
        ("reset", "dcgmi diag -r 2: ?/memory FAIL on GPU 1"),
        ("reset", "dcgmi diag -r 2: Deployment/memory FAIL on GPU 1")]


def test_dcgm_4_entities_and_summaries_name_their_level() -> None:
    doc = {"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [
        {"name": "memory", "results": [{"entity_id": 3, "status": "Fail"},
                                       {"entity_group": "Gpu", "entity_id": 4,
                                        "status": "Fail"}]},
        {"name": "pcie", "test_summary": {"status": "Fail"}, "results": []}]}]}}
    f = h.dcgm_findings(doc, 4)
    assert [x.message for x in f] == ["dcgmi diag -r 4: Hardware/memory FAIL on GPU 3",
                                      "dcgmi diag -r 4: Hardware/memory FAIL on GPU 4",
                                      "dcgmi diag -r 4: Hardware/pcie FAIL on GPU ?"]


def test_gpu_rows_one_by_one_at_the_thresholds() -> None:
    csv = ("garbage\n"
           "0, 0, No, Yes, No, Not Active, 90\n"
           "1, 0, No, No, 0, Not Active, 89\n")
    f = h.gpu_findings(csv)
    assert [(x.tier, x.message) for x in f] == [
        ("isolate", "GPU 0: row remapping failed (1)"),
        ("monitor", "GPU 0: 90 C (>= 90 C)")]


def test_a_nodes_entry_says_what_it_could_read() -> None:
    raw = {"gpu_csv": "0, 0, No, No, 0, Not Active, 40\n", "dcgm": {"available": True},
           "ports": {"mlx5_1:1": {}, "mlx5_0:1": {}}, "kernel_log": True}
    node = h.node_json("n1", [], raw)
    assert (node["gpus"], node["dcgm"], node["ports"], node["kernel_log"]) == (
        True, True, ["mlx5_0:1", "mlx5_1:1"], True)
    assert node["verdict"] == "ok" and node["error"] is None
    bare = h.node_json("n2", [], {"gpu_csv": None, "dcgm": {"available": False}})
    assert (bare["gpus"], bare["dcgm"], bare["ports"], bare["kernel_log"]) == (
        False, False, [], False)


def test_dcgm_warnings_as_dcgm_writes_them_and_as_it_might() -> None:
    def one(warnings: object) -> str:
        res = {"gpu_ids": "0", "status": "Warn", "warnings": warnings}
        doc = {"test_categories": [{"category": "Hardware",
                                    "tests": [{"name": "m", "results": [res]}]}]}
        return h.dcgm_findings(doc, 1)[0].message

    head = "dcgmi diag -r 1: Hardware/m WARN on GPU 0"
    assert one([{"warning": "a"}, "b", {"error_id": 3}]) == f"{head}: a; b; {{'error_id': 3}}"
    assert one("not a list") == head and one([]) == head
    assert one([{"warning": "x" * 400}]) == f"{head}: {'x' * 300}"


def test_a_nodes_findings_from_each_of_its_sources() -> None:
    xid = "NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off the bus."
    raw: dict[str, object] = {
        "gpu_csv": None, "gpu_error": "E" * 250 + " is not a valid field",
        "xid_lines": ["[1.0] " + xid, "[9.0] " + xid],
        "dcgm": {"available": True, "level": 2, "json": {"test_categories": [
            {"category": "Hardware", "tests": [
                {"name": "m", "results": [{"gpu_ids": "1", "status": "Fail"}]}]}]}}}
    f = h.node_findings(raw, previous_xids=["[1.0] " + xid])
    assert [(x.tier, x.what, x.where, x.message) for x in f] == [
        ("monitor", "gpu", "nvidia-smi",
         "nvidia-smi --query-gpu failed: " + ("E" * 250 + " is not a valid field")[-200:]),
        ("isolate", "xid", "PCI:0000:18:00", "Xid 79 (GPU fallen off the bus) on "
         "PCI:0000:18:00 x2 (1 new since the last check)"),
        ("isolate", "dcgm", "GPU 1", "dcgmi diag -r 2: Hardware/m FAIL on GPU 1")]
    no_level = {"available": True, "json": raw["dcgm"]["json"]}  # type: ignore[index]
    g = h.node_findings({"dcgm": no_level})
    assert g[0].message.startswith("dcgmi diag -r 0: ")
    for dcgm, text in (({"available": True, "text": "dcgmi: not found"}, "dcgmi: not found"),
                       ({"available": True}, "")):
        assert h.node_findings({"dcgm": dcgm}) == [
            h.Finding("monitor", "dcgm", "dcgmi", f"dcgmi diag gave no JSON: {text}")]
    assert h.node_findings({"dcgm": {"available": False, "text": "x"}}) == []


def test_a_port_the_first_reading_did_not_see() -> None:
    assert h.port_findings({}, {"mlx5_2:1": {"link_downed": 3}}) == []


def test_pause_frames_of_each_port_in_turn() -> None:
    ports: dict[str, dict[str, object]] = {
        "a:1": {"pfc_before": None, "pfc_after": {"tx_pause": 9}},  # one reading: skipped
        "b:1": {"netdev": "eth1", "pfc_before": {"rx_pause": 0, "tx_pause": 5, "tx_x": "1"},
                "pfc_after": {"rx_pause": 100, "tx_pause": 6, "tx_x": "2", "rx_prio0": 5}},
        "c:1": {"netdev": "eth2", "pfc_before": {"rx_pause": 1},
                "pfc_after": {"rx_pause": 100}}}
    assert [(f.what, f.where, f.message) for f in h.pfc_findings(ports)] == [
        ("pfc", "b:1", "b:1 (eth1): rx_pause grew by 100 between two readings (the switch "
         "paused the node: congestion or a pause storm)"),
        ("pfc", "b:1", "b:1 (eth1): tx_pause grew by 1 between two readings (the node "
         "paused the switch: it cannot take what arrives)")]


def test_a_nodes_ports_and_limits() -> None:
    raw: dict[str, object] = {
        "ports": {"mlx5_0:1": {"state": "1: DOWN", "before": {"link_downed": 1},
                               "after": {"link_downed": 2}},
                  "mlx5_1:1": {"state": None}},
        "memlock": 65536, "shm_bytes": (1 << 30) - 1}
    assert [(f.tier, f.where, f.message) for f in h.node_findings(raw)] == [
        ("isolate", "mlx5_0:1", "mlx5_0:1: port state '1: DOWN'"),
        ("reset", "mlx5_0:1", "mlx5_0:1: link_downed grew by 1 (1 -> 2)"),
        ("monitor", "memlock", "memlock 65536 bytes, not unlimited (RDMA needs it)"),
        ("monitor", "/dev/shm", "/dev/shm is 1023 MiB (< 1024 MiB)")]
    # unlimited memlock, no RDMA port, /dev/shm of exactly 1 GiB: nothing
    assert h.node_findings({"memlock": -1, "ports": {"p": {}}, "shm_bytes": 1 << 30}) == []
    assert h.node_findings({"memlock": 65536, "ports": {}}) == []
    assert h.node_findings({"memlock": "65536", "ports": {"p": {}}}) == []


def test_dcgmis_words_without_json_are_cut_to_their_last_200_characters() -> None:
    f = h.node_findings({"dcgm": {"available": True, "text": "a" * 50 + "b" * 200}})
    assert f[0].message == "dcgmi diag gave no JSON: " + "b" * 200
