"""Checks of the arguments of the public functions, one rule for all: a wrong type is a
``TypeError``, a value out of range a :class:`taps.TapsError` subclass (a ``ValueError``), and both
name the function, the argument and the value (docs/errors.md)."""

from __future__ import annotations

import math
from numbers import Integral, Real

from taps._core import TapsError

#: Sizes and counts must fit the core's 64-bit signed integers.
MAX_INT = 2**63 - 1


class ArgumentError(TapsError):
    """A number argument out of its range: NaN, infinite, negative or too large."""


def number(where: str, name: str, value: object, *, positive: bool = True) -> float:
    """``value`` as a finite float, > 0 if ``positive`` else >= 0."""
    if not isinstance(value, Real) or isinstance(value, bool):
        raise TypeError(f"{where}: {name} must be a number, got {type(value).__name__}")
    x = float(value)
    if not math.isfinite(x) or x < 0 or (positive and x == 0):
        bound = "positive" if positive else "non-negative"
        raise ArgumentError(f"{where}: {name} must be a finite {bound} number, got {value!r}")
    return x


def size(where: str, name: str, value: object, error: type[TapsError] = ArgumentError) -> int:
    """``value`` as an int in ``1 ..`` :data:`MAX_INT`; ``error`` is raised when it is out of
    range."""
    if not isinstance(value, Integral) or isinstance(value, bool):
        raise TypeError(f"{where}: {name} must be an int, got {type(value).__name__}")
    n = int(value)
    if not 1 <= n <= MAX_INT:
        raise error(f"{where}: {name} must be a positive int below 2**63, got {n}")
    return n
