"""Rules for ATen splits and slices: ``split``, ``chunk``, ``unbind``, ``select``, ``slice`` and
the ``getitem`` that reads a piece. A split makes no operator until a piece is read."""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from taps.frontends.torch.builder import AtenValue, constant
from taps.frontends.torch.rules._context import (
    Context,
    from_rows,
    lead,
    norm_dim,
    rowable,
    rows,
    tensor_arg,
    unrows,
)


@dataclass(frozen=True)
class Pieces:
    """The outputs of a split along ``dim`` at ``bounds``; each piece becomes an operator when
    something reads it. Equal pieces read ``chunks``, a view with the dim as (pieces, size)."""

    value: AtenValue
    dim: int
    bounds: tuple[int, ...]
    chunks: AtenValue | None


def _take(cx: Context, v: AtenValue, dim: int, start: int, stop: int, kind: str) -> AtenValue:
    """``v`` narrowed to ``[start, stop)`` along ``dim``: an operator whose input dim is whole
    and whose output dim is its own axis (on rows when the dim is not batch or seq)."""
    k = rowable(cx, v)
    if k and dim >= k:
        return unrows(cx, _take(_Rowless(cx, k), rows(cx, v, k), dim - k + 1, start, stop, kind))
    n = len(v.shape)
    labels = lead(n)
    in_l = [f"{lab}_in" if i == dim else lab for i, lab in enumerate(labels)]
    out_l = [f"{lab}_out" if i == dim else lab for i, lab in enumerate(labels)]
    shape = list(v.shape)
    shape[dim] = stop - start
    part = [lab for i, lab in enumerate(labels) if i != dim]
    return cx.b.op(kind, cx.path, [(v, in_l)], shape, out_l, cx.dtypes[0], part, cx.order())


def _select(cx: Context, v: AtenValue, dim: int, kind: str) -> AtenValue:
    """One index of ``dim``: the dim is a whole axis the output lacks. If ``v`` views an
    operator's output of which ``dim`` is one factor, the operator is factored first (so a fused
    QKV projection can still be split by heads)."""
    if v.constant:
        return constant(v.shape[:dim] + v.shape[dim + 1 :], v.dtype_bytes)
    cx.b.factor(v, dim, cx.path)
    if (
        dim >= 2
        and cx.rows
        and cx.order() is None
        and len(v.shape) == len(cx.shapes[0]) + 1 >= 3
        and v.shape[:2] == cx.shapes[0][:2]
        and v.perm[1] == v.perm[0] + 1
        and (len(v.shape) == 3 or from_rows(cx, v))
    ):
        return unrows(cx, _select(_Rowless(cx), rows(cx, v), dim - 1, kind))
    n = len(v.shape)
    labels = lead(n)
    in_l = [f"{lab}_sel" if i == dim else lab for i, lab in enumerate(labels)]
    out_l = [lab for i, lab in enumerate(labels) if i != dim]
    shape = v.shape[:dim] + v.shape[dim + 1 :]
    # A piece of a split reads the pieces' dim whole, as its producer keeps it (factor): split
    # there, every device but one would read zeros and the piece be partial sums, all-reduced.
    # A ``select`` keeps the dim partitionable (x[:, 0] of a tensor split by sequence).
    part = out_l if kind == "split" else None
    return cx.b.op(kind, cx.path, [(v, in_l)], shape, out_l, cx.dtypes[0], part, cx.order())


class _Rowless:
    """The context of a node already seen as rows (its first ``k`` dims): no second merge, and
    the rows shape."""

    def __init__(self, cx: Context, k: int = 2) -> None:
        self._cx = cx
        out = cx.shapes[0]
        self.shapes = [(math.prod(out[:k]), *out[k:])]
        self.rows = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cx, name)

    def order(self) -> None:
        return None


def _piece(cx: Context, p: Pieces, i: int) -> AtenValue:
    """Piece ``i`` of ``p``: a ``split`` operator (nothing for a constant)."""
    start, stop = p.bounds[i], p.bounds[i + 1]
    if p.chunks is not None:
        return _select(cx, p.chunks, p.dim, "split")
    if p.value.constant:
        shape = list(p.value.shape)
        shape[p.dim] = stop - start
        return constant(shape, p.value.dtype_bytes)
    cx.b.factor(p.value, p.dim, cx.path)
    return _take(cx, p.value, p.dim, start, stop, "split")


def _split(cx: Context, sizes: Sequence[int], dim: int) -> Pieces:
    """The node's tensor argument split along ``dim`` into pieces of ``sizes``."""
    v = tensor_arg(cx, 0, "self")
    bounds = [0]
    for s in sizes:
        bounds.append(bounds[-1] + s)
    chunks = None
    if len(sizes) > 1 and len(set(sizes)) == 1:
        shape = (*v.shape[:dim], len(sizes), sizes[0], *v.shape[dim + 1 :])
        chunks = cx.b.reshape(v, shape, cx.path, "chunks")
    return Pieces(v, dim, tuple(bounds), chunks)


def split(cx: Context) -> Pieces:
    """``split``, ``split_with_sizes``: pieces of the given sizes along ``dim``."""
    v = tensor_arg(cx, 0, "self")
    size = cx.arg(1, "split_size")
    dim = norm_dim(cx.arg(2, "dim", 0), len(v.shape))
    if isinstance(size, int):
        total = v.shape[dim]
        sizes = [min(size, total - s) for s in range(0, total, size)]
    else:
        sizes = list(size)
    return _split(cx, sizes, dim)


def chunk(cx: Context) -> Pieces:
    """``chunk``: pieces of the node's output sizes along ``dim``."""
    v = tensor_arg(cx, 0, "self")
    dim = norm_dim(cx.arg(2, "dim", 0), len(v.shape))
    return _split(cx, [s[dim] for s in cx.shapes], dim)


def unbind(cx: Context) -> Pieces:
    """``unbind``: pieces of size 1 along ``dim``, each read by a ``select``."""
    v = tensor_arg(cx, 0, "self")
    dim = norm_dim(cx.arg(1, "dim", 0), len(v.shape))
    return Pieces(v, dim, tuple(range(v.shape[dim] + 1)), v)


def select(cx: Context) -> AtenValue:
    """``select``: one index of a dim, a ``select`` operator (the dim whole in its input)."""
    v = tensor_arg(cx, 0, "self")
    return _select(cx, v, norm_dim(cx.args[1], len(v.shape)), "select")


def slice_(cx: Context) -> AtenValue:
    """``slice``, ``narrow``: nothing for the whole dim, else a ``slice`` (the dim whole in its
    input)."""
    v = tensor_arg(cx, 0, "self")
    n = len(v.shape)
    dim = norm_dim(cx.arg(1, "dim", 0), n)
    out = cx.shapes[0]
    if out == v.shape:
        return v
    return _take(cx, v, dim, 0, out[dim], "slice")


def getitem(cx: Context) -> Any:
    """``getitem``: a piece of a split (:class:`Pieces`), or an element of a tuple output."""
    seq, i = cx.args[0], cx.args[1]
    if isinstance(seq, Pieces):
        return _piece(cx, seq, i)
    return operator.getitem(seq, i)
