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
    assert out.getvalue() == "a: sent 1 (10 B), skipped 0, deleted 0, 1 error\n"
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
