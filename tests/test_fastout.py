"""exec's byte-level output path."""

from __future__ import annotations

import asyncio
import io
import threading

from launcher.models import Host
from launcher.output import fastout
from launcher.output.fastout import ExecOutput


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


class SlowStream(io.BytesIO):
    """A stdout whose reader is paused until released (`| less`)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def write(self, data):  # type: ignore[override]
        self.release.wait(10)
        return super().write(data)


async def test_a_slow_reader_slows_the_reads_and_loses_nothing(monkeypatch):
    monkeypatch.setattr(fastout, "HIGH_WATER", 100)
    monkeypatch.setattr(fastout, "LOW_WATER", 50)
    out = SlowStream()
    o = ExecOutput(["a"], color=False, out=out, err=io.BytesIO())
    for i in range(50):
        o.chunk(Host("a"), None, "out", b"%d\n" % i)
    waiter = asyncio.ensure_future(o.backpressure())
    await asyncio.sleep(0.2)
    assert not waiter.done()  # the reads wait for the console...
    out.release.set()
    await asyncio.wait_for(waiter, 5)  # ...and resume once it drained
    o.close()
    assert out.getvalue() == b"".join(b"a: %d\n" % i for i in range(50))


def test_timestamps_are_the_arrival_time_of_each_chunk():
    import re
    import time

    o, out, err = _out(timestamps=True)
    before = time.time()
    o.chunk(Host("a"), None, "out", b"one\ntwo\nthr")
    time.sleep(0.05)
    o.chunk(Host("a"), None, "out", b"ee\n")
    o.say("dtrain", "note")
    o.close()
    lines = out.getvalue().decode().splitlines()
    stamp = r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}) "
    parsed = [re.fullmatch(stamp + r"a: (.*)", line) for line in lines]
    assert all(parsed) and [m[2] for m in parsed] == ["one", "two", "three"]
    assert parsed[0][1] == parsed[1][1]  # one chunk, one arrival time
    first = time.mktime(time.strptime(parsed[0][1][:19], "%Y-%m-%dT%H:%M:%S"))
    assert int(before) <= first <= time.time()
    assert parsed[2][1] > parsed[0][1]  # the tail arrived later: its line carries that time
    assert re.fullmatch(stamp + "dtrain: note\n", err.getvalue().decode())
