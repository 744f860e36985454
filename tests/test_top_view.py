"""`dtrain top`'s views, pure: rows from documents, fold, sort, filter, the keys, the schema."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from launcher.commands.top.model import TopState
from launcher.commands.top.screen import KeyState, renderable
from launcher.commands.top.view import ViewOptions, fold_rows, node_row, plain, rows
from tests.reports import validate_sample_record, validate_top

GPU = {"index": 0, "name": "H100", "util_pct": 37, "mem_used_mib": 1024,
       "mem_total_mib": 81559, "temp_c": 41, "power_w": 123.45, "power_limit_w": 700}


def sample(cpu: float = 12.0, gpus: list[dict[str, Any]] | None = None, rx: int = 1500,
           **extra: Any) -> dict[str, Any]:
    return {"type": "sample", "t": 1000.0, "dt": 1.0, "cpu_pct": cpu, "ncpu": 8,
            "load": [1.25, 1.0, 0.5], "mem_used": 3 << 30, "mem_total": 16 << 30,
            "net": {"iface": "ens1f0", "rx_bps": rx, "tx_bps": 2 << 20},
            "gpus": gpus or [], "gpu_source": "nvidia-smi" if gpus else None,
            "gpu_error": None, "self_cpu_ms": 0.4, **extra}


def state_with(samples: dict[str, dict[str, Any] | None]) -> TopState:
    st = TopState(list(samples), 1.0)
    for host, msg in samples.items():
        if msg is None:
            st.on_state(host, "unreachable", "Connection refused")
        else:
            st.on_sample(host, msg)
    return st


def test_a_node_row_shows_each_gpu_and_the_totals() -> None:
    g1 = dict(GPU, index=1, util_pct=81, mem_used_mib=40960, temp_c=45, power_w=456.7)
    doc = state_with({"gpu1": sample(gpus=[GPU, g1]), "cpu1": sample()}).document()
    validate_top(doc)
    r = node_row(doc["nodes"][0])
    assert r.cells["util"] == "37 81" and r.cells["gpus"] == "2"
    assert r.cells["gmem"] == "41.0/159.3G" and r.cells["temp"] == "45"
    assert r.cells["power"] == "580/1400" and r.cells["cpu"] == "12"
    assert r.cells["mem"] == "3.0G/16G" and r.cells["net"] == "1.5K/2.0M"
    cpu_only = node_row(doc["nodes"][1])
    assert cpu_only.cells["gpus"] == cpu_only.cells["util"] == cpu_only.cells["gmem"] == "-"


def test_unreachable_and_lost_nodes_are_rows_too() -> None:
    st = state_with({"a": sample(), "b": None})
    st.on_state("a", "lost", "no sample for 6 s")
    doc = st.document()
    validate_top(doc)
    text = plain(doc)
    assert "a     lost" in text and "no sample for 6 s" in text
    assert "b     unreachable" in text and "Connection refused" in text
    assert "2 nodes: 1 lost, 1 unreachable" in text


def test_fold_sort_and_filter() -> None:
    idle = [dict(GPU, util_pct=0)]
    samples = {f"gpu{k:02d}": sample(cpu=1.0 + k % 3, gpus=idle, rx=1000 + k)
               for k in range(1, 61)}
    samples["gpu61"] = sample(cpu=90.0, gpus=[dict(GPU, util_pct=99)])
    doc = state_with(samples).document()
    folded = rows(doc, ViewOptions(fold=True))
    assert [r.cells["node"] for r in folded] == ["gpu[01-60] (60)", "gpu61"]
    assert folded[0].cells["note"] == "idle"
    assert "gpu[01-60] (60)" in plain(doc, ViewOptions(fold=True))
    by_cpu = rows(doc, ViewOptions(sort="cpu"))
    assert by_cpu[0].hosts == ["gpu61"]
    assert rows(doc, ViewOptions(sort="cpu", reverse=True))[-1].hosts == ["gpu61"]
    assert [r.hosts[0] for r in rows(doc, ViewOptions(filter="gpu[59-61]"))] == \
        ["gpu59", "gpu60", "gpu61"]
    assert [r.hosts[0] for r in rows(doc, ViewOptions(filter="gpu6*"))] == \
        ["gpu60", "gpu61"]
    assert len(rows(doc, ViewOptions(filter="gpu0"))) == 9  # a substring: gpu01..gpu09


def test_rows_that_differ_are_never_folded() -> None:
    a = node_row({"host": "a", "state": "ok", "sample": sample(cpu=10)}, coarse=True)
    b = node_row({"host": "b", "state": "ok", "sample": sample(cpu=90)}, coarse=True)
    assert len(fold_rows([a, b])) == 2


def test_keys() -> None:
    k = KeyState(ViewOptions())
    k.feed(b"s")
    assert k.opts.sort == "state"
    k.feed(b"S")
    assert k.opts.sort == "node"
    k.feed(b"rf")
    assert k.opts.reverse and k.opts.fold
    k.feed(b"/gpu[1-4]\r")
    assert k.opts.filter == "gpu[1-4]" and k.editing is None
    k.feed(b"/xy\x7f\x7f\x1b")
    assert k.opts.filter == "" and k.editing is None
    k.feed(b"jj\x1b[B\x1b[6~k")
    assert k.offset == 12
    assert not k.quit
    k.feed(b"q")
    assert k.quit


def test_the_screen_fits_the_terminal() -> None:
    doc = state_with({f"n{k}": sample() for k in range(100)}).document()
    keys = KeyState(ViewOptions())
    group = renderable(doc, keys, height=30)
    table = group.renderables[1]
    # header line, table header, rows, footer: within the 30 lines, nearly all of them used
    assert 1 + 1 + table.row_count + 1 <= 30 and table.row_count >= 30 - 6
    keys.feed(b"\x1b[6~" * 20)
    renderable(doc, keys, height=30)
    assert keys.offset == 100 - table.row_count  # scrolling stops at the last row


def test_the_schema_rejects_what_it_should() -> None:
    doc = state_with({"a": sample()}).document()
    validate_top(doc)
    doc["nodes"][0]["state"] = "sleepy"
    with pytest.raises(jsonschema.ValidationError):
        validate_top(doc)
    rec = {"host": "a", **{k: v for k, v in sample().items() if k != "type"}}
    validate_sample_record(rec)
    with pytest.raises(jsonschema.ValidationError):
        validate_sample_record({k: v for k, v in rec.items() if k != "host"})
