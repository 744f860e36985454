"""Issue 50 item 4: a lemon record whose time dtrain could not have written (negative, before
2000, far in the future, NaN, inf, 1e300) is a record of unknown time: `dtrain nodes`,
doctor's note and the restart loop's lines say "time unknown", never a 300-digit "ago"."""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path

import pytest

from launcher.decide.outcome import lemons as lm
from launcher.job.lemons import LemonStore

BAD_TIMES = [-1e300, -1.0, 0.0, 5.0, 946684799.0, 1e300, 1e12, math.nan, math.inf, -math.inf]
LONG_NUMBER = re.compile(r"\d{7,}")  # no age or date dtrain prints has 7 digits in a row


def write(store: LemonStore, records: list[dict[str, object]]) -> None:
    store.directory.mkdir(parents=True, exist_ok=True)
    # json.dumps writes NaN and Infinity; Python's reader (the store's) takes them back
    store.path.write_text(json.dumps({"lemons_version": 1, "lemons": records}))


@pytest.mark.parametrize("t", BAD_TIMES + ["far future"])
def test_a_time_dtrain_could_not_have_written_is_unknown(t: float | str) -> None:
    now = time.time()
    t = now + 30 * 86400 if t == "far future" else t
    assert isinstance(t, float)
    assert not lm.known_time(t, now)
    lemon = lm.Lemon("n1", "lost", "r1", t, now + 600)
    for line in (lm.skip_line(lemon, now), lm.kept_line(lemon, now)):
        assert "time unknown" in line and not LONG_NUMBER.search(line), line


def test_a_plausible_time_is_known_and_said_as_an_age() -> None:
    now = time.time()
    assert lm.known_time(now - 3 * 3600, now) and lm.known_time(now + 60, now)
    assert lm.since(now - 3 * 3600, now) == "3 h ago"
    assert lm.since(-1e300, now) == "time unknown"


def test_ago_never_prints_a_huge_number() -> None:
    for s in (1e300, math.inf, math.nan, -math.inf, 1e20):
        assert not LONG_NUMBER.search(lm.ago(s)), lm.ago(s)
    assert lm.ago(40) == "40 s" and lm.ago(600) == "10 min" and lm.ago(3 * 3600) == "3 h"


def test_dtrain_nodes_lists_a_corrupt_time_as_unknown(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from launcher.commands.nodes import fenced_notes, list_nodes

    store = LemonStore(tmp_path / "s")
    now = time.time()
    records: list[dict[str, object]] = [
        {"host": f"bad{i}", "why": "lost", "run_id": "r", "t": t, "until": now + 600}
        for i, t in enumerate(BAD_TIMES)]
    records.append({"host": "good", "why": "lost", "run_id": "r", "t": now - 7200,
                    "until": now + 600})
    write(store, records)
    assert list_nodes(store=store) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines()[1:-1]}
    assert set(rows) == {f"bad{i}" for i in range(len(BAD_TIMES))} | {"good"}, out
    assert not LONG_NUMBER.search(out), out
    assert all("time unknown" in rows[f"bad{i}"] for i in range(len(BAD_TIMES))), out
    assert "(2 h ago)" in rows["good"] and "time unknown" not in rows["good"]
    notes = fenced_notes([f"bad{i}" for i in range(len(BAD_TIMES))], store)
    assert notes and all("time unknown" in n and not LONG_NUMBER.search(n) for n in notes)


@pytest.mark.parametrize("until", [math.inf, math.nan, 32503680000.0])  # the year 3000
def test_a_fence_never_lasts_forever(until: float) -> None:
    """An ``until`` no dtrain wrote (by hand, a broken clock) fences at most a lifetime."""
    now = time.time()
    lemon = lm.Lemon("n1", "lost", "r1", now - 3600, until)
    assert lm.current([lemon], now) == ({} if math.isnan(until) else {"n1": lemon})
    assert lm.ends(lemon, now) <= now - 3600 + lm.MAX_LIFETIME_S
    later = now - 3600 + lm.MAX_LIFETIME_S + 1
    assert lm.current([lemon], later) == {}
    kept, dropped = lm.expire([lemon], later)
    assert (kept, dropped) == ([], [lemon])
    unknown = lm.Lemon("n2", "lost", "r1", math.nan, until)
    assert lm.current([unknown], now) == {}
