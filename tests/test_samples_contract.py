"""samples.jsonl and meta.json `stragglers` as the run report reads them: the fields the
node sampler writes (docs/output-and-archive.md) give every utilisation series and the
straggler's reason (a contract between #29's writer and #30's reader)."""

from __future__ import annotations

from launcher.decide.outcome.stragglers import StragglerDetector, StragglerSettings
from launcher.output.runreport.summary import _stragglers
from launcher.output.runreport.usage import sample_values
from tests.reports import validate_sample_record

RECORD = {"t": 1000.0, "host": "node4", "node_rank": 3, "dt": 10.0, "cpu_pct": 40.0,
          "ncpu": 8, "load": [1.0, 1.0, 1.0], "mem_used": 4 << 30, "mem_total": 16 << 30,
          "net": {"iface": "ens1f0", "rx_bps": 3000, "tx_bps": 1000},
          "gpus": [{"index": 0, "name": "H100", "util_pct": 37, "mem_used_mib": 1024,
                    "mem_total_mib": 4096, "temp_c": 41, "power_w": 123.45,
                    "power_limit_w": 700},
                   {"index": 1, "name": "H100", "util_pct": 81, "mem_used_mib": 3072,
                    "mem_total_mib": 4096, "temp_c": 45, "power_w": 456.7,
                    "power_limit_w": 700}],
          "gpu_source": "nvidia-smi", "gpu_error": None, "gpu_age": 0.5,
          "ranks": {"3": {"cpu": 12.5, "pids": 2, "state": "R"}}, "self_cpu_ms": 0.8}


def test_a_sample_record_gives_every_utilisation_series() -> None:
    validate_sample_record(RECORD)
    assert sample_values(RECORD) == {"gpu_util": 59.0, "gpu_mem": 50.0, "cpu": 40.0,
                                     "mem": 25.0, "nic": 4000.0}


def test_a_straggler_flag_carries_its_reason_to_the_report() -> None:
    det = StragglerDetector(StragglerSettings(window=4, hold=2))
    for t in range(12):
        det.add("node1", float(t), {0: t * 0.1})
        det.add("node3", float(t), {2: t * 0.9})
        det.evaluate(float(t))
    meta = {"stragglers": det.as_json()}
    why = _stragglers(meta)
    assert list(why) == ["node3"]
    assert why["node3"].startswith("straggler: node3 (rank 2) is rarely waiting")
