"""``python -m launcher.transports.keeper --dir DIR --idle SECONDS``: the keeper process
(started by a command that finds none; docs/connections.md)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from launcher.transports.keeper.server import main_async


def main() -> int:
    ap = argparse.ArgumentParser(prog="dtrain-keeper")
    ap.add_argument("--dir", required=True)
    ap.add_argument("--idle", type=float, default=600.0)
    args = ap.parse_args()
    return asyncio.run(main_async(Path(args.dir), args.idle))


if __name__ == "__main__":
    sys.exit(main())
