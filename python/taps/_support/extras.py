"""Optional dependencies (the extras ``taps[torch]``, ``taps[jax]``, ``taps[plot]``): imported
only where a capability needs them, with one clear error when they are missing."""

from __future__ import annotations

import importlib
from types import ModuleType

from taps.errors import MissingExtraError


def require(module: str, extra: str, purpose: str) -> ModuleType:
    """Import ``module`` or raise :class:`MissingExtraError` saying that ``purpose`` needs
    ``pip install 'taps[extra]'``."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingExtraError(
            f"{purpose} needs {module.split('.')[0]}, which is not installed "
            f"({e}): pip install 'taps[{extra}]'"
        ) from None
