"""--notify's cost to a run's wall time (issue #38: "notifications add nothing measurable").

    python bench/bench_notify.py [--reps 3]

The same short local run (`-H localhost`, one rank, 3 progress lines) with and without
`--notify` to a stdlib HTTP server on 127.0.0.1, interleaved; the medians and their ratio
are reported, never asserted.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


class Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/hook"
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "s.py"
        script.write_text("import time\nfor i in range(3):\n    print(f'step {i}', "
                          "flush=True); time.sleep(0.2)\n")
        times: dict[str, list[float]] = {"plain": [], "notify": []}
        for _ in range(a.reps):
            for kind in times:
                extra = ["--notify", url] if kind == "notify" else []
                t = time.perf_counter()
                subprocess.run([sys.executable, "-m", "launcher", "run", "-H", "localhost",
                                "--nproc-per-node", "1", "--archive-dir", f"{tmp}/runs",
                                *extra, str(script)], cwd=REPO, check=True,
                               capture_output=True)
                times[kind].append(time.perf_counter() - t)
    srv.shutdown()
    p, n = statistics.median(times["plain"]), statistics.median(times["notify"])
    print(f"run wall time, median of {a.reps}: plain {p:.2f} s, --notify {n:.2f} s, "
          f"ratio {n / p:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
