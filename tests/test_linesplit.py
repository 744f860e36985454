"""LineSplitter: chunk boundaries, progress bars, encodings and very long lines."""

from __future__ import annotations

import random

import pytest

from launcher.output.linesplit import CONTINUED, LineSplitter


def split_all(chunks: list[bytes], max_line: int = 64 * 1024 * 1024) -> list[str]:
    splitter = LineSplitter(max_line)
    out: list[str] = []
    for chunk in chunks:
        out.extend(splitter.feed(chunk))
    return out + splitter.flush()


def random_chunks(data: bytes, rng: random.Random, most: int = 100) -> list[bytes]:
    chunks, pos = [], 0
    while pos < len(data):
        size = rng.randint(1, most)
        chunks.append(data[pos : pos + size])
        pos += size
    return chunks


@pytest.mark.parametrize(
    ("chunks", "lines"),
    [
        pytest.param([b"a\nb\n"], ["a", "b"], id="two-lines"),
        pytest.param([b"ab", b"c\nd", b"e\n"], ["abc", "de"], id="split-across-chunks"),
        pytest.param([b"tail"], ["tail"], id="no-newline-at-eof"),
        pytest.param([b"\n\n"], ["", ""], id="empty-lines"),
        pytest.param([b""], [], id="nothing"),
        pytest.param([b"abc\r\n"], ["abc"], id="crlf"),
        pytest.param([b"abc\r", b"\n"], ["abc"], id="crlf-split"),
        pytest.param([b"abc\r", b"xy\n"], ["xy"], id="cr-then-text-split"),
        pytest.param([b"10%\r50%\r100%\n"], ["100%"], id="progress-bar"),
        pytest.param([b"\r10%", b"\r50%", b"\r100%", b"\n"], ["100%"], id="progress-chunks"),
        pytest.param([b"10%\r100%\r\n"], ["100%"], id="progress-then-crlf"),
        pytest.param([b"line\r\r\n"], ["line"], id="double-cr"),
        pytest.param([b"100%\r"], ["100%"], id="cr-at-eof"),
        pytest.param([b"x\n\r"], ["x"], id="lone-cr-at-eof"),
    ],
)
def test_lines(chunks: list[bytes], lines: list[str]) -> None:
    assert split_all(chunks) == lines


def test_every_chunking_gives_the_same_lines() -> None:
    data = "".join(f"line {i} é€😀\r\n" if i % 3 else f"{i}%\r{i + 1}%\n" for i in range(500))
    raw = data.encode()
    expected = split_all([raw])
    rng = random.Random(7)
    for _ in range(20):
        assert split_all(random_chunks(raw, rng, 13)) == expected
    assert expected[1] == "line 1 é€😀"
    assert expected[0] == "1%"


def test_multibyte_character_split_between_chunks() -> None:
    raw = "€😀\n".encode()
    for cut in range(1, len(raw)):
        assert split_all([raw[:cut], raw[cut:]]) == ["€😀"]


def test_invalid_utf8_is_replaced_not_fatal() -> None:
    assert split_all([b"ok \xff\xfe bad\n", b"trunc \xe2\x82", b"\n"]) == [
        "ok \ufffd\ufffd bad",
        "trunc \ufffd",
    ]


def test_thousand_rewrites_become_one_line_with_the_last_state() -> None:
    splitter = LineSplitter()
    out: list[str] = []
    for i in range(1000):
        out += splitter.feed(f"\rstep {i:4d}/1000 [{'#' * (i // 50):<20}]".encode())
    out += splitter.feed(b"\n")
    assert out == ["step  999/1000 [################### ]"]


def test_endless_cr_updates_hold_one_segment() -> None:
    splitter = LineSplitter()
    for i in range(100_000):
        assert splitter.feed(f"\r{i:08d}".encode()) == []
    assert splitter.pending == 8
    assert splitter.flush() == ["00099999"]


def test_five_megabyte_line_comes_out_whole() -> None:
    line = ("x" * 1023 + "é") * 5 * 1024
    raw = line.encode() + b"\nnext\n"
    out = split_all([raw[i : i + 65536] for i in range(0, len(raw), 65536)])
    assert out == [line, "next"]


def test_line_over_the_cap_is_cut_at_character_boundaries() -> None:
    text = "€" * 100  # 300 bytes, three per character
    for chunks in ([text.encode() + b"\n"], [text.encode()[i : i + 7] for i in range(0, 300, 7)]):
        out = split_all(chunks, max_line=64)
        assert all(piece.endswith(CONTINUED) for piece in out[:-1])
        assert "".join(piece.removesuffix(CONTINUED) for piece in out) == text
        assert "\ufffd" not in "".join(out)


def test_cap_bounds_memory_of_an_open_line() -> None:
    splitter = LineSplitter(max_line=1000)
    out: list[str] = []
    for _ in range(100):
        out += splitter.feed(b"y" * 333)
        assert splitter.pending <= 1000
    out += splitter.flush()
    assert "".join(piece.removesuffix(CONTINUED) for piece in out) == "y" * 33300


def test_many_sources_interleaved_keep_their_own_partial_lines() -> None:
    rng = random.Random(1)
    sources = {name: LineSplitter() for name in "abcdef"}
    data = {name: "".join(f"{name}{i}\n" for i in range(2000)).encode() for name in sources}
    pending = {name: random_chunks(raw, rng) for name, raw in data.items()}
    got: dict[str, list[str]] = {name: [] for name in sources}
    while any(pending.values()):
        name = rng.choice([n for n, chunks in pending.items() if chunks])
        got[name] += sources[name].feed(pending[name].pop(0))
    for name, splitter in sources.items():
        got[name] += splitter.flush()
        assert got[name] == [f"{name}{i}" for i in range(2000)]


