"""The goodput ledger (decide/outcome/goodput.py, docs/goodput.md) on hand-made records: every cause
of a two-attempt run computed by hand; "not measured" without step numbers or progress."""

from __future__ import annotations

from typing import Any

import pytest

from launcher.decide.outcome.goodput import CAUSES, ledger_of, percent


def rec(t: float, line: str, attempt: int = 1, rank: int = 0, host: str = "n1") -> dict[str, Any]:
    return {"t": t, "host": host, "node_rank": 0, "rank": rank, "stream": "out",
            "attempt": attempt, "line": line}


def two_attempts(a1_lines: list[dict[str, Any]], a2_lines: list[dict[str, Any]],
                 hangs: list[dict[str, Any]] | None = None) -> Any:
    meta = {"start": 1000.0, "end": 1100.0, "state": "finished", "exit_code": 0,
            "hangs": hangs or [],
            "attempts": [{"n": 1, "start": 999.0, "end": 1040.0, "detected": 1035.0,
                          "relaunched": 1042.0},
                         {"n": 2, "start": 1042.0, "end": 1100.0, "detected": None,
                          "relaunched": None}]}
    return ledger_of(meta, [*a1_lines, *a2_lines])


def ckpt_run() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    a1 = [rec(1001.0, "world size 2 attempt 1"), rec(1005.0, "starting at step 0")]
    a1 += [rec(1006.0 + s, f"step {s}") for s in range(10)]
    a1 += [rec(1015.5, "checkpoint step 10")]
    a1 += [rec(1006.0 + s, f"step {s}") for s in range(10, 20)]
    a1 += [rec(1006.0 + s, f"step {s}", rank=1, host="n2") for s in range(20)]
    a2 = [rec(1048.0, "world size 2 attempt 2", 2), rec(1050.0, "resumed at step 10", 2)]
    a2 += [rec(1041.0 + s, f"step {s}", 2) for s in range(10, 30)]
    a2 += [rec(1071.0, "done", 2)]
    return a1, a2


def test_every_cause_of_a_restarted_run_by_hand() -> None:
    led = two_attempts(*ckpt_run())
    a1, a2 = led.attempts
    assert a1.seconds == {"startup": 6.0, "productive": 10.0, "lost": 9.5,
                          "checkpoint_save": 0.5, "checkpoint_restore": 0.0, "hang": 0.0,
                          "detection": 10.0, "restart": 5.0, "backoff": 2.0, "winddown": 0.0}
    assert a1.wall == 43.0 and a1.lost_steps == 10 and a1.highest == 19
    assert a2.seconds == {**dict.fromkeys(CAUSES, 0.0), "startup": 6.0,
                          "checkpoint_restore": 2.0, "productive": 20.0, "winddown": 30.0}
    assert a2.resumed_at == 10 and a2.wall == 58.0
    assert led.wall == 101.0 and led.totals["productive"] == 30.0
    assert led.goodput == pytest.approx(30 / 101) and percent(led.goodput) == "30%"
    assert sum(v or 0.0 for v in led.totals.values()) == pytest.approx(led.wall)
    doc = led.json()
    assert doc["not_measured"] == [] and doc["attempts"][0]["lost_steps"] == 10
    # step time: rank 0 steps once a second; rank 1 too (n2 is its node)
    assert doc["step_time"]["nodes"] == {"n1": 1.0, "n2": 1.0}


def test_a_hang_is_its_own_cause() -> None:
    a1, a2 = ckpt_run()
    led = two_attempts(a1, a2, hangs=[{"t": 1031.0, "attempt": 1, "stalled_s": 6.0}])
    s = led.attempts[0].seconds
    assert (s["hang"], s["detection"], s["restart"]) == (6.0, 0.0, 9.0)


def test_without_step_numbers_lost_time_is_not_measured() -> None:
    a1 = [rec(1005.0 + i, f"loss {1 - i / 100:.3f}") for i in range(20)]
    a2 = [rec(1050.0 + i, f"loss {1 - i / 100:.3f}", 2) for i in range(20)]
    led = two_attempts(a1, a2)
    assert led.attempts[0].seconds["lost"] is None and led.totals["lost"] is None
    assert led.goodput is None and led.json()["not_measured"] == ["lost"]
    assert "not measured" in led.notes[0]


def test_without_progress_lines_productive_time_is_not_measured() -> None:
    meta = {"start": 0.0, "end": 10.0, "state": "finished", "exit_code": 0}
    led = ledger_of(meta, [rec(1.0, "hello")])
    assert led.goodput is None and led.totals["productive"] is None
    assert led.totals["startup"] == 10.0 and "--progress" in led.notes[0]


def test_a_plain_run_and_a_running_one() -> None:
    lines = [rec(2.0 + s, f"step {s}") for s in range(8)]
    done = ledger_of({"start": 0.0, "end": 12.0, "state": "finished"}, lines)
    assert done.totals["startup"] == 2.0 and done.totals["productive"] == 7.0
    assert done.totals["winddown"] == 3.0 and done.goodput == pytest.approx(7 / 12)
    live = ledger_of({"start": 0.0, "state": "running"}, lines, now=11.0)
    assert live.running and live.totals["productive"] == 9.0 and live.wall == 11.0


