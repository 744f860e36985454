"""Console formats (plain and colour), filters, batching, EPIPE, and --gather folding."""

from __future__ import annotations

import io
import re

import pytest

from launcher.models import OutputLine
from launcher.output.console import RED, RESET, Console, Gatherer, fold_hosts, should_color


class TTY(io.StringIO):
    def isatty(self) -> bool:
        return True


class CountingStream(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, s: str) -> int:
        self.writes += 1
        return super().write(s)


class BrokenPipe(io.StringIO):
    def write(self, s: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def out(host: str, text: str, rank: int | None = None, stream: str = "out") -> OutputLine:
    return OutputLine(host=host, stream=stream, text=text, rank=rank)


def plain(**kwargs: object) -> tuple[Console, io.StringIO]:
    stream = io.StringIO()
    return Console(stream, color=False, **kwargs), stream  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        pytest.param(out("node1", "hello", 3), "node1 r3: hello", id="rank"),
        pytest.param(out("node1", "oops", 3, "err"), "node1 r3 [err]: oops", id="rank-stderr"),
        pytest.param(out("node1", "agent"), "node1: agent", id="node-level-is-pdsh"),
        pytest.param(out("node1", "x", None, "err"), "node1 [err]: x", id="node-stderr"),
        pytest.param(out("", "starting", None, "dtrain"), "dtrain: starting", id="dtrain"),
        pytest.param(out("n2", "lost", None, "dtrain"), "dtrain: n2: lost", id="dtrain-host"),
    ],
)
def test_plain_format(line: OutputLine, expected: str) -> None:
    console, _ = plain(labels=["node1", "a-much-longer-name"])
    assert console.format_line(line) == expected


def test_plain_with_err_stream_is_exactly_pdsh() -> None:
    stdout, stderr = io.StringIO(), io.StringIO()
    console = Console(stdout, err_stream=stderr, color=False)
    console.write([out("h1", "ok"), out("h1", "bad", stream="err"), out("", "msg", None, "dtrain")])
    assert stdout.getvalue() == "h1: ok\n"
    assert stderr.getvalue() == "h1: bad\ndtrain: msg\n"


def test_colour_format_pads_and_marks_stderr() -> None:
    console = Console(TTY(), color=True, labels=["n1", "node10"], world_size=16)
    rank = console.format_line(out("n1", "hi", 3))
    err = console.format_line(out("n1", "bad", 12, "err"))
    node = console.format_line(out("node10", "agent"))
    own = console.format_line(out("", "hello", None, "dtrain"))
    strip = _strip_ansi
    assert strip(rank) == "n1     r3  │ hi"
    assert strip(err) == "n1     r12 ! bad"
    assert strip(node) == "node10     │ agent"
    assert strip(own) == "dtrain     │ hello"
    assert f"{RED}!{RESET}" in err
    assert rank.startswith("\x1b[36m") and node.startswith("\x1b[33m")  # one colour per host


def test_colour_resets_after_remote_escape_codes() -> None:
    console = Console(TTY(), color=True)
    assert console.format_line(out("h", "\x1b[31mred")).endswith("red" + RESET)


def test_width_grows_with_a_new_longer_host() -> None:
    console = Console(TTY(), color=True)
    console.format_line(out("a", "x"))
    assert _strip_ansi(console.format_line(out("abcd", "x"))) == "abcd │ x"
    assert _strip_ansi(console.format_line(out("a", "x"))) == "a    │ x"


@pytest.mark.parametrize(
    ("env", "tty", "expected"),
    [
        pytest.param({}, True, True, id="tty"),
        pytest.param({"NO_COLOR": "1"}, True, False, id="no-color"),
        pytest.param({"NO_COLOR": ""}, True, True, id="empty-no-color-ignored"),
        pytest.param({"FORCE_COLOR": "1"}, False, True, id="force-color-on-a-pipe"),
        pytest.param({"FORCE_COLOR": "0"}, False, False, id="force-color-0"),
        pytest.param({"FORCE_COLOR": "1", "NO_COLOR": "1"}, True, False, id="no-color-wins"),
        pytest.param({}, False, False, id="pipe"),
    ],
)
def test_should_color(env: dict[str, str], tty: bool, expected: bool) -> None:
    stream = TTY() if tty else io.StringIO()
    assert should_color(stream, env) is expected


def test_no_color_env_gives_plain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    stream = TTY()
    Console(stream).write([out("h", "x", 1)])
    assert stream.getvalue() == "h r1: x\n"