def test_max_line_must_hold_a_character() -> None:
    with pytest.raises(ValueError, match="max_line"):
        LineSplitter(max_line=2)


def test_the_smallest_cap_is_one_four_byte_character() -> None:
    assert split_all(["😀😀".encode(), b"\n"], max_line=4) == ["😀" + CONTINUED, "😀"]
    with pytest.raises(ValueError) as err:
        LineSplitter(max_line=3)
    assert str(err.value) == "max_line must be at least 4 bytes (one UTF-8 character)"


def _cut_everywhere(text: str, max_line: int) -> None:
    """Fed whole and byte by byte, every piece is at most max_line bytes, never splits a
    character, is as long as it can be (a cut goes back at most 3 bytes) and they join up."""
    raw = text.encode()
    for chunks in ([raw + b"\n"], [raw[i : i + 1] for i in range(len(raw))] + [b"\n"]):
        out = split_all(chunks, max_line=max_line)
        pieces = [p.removesuffix(CONTINUED) for p in out]
        assert all(p.endswith(CONTINUED) for p in out[:-1]) and not out[-1].endswith(CONTINUED)
        assert "".join(pieces) == text and "\ufffd" not in text + "".join(pieces)
        for piece in pieces[:-1]:
            assert max_line - 3 <= len(piece.encode()) <= max_line, (text, max_line, pieces)


@pytest.mark.parametrize("char", ["a", "é", "©", "€", "😀"], ids=["1", "2", "2-odd", "3", "4"])
def test_long_lines_are_cut_at_every_offset_without_splitting_a_character(char: str) -> None:
    # "é" is C3 A9 and "©" C2 A9: an odd continuation byte must be recognised as one too
    for lead in range(4):
        for max_line in (4, 5, 6, 7, 9):
            _cut_everywhere("x" * lead + char * 12, max_line)


def test_ascii_pieces_are_exactly_the_cap() -> None:
    assert split_all([b"abcdefghij\n"], max_line=4) == [
        "abcd" + CONTINUED, "efgh" + CONTINUED, "ij"]


def test_a_line_of_exactly_the_cap_is_not_cut_open_or_complete() -> None:
    # open: fed without its newline (the cap is reached, not passed)
    splitter = LineSplitter(max_line=8)
    assert splitter.feed(b"12345678") == [] and splitter.pending == 8
    assert splitter.feed(b"\n") == ["12345678"]
    # complete, inside a run of lines longer than the cap (the per-line slow path)
    assert split_all([b"12345678\nab cd\nef\tg\n"], max_line=8) == [
        "12345678", "ab cd", "ef\tg"]


def test_stray_continuation_bytes_are_cut_three_back_at_most() -> None:
    out = split_all([b"\x80" * 20 + b"\n"], max_line=8)
    assert [len(p.removesuffix(CONTINUED)) for p in out] == [5, 5, 5, 5]  # 5 bytes each, U+FFFD


def test_invalid_utf8_is_replaced_on_the_slow_paths_too() -> None:
    # a line over the cap, an open line cut at the cap, and the unfinished last line
    assert split_all([b"ab\xffcdefgh\xfe\n"], max_line=8) == [
        "ab\ufffdcdefg" + CONTINUED, "h\ufffd"]
    assert split_all([b"ab\xffcdefgh\xfe"], max_line=8) == [
        "ab\ufffdcdefg" + CONTINUED, "h\ufffd"]
    assert split_all([b"tail \xff"]) == ["tail \ufffd"]


@pytest.mark.parametrize("max_line", [4096, 16], ids=["fast", "over-the-cap"])
def test_carriage_returns_drop_only_carriage_returns(max_line: int) -> None:
    # trailing spaces and other characters stay; only "\r" is stripped and folded
    chunks = [b"x\rkeep  \r\n", b"endX\r\n", b"\rfirst\rsecond\rthird  \n",
              b"CR at the start\r\n" + b"z" * 20 + b"\n"]
    for feed in (chunks, [b"".join(chunks)]):  # one chunk: a block over the cap
        assert split_all(feed, max_line=max_line)[:4] == [
            "keep  ", "endX", "third  ", "CR at the start"]
    assert split_all([b"open  "]) == ["open  "]
    assert split_all([b"openX"]) == ["openX"]
    assert split_all([b"a\rb\rsegX  "]) == ["segX  "]


def test_a_long_history_before_the_last_carriage_return_is_never_cut() -> None:
    # the slow path folds at the last "\r" before measuring the line
    history = b"x\r" + b"A" * 30 + b"\rdone"
    assert split_all([history + b"\n" + b"y" * 20 + b"\n"], max_line=16)[0] == "done"
    splitter = LineSplitter(max_line=16)
    assert splitter.feed(history) == [] and splitter.pending == 4
    assert splitter.flush() == ["done"]


def test_an_open_line_keeps_only_its_last_segment() -> None:
    splitter = LineSplitter()
    assert splitter.feed(b"10%\r20%\r30%") == [] and splitter.pending == 3
    assert splitter.feed(b"\r40%\r") == [] and splitter.pending == 3
    assert splitter.feed(b"\n") == ["40%"]
