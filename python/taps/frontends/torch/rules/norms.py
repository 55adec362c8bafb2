"""Rules for ATen normalisations and softmax: the dims a statistic is taken over stay whole (but
batch norm's, whose statistics stay per device)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from taps.frontends.torch.builder import AtenValue, constant
from taps.frontends.torch.rules._context import (
    Context,
    dim_labels,
    lead,
    norm_dim,
    op,
    rowable,
    rows,
    tensor_arg,
    unrows,
)


def _norm(
    cx: Context, kind: str, x: AtenValue, params: Sequence[Any], normalized: int
) -> AtenValue:
    """A ``kind`` operator normalising the last ``normalized`` dims of ``x`` (whole), with the
    parameters ``params`` on them; (batch, seq, h) as rows."""
    n = len(x.shape)
    whole = [f"h{i}" if normalized > 1 else "h" for i in range(normalized)]
    ps = [p for p in params if isinstance(p, AtenValue) and not p.constant]
    k = rowable(cx, x) if normalized == 1 else 0
    if k:
        r = rows(cx, x, k)
        row_labels = [*lead(len(r.shape) - 1), "h"]
        row_inputs = [(r, row_labels), *((p, ["h"]) for p in ps)]
        made = cx.b.op(
            kind, cx.path, row_inputs, r.shape, row_labels, cx.dtypes[0], row_labels[:-1]
        )
        return unrows(cx, made)
    labels = [*lead(n - normalized), *whole]
    inputs: list[tuple[AtenValue | None, Sequence[str]]] = [(x, labels)]
    inputs += [(p, labels[n - len(p.shape) :]) for p in ps]
    return op(cx, kind, inputs, labels, labels[: n - normalized])


def layer_norm(cx: Context) -> AtenValue:
    """``layer_norm``: a ``layernorm``, the normalised dims whole, weight and bias on them."""
    x = tensor_arg(cx, 0, "input")
    shape = cx.arg(1, "normalized_shape")
    return _norm(cx, "layernorm", x, [cx.arg(2, "weight"), cx.arg(3, "bias")], len(shape))


def rms_norm(cx: Context) -> AtenValue:
    """``rms_norm``: an ``rmsnorm``, the normalised dims whole, the weight on them."""
    x = tensor_arg(cx, 0, "input")
    shape = cx.arg(1, "normalized_shape")
    return _norm(cx, "rmsnorm", x, [cx.arg(2, "weight")], len(shape))


def group_norm(cx: Context) -> AtenValue:
    """``group_norm``: a ``groupnorm``, channels and spatial dims whole (groups mix channels).

    Only the batch is partitionable."""
    x = tensor_arg(cx, 0, "input")
    labels = ["b", "c", *dim_labels(len(x.shape))[2:]]
    inputs: list[tuple[AtenValue | None, Sequence[str]]] = [(x, labels)]
    for p in (cx.arg(2, "weight"), cx.arg(3, "bias")):
        if isinstance(p, AtenValue) and not p.constant:
            inputs.append((p, ["c"]))
    return op(cx, "groupnorm", inputs, labels, ["b"])


def batch_norm(cx: Context) -> Any:
    """``batch_norm`` (and ``_native_batch_norm_legit_*``): a ``batchnorm`` on ``(b, c, ...)``.

    Per-channel statistics over batch and space: batch and channels partitionable (a split
    batch keeps statistics per device, as data parallelism does), spatial axes whole. Running
    statistics are buffers, not parameters. Without space (``BatchNorm1d`` on ``(b, c)``, a
    1 x 1 map), the batch is viewed as ``(b / 2, 2)`` and only ``b / 2`` splits: a device keeps
    at least two values per channel, since torch trains no BatchNorm on one."""
    x = tensor_arg(cx, 0, "input")
    labels = ["b", "c", *(f"x{i}" for i in range(len(x.shape) - 2))]
    params: list[tuple[AtenValue, Sequence[str]]] = [
        (p, ["c"])
        for p in (cx.arg(1, "weight"), cx.arg(2, "bias"))
        if isinstance(p, AtenValue) and not p.constant
    ]
    if math.prod(x.shape[2:]) == 1 and x.shape[0] % 2 == 0:
        paired = (x.shape[0] // 2, 2, *x.shape[1:])
        pairs = cx.b.op(
            "batchnorm",
            cx.path,
            [(cx.b.reshape(x, paired, cx.path, "pairs"), ["b", "r", *labels[1:]]), *params],
            paired,
            ["b", "r", *labels[1:]],
            cx.dtypes[0],
            ["b", "c"],
        )
        out = cx.b.reshape(pairs, cx.shapes[0], cx.path, "samples")
    else:
        out = op(cx, "batchnorm", [(x, labels), *params], labels, ["b", "c"])
    if len(cx.shapes) > 1:  # (out, mean, invstd, ...): statistics only feed the buffers
        return [out, *(constant(s, d) for s, d in zip(cx.shapes[1:], cx.dtypes[1:]))]
    return out


def softmax(cx: Context) -> AtenValue:
    """``softmax``, ``log_softmax`` (and ``_softmax``, ...): one operator, the normalised dim
    whole."""
    x = tensor_arg(cx, 0, "self")
    n = len(x.shape)
    d = norm_dim(cx.arg(1, "dim"), n)
    labels = lead(n)
    kind = "log_softmax" if "log" in cx.kind else "softmax"
    return op(cx, kind, [(x, labels)], labels, [lab for i, lab in enumerate(labels) if i != d])
