"""Rules for ATen indexing: ``index`` (advanced indexing), ``index_select``, ``gather`` and the
writes ``index_put``, ``index_add``, ``scatter`` and ``scatter_add``.

Which elements are read or written depends on index values, so an indexed dim of the tensor
read from (or written into) is whole: every device holds all of it. Every other dim may be
split. The axes that come from the index tensors may be split too: a device reading a slice of
the indices from the whole indexed dims computes its slice of the result. Index tensors are
inputs of the operator when they are graph tensors (token ids; no gradient), else constants.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from taps.frontends.torch.builder import AtenValue
from taps.frontends.torch.rules._context import (
    Context,
    Unsupported,
    broadcast_labels,
    lead,
    norm_dim,
    op,
    tensor_arg,
)


def _present(v: Any) -> AtenValue | None:
    """``v`` if it is a graph tensor (an operand), else ``None`` (a constant, a scalar)."""
    return v if isinstance(v, AtenValue) and not v.constant else None


def _broadcast(shapes: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    """The broadcast shape of ``shapes`` (torch's rule: aligned from the right)."""
    rank = max((len(s) for s in shapes), default=0)
    out = [1] * rank
    for s in shapes:
        for i, size in enumerate(s):
            j = rank - len(s) + i
            if size != 1:
                if out[j] not in (1, size):
                    raise Unsupported(f"index tensors of shapes {list(shapes)} do not broadcast")
                out[j] = size
    return tuple(out)


class _Advanced:
    """``x[indices]`` with ``indices`` one entry per leading dim of ``x`` (``None``: the whole
    dim): the labels of ``x``, of the result and of the live index tensors."""

    def __init__(self, x: AtenValue, indices: Sequence[Any]) -> None:
        n = len(x.shape)
        labels = lead(n)
        self.at = [i for i, t in enumerate(indices) if t is not None]
        if not self.at or any(not isinstance(indices[i], AtenValue) for i in self.at):
            raise Unsupported("an index that is not a tensor")
        tensors = [indices[i] for i in self.at]
        shape = _broadcast([t.shape for t in tensors])
        idx = [f"i{k}" for k in range(len(shape))]
        self.x_labels = [f"{lab}_idx" if i in self.at else lab for i, lab in enumerate(labels)]
        self.kept = [lab for i, lab in enumerate(labels) if i not in self.at]
        first, last = self.at[0], self.at[-1]
        if self.at == list(range(first, last + 1)):  # together: the index dims go in their place
            self.out_labels = [*labels[:first], *idx, *labels[last + 1 :]]
            self.out_shape = (*x.shape[:first], *shape, *x.shape[last + 1 :])
        else:  # apart: the index dims go first (numpy's rule)
            rest = [i for i in range(n) if i not in self.at]
            self.out_labels = [*idx, *(labels[i] for i in rest)]
            self.out_shape = (*shape, *(x.shape[i] for i in rest))
        self.index_inputs = [
            (t, broadcast_labels(t, idx, shape)) for t in tensors if _present(t) is not None
        ]


def index(cx: Context) -> AtenValue:
    """``index`` (``x[i, j]``, ``x[:, idx]``): an ``index`` operator.

    The indexed dims of ``x`` are whole; its other dims and the dims of the (broadcast) index
    tensors are axes of the result, all partitionable."""
    x = tensor_arg(cx, 0, "self")
    adv = _Advanced(x, list(cx.arg(1, "indices")))
    if adv.out_shape != tuple(cx.shapes[0]):  # a boolean mask: a data-dependent shape
        raise Unsupported("an index by a boolean mask")
    inputs = [(_present(x), adv.x_labels), *adv.index_inputs]
    return op(cx, "index", inputs, adv.out_labels, adv.out_labels)


def index_select(cx: Context) -> AtenValue:
    """``index_select(x, dim, index)``: an ``index`` operator with one index tensor at ``dim``."""
    x = tensor_arg(cx, 0, "self")
    dim = norm_dim(cx.arg(1, "dim"), len(x.shape))
    ids = tensor_arg(cx, 2, "index")
    adv = _Advanced(x, [None] * dim + [ids])
    inputs = [(_present(x), adv.x_labels), *adv.index_inputs]
    return op(cx, "index", inputs, adv.out_labels, adv.out_labels)


def gather(cx: Context) -> AtenValue:
    """``gather(x, dim, index)``: a ``gather`` operator, ``out[..., j, ...] = x[..., index[...,
    j, ...], ...]`` along ``dim``.

    The result has the index's shape and labels. ``dim`` of ``x`` is whole, and the result
    may be split along it. Any other dim where the index is shorter than ``x`` (it reads a
    prefix) is whole everywhere: position ``j`` of the index reads row ``j`` of ``x``, so
    neither can be split apart from the other."""
    x = tensor_arg(cx, 0, "self")
    n = len(x.shape)
    dim = norm_dim(cx.arg(1, "dim"), n)
    ids = tensor_arg(cx, 2, "index")
    labels = lead(n)
    x_labels = [
        f"{lab}_src" if i == dim or x.shape[i] != ids.shape[i] else lab
        for i, lab in enumerate(labels)
    ]
    part = [lab for i, lab in enumerate(labels) if i == dim or x.shape[i] == ids.shape[i]]
    inputs = [(_present(x), x_labels), (_present(ids), labels)]
    return op(cx, "gather", inputs, labels, part)


def _written(cx: Context, kind: str, target: AtenValue, writes: list, whole: set[int]) -> Any:
    """An operator of ``kind`` whose output is ``target`` with ``writes`` (operands and their
    labels) written into it; the dims ``whole`` of ``target`` stay whole."""
    labels = lead(len(target.shape))
    part = [lab for i, lab in enumerate(labels) if i not in whole]
    inputs = [(_present(target), labels), *((_present(v), lab) for v, lab in writes)]
    return op(cx, kind, inputs, labels, part)


def index_put(cx: Context) -> AtenValue:
    """``index_put(x, indices, values)`` (``x[i] = v``, ``x[i] += v``): an ``index_put``
    operator with ``x``'s shape.

    The indexed dims are whole; the values are read against ``x[indices]`` (their index dims
    whole too), so the other dims are shared with ``x`` and partitionable."""
    x = tensor_arg(cx, 0, "self")
    adv = _Advanced(x, list(cx.arg(1, "indices")))
    values = cx.arg(2, "values")
    writes = list(adv.index_inputs)
    if _present(values) is not None:
        v_labels = broadcast_labels(values, adv.out_labels, adv.out_shape)
        writes.append((values, v_labels))
    return _written(cx, "index_put", x, writes, set(adv.at))


def index_add(cx: Context) -> AtenValue:
    """``index_add(x, dim, index, source)``: an ``index_add`` operator with ``x``'s shape;
    ``dim`` whole, ``source``'s other dims shared with ``x``."""
    x = tensor_arg(cx, 0, "self")
    n = len(x.shape)
    dim = norm_dim(cx.arg(1, "dim"), n)
    ids, source = cx.arg(2, "index"), cx.arg(3, "source")
    labels = lead(n)
    src_labels = ["i0" if i == dim else lab for i, lab in enumerate(labels)]
    writes = [(ids, ["i0"]), (source, src_labels)]
    return _written(cx, "index_add", x, writes, {dim})


def scatter(cx: Context) -> AtenValue:
    """``scatter``, ``scatter_add``, ``scatter_reduce``: an operator of the op's name with
    ``x``'s shape, writing ``src`` at ``index`` along ``dim``.

    ``dim`` is whole, as is any dim where the index is shorter than ``x``; the index and
    ``src`` share the other dims with ``x``."""
    x = tensor_arg(cx, 0, "self")
    n = len(x.shape)
    dim = norm_dim(cx.arg(1, "dim"), n)
    ids = tensor_arg(cx, 2, "index")
    src = cx.arg(3, "src")
    labels = lead(n)
    whole = {i for i in range(n) if i == dim or ids.shape[i] != x.shape[i]}
    idx_labels = [f"{lab}_src" if i in whole else lab for i, lab in enumerate(labels)]
    writes: list = [(ids, idx_labels)]
    if isinstance(src, AtenValue):
        if src.shape != ids.shape:  # src larger than the index: only its prefix is read
            raise Unsupported("a scatter whose source is larger than its index")
        writes.append((src, idx_labels))
    return _written(cx, cx.kind, x, writes, whole)
