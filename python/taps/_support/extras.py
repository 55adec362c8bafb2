"""Optional dependencies (the extras ``taps[torch]``, ``taps[jax]``, ``taps[plot]``): imported
only where a capability needs them, with one clear error when they are missing."""

from __future__ import annotations

import importlib
from types import ModuleType

from taps.errors import MissingExtraError, ResourceError

#: What the dynamic loader says when it cannot map a library for want of memory or address space
#: (torch's libtorch_cpu.so under a 2 GiB ``ulimit -v``: "failed to map segment from shared
#: object").
_NO_ROOM = ("failed to map segment", "cannot allocate memory")


def require(module: str, extra: str, purpose: str) -> ModuleType:
    """Import ``module`` or raise :class:`MissingExtraError` saying that ``purpose`` needs
    ``pip install 'taps[extra]'`` (:class:`ResourceError` if it is installed but its libraries do
    not fit in the memory this process may use)."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        if any(s in str(e).lower() for s in _NO_ROOM):
            raise ResourceError(
                f"{purpose} needs {module.split('.')[0]}, whose libraries do not fit in the "
                f"memory this process may use ({e}); raise its address-space limit (ulimit -v) "
                "or free memory"
            ) from None
        raise MissingExtraError(
            f"{purpose} needs {module.split('.')[0]}, which is not installed "
            f"({e}): pip install 'taps[{extra}]'"
        ) from None
