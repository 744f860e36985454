"""Text from nodes made safe for an HTML page (every node-derived string goes through here).

``text()`` escapes ``& < > " '`` and replaces what HTML does not allow in text: C0 controls
(ESC, NUL, ...), DEL and C1 controls become ``cat -v`` notation (``^[``), colour sequences
(SGR) are dropped, noncharacters become U+FFFD. ``ident()`` makes an id or class from any
text. ``json_script()`` embeds data in ``<script type="application/json">`` so that no
``</script>``, ``<!--`` or ``&`` inside a string can end or change the element.
"""

from __future__ import annotations

import html
import json
import math
import re
from typing import Any

from launcher.text.termsafe import clean_text

_SGR = re.compile("\x1b\\[[0-9;:]*m")
_NONCHAR = re.compile("[\ufdd0-\ufdef\ufffe\uffff\U0001fffe\U0001ffff\U0002fffe\U0002ffff"
                      "\U0003fffe\U0003ffff\U0004fffe-\U0010ffff\ud800-\udfff]")


def plain(value: object) -> str:
    """The text as shown: colours dropped, controls in caret notation, noncharacters
    replaced (not yet escaped)."""
    s = _SGR.sub("", str(value))
    s = clean_text(s).replace("\r", "^M")
    return _NONCHAR.sub("\ufffd", s)


def text(value: object) -> str:
    """Escaped for HTML text and attribute values (quotes included)."""
    return html.escape(plain(value), quote=True)


def ident(value: object) -> str:
    """An HTML id/class fragment: ASCII letters, digits, '-' and '_' only."""
    return "".join(c if c.isascii() and (c.isalnum() or c in "-_") else "-" if c == " "
                   else "_" for c in str(value))


def json_script(data: Any) -> str:
    """JSON safe inside a <script type="application/json"> element."""
    raw = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return (raw.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def finite_data(data: Any) -> Any:
    """A JSON-like value with every float that JSON cannot carry (NaN, Infinity: a result
    out of range) as None: the page and ``report --json`` are always produced, and valid."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, list | tuple):
        return [finite_data(x) for x in data]
    if isinstance(data, dict):
        return {k: finite_data(v) for k, v in data.items()}
    return data


def clean_data(data: Any) -> Any:
    """Every string in a JSON-like value passed through ``plain`` (for the page's data), every
    non-finite float as None."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, str):
        return plain(data)
    if isinstance(data, list | tuple):
        return [clean_data(x) for x in data]
    if isinstance(data, dict):
        return {plain(k): clean_data(v) for k, v in data.items()}
    return data
