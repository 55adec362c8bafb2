"""The rule for ATen reductions: the reduced dims are contracted axes."""

from __future__ import annotations

from typing import Any

from taps.frontends.torch.builder import AtenValue, constant
from taps.frontends.torch.rules._context import (
    Context,
    elementwise,
    lead,
    norm_dim,
    rowable,
    rows,
    tensor_arg,
    unrows,
)


def reduction(cx: Context) -> Any:
    """``sum``, ``mean``, ``amax``, ``max``, ``var``, ``norm``, ...: one operator of the op's name.

    Reduced dims are contracted axes: split, they leave partial results (an all_reduce).
    ``max``/``min`` of two tensors are elementwise."""
    x = tensor_arg(cx, 0, "self")
    if cx.kind in ("max", "min") and isinstance(cx.arg(1, "other"), AtenValue):
        return elementwise(cx, cx.kind, cx.args)
    n = len(x.shape)
    dims = cx.arg(1, "dim")
    if cx.kind == "norm":
        dims = cx.arg(2, "dim")
    if dims is None or dims == [] or isinstance(dims, float):
        dims = list(range(n))
    dims = {norm_dim(d, n) for d in ([dims] if isinstance(dims, int) else dims)}
    keep = len(cx.shapes[0]) == n  # keepdim: the reduced dims stay, of size 1
    if keep and n == 3 and dims == {2} and rowable(cx, x):  # (batch, seq, h) -> (batch, seq, 1)
        r = rows(cx, x)
        made = cx.b.op(
            cx.kind, cx.path, [(r, ["b", "h"])], (r.shape[0], 1), ["b", "kept"], cx.dtypes[0]
        )
        result: AtenValue = unrows(cx, made)
    else:
        labels = lead(n)
        out_labels = []
        for i, lab in enumerate(labels):
            if i not in dims:
                out_labels.append(lab)
            elif keep:
                out_labels.append(f"kept{i}")
        result = cx.b.op(cx.kind, cx.path, [(x, labels)], cx.shapes[0], out_labels, cx.dtypes[0])
    if len(cx.shapes) > 1:  # (values, indices)
        return [result, constant(cx.shapes[1], 8)]
    return result
