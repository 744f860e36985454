"""dtrain: a multi-node PyTorch launcher over SSH (the pdsh replacement)."""

from __future__ import annotations

__version__ = "0.1.0"

from launcher.errors import DtrainError

__all__ = ["DtrainError", "__version__"]
