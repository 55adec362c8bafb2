"""The time limit of a search as a point on the ``time.perf_counter()`` clock, checked between
the steps of every stage (enumeration, cost tables, reductions, pruning, the ILP build), so that
``time_limit`` bounds the whole search rather than SCIP alone (docs/errors.md)."""

from __future__ import annotations

import time

from taps.errors import TimeLimitError


def left(deadline: float | None) -> float | None:
    """The seconds left before ``deadline`` (never negative); None without one."""
    return None if deadline is None else max(deadline - time.perf_counter(), 0.0)


def passed(deadline: float | None) -> bool:
    """Whether ``deadline`` has passed (never, without one)."""
    return deadline is not None and time.perf_counter() > deadline


def check(deadline: float | None, stage: str) -> None:
    """Raise :class:`taps.errors.TimeLimitError` naming ``stage`` if ``deadline`` has passed."""
    if passed(deadline):
        raise TimeLimitError(f"the time limit ran out while {stage}")
