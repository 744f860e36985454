"""exec's byte-level output path."""

from __future__ import annotations

import io

from launcher import fastout
from launcher.fastout import ExecOutput
from launcher.models import Host


def _out(**kw):
    out, err = io.BytesIO(), io.BytesIO()
    return ExecOutput(["a", "bb"], color=False, out=out, err=err, **kw), out, err


def test_lines_are_tagged_whole_across_chunks():
    o, out, err = _out()
    a, b = Host("a"), Host("bb")
    for piece in (b"one\ntw", b"o\n", b"thr"):
        o.chunk(a, None, "out", piece)
    o.chunk(b, None, "out", b"\xff\xfe bytes\n")
    o.chunk(a, None, "err", b"oops\n")
    o.flush("a")
    o.close()
    assert out.getvalue() == b"a: one\na: two\nbb: \xff\xfe bytes\na: thr\n"
    assert err.getvalue() == b"a: oops\n"


def test_long_line_is_not_torn():
    o, out, _ = _out()
    line = b"x" * 3_000_000
    for i in range(0, len(line), 65536):
        o.chunk(Host("a"), None, "out", line[i:i + 65536])
    o.chunk(Host("a"), None, "out", b"\n")
    o.close()
    assert out.getvalue() == b"a: " + line + b"\n"


def test_overflow_drops_lines_with_a_marker(monkeypatch):
    monkeypatch.setattr(fastout, "MAX_QUEUED", 10)
    o, out, err = _out()
    o._cond.acquire()  # hold the writer so the queue fills up
    try:
        o._queue.append((out, b""))
        o._queued = 10
    finally:
        o._cond.release()
    o.chunk(Host("a"), None, "out", b"lost\n")
    assert o.skipped == 1
    o._queued = 0
    o.chunk(Host("a"), None, "out", b"kept\n")
    o.close()
    assert b"1 lines skipped" in err.getvalue() and out.getvalue().endswith(b"a: kept\n")
