"""Rules for ATen joins and broadcasts: ``cat``, ``stack`` and ``expand``."""

from __future__ import annotations

from taps.frontends.torch.builder import AtenValue
from taps.frontends.torch.rules._context import (
    Context,
    broadcast_labels,
    lead,
    live,
    norm_dim,
    tensor_arg,
)


def cat(cx: Context) -> AtenValue:
    """``cat``, ``concat``, ``concatenate``: a ``cat`` operator.

    The joined dim is an axis of its own in every operand (whole); other dims are shared."""
    tensors = [t for t in cx.args[0] if isinstance(t, AtenValue)]
    out = cx.shapes[0]
    n = len(out)
    dim = norm_dim(cx.arg(1, "dim", 0), n)
    labels = lead(n)
    inputs = []
    for k, t in enumerate(tensors):
        if t.constant or t.shape[dim] == 0:
            continue
        inputs.append((t, [f"{lab}_{k}" if i == dim else lab for i, lab in enumerate(labels)]))
    out_l = [f"{lab}_cat" if i == dim else lab for i, lab in enumerate(labels)]
    part = [lab for i, lab in enumerate(labels) if i != dim]
    return cx.b.op("cat", cx.path, inputs, out, out_l, cx.dtypes[0], part, cx.order())


def stack(cx: Context) -> AtenValue:
    """``stack``: a ``stack`` operator whose new dim is an output axis."""
    tensors = live(cx.args[0])
    out = cx.shapes[0]
    dim = norm_dim(cx.arg(1, "dim", 0), len(out))
    labels = lead(len(out))
    own = [lab for i, lab in enumerate(labels) if i != dim]
    part = own
    return cx.b.op(
        "stack", cx.path, [(t, own) for t in tensors], out, labels, cx.dtypes[0], part, cx.order()
    )


def expand(cx: Context) -> AtenValue:
    """``expand``, ``expand_as``, ``broadcast_to``: nothing if the shape stays, else an
    ``expand`` operator whose new or grown dims are output-only axes."""
    v = tensor_arg(cx, 0, "self")
    out = cx.shapes[0]
    if tuple(out) == v.shape:
        return v
    labels = lead(len(out))
    return cx.b.op(
        "expand",
        cx.path,
        [(v, broadcast_labels(v, labels, out))],
        out,
        labels,
        cx.dtypes[0],
        order=cx.order(),
    )
