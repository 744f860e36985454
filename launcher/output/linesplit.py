"""Byte chunks -> whole text lines, for one output source (host, rank, stream).

The supervisor forwards raw chunks as the remote pipe delivers them, so a chunk can end
mid-line or mid-character. ``LineSplitter`` keeps the unfinished tail and hands out only
whole lines, decoded once per batch, never per byte:

- lines end at b"\\n"; text is UTF-8 with errors="replace", decoded only on whole lines,
  so a multibyte character split across two chunks survives;
- carriage returns (progress bars): a line keeps only the text after its last "\\r", after
  trailing "\\r"s are dropped ("abc\\r\\n" -> "abc"); while a line is still open, everything
  before its last inner "\\r" is thrown away, so an endless stream of "\\r" updates without
  "\\n" holds one segment, never the whole history;
- a line longer than ``max_line`` bytes is cut (at a character boundary) into pieces that
  end with ``CONTINUED``, so one runaway line cannot take all memory.

Decoding the whole run of complete lines with one ``bytes.decode`` and one ``str.split``
is correct because b"\\n" never occurs inside a UTF-8 multibyte sequence, and it is what
makes the splitter fast (millions of short lines per second).
"""

from __future__ import annotations

DEFAULT_MAX_LINE = 64 * 1024 * 1024
CONTINUED = " [dtrain: line too long, continued on the next line]"


class LineSplitter:
    """Turn one source's byte chunks into whole lines."""

    __slots__ = ("_buf", "_cr", "max_line")

    def __init__(self, max_line: int = DEFAULT_MAX_LINE) -> None:
        if max_line < 4:
            raise ValueError("max_line must be at least 4 bytes (one UTF-8 character)")
        self.max_line = max_line
        self._buf = bytearray()  # the open line, after its last inner "\r"
        self._cr = False  # the open line ended with "\r" (maybe the first half of CRLF)

    def feed(self, data: bytes) -> list[str]:
        """Add a chunk; return the lines it completed (without their newline)."""
        nl = data.rfind(b"\n")
        if nl < 0:
            return self._extend(data)
        head = data[:nl]
        if self._buf or self._cr:
            head = self._take_open() + head
        lines = self._complete(head)
        rest = data[nl + 1 :]
        if rest:
            lines.extend(self._extend(rest))
        return lines

    def flush(self) -> list[str]:
        """End of stream: return the unfinished last line, if it has any text."""
        if not self._buf:
            self._cr = False
            return []
        return [_decode(self._take_open())]

    @property
    def pending(self) -> int:
        """Bytes held for the open line (for tests and memory accounting)."""
        return len(self._buf)

    def _take_open(self) -> bytes:
        """Return the open line (with its trailing "\r", if any) and reset it."""
        text = bytes(self._buf) + (b"\r" if self._cr else b"")
        self._buf = bytearray()
        self._cr = False
        return text

    def _complete(self, block: bytes) -> list[str]:
        """Decode a run of complete lines joined by b"\n"."""
        if len(block) > self.max_line:
            # Rare: only a line over the cap needs the per-line slow path.
            return self._complete_long(block)
        text = block.decode("utf-8", "replace")
        lines = text.split("\n")
        if "\r" in text:
            lines = [_collapse(line) if "\r" in line else line for line in lines]
        return lines

    def _complete_long(self, block: bytes) -> list[str]:
        """Complete lines, cutting the ones longer than max_line into marked pieces."""
        out: list[str] = []
        for raw in block.split(b"\n"):
            raw = _collapse_bytes(raw)
            while len(raw) > self.max_line:
                cut = _char_boundary(raw, self.max_line)
                out.append(_decode(raw[:cut]) + CONTINUED)
                raw = raw[cut:]
            out.append(_decode(raw))
        return out

    def _extend(self, data: bytes) -> list[str]:
        """Add bytes that contain no newline to the open line."""
        body = data.rstrip(b"\r")
        if body:
            cr = body.rfind(b"\r")
            if cr >= 0:
                # A progress bar rewrote the line: only the last segment matters.
                self._buf = bytearray(body[cr + 1 :])
            elif self._cr:
                # The pending "\r" was not part of a CRLF: it rewound the line.
                self._buf = bytearray(body)
            else:
                self._buf += body
            self._cr = len(body) != len(data)
        elif data:
            self._cr = True
        if len(self._buf) > self.max_line:
            return self._cut_open()
        return []

    def _cut_open(self) -> list[str]:
        """Emit the open line's head in max_line pieces; keep the remainder open."""
        out: list[str] = []
        buf = self._buf
        while len(buf) > self.max_line:
            cut = _char_boundary(buf, self.max_line)
            out.append(_decode(bytes(buf[:cut])) + CONTINUED)
            del buf[:cut]
        return out


def _decode(raw: bytes) -> str:
    return _collapse(raw.decode("utf-8", "replace"))


def _collapse(line: str) -> str:
    """Keep what a terminal would show last: the text after the last inner "\r"."""
    body = line.rstrip("\r")
    return body[body.rfind("\r") + 1 :]


def _collapse_bytes(line: bytes) -> bytes:
    body = line.rstrip(b"\r")
    return body[body.rfind(b"\r") + 1 :]


def _char_boundary(raw: bytes | bytearray, limit: int) -> int:
    """The largest cut <= limit that does not split a UTF-8 sequence (at most 3 back)."""
    cut = limit
    while cut > limit - 3 and (raw[cut] & 0xC0) == 0x80:
        cut -= 1
    return cut
