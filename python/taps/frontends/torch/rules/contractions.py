"""Rules for ATen contractions: linear layers, matrix products, einsum and embedding lookups
(a one-hot matmul). Contracted axes may be split, leaving partial sums."""

from __future__ import annotations

import string
from collections.abc import Sequence

from taps.frontends.torch.builder import AtenValue
from taps.frontends.torch.rules._context import (
    Context,
    Unsupported,
    broadcast_labels,
    lead,
    op,
    rowable,
    rows,
    tensor_arg,
    unrows,
)


def linear(cx: Context) -> AtenValue:
    """``linear``: ``x (..., in) @ weight (out, in)^T + bias (out)``; ``x (batch, seq, in)`` as
    rows."""
    x, w, bias = tensor_arg(cx, 0, "input"), tensor_arg(cx, 1, "weight"), cx.arg(2, "bias")
    # The bias is added after the contraction: an addend.
    addends = [(bias, ["out"])] if isinstance(bias, AtenValue) else []
    k = rowable(cx, x)
    if k:
        r = rows(cx, x, k)
        lead_r = lead(len(r.shape) - 1)
        out = cx.b.op(
            "linear",
            cx.path,
            [(r, [*lead_r, "in"]), (w, ["out", "in"])],
            (*r.shape[:-1], cx.shapes[0][-1]),
            [*lead_r, "out"],
            cx.dtypes[0],
            addends=addends,
        )
        return unrows(cx, out)
    labels = lead(len(x.shape) - 1)
    return op(
        cx, "linear", [(x, [*labels, "in"]), (w, ["out", "in"])], [*labels, "out"], None, addends
    )


def mm(cx: Context) -> AtenValue:
    """``mm``: a ``matmul`` ``i k, k j -> i j``."""
    a, c = tensor_arg(cx, 0, "self"), tensor_arg(cx, 1, "mat2")
    return op(cx, "matmul", [(a, ["i", "k"]), (c, ["k", "j"])], ["i", "j"])


def addmm(cx: Context) -> AtenValue:
    """``addmm``: a ``linear`` ``bias + a @ b`` (the bias an addend, broadcast over rows)."""
    bias, a, c = cx.arg(0, "self"), tensor_arg(cx, 1, "mat1"), tensor_arg(cx, 2, "mat2")
    addends: list[tuple[AtenValue | None, Sequence[str]]] = []
    if isinstance(bias, AtenValue) and not bias.constant:
        addends.append((bias, broadcast_labels(bias, ["i", "j"], cx.shapes[0])))
    return op(cx, "linear", [(a, ["i", "k"]), (c, ["k", "j"])], ["i", "j"], None, addends)


def bmm(cx: Context) -> AtenValue:
    """``bmm``: a ``matmul`` ``b i k, b k j -> b i j``."""
    a, c = tensor_arg(cx, 0, "self"), tensor_arg(cx, 1, "mat2")
    return op(cx, "matmul", [(a, ["b", "i", "k"]), (c, ["b", "k", "j"])], ["b", "i", "j"])


def baddbmm(cx: Context) -> AtenValue:
    """``baddbmm``: a ``matmul`` ``b i k, b k j -> b i j`` plus ``self`` broadcast (an addend:
    BLOOM's ALiBi bias added to the attention scores)."""
    bias, a, c = cx.arg(0, "self"), tensor_arg(cx, 1, "batch1"), tensor_arg(cx, 2, "batch2")
    labels = ["b", "i", "j"]
    addends: list[tuple[AtenValue | None, Sequence[str]]] = []
    if isinstance(bias, AtenValue) and not bias.constant:
        addends.append((bias, broadcast_labels(bias, labels, cx.shapes[0])))
    return op(cx, "matmul", [(a, ["b", "i", "k"]), (c, ["b", "k", "j"])], labels, None, addends)


def matmul(cx: Context) -> AtenValue:
    """``matmul``: a ``matmul`` with vectors promoted and batch dims broadcast."""
    a, c = tensor_arg(cx, 0, "self"), tensor_arg(cx, 1, "other")
    out = cx.shapes[0]
    batch = lead(max(len(a.shape), len(c.shape)) - 2)
    if len(a.shape) == 1 and len(c.shape) == 1:
        return op(cx, "matmul", [(a, ["k"]), (c, ["k"])], [])
    a_labels = ["k"] if len(a.shape) == 1 else ["i", "k"]
    c_labels = ["k"] if len(c.shape) == 1 else ["k", "j"]
    out_labels = batch + [lab for lab in ("i", "j") if lab in a_labels + c_labels]
    full = [*batch, "i", "j"]
    sizes = (*out[: len(batch)], 0, 0)

    def with_batch(v: AtenValue, own: list[str]) -> list[str]:
        nb = len(v.shape) - len(own)
        labels = []
        for i in range(nb):
            j = len(batch) - nb + i
            labels.append(full[j] if v.shape[i] == sizes[j] else f"one{j}")
        return labels + own

    return op(
        cx,
        "matmul",
        [(a, with_batch(a, a_labels)), (c, with_batch(c, c_labels))],
        out_labels,
    )


def einsum(cx: Context) -> AtenValue:
    """``einsum``: letters are axes; ``...`` becomes leading axes. Every axis partitionable."""
    equation: str = cx.args[0].replace(" ", "")
    tensors = list(cx.args[1])
    lhs, _, rhs = equation.partition("->")
    specs = lhs.split(",")
    if not _:
        letters = sorted(c for c in set(lhs) if c.isalpha() and lhs.count(c) == 1)
        rhs = ("..." if "..." in lhs else "") + "".join(letters)
    spare = [c for c in string.ascii_letters if c not in equation]
    ell_rank = max(
        (len(t.shape) - len(s.replace("...", "")) for s, t in zip(specs, tensors) if "..." in s),
        default=0,
    )
    ell = spare[:ell_rank]

    def expand(spec: str, rank: int) -> list[str]:
        if "..." not in spec:
            return list(spec)
        head, tail = spec.split("...")
        n = rank - len(head) - len(tail)
        return [*head, *ell[ell_rank - n :], *tail]

    inputs = []
    for spec, t in zip(specs, tensors):
        labels = expand(spec, len(t.shape))
        if len(set(labels)) != len(labels):
            raise Unsupported(f"einsum {equation!r} repeats an index within one operand")
        if isinstance(t, AtenValue) and not t.constant:
            inputs.append((t, labels))
    return op(cx, "einsum", inputs, expand(rhs, len(cx.shapes[0])))


def embedding(cx: Context) -> AtenValue:
    """``embedding``: ``ids (b, s) x table (v, h) -> (b, s, h)``, a one-hot matmul.

    A split vocabulary leaves partial sums."""
    w, ids = tensor_arg(cx, 0, "weight"), tensor_arg(cx, 1, "indices")
    if cx.rows and cx.order() is None and len(ids.shape) == 2 and ids.perm[1] == ids.perm[0] + 1:
        r = rows(cx, ids)
        out = cx.b.op(
            "embedding",
            cx.path,
            [(r, ["b"]), (w, ["v", "h"])],
            (r.shape[0], w.shape[1]),
            ["b", "h"],
            cx.dtypes[0],
        )
        return unrows(cx, out)
    labels = lead(len(ids.shape))
    return op(cx, "embedding", [(ids, labels), (w, ["v", "h"])], [*labels, "h"])
