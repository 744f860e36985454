"""A page in headless Chromium, as a person would see it: screenshot, console, requests.

Drives Debian's ``chromium`` over the DevTools protocol on a pipe (``--remote-debugging-pipe``:
fd 3 for commands, fd 4 for replies, NUL-terminated JSON), so nothing listens on a port and
nothing reaches the network. ``open_page`` loads a file, waits for the page's own ``ready``
flag (``document.documentElement.dataset.ready``), and returns the PNG, every console
message, every uncaught exception, every browser log entry (CSP violations land there) and
every URL the page asked for.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import struct
import subprocess
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--force-device-scale-factor=1", "--mute-audio",
         "--remote-debugging-pipe"]


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@dataclass
class PageResult:
    png: bytes = b""
    console: list[dict[str, Any]] = field(default_factory=list)  # {"type", "text"}
    exceptions: list[str] = field(default_factory=list)
    log: list[dict[str, Any]] = field(default_factory=list)  # {"level", "text", "source"}
    requests: list[str] = field(default_factory=list)
    ready: bool = False
    values: dict[str, Any] = field(default_factory=dict)  # the evaluated expressions

    @property
    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and error log entries."""
        return ([f"console.{c['type']}: {c['text']}" for c in self.console
                 if c["type"] in ("error", "assert")]
                + [f"exception: {e}" for e in self.exceptions]
                + [f"log {e['source']}: {e['text']}" for e in self.log
                   if e.get("level") == "error"])


def _high(fd: int) -> int:
    import fcntl

    high = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return high


