"""Remote output on a terminal: colours pass, every other control sequence is neutralised."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from launcher.models import Host, OutputLine
from launcher.output.archive import RunArchive
from launcher.output.console import Console
from launcher.output.fastout import ExecOutput
from launcher.output.pipeline import OutputPipeline
from launcher.text import termsafe
from launcher.text.termsafe import clean_bytes, clean_text, inert, needs_cleaning
from tests.util import cannot_run

OSC52 = b"\x1b]52;c;cm0gLXJmIH4K\x07"  # "write `rm -rf ~` to the clipboard"


@pytest.mark.parametrize(("raw", "shown"), [
    pytest.param(b"plain text", b"plain text", id="plain"),
    pytest.param(b"\xff\xfe bytes\tand tab", b"\xff\xfe bytes\tand tab", id="binary-and-tab"),
    pytest.param(b"\xc2\xb0C \xc3\xa9t\xc3\xa9", b"\xc2\xb0C \xc3\xa9t\xc3\xa9", id="utf8"),
    pytest.param(b"\x1b[1;31mred\x1b[0m", b"\x1b[1;31mred\x1b[0m\x1b[0m", id="sgr-kept"),
    pytest.param(OSC52 + b"hi", b"^[]52;c;cm0gLXJmIH4K^Ghi", id="osc52-clipboard"),
    pytest.param(b"\x1b]0;owned\x1b\\title", b"^[]0;owned^[\\title", id="osc-title"),
    pytest.param(b"\x1b[1A\x1b[2Knode2: fake", b"^[[1A^[[2Knode2: fake", id="cursor-up"),
    pytest.param(b"x\x08\x08\x08node2", b"x^H^H^Hnode2", id="backspace"),
    pytest.param(b"10%\r50%\r100%", b"100%", id="cr-folds"),
    pytest.param(b"\rnode2: fake", b"node2: fake", id="cr-at-start"),
    pytest.param(b"crlf\r", b"crlf", id="crlf"),
    pytest.param(b"\xc2\x9b2J", b"M-^[2J", id="c1-csi"),
    pytest.param(b"bell\x07 del\x7f nul\x00 so\x0e", b"bell^G del^? nul^@ so^N", id="c0"),
    pytest.param(b"a\x1b[31m\nb", b"a\x1b[31m\x1b[0m\nb\x1b[0m", id="reset-per-line"),
])
def test_clean_bytes(raw: bytes, shown: bytes) -> None:
    assert clean_bytes(raw) == shown
    assert clean_text(raw.decode("utf-8", "surrogateescape")).encode(
        "utf-8", "surrogateescape") == shown


def test_needs_cleaning_only_with_control_bytes() -> None:
    assert not needs_cleaning(b"hello\tworld\nline two\n")
    for byte in [*range(0x00, 0x09), *range(0x0B, 0x20), 0x7F]:
        assert needs_cleaning(b"a" + bytes([byte]) + b"b"), byte
    assert needs_cleaning(b"\xc2\x9b")


CONTROLS = [*range(0x20), 0x7F, *range(0x80, 0xA0)]


def test_the_notation_is_cat_v_s_for_every_control() -> None:
    if shutil.which("cat") is None:
        cannot_run("no cat (coreutils) here")
    # the oracle: coreutils' own `cat -vT` (tab as ^I); newline it never shows, ^J by the rule
    for code in CONTROLS:
        shown = "^J" if code == 0x0A else subprocess.run(
            ["cat", "-vT"], input=bytes([code]), capture_output=True, check=True).stdout.decode()
        assert termsafe._caret(code) == shown, hex(code)
        # the tables the filters use hold the same (a C1 control is two bytes in UTF-8)
        assert inert(chr(code)) == shown


@pytest.mark.parametrize(("raw", "shown"), [
    pytest.param(b"x\rab  \r", b"ab  ", id="cr-fold-keeps-trailing-spaces"),
    pytest.param(b"x\rabX\r", b"abX", id="cr-fold-strips-only-cr"),
    pytest.param(b"a\rb\nc\rd\ne", b"b\nd\ne", id="cr-fold-per-line"),
    pytest.param(b"\x1b[mreset", b"\x1b[mreset\x1b[0m", id="bare-sgr-is-a-colour"),
    pytest.param(b"\x1b[38:5:196mx", b"\x1b[38:5:196mx\x1b[0m", id="colon-sgr"),
    pytest.param(b"\x1b[31;1Hx", b"^[[31;1Hx", id="cursor-position-not-sgr"),
    pytest.param(b"\x1bPq#0;2;0;0;0\x1b\\", b"^[Pq#0;2;0;0;0^[\\", id="dcs-sixel"),
    pytest.param(b"\x1b[6n", b"^[[6n", id="device-status-report"),
    pytest.param(b"\x1b(0lqk", b"^[(0lqk", id="charset-switch"),
    pytest.param(b"\xc2\x9d8;;http://x\xc2\x9c", b"M-^]8;;http://xM-^\\", id="c1-osc"),
])
def test_escape_sequences_from_a_node_are_inert(raw: bytes, shown: bytes) -> None:
    assert clean_bytes(raw) == shown
    assert clean_text(raw.decode("utf-8", "surrogateescape")).encode(
        "utf-8", "surrogateescape") == shown


def test_inert_shows_every_control_even_a_colour_and_keeps_only_what_it_is_told() -> None:
    assert inert("plain ok") == "plain ok"
    assert inert("a\x1b[31mb\tc\n\x9b") == "a^[[31mb^Ic^JM-^["
    assert inert("a\x1b[31mb\tc\n\x9b", keep="\n\t") == "a^[[31mb\tc\nM-^["
    assert inert("node2:\rnode1: ok\x07", keep="\n") == "node2:^Mnode1: ok^G"


def _exec_out(**kw: object) -> tuple[ExecOutput, io.BytesIO, io.BytesIO]:
    out, err = io.BytesIO(), io.BytesIO()
    return ExecOutput(["n1", "n2"], color=False, out=out, err=err, **kw), out, err  # type: ignore[arg-type]


@pytest.mark.parametrize("stream", ["out", "err"])
def test_exec_on_a_terminal_neutralises(stream: str) -> None:
    o, out, err = _exec_out(sanitize=True)
    o.chunk(Host("n1"), None, stream, b"ok\n\x1b[1A\rn2: fake\n" + OSC52 + b"\n\x1b[32mgreen")
    o.close()
    got = (out if stream == "out" else err).getvalue()
    assert got == (b"n1: ok\nn1: n2: fake\nn1: ^[]52;c;cm0gLXJmIH4K^G\n"
                   b"n1: \x1b[32mgreen\x1b[0m\n")


@pytest.mark.parametrize("sanitize", [False, None], ids=["raw", "pipe"])
def test_exec_raw_or_pipe_passes_bytes(sanitize: bool | None) -> None:
    o, out, _ = _exec_out(sanitize=sanitize)
    o.chunk(Host("n1"), None, "out", b"\x1b[1A\rn2: fake\n" + OSC52 + b"\n")
    o.close()
    assert out.getvalue() == b"n1: \x1b[1A\rn2: fake\nn1: " + OSC52 + b"\n"


def test_console_on_a_terminal_neutralises_and_raw_does_not() -> None:
    line = OutputLine("n1", "out", "\x1b]52;c;eA==\x07\x1b[2Jx\x1b[1my", 0)
    safe = Console(io.StringIO(), color=False, sanitize=True)
    assert safe.format_line(line) == "n1 r0: ^[]52;c;eA==^G^[[2Jx\x1b[1my\x1b[0m"
    raw = Console(io.StringIO(), color=False, sanitize=False)
    assert raw.format_line(line) == "n1 r0: " + line.text


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_console_default_follows_the_terminal() -> None:
    assert Console(Tty()).sanitize and not Console(io.StringIO()).sanitize
    assert Console(io.StringIO(), err_stream=Tty()).sanitize  # type: ignore[arg-type]


async def test_archive_keeps_the_original_bytes(tmp_path: Path) -> None:
    stream = Tty()
    archive = RunArchive.create(tmp_path, "r")
    async with OutputPipeline(Console(stream, color=False), archive) as out:
        out.feed("n1", 0, "out", OSC52 + b"x\n", node_rank=0)
    assert stream.getvalue() == "n1 r0: ^[]52;c;cm0gLXJmIH4K^Gx\n"
    records = [json.loads(raw) for raw in (tmp_path / "r" / "output.jsonl").read_text()
               .splitlines()]
    assert [rec["line"] for rec in records] == [OSC52.decode() + "x"]
