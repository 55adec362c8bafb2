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
    try:
        x = float(value)
    except OverflowError:  # an int beyond a float's range: Python may refuse to print it
        raise ArgumentError(
            f"{where}: {name} must be a finite number, got {shown(value)}"
        ) from None
    if not math.isfinite(x) or x < 0 or (positive and x == 0):
        bound = "positive" if positive else "non-negative"
        raise ArgumentError(f"{where}: {name} must be a finite {bound} number, got {value!r}")
    return x


def shown(value: object) -> str:
    """``value`` as a message shows it: its repr, but an int of more than 128 bits (Python
    refuses to print one of more than 4,300 digits) by its size, in a list or tuple too."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an int of {value.bit_length()} bits"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(shown(v) for v in value)
        return (
            f"[{inner}]"
            if isinstance(value, list)
            else f"({inner}{',' if len(value) == 1 else ''})"
        )
    return repr(value)


def instance(where: str, name: str, value: object, kind: type) -> None:
    """A one-line ``TypeError`` unless ``value`` is a ``kind`` (a taps class: named ``taps.X``)."""
    if not isinstance(value, kind):
        raise TypeError(
            f"{where}: {name} must be a taps.{kind.__name__}, got {type(value).__name__}"
        )


def text(where: str, name: str, value: object) -> None:
    """A one-line ``TypeError`` unless ``value`` is a text to parse (a str or bytes)."""
    if not isinstance(value, (str, bytes, bytearray)):
        raise TypeError(f"{where}: {name} must be a str or bytes, got {type(value).__name__}")


def flag(where: str, name: str, value: object) -> None:
    """A one-line ``TypeError`` unless ``value`` is True or False."""
    if not isinstance(value, bool):
        raise TypeError(f"{where}: {name} must be True or False, got {shown(value)}")


def some(names: list[str]) -> str:
    """The first few of ``names``, quoted, for a one-line message."""
    return ", ".join(repr(n) for n in names[:5]) + (" ..." if len(names) > 5 else "")
