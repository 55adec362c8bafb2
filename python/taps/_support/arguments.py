"""Checks of the number arguments of the public functions, one rule for all: a wrong type is a
``TypeError``, a value out of range a :class:`taps.TapsError` subclass (a ``ValueError``), and both
name the function, the argument and the value (docs/errors.md). Sizes are the graph's
(:func:`taps.graph.records.checked_size`)."""

from __future__ import annotations

import math
from numbers import Real

from taps.errors import ArgumentError


def number(where: str, name: str, value: object, *, positive: bool = True) -> float:
    """``value`` as a finite float, > 0 if ``positive`` else >= 0."""
    if not isinstance(value, Real) or isinstance(value, bool):
        raise TypeError(f"{where}: {name} must be a number, got {type(value).__name__}")
    x = float(value)
    if not math.isfinite(x) or x < 0 or (positive and x == 0):
        bound = "positive" if positive else "non-negative"
        raise ArgumentError(f"{where}: {name} must be a finite {bound} number, got {value!r}")
    return x
