"""`dtrain top RUN`: what a run's archive says beside the samples (placeholder)."""

from __future__ import annotations
