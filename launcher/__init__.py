"""dtrain: a multi-node PyTorch launcher over SSH (the pdsh replacement)."""

from __future__ import annotations

__version__ = "0.1.0"

from launcher import _quiet_import
from launcher.errors import DtrainError

_quiet_import.install()  # before anything imports asyncssh (see the module)

__all__ = ["DtrainError", "__version__"]