def test_a_checkpoint_pattern_of_ones_own() -> None:
    lines = [rec(1.0 + s, f"step {s}") for s in range(5)]
    lines.insert(3, rec(3.9, "EXPORT weights"))
    lines = sorted(lines, key=lambda r: r["t"])
    led = ledger_of({"start": 0.0, "end": 6.0, "state": "finished"}, lines,
                    checkpoint=r"EXPORT")
    assert led.totals["checkpoint_save"] == pytest.approx(0.9)


def test_the_report_draws_a_band_per_cause_the_table_and_compare(tmp_path: Any) -> None:
    import json

    from launcher.commands.report.load import load
    from launcher.output.runreport import page
    from tests.report_archives import write_archive

    a1, a2 = ckpt_run()
    meta = {"start": 1000.0, "end": 1100.0, "state": "finished", "exit_code": 0,
            "attempts": [{"n": 1, "start": 999.0, "end": 1040.0, "detected": 1035.0,
                          "relaunched": 1042.0},
                         {"n": 2, "start": 1042.0, "end": 1100.0, "detected": None,
                          "relaunched": None}]}
    # an archive without a recorded ledger (an older or a live run): the report makes it
    run = write_archive(tmp_path / "a", meta, [*a1, *a2])
    s = load(run, []).summary
    assert s.goodput is not None and s.goodput["goodput"] == round(30 / 101, 4)
    html = page.render([s])
    causes = {c for c in CAUSES if (s.goodput["seconds"][c] or 0) > 0}
    for cause in causes:
        assert f'class="gp-band" data-cause="{cause}"' in html, cause
    assert 'class="gp-band" data-cause="hang"' not in html
    assert "Goodput: 29.7% of" in html and "<th>attempt 2</th>" in html
    # recorded: drawn as it is; --compare: both ledgers side by side
    other = write_archive(tmp_path / "b", {**meta, "goodput": {**s.goodput, "goodput": 0.5}},
                          [*a1, *a2])
    pair = page.render([s, load(other, []).summary])
    assert "Goodput, A and B" in pair and "<td>29.7%</td><td>50.0%</td>" in pair
    assert json.loads(json.dumps(s.goodput))["segments"][0][2] == "startup"


def test_the_goodput_bands_in_headless_chromium(tmp_path: Any) -> None:
    from launcher.commands.report.load import load
    from launcher.output.runreport import page
    from tests import browser
    from tests.report_archives import write_archive

    if browser.chromium() is None:
        from tests.util import cannot_run

        cannot_run("chromium is not installed (scripts/test installs Debian's chromium)")
    a1, a2 = ckpt_run()
    meta = {"start": 1000.0, "end": 1100.0, "state": "finished", "exit_code": 0,
            "attempts": [{"n": 1, "start": 999.0, "end": 1040.0, "detected": 1035.0,
                          "relaunched": 1042.0},
                         {"n": 2, "start": 1042.0, "end": 1100.0, "detected": None,
                          "relaunched": None}]}
    s = load(write_archive(tmp_path / "a", meta, [*a1, *a2]), []).summary
    path = tmp_path / "report.html"
    path.write_text(page.render([s]))
    res = browser.open_page(path, evaluate={"bands": (
        "JSON.stringify([...document.querySelectorAll('#goodput .gp-band')].map(r => "
        "[r.dataset.cause, r.getBoundingClientRect().width]))"), "rows": (
        "document.querySelectorAll('#goodput table.ledger tbody tr').length")})
    assert res.ready and not res.exceptions, res.exceptions
    assert not [x for x in res.console if x["type"] == "error"], res.console
    assert not [x for x in res.log if x["level"] == "error"], res.log
    import json

    bands = json.loads(res.values["bands"])
    assert {c for c, _ in bands} == {"startup", "productive", "lost", "checkpoint_save",
                                     "checkpoint_restore", "detection", "restart", "backoff",
                                     "winddown"}
    assert all(w > 0 for _, w in bands)
    widths = {c: sum(w for k, w in bands if k == c) for c, _ in bands}
    assert widths["winddown"] > widths["backoff"]  # 30 s against 2 s, on one axis
    assert res.values["rows"] == len(CAUSES) + 1
    assert "seconds per step, per node (slowest first): n1 1 s, n2 1 s" in path.read_text()


def test_a_bad_checkpoint_pattern_exits_2_before_anything_connects() -> None:
    import subprocess
    import sys

    from tests.util import REPO

    res = subprocess.run([sys.executable, "-m", "launcher", "run", "-H", "198.18.0.99",
                          "--checkpoint", "(", "train.py"], cwd=REPO, text=True,
                         capture_output=True, timeout=60)
    assert res.returncode == 2, res.stderr
    assert "--checkpoint '('" in res.stderr


def test_a_stepless_line_at_the_same_time_as_a_numbered_one_does_not_break_the_ledger():
    # examples/train.py's last lines: `step 4 ...` and `done: 5 steps ...` in one clock tick
    # (sorting the (t, step) points compared None with an int: the run ended in a traceback)
    lines = [rec(1.0, "step 0 loss 2.0"), rec(2.0, "step 1 loss 1.5"),
             rec(3.0, "step 2 loss 1.0"), rec(3.0, "done: 3 steps, final loss 1.0")]
    led = ledger_of({"start": 0.0, "end": 4.0, "state": "finished"}, lines)
    assert led is not None