def test_filters_limit_ranks_and_hosts_but_not_dtrain_messages() -> None:
    console, stream = plain(ranks={1}, hosts={"a"})
    console.write(
        [
            out("a", "keep", 1),
            out("a", "other rank", 2),
            out("b", "other host", 1),
            out("a", "node-level"),
            out("", "note", None, "dtrain"),
        ]
    )
    assert stream.getvalue() == "a r1: keep\ndtrain: note\n"


def test_one_write_per_batch() -> None:
    stream = CountingStream()
    console = Console(stream, color=False)
    console.write([out("h", str(i)) for i in range(1000)])
    assert stream.writes == 1
    assert stream.getvalue().count("\n") == 1000


def test_multiline_text_gets_a_tag_per_line() -> None:
    console, _ = plain()
    assert console.format_line(out("", "a\nb", None, "dtrain")) == "dtrain: a\ndtrain: b"


def test_broken_pipe_stops_output_without_raising() -> None:
    console = Console(BrokenPipe(), color=False)
    console.write([out("h", "x")])
    assert console.broken
    console.write([out("h", "y")])  # no second exception
    console.flush()


def test_gather_folds_hosts_with_identical_output() -> None:
    gatherer = Gatherer()
    hosts = [f"198.18.0.{i}" for i in (11, 12, 13, 14)]
    for host in hosts:
        gatherer.add([out(host, "Linux"), out(host, "ok", stream="err")])
    gatherer.add([out("other", "different"), out("", "note", None, "dtrain")])
    assert gatherer.render() == (
        "----------------\n198.18.0.[11-14]\n----------------\nLinux\nok\n"
        "----------------\nother\n----------------\ndifferent\n"
    )


def test_gather_keeps_line_order_per_host() -> None:
    gatherer = Gatherer()
    gatherer.add([out("n1", "a"), out("n2", "a"), out("n1", "b"), out("n2", "c")])
    assert gatherer.groups() == [("n1", ["a", "b"]), ("n2", ["a", "c"])]


def test_fold_hosts() -> None:
    assert fold_hosts(["node1", "node3", "node2"]) == "node[1-3]"
    assert fold_hosts(["weird[name"]) == "weird[name"


def _strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


# --------------------------------------------------------------------------- --timestamps

STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}"


def test_wall_clock_is_local_iso_8601_with_milliseconds() -> None:
    import time

    from launcher.output.console import wall_clock

    t = 1_795_000_000.0456
    assert wall_clock(t) == time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t)) + ".045"
    assert wall_clock(1_795_000_000.9999).endswith(":40.999")  # never rounds into :41
    assert re.fullmatch(STAMP, wall_clock(time.time()))


def test_timestamps_prefix_every_line_with_its_arrival_time() -> None:
    from launcher.output.console import wall_clock

    t = 1_795_000_000.25
    console, stream = plain(timestamps=True)
    console.write([OutputLine("node1", "out", "hello", 3, t=t),
                   OutputLine("node2", "err", "two\nlines", None, t=t + 1),
                   OutputLine("", "dtrain", "note", t=t + 2)])
    assert stream.getvalue().splitlines() == [
        f"{wall_clock(t)} node1 r3: hello", f"{wall_clock(t + 1)} node2 [err]: two",
        f"{wall_clock(t + 1)} node2 [err]: lines", f"{wall_clock(t + 2)} dtrain: note"]
    tty = TTY()
    Console(tty, color=True, timestamps=True).write([OutputLine("node1", "out", "x", t=t)])
    assert tty.getvalue().startswith(f"\x1b[2m{wall_clock(t)}{RESET} ")
    untimed, stream = plain()
    untimed.write([OutputLine("node1", "out", "hello", t=t)])
    assert stream.getvalue() == "node1: hello\n"


def test_timestamps_leave_the_summary_after_the_job_unstamped() -> None:
    """docs/cli.md: dtrain's in-stream messages are stamped, the summary is not (24.7)."""
    from launcher.output.console import wall_clock
    from launcher.output.fold import SUMMARY

    t = 1_795_000_000.25
    console, stream = plain(timestamps=True)
    console.write([OutputLine("", "dtrain", "note", t=t),
                   OutputLine("", "dtrain", "ok: succeeded (exit 0)", None, SUMMARY, t)])
    assert stream.getvalue().splitlines() == [f"{wall_clock(t)} dtrain: note",
                                              "dtrain: ok: succeeded (exit 0)"]
