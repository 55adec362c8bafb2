"""Rules for ATen operators that make no operator: aliases, copies, dtype changes, dropout and
runtime assertions."""

from __future__ import annotations

from typing import Any

from taps.frontends.torch.builder import AtenValue, constant
from taps.frontends.torch.rules._context import Context, elementwise


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


def copy(cx: Context) -> Any:
    """``copy_(dst, src)`` (a slice assignment ``x[:, 1:] = y``): ``src`` broadcast to
    ``dst``'s shape, an elementwise ``copy`` (a constant if ``src`` is one). The node's value
    is what later readers of the node see; a tensor that ``dst`` is a view of keeps its earlier
    value (the front end does not follow writes through views)."""
    src = cx.arg(1, "src")
    if not isinstance(src, AtenValue) or src.constant:
        return constant(cx.shapes[0], cx.dtypes[0])
    return elementwise(cx, "copy", [src])
