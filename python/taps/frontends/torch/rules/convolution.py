"""Rules for ATen convolutions and pooling: batch and channels partitionable, spatial axes
whole."""

from __future__ import annotations

from typing import Any

from taps.frontends.torch.builder import AtenValue, constant
from taps.frontends.torch.rules._context import Context, lead, op, tensor_arg


def conv2d(cx: Context) -> AtenValue:
    """``conv2d``: ``x (b, ci, h, w) * weight (co, ci, kh, kw) + bias (co)``, a ``conv2d``.

    The bias is an addend; batch and channels partitionable, spatial axes whole. With ``groups`` > 1
    the channels are (groups, per group) views, ``x (b, g, ci, h, w) * weight (g, co, ci, kh, kw) +
    bias (g, co)``: the groups are a partitionable axis that neither is contracted nor sums partials
    (ResNeXt's grouped and MobileNet's depthwise convolutions)."""
    x, w, bias = tensor_arg(cx, 0, "input"), tensor_arg(cx, 1, "weight"), cx.arg(2, "bias")
    groups = cx.arg(6, "groups", 1)
    if groups == 1:
        return op(
            cx,
            "conv2d",
            [(x, ["b", "ci", "hi", "wi"]), (w, ["co", "ci", "kh", "kw"])],
            ["b", "co", "ho", "wo"],
            ["b", "ci", "co"],
            [(bias, ["co"])],
        )
    b, _, h, wi = x.shape
    cout, per_group, kh, kw = w.shape
    g, co = groups, cout // groups

    def split(v: AtenValue, what: str, shape: tuple[int, ...], labels: list[str]) -> tuple:
        return cx.b.reshape(v, shape, cx.path, f"{what}_groups"), labels

    inputs = [
        split(x, "input", (b, g, per_group, h, wi), ["b", "g", "ci", "hi", "wi"]),
        split(w, "weight", (g, co, per_group, kh, kw), ["g", "co", "ci", "kh", "kw"]),
    ]
    addends = [split(bias, "bias", (g, co), ["g", "co"])] if isinstance(bias, AtenValue) else []
    out = cx.shapes[0]
    grouped = cx.b.op(
        "conv2d",
        cx.path,
        inputs,
        (out[0], g, co, *out[2:]),
        ["b", "g", "co", "ho", "wo"],
        cx.dtypes[0],
        ["b", "g", "ci", "co"],
        addends=addends,
    )
    return cx.b.reshape(grouped, out, cx.path, "channels")


def pool2d(cx: Context) -> Any:
    """``max_pool2d``, ``avg_pool2d``, ``adaptive_*_pool2d``, ...: a ``pool`` operator.

    Batch and channels partitionable, spatial axes whole. An adaptive pooling to the input's own
    size is the identity (torchvision's AlexNet at 224x224)."""
    x = tensor_arg(cx, 0, "self")
    out = cx.shapes[0]
    if cx.kind.startswith("adaptive") and out == x.shape:
        result: Any = x
    else:
        n = len(x.shape)
        labels_in = [*lead(n - 2), "hi", "wi"]
        labels_out = [*lead(n - 2), "ho", "wo"]
        result = op(cx, "pool", [(x, labels_in)], labels_out, lead(n - 2))
    if len(cx.shapes) > 1:  # (values, indices)
        return [result, constant(cx.shapes[1], 8)]
    return result
