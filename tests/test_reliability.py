"""What the fault campaign (bench/soak.py, docs/reliability.md) found, as regressions that
run without the cluster."""

from __future__ import annotations

import subprocess
import sys

from tests.util import REPO, TRACEBACK

# Ctrl-C while `dtrain` still imports its CLI (seconds on a loaded box): the interrupt is
# raised where the import stands, here at the import of launcher.cli.run, deterministically
INTERRUPTED_IMPORT = """
import sys
class Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name == "launcher.cli.run":
            raise KeyboardInterrupt
        return None
sys.meta_path.insert(0, Interrupt())
from launcher.cli import main
main()
"""


def test_ctrl_c_while_the_cli_imports_is_exit_130_without_a_traceback() -> None:
    res = subprocess.run([sys.executable, "-c", INTERRUPTED_IMPORT, "--version"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert not TRACEBACK.search(res.stderr), res.stderr[-2000:]
    assert res.returncode == 130, (res.returncode, res.stderr[-2000:])
