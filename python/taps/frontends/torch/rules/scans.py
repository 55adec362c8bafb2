"""Rules for ATen operators along one dim whose every result reads the whole dim: scans
(``cumsum``), sorts (``sort``, ``argsort``, ``topk``) and arg-reductions (``argmax``,
``argmin``). That dim is whole; every other dim may be split."""

from __future__ import annotations

from typing import Any

from taps.frontends.torch.builder import AtenValue
from taps.frontends.torch.rules._context import Context, lead, norm_dim, op, tensor_arg


def _along(cx: Context, kind: str, x: AtenValue, dim: int) -> AtenValue:
    """A ``kind`` operator of ``x``'s shape, ``dim`` whole."""
    labels = lead(len(x.shape))
    return op(cx, kind, [(x, labels)], labels, [lab for i, lab in enumerate(labels) if i != dim])


def scan(cx: Context) -> AtenValue:
    """``cumsum``, ``cumprod``, ``logcumsumexp``: an operator of the op's name, ``dim``
    whole."""
    x = tensor_arg(cx, 0, "self")
    return _along(cx, cx.kind, x, norm_dim(cx.arg(1, "dim"), len(x.shape)))


def sort(cx: Context) -> Any:
    """``sort`` (values, indices) and ``argsort`` (indices): a ``sort`` operator, and for the
    indices an ``argsort`` operator, ``dim`` whole."""
    x = tensor_arg(cx, 0, "self")
    dim = norm_dim(cx.arg(1, "dim", -1), len(x.shape))
    if cx.kind == "argsort":
        return _along(cx, "argsort", x, dim)
    return [_along(cx, "sort", x, dim), _along(cx, "argsort", x, dim)]


def topk(cx: Context) -> list[AtenValue]:
    """``topk(x, k, dim)``: a ``topk`` operator (values) and a ``topk_indices`` operator; ``dim``
    whole in ``x``, the ``k`` best an output axis of its own (partitionable with the rest)."""
    x = tensor_arg(cx, 0, "self")
    n = len(x.shape)
    dim = norm_dim(cx.arg(2, "dim", -1), n)
    labels = lead(n)
    in_l = [f"{lab}_in" if i == dim else lab for i, lab in enumerate(labels)]
    out_l = [f"{lab}_k" if i == dim else lab for i, lab in enumerate(labels)]
    return [op(cx, kind, [(x, in_l)], out_l, out_l) for kind in ("topk", "topk_indices")]


def arg_reduction(cx: Context) -> AtenValue:
    """``argmax``, ``argmin``: an operator of the op's name whose reduced dim (all of them
    without ``dim``) is whole in its input: an index is not a partial result to combine."""
    x = tensor_arg(cx, 0, "self")
    n = len(x.shape)
    dim = cx.arg(1, "dim")
    keep = bool(cx.arg(2, "keepdim", False))
    labels = lead(n)
    reduced = set(range(n)) if dim is None else {norm_dim(dim, n)}
    if dim is None:
        out_l = [f"kept{i}" for i in range(n)] if keep else []
    else:
        out_l = [
            f"kept{i}" if i in reduced else lab
            for i, lab in enumerate(labels)
            if keep or i not in reduced
        ]
    part = [lab for i, lab in enumerate(labels) if i not in reduced]
    return op(cx, cx.kind, [(x, labels)], out_l, part)
