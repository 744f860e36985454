"""RunArchive layout, atomic meta, flushing, run lookup, and secret redaction."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from launcher.errors import UsageError
from launcher.models import OutputLine
from launcher.output.archive import (
    ARCHIVE_VERSION,
    RunArchive,
    check_run_id,
    latest_run,
    new_run_id,
    read_meta,
    resolve_run,
)
from launcher.text.redact import REDACTED, is_secret_name, redact_env


def line(host: str, text: str, rank: int | None = None, stream: str = "out") -> OutputLine:
    return OutputLine(host=host, stream=stream, text=text, rank=rank, node_rank=0, t=100.5)


def records(run: Path) -> list[dict[str, object]]:
    return [json.loads(raw) for raw in (run / "output.jsonl").read_text().splitlines()]


def test_run_id_sorts_by_time() -> None:
    first, second = new_run_id(1_800_000_000), new_run_id(1_800_000_001)
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{4}", first)
    assert first.startswith("20270115-") and first < second


def test_layout_and_formats(tmp_path: Path) -> None:
    with RunArchive.create(tmp_path, "myrun") as archive:
        archive.write_lines(
            [
                line("n1", "hello", 0),
                line("n1", 'quote " é \x00', 1, "err"),
                line("n1", "agent"),
                line("", "starting", stream="dtrain"),
                line("n1:2222", "port host", 2),
            ]
        )
    run = tmp_path / "myrun"
    assert records(run)[0] == {
        "t": 100.5,
        "host": "n1",
        "node_rank": 0,
        "rank": 0,
        "stream": "out",
        "line": "hello",
    }
    assert [r["line"] for r in records(run)][1] == 'quote " é \x00'
    assert [r["stream"] for r in records(run)] == ["out", "err", "out", "dtrain", "out"]
    assert (run / "hosts" / "n1.log").read_text() == 'r0 hello\nr1 quote " é \x00\nagent\n'
    assert (run / "hosts" / "n1:2222.log").read_text() == "r2 port host\n"
    meta = read_meta(run)
    assert meta["archive_version"] == ARCHIVE_VERSION and meta["run_id"] == "myrun"


def test_missing_time_is_filled_in(tmp_path: Path) -> None:
    with RunArchive.create(tmp_path) as archive:
        archive.write_lines([OutputLine("h", "out", "x")])
    (run,) = tmp_path.iterdir()
    assert abs(float(records(run)[0]["t"]) - time.time()) < 60  # type: ignore[arg-type]


def test_meta_update_merges_and_keeps_version(tmp_path: Path) -> None:
    archive = RunArchive.create(tmp_path, "r")
    archive.write_meta({"command": ["train.py"], "archive_version": 99})
    archive.update_meta(outcome="ok", end=123.0)
    meta = read_meta(tmp_path / "r")
    assert meta["archive_version"] == ARCHIVE_VERSION
    assert meta["command"] == ["train.py"] and meta["outcome"] == "ok"
    archive.close()
    archive.update_meta(note="after close")  # meta stays writable after the output is closed
    assert read_meta(tmp_path / "r")["note"] == "after close"


def test_meta_is_replaced_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = RunArchive.create(tmp_path, "r")
    archive.write_meta({"v": 1})

    def crash(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        archive.write_meta({"v": 2})
    assert read_meta(tmp_path / "r")["v"] == 1  # the old file, whole
    assert [p.name for p in (tmp_path / "r").iterdir() if p.name.endswith(".tmp")] == []
    archive.close()


def test_output_is_flushed_within_a_second(tmp_path: Path) -> None:
    now = [0.0]
    archive = RunArchive.create(tmp_path, "r", clock=lambda: now[0])
    archive.write_lines([line("h", "first")])
    archive.flush()
    archive.write_lines([line("h", "buffered")])
    assert len(records(tmp_path / "r")) == 1  # still in the buffer
    archive.flush_if_due(interval=0.0)
    assert len(records(tmp_path / "r")) == 2
    archive.write_lines([line("h", "later")])
    now[0] += 1.0
    archive.write_lines([line("h", "next")])
    assert len(records(tmp_path / "r")) == 4
    archive.close()
    with pytest.raises(RuntimeError):
        archive.write_lines([line("h", "after close")])


@pytest.mark.parametrize("bad", ["", ".", "..", "../x", "a/b", "-x", ".hidden", "a b", "x" * 200])
def test_unsafe_run_ids_are_refused(bad: str) -> None:
    with pytest.raises(UsageError):
        check_run_id(bad)


def test_run_id_is_never_reused(tmp_path: Path) -> None:
    RunArchive.create(tmp_path, "same").close()
    with pytest.raises(UsageError, match="already exists"):
        RunArchive.create(tmp_path, "same")


def test_latest_and_resolve(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no runs"):
        resolve_run(tmp_path, None)
    assert latest_run(tmp_path / "missing") is None
    old = RunArchive.create(tmp_path, "20260101-000000-aaaa")
    old.update_meta(created_ts=1.0)
    new = RunArchive.create(tmp_path, "zz-user-named")
    new.update_meta(created_ts=2.0)
    old.close()
    new.close()
    assert latest_run(tmp_path) == new.path
    assert resolve_run(tmp_path, None) == new.path
    assert resolve_run(tmp_path, "20260101-000000-aaaa") == old.path
    assert resolve_run(tmp_path, "2026") == old.path  # a unique prefix
    assert resolve_run(tmp_path, str(old.path)) == old.path
    with pytest.raises(UsageError, match="no run 'nope'") as info:
        resolve_run(tmp_path, "nope")
    assert info.value.hint is not None and "zz-user-named" in info.value.hint
    RunArchive.create(tmp_path, "2026b").close()
    with pytest.raises(UsageError, match="ambiguous"):
        resolve_run(tmp_path, "2026")


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("HF_TOKEN", True),
        ("WANDB_API_KEY", True),
        ("APIKEY", True),
        ("KEY", True),
        ("SSH_KEY", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("DB_PASSWORD", True),
        ("DB_PASS", True),
        ("MYSQL_PASSWD", True),
        ("GIT_CREDENTIALS", True),
        ("AUTH", True),
        ("OAUTH", True),
        ("hf_token", True),
        ("apiKey", True),
        ("KEYBOARD", False),
        ("AUTHOR", False),
        ("PASSTHROUGH", False),
        ("NCCL_IB_HCA", False),
        ("PATH", False),
        ("PWD", False),
    ],
)
def test_secret_names(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret


def test_redact_env_keeps_order_and_hides_values() -> None:
    env = {"MASTER_ADDR": "10.0.0.1", "HF_TOKEN": "hf_abc", "NCCL_DEBUG": "INFO"}
    assert list(redact_env(env).items()) == [
        ("MASTER_ADDR", "10.0.0.1"),
        ("HF_TOKEN", REDACTED),
        ("NCCL_DEBUG", "INFO"),
    ]
    assert redact_env([("X_SECRET", "s")]) == {"X_SECRET": REDACTED}