class _Pipe:
    def __init__(self, proc: subprocess.Popen[bytes], to_fd: int, from_fd: int) -> None:
        self.proc, self.to_fd, self.from_fd = proc, to_fd, from_fd
        self.buf = b""
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, params: dict[str, Any] | None = None,
             session: str | None = None, timeout: float = 30) -> dict[str, Any]:
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.to_fd, json.dumps(msg).encode() + b"\0")
        want = self.next_id
        deadline = time.monotonic() + timeout
        while True:
            for m in self._read(deadline):
                if m.get("id") == want:
                    if "error" in m:
                        raise RuntimeError(f"{method}: {m['error']}")
                    result: dict[str, Any] = m.get("result", {})
                    return result
                self.events.append(m)

    def wait_event(self, name: str, timeout: float) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout
        while True:
            for i, m in enumerate(self.events):
                if m.get("method") == name:
                    return self.events.pop(i)
            if time.monotonic() > deadline:
                return None
            self.events.extend(self._read(deadline, quiet=True))

    def _read(self, deadline: float, quiet: bool = False) -> list[dict[str, Any]]:
        import select

        while b"\0" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                if quiet:
                    return []
                raise TimeoutError("chromium did not answer in time")
            ready, _, _ = select.select([self.from_fd], [], [], min(left, 0.5))
            if not ready:
                continue
            chunk = os.read(self.from_fd, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe")
            self.buf += chunk
        *msgs, self.buf = self.buf.split(b"\0")
        return [json.loads(m) for m in msgs if m]


def open_page(path: Path, *, width: int = 1280, height: int = 900, full_page: bool = True,
              max_height: int = 8000, evaluate: dict[str, str] | None = None,
              timeout: float = 60) -> PageResult:
    """Load ``path`` (file://), wait until it says it is ready, take a screenshot."""
    exe = chromium()
    if exe is None:
        raise FileNotFoundError("chromium is not installed")
    res = PageResult()
    profile = tempfile.mkdtemp(prefix="dtrain-chromium-")
    to_r, to_w = os.pipe()
    from_r, from_w = os.pipe()
    # the child's ends at fds >= 10 (bash: dash reads one digit), so moving them to 3 and 4
    # cannot overwrite each other
    to_r, from_w = _high(to_r), _high(from_w)
    script = f'exec "$0" "$@" 3<&{to_r} 4>&{from_w} {to_r}<&- {from_w}>&-'
    proc = subprocess.Popen(["bash", "-c", script, exe, *FLAGS, f"--user-data-dir={profile}",
                             "about:blank"], pass_fds=(to_r, from_w),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(to_r)
    os.close(from_w)
    pipe = _Pipe(proc, to_w, from_r)
    try:
        target = pipe.send("Target.createTarget", {"url": "about:blank"}, timeout=timeout)
        sess = pipe.send("Target.attachToTarget", {"targetId": target["targetId"],
                                                   "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Network", "Page"):
            pipe.send(f"{domain}.enable", session=sess)
        pipe.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": height,
                                                         "deviceScaleFactor": 1,
                                                         "mobile": False}, session=sess)
        pipe.send("Page.navigate", {"url": path.resolve().as_uri()}, session=sess)
        pipe.wait_event("Page.loadEventFired", timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = pipe.send("Runtime.evaluate", {"expression":
                          "document.documentElement.dataset.ready === '1'",
                          "returnByValue": True}, session=sess)
            if r.get("result", {}).get("value") is True:
                res.ready = True
                break
            time.sleep(0.1)
        for name, expr in (evaluate or {}).items():
            r = pipe.send("Runtime.evaluate", {"expression": expr, "returnByValue": True,
                                               "awaitPromise": True}, session=sess)
            res.values[name] = r.get("result", {}).get("value")
        if full_page:
            metrics = pipe.send("Page.getLayoutMetrics", session=sess)
            size = metrics.get("cssContentSize") or metrics.get("contentSize") or {}
            full = min(max_height, int(size.get("height", height)))
            pipe.send("Emulation.setDeviceMetricsOverride", {
                "width": width, "height": max(height, full), "deviceScaleFactor": 1,
                "mobile": False}, session=sess)
            time.sleep(0.3)  # let the charts redraw at the new size
        shot = pipe.send("Page.captureScreenshot", {"format": "png"}, session=sess)
        res.png = base64.b64decode(shot["data"])
        pipe.events.extend(pipe._read(time.monotonic() + 0.2, quiet=True))
        for m in pipe.events:
            p = m.get("params", {})
            if m.get("method") == "Runtime.consoleAPICalled":
                text = " ".join(str(a.get("value", a.get("description", "")))
                                for a in p.get("args", []))
                res.console.append({"type": p.get("type"), "text": text})
            elif m.get("method") == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                res.exceptions.append(str(d.get("exception", {}).get("description")
                                          or d.get("text")))
            elif m.get("method") == "Log.entryAdded":
                e = p.get("entry", {})
                res.log.append({"level": e.get("level"), "text": e.get("text"),
                                "source": e.get("source")})
            elif m.get("method") == "Network.requestWillBeSent":
                res.requests.append(p.get("request", {}).get("url", ""))
        try:
            pipe.send("Browser.close", timeout=10)
        except (RuntimeError, TimeoutError):
            pass
    finally:
        os.close(to_w)
        os.close(from_r)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(profile, ignore_errors=True)
    return res


def png_pixels(png: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB(A) bytes) of an 8-bit, non-interlaced PNG (what Chromium
    writes): enough to tell a blank screenshot from a drawn one without an image library."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, b""
    width = height = ctype = 0
    while pos < len(png):
        (length,) = struct.unpack(">I", png[pos:pos + 4])
        kind, body = png[pos + 4:pos + 8], png[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and interlace == 0 and ctype in (2, 6), (depth, ctype)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    bpp = 4 if ctype == 6 else 3
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 0xFF
            elif f == 2:
                line[i] = (line[i] + b) & 0xFF
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) \
                    & 0xFF
        rows.append(bytes(line))
        prev = line
    return width, height, rows


def colours(png: bytes, step: int = 4) -> int:
    """How many distinct colours a screenshot has (sampling every ``step``-th pixel)."""
    width, _, rows = png_pixels(png)
    bpp = len(rows[0]) // width if rows else 3
    seen = set()
    for row in rows[::step]:
        for i in range(0, len(row), bpp * step):
            seen.add(row[i:i + 3])
    return len(seen)
