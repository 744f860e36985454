"""Remote output made safe for the user's terminal: colours pass, every other control does not.

A node's output is text someone else controls. Written raw to a terminal, its control
sequences act on the user's terminal: ``\\r``, backspace or a cursor move can overwrite the
``node1:`` tag with ``node2:``; ``ESC ] 52`` (OSC 52) writes the clipboard; ``ESC ] 0`` sets the
window title; others switch character sets or ask the terminal to answer. So, on a terminal
(and without ``--raw``):

* SGR sequences (``ESC [ params m``: colours, bold) pass, and a line that used one ends with
  a reset, so the next tag is drawn in its own colour;
* a carriage return folds the line to what the terminal would have shown last, the text
  after the last ``\\r`` (progress bars keep working; the tag is never overwritten);
  a ``\\r`` before the newline (CRLF) is dropped;
* every other C0 control byte (ESC included), DEL and the C1 controls (U+0080-U+009F, two
  bytes in UTF-8) are shown in ``cat -v`` notation (``^[``, ``^G``, ``^?``, ``M-^[``): inert
  text that still shows what the node sent;
* tab and newline are left alone.

Text dtrain itself prints that holds something a node or an archive supplied (a node's
error, a host name it reported, a run id or an outcome read from meta.json) goes through
``inert``: every control, ESC of a colour included, is shown in the same notation, on a
terminal or not (render.note, render.error, the doctor, smoke, cp and ps tables).

The run archive and ``--raw`` keep the original bytes. Both forms work on whole lines (a
sequence torn across two reads would otherwise slip through), and the byte form is cheap to
skip: a chunk without any control byte is returned as it is after one ``bytes.translate``.
"""

from __future__ import annotations

import re

RESET = "\x1b[0m"
_RESET_B = RESET.encode()
_C0_BUT_TAB_LF = bytes(range(0x00, 0x09)) + bytes(range(0x0B, 0x20)) + b"\x7f"
# one pass: keep SGR, replace the rest (C0 but \t \n \r, DEL, C1 as UTF-8)
_BYTES = re.compile(rb"\x1b\[[0-9;:]*m|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]|\xc2[\x80-\x9f]")
_TEXT = re.compile("\x1b\\[[0-9;:]*m|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def _caret(code: int) -> str:
    """``cat -v`` notation for one control code point (C0, DEL, C1)."""
    prefix = "M-" if code >= 0x80 else ""
    code &= 0x7F
    return prefix + ("^?" if code == 0x7F else "^" + chr(code + 0x40))


_CARET_B = {code: _caret(code).encode() for code in [*range(0x20), 0x7F, *range(0x80, 0xA0)]}
_CARET_S = {chr(code): text.decode() for code, text in _CARET_B.items()}


def needs_cleaning(data: bytes) -> bool:
    """True when the chunk holds a control byte (or a possible C1 control) to look at."""
    return len(data.translate(None, _C0_BUT_TAB_LF)) != len(data) or b"\xc2" in data


def _fold_bytes(line: bytes) -> bytes:
    body = line.rstrip(b"\r")
    return body[body.rfind(b"\r") + 1:]


def _fold_text(line: str) -> str:
    body = line.rstrip("\r")
    return body[body.rfind("\r") + 1:]


def clean_bytes(block: bytes) -> bytes:
    """Neutralise the controls in whole lines of bytes (``\\n``-separated, no final newline)."""
    if b"\r" in block:
        block = b"\n".join(_fold_bytes(line) if b"\r" in line else line
                           for line in block.split(b"\n"))
    sgr = False

    def sub(match: re.Match[bytes]) -> bytes:
        nonlocal sgr
        token = match.group()
        if len(token) > 2:  # ESC [ ... m: a colour
            sgr = True
            return token
        return _CARET_B[token[-1]] if token[0] == 0xC2 else _CARET_B[token[0]]

    block = _BYTES.sub(sub, block)
    if sgr:  # the node's colours end with its line
        block = block.replace(b"\n", _RESET_B + b"\n") + _RESET_B
    return block


def clean_text(text: str) -> str:
    """The same for decoded text (one line or several)."""
    if "\r" in text:
        text = "\n".join(_fold_text(line) if "\r" in line else line
                         for line in text.split("\n"))
    sgr = False

    def sub(match: re.Match[str]) -> str:
        nonlocal sgr
        token = match.group()
        if len(token) > 1:
            sgr = True
            return token
        return _CARET_S[token]

    text = _TEXT.sub(sub, text)
    if sgr:
        text = text.replace("\n", RESET + "\n") + RESET
    return text



_ANY_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def inert(text: str, keep: str = "") -> str:
    """Every control character (C0, DEL, C1; ESC too) in ``cat -v`` notation, except those
    in ``keep`` (a note keeps "\\n" and "\\t"); cheap when there is none."""
    if not _ANY_CONTROL.search(text):
        return text
    return _ANY_CONTROL.sub(lambda m: m.group() if m.group() in keep else _CARET_S[m.group()],
                            text)
