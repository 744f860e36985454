"""Small things found by running dtrain (issue 34, item 4), each checked as a user meets it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.util import node_program

SHIM = node_program()  # the bundle torchrun starts as each worker


def test_a_syntax_error_is_placed_at_the_user_s_file_and_line(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import os\n\ndef f(:\n    pass\n")
    plain = subprocess.run([sys.executable, "-u", str(script)], capture_output=True,
                           text=True, cwd=tmp_path)
    wrapped = subprocess.run([sys.executable, "-u", str(SHIM), str(script)],
                             capture_output=True, text=True, cwd=tmp_path,
                             env={**os.environ, "DTRAIN_ARM_SOCK": str(tmp_path / "x.sock"),
                                  "RANK": "0"})
    assert f'File "{script}", line 3' in wrapped.stderr, wrapped.stderr
    assert "dtrain_shim" not in wrapped.stderr and str(SHIM) not in wrapped.stderr
    assert (wrapped.returncode, wrapped.stderr) == (1, plain.stderr)


def test_the_hang_line_names_the_newest_progress_line_not_a_throttled_older_one() -> None:
    from launcher.decide.outcome.hang import ProgressWatch, compile_progress
    from launcher.models import OutputLine

    w = ProgressWatch(compile_progress(None), range(2), 0.0)
    w.observe([OutputLine("n1", "out", "step 0 loss 1.0", 0, 0, 100.0),
               OutputLine("n1", "out", "step 1 loss 0.5", 0, 0, 100.3),  # within 1 s
               OutputLine("n1", "out", "loading the next shard", 0, 0, 100.5),
               OutputLine("n2", "out", "step 0 loss 1.0", 1, 1, 100.1)])
    assert w.latest() == (100.3, 0, "step 1 loss 0.5")


def _js_function(source: str, name: str) -> str:
    start = source.index(f"function {name}(")
    depth, i = 0, source.index("{", start)
    while True:
        depth += {"{": 1, "}": -1}.get(source[i], 0)
        i += 1
        if depth == 0:
            return source[start:i]


def test_the_cpu_chart_s_y_ticks_differ_when_the_values_sit_near_100_percent() -> None:
    import json
    import shutil

    from tests.util import cannot_run

    node = shutil.which("node")
    if node is None:
        cannot_run("no node.js here (scripts/test installs Debian's nodejs)")
    from launcher.output.runreport import page

    js = (Path(page.__file__).parent / "assets" / "report.js").read_text()
    prog = (_js_function(js, "fmtNum") + "\n" + _js_function(js, "yTicks") + "\n"
            "console.log(JSON.stringify([yTicks([99.5, 100, 100.5, 101], '%'), "
            "yTicks([99.9, 99.95, 100, 100.05], '%'), yTicks([0, 25, 50, 75, 100], '%'), "
            "yTicks([0, 0.25, 0.5, 0.75, 1], '%'), yTicks([0, 0.2, 0.4], '%')]));")
    out = subprocess.run([node, "-e", prog], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    near, nearer, wide, quarters, fifths = json.loads(out.stdout)
    # an H200's idle GPU utilisation (docs/gpu-check.md): not 0.0, 0.3, 0.5, 0.8, 1.0
    assert quarters == ["0.00%", "0.25%", "0.50%", "0.75%", "1.00%"]
    assert fifths == ["0.0%", "0.2%", "0.4%"]
    assert near == ["99.5%", "100.0%", "100.5%", "101.0%"]
    assert len(set(nearer)) == 4
    assert wide == ["0%", "25%", "50%", "75%", "100%"]


def test_a_syntax_error_as_python_prints_it_is_the_exception_it_is() -> None:
    """No "Traceback" line: the place, the line, the caret, the error (what the rank shim
    now prints, as plain python does)."""
    from launcher.decide.outcome.failures import python_exception

    lines = ['  File "/x/broken.py", line 2', "    def broken(:", "               ^",
             "SyntaxError: invalid syntax"]
    assert python_exception(lines) == ("SyntaxError", "invalid syntax", "broken.py:2")
    assert python_exception(["SyntaxError: in a message, no place"]) is None
