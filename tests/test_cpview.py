"""commands/cp/view: the summary line format (cp-summary 1) and the live progress line."""

from __future__ import annotations

import io

from launcher.commands.cp.view import CopyView, human, summary_line
from launcher.models import CopyResult


def test_summary_line_format() -> None:
    r = CopyResult("node1", sent=12, sent_bytes=3_565_158, skipped=100, deleted=2)
    assert summary_line(r) == "node1: sent 12 (3.4 MiB), skipped 100, deleted 2"
    r.stale, r.errors = 3, ["x: permission denied"]
    assert summary_line(r).endswith(", 3 stale temps removed, 1 error")
    lost = CopyResult("n9", unreachable="timed out connecting after 2 s")
    assert summary_line(lost) == "n9: not reached: timed out connecting after 2 s"


def test_human() -> None:
    assert [human(0), human(1536), human(5 << 30)] == ["0 B", "1.5 KiB", "5.0 GiB"]


def test_plain_output_has_no_control_characters() -> None:
    out, err = io.StringIO(), io.StringIO()
    view = CopyView(2, live=False, out=out, err=err)
    view.add_bytes(10)
    view.node_done(CopyResult("a", sent=1, sent_bytes=10, errors=["f: no space"]))
    view.close()
    assert out.getvalue().startswith("a: sent 1 (10 B), skipped 0, deleted 0, 1 error\ntotal ")
    assert err.getvalue() == "dtrain: a: f: no space\n"


def test_live_line_is_redrawn_and_cleared() -> None:
    out, err = io.StringIO(), io.StringIO()
    view = CopyView(2, live=True, out=out, err=err)
    view.add_bytes(2048)
    assert "0/2 nodes done, 2.0 KiB sent" in err.getvalue()
    view.node_done(CopyResult("a"))
    view.close()
    assert err.getvalue().endswith("\r\x1b[K")
    assert "1/2 nodes done" in err.getvalue()


def test_pull_says_received_and_the_total_comes_last() -> None:
    """Issue 24.7/24.8: --pull received files (it said 'sent'); a total with throughput."""
    out, err = io.StringIO(), io.StringIO()
    view = CopyView(2, live=False, out=out, err=err, verb="received")
    view.node_done(CopyResult("node1", sent=2, sent_bytes=35))
    view.node_done(CopyResult("node2", sent=1, sent_bytes=5))
    view.close()
    lines = out.getvalue().splitlines()
    assert lines[:2] == ["node1: received 2 (35 B), skipped 0, deleted 0",
                         "node2: received 1 (5 B), skipped 0, deleted 0"]
    assert lines[2].startswith("total 2 nodes: received 3 (40 B), skipped 0, deleted 0 in ")
    assert lines[2].endswith("/s") and len(lines) == 3


def test_many_nodes_fold_identical_lines_failures_first() -> None:
    """Issue 24.8: from 16 nodes on, one line per distinct result, failed ones first."""
    out, err = io.StringIO(), io.StringIO()
    names = [f"gpu{k:02d}" for k in range(1, 21)]
    view = CopyView(20, live=False, out=out, err=err, order=names)
    for name in reversed(names):  # finishing in any order
        if name == "gpu07":
            view.node_done(CopyResult(name, unreachable="timed out connecting after 2 s"))
        else:
            view.node_done(CopyResult(name, sent=3, sent_bytes=3072))
    view.close()
    assert out.getvalue().splitlines()[:2] == [
        "gpu07: not reached: timed out connecting after 2 s",
        "gpu[01-06,08-20]: sent 3 (3.0 KiB), skipped 0, deleted 0"]
    last = out.getvalue().splitlines()[2]
    assert last.startswith("total 20 nodes: sent 57 (57.0 KiB)") and "1 node failed" in last
