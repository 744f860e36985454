"""dtrain: a multi-node PyTorch launcher over SSH (the pdsh replacement)."""

from __future__ import annotations

__version__ = "0.1.0"

try:  # Ctrl-C as the CLI starts: exit 130 without a traceback (docs/reliability.md)
    from launcher import _quiet_import
    from launcher.errors import DtrainError
except KeyboardInterrupt:
    exec("")  # launcher.errors.interrupt_handled(), which may not be imported yet
    raise SystemExit(130) from None  # launcher.exitcodes.EXIT_INTERRUPTED, maybe not imported yet

_quiet_import.install()  # before anything imports asyncssh (see the module)

__all__ = ["DtrainError", "__version__"]
