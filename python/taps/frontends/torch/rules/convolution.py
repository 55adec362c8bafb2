"""Rules for ATen convolutions and pooling of 1, 2 or 3 spatial dims: batch and channels
partitionable, spatial axes whole."""

from __future__ import annotations

from typing import Any

from taps.frontends.torch.builder import AtenValue, constant
from taps.frontends.torch.rules._context import Context, Unsupported, lead, op, tensor_arg


def _spatial(k: int) -> tuple[list[str], list[str], list[str]]:
    """Input, kernel and output labels of ``k`` spatial dims: ``hi wi``, ``kh kw``, ``ho wo``
    for two (as the Graph API's conv2d names them), ``x0i``, ``k0``, ``x0o``, ... otherwise."""
    if k == 2:
        return ["hi", "wi"], ["kh", "kw"], ["ho", "wo"]
    return [f"x{i}i" for i in range(k)], [f"k{i}" for i in range(k)], [f"x{i}o" for i in range(k)]


def groups_position(kind: str) -> int:
    """Where ``groups`` is among the positional arguments of convolution ``kind``."""
    return 8 if kind in ("convolution", "_convolution") else 6


def conv(cx: Context) -> AtenValue:
    """``conv1d``, ``conv2d``, ``conv3d``, ``convolution``: ``x (b, ci, *spatial) * weight (co,
    ci, *kernel) + bias (co)``, a ``conv1d``/``conv2d``/``conv3d`` operator.

    The bias is an addend; batch and channels partitionable, spatial axes whole. With ``groups`` > 1
    the channels are (groups, per group) views, ``x (b, g, ci, ...) * weight (g, co, ci, ...) +
    bias (g, co)``: the groups are a partitionable axis that neither is contracted nor sums partials
    (ResNeXt's grouped and MobileNet's depthwise convolutions). An unbatched input has no ``b``."""
    x, w, bias = tensor_arg(cx, 0, "input"), tensor_arg(cx, 1, "weight"), cx.arg(2, "bias")
    if cx.kind == "convolution" and cx.arg(6, "transposed", False):
        raise Unsupported("a transposed convolution")
    groups = cx.arg(groups_position(cx.kind), "groups", 1)
    k = len(w.shape) - 2
    kind = f"conv{k}d"
    batch = ["b"] if len(x.shape) == k + 2 else []
    si, sk, so = _spatial(k)
    if groups == 1:
        return op(
            cx,
            kind,
            [(x, [*batch, "ci", *si]), (w, ["co", "ci", *sk])],
            [*batch, "co", *so],
            [*batch, "ci", "co"],
            [(bias, ["co"])],
        )
    nb = len(batch)
    cout, per_group = w.shape[:2]
    g, co = groups, cout // groups

    def split(v: AtenValue, what: str, shape: tuple[int, ...], labels: list[str]) -> tuple:
        return cx.b.reshape(v, shape, cx.path, f"{what}_groups"), labels

    inputs = [
        split(
            x, "input", (*x.shape[:nb], g, per_group, *x.shape[nb + 1 :]), [*batch, "g", "ci", *si]
        ),
        split(w, "weight", (g, co, per_group, *w.shape[2:]), ["g", "co", "ci", *sk]),
    ]
    addends = [split(bias, "bias", (g, co), ["g", "co"])] if isinstance(bias, AtenValue) else []
    out = cx.shapes[0]
    grouped = cx.b.op(
        kind,
        cx.path,
        inputs,
        (*out[:nb], g, co, *out[nb + 1 :]),
        [*batch, "g", "co", *so],
        cx.dtypes[0],
        [*batch, "g", "ci", "co"],
        addends=addends,
    )
    return cx.b.reshape(grouped, out, cx.path, "channels")


def pool(cx: Context) -> Any:
    """``max_pool2d``, ``avg_pool1d``, ``adaptive_avg_pool3d``, ...: a ``pool`` operator.

    Batch and channels partitionable, spatial axes whole. An adaptive pooling to the input's own
    size is the identity (torchvision's AlexNet at 224x224)."""
    x = tensor_arg(cx, 0, "self")
    out = cx.shapes[0]
    if cx.kind.startswith("adaptive") and out == x.shape:
        result: Any = x
    else:
        k = int(cx.kind.split("pool")[1][0])  # max_pool2d, adaptive_avg_pool1d, ...
        n = len(x.shape)
        si, _, so = _spatial(k)
        result = op(cx, "pool", [(x, [*lead(n - k), *si])], [*lead(n - k), *so], lead(n - k))
    if len(cx.shapes) > 1:  # (values, indices)
        return [result, constant(cx.shapes[1], 8)]
    return result
