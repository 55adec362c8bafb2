"""The ``torch`` extra, imported on first use: importing taps must not import torch."""

from __future__ import annotations

from typing import Any

from taps._support.extras import require


def require_torch() -> Any:
    """The ``torch`` module, or :class:`taps.MissingExtraError` naming the ``torch`` extra."""
    return require("torch", "torch", "taps.from_torch")
