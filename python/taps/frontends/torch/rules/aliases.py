"""Rules for ATen operators that make no operator: aliases, copies, dtype changes, dropout and
runtime assertions."""

from __future__ import annotations

from typing import Any

from taps.frontends.torch.builder import constant
from taps.frontends.torch.rules._context import Context


def free(cx: Context) -> Any:
    """``clone``, ``contiguous``, ``detach``, ``_to_copy``, ``dropout``, ...: the first argument.

    No data moves between devices (a dtype change keeps the graph tensor, whose element size is
    the producer's)."""
    return cx.args[0]


def native_dropout(cx: Context) -> Any:
    """``native_dropout``: its input unchanged, and its mask a constant."""
    return [cx.args[0], constant(cx.shapes[1], 1)]


def no_value(cx: Context) -> None:
    """``_assert_scalar``, ``_assert_async``, ``sym_constrain_range_for_size``: nothing."""
    return None
