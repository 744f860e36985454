"""output/render.py: what dtrain itself prints: errors with their hint, notes, GitHub
annotations, counts; colour only where should_color says (pure, on StringIO streams)."""

from __future__ import annotations

import io

import pytest

from launcher.errors import DtrainError, UsageError
from launcher.output import render
from launcher.text.words import count


class TTY(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def plain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.delenv("NO_COLOR", raising=False)


def test_an_error_is_one_line_and_its_hint_the_next(plain: None) -> None:
    out = io.StringIO()
    render.error(UsageError("h.txt:3: bad port 'x'", hint="e.g. node1:2222"), out)
    assert out.getvalue() == "dtrain: error: h.txt:3: bad port 'x'\n  hint: e.g. node1:2222\n"
    out = io.StringIO()
    render.error(DtrainError("connection refused", host="node3"), out)
    assert out.getvalue() == "dtrain: error: node3: connection refused\n"


def test_an_error_on_a_terminal_is_red_and_its_hint_dim(plain: None) -> None:
    out = TTY()
    render.error(DtrainError("it broke", hint="fix it", host="n1"), out)
    assert out.getvalue() == ("\x1b[1;31mdtrain: error:\x1b[0m n1: it broke\n"
                              "\x1b[2m  hint: fix it\x1b[0m\n")
    out = TTY()
    render.note("3 nodes ok", out)
    assert out.getvalue() == "\x1b[1mdtrain:\x1b[0m 3 nodes ok\n"


def test_no_color_wins_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    out = TTY()
    render.error(DtrainError("x", hint="y"), out)
    render.note("z", out)
    assert out.getvalue() == "dtrain: error: x\n  hint: y\ndtrain: z\n"


def test_what_a_node_sent_is_made_inert_but_lines_and_tabs_stay(plain: None) -> None:
    out = io.StringIO()
    render.error(DtrainError("a\x1b[2Jb\tc\nd\x07", hint="h\x1b]0;t\x07", host="n\x1b[1m"), out)
    assert out.getvalue() == "dtrain: error: n^[[1m: a^[[2Jb\tc\nd^G\n  hint: h^[]0;t^G\n"
    out = io.StringIO()
    render.note("one\ntwo\tthree\x1b[31m", out)
    assert out.getvalue() == "dtrain: one\ntwo\tthree^[[31m\n"


def test_the_default_stream_is_stderr(plain: None, capsys: pytest.CaptureFixture[str]) -> None:
    render.error(DtrainError("e"))
    render.note("n")
    render.github_error("g")
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == (
        "", "dtrain: error: e\ndtrain: n\n::error title=dtrain%3A failure::g\n")


def test_github_annotations_name_hosts_and_ranks_escaped() -> None:
    out = io.StringIO()
    render.github_error("100% lost\r\non node1", hosts=["node1", "node2"], ranks=[0, 3],
                        stream=out)
    assert out.getvalue() == ("::error title=dtrain%3A host node1%2C node2; rank 0%2C 3"
                              "::100%25 lost%0D%0Aon node1\n")
    out = io.StringIO()
    render.github_error("a: b, c", ranks=[7], stream=out)
    assert out.getvalue() == "::error title=dtrain%3A rank 7::a: b, c\n"
    out = io.StringIO()
    render.github_error("x\x1b[2J", hosts=["h:1"], stream=out)
    assert out.getvalue() == "::error title=dtrain%3A host h%3A1::x^[[2J\n"


def test_counts_take_a_plural_except_for_one() -> None:
    assert [count(n, "node") for n in (0, 1, 2)] == ["0 nodes", "1 node", "2 nodes"]


def test_a_hint_keeps_its_lines_and_tabs_and_a_stream_without_isatty_is_plain(plain: None
                                                                            ) -> None:
    out = io.StringIO()
    render.error(DtrainError("x", hint="first\n\tsecond"), out)
    assert out.getvalue() == "dtrain: error: x\n  hint: first\n\tsecond\n"
    assert render.should_color(object(), {}) is False  # type: ignore[arg-type]
