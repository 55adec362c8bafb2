"""Rules for ATen operators that move, pad or repeat elements: ``pad`` (``constant_pad_nd``),
``roll``, ``repeat`` and ``repeat_interleave``.

A padded or rolled dim is whole (an element's neighbours move across a split); a repeated dim
is seen as (copies, size) or (size, copies), so the tensor's own size stays partitionable and
shared with the input, and the copies are an output axis."""

from __future__ import annotations

from taps.frontends.torch.builder import AtenValue
from taps.frontends.torch.rules._context import (
    Context,
    Unsupported,
    lead,
    norm_dim,
    op,
    tensor_arg,
)


def pad(cx: Context) -> AtenValue:
    """``pad``, ``constant_pad_nd``: nothing if no dim grows or shrinks, else a ``pad``
    operator whose padded dims are whole in the input and axes of their own in the output."""
    x = tensor_arg(cx, 0, "self")
    out = cx.shapes[0]
    if tuple(out) == x.shape:
        return x
    n = len(x.shape)
    labels = lead(n)
    padded = {i for i in range(n) if out[i] != x.shape[i]}
    in_l = [f"{lab}_in" if i in padded else lab for i, lab in enumerate(labels)]
    out_l = [f"{lab}_out" if i in padded else lab for i, lab in enumerate(labels)]
    part = [lab for i, lab in enumerate(labels) if i not in padded]
    return op(cx, "pad", [(x, in_l)], out_l, part)


def roll(cx: Context) -> AtenValue:
    """``roll(x, shifts, dims)``: a ``roll`` operator, the rolled dims whole (all of them
    without ``dims``: the flattened tensor rolls)."""
    x = tensor_arg(cx, 0, "self")
    n = len(x.shape)
    dims = cx.arg(2, "dims", [])
    dims = [dims] if isinstance(dims, int) else list(dims)
    rolled = {norm_dim(d, n) for d in dims} if dims else set(range(n))
    labels = lead(n)
    return op(
        cx, "roll", [(x, labels)], labels, [lab for i, lab in enumerate(labels) if i not in rolled]
    )


def _copies(
    cx: Context, kind: str, x: AtenValue, pieces: list[tuple[int | None, int, str]]
) -> AtenValue:
    """A ``kind`` operator whose output, seen as ``pieces`` (each a dim of ``x`` or ``None``
    for copies, its size, its label), is viewed as the node's output (the pieces merge in
    order)."""
    x_labels = [""] * len(x.shape)
    for i, _size, label in pieces:
        if i is not None:
            x_labels[i] = label
    shape = tuple(size for _, size, _ in pieces)
    made = cx.b.op(
        kind, cx.path, [(x, x_labels)], shape, [lab for _, _, lab in pieces], cx.dtypes[0]
    )
    return cx.b.reshape(made, cx.shapes[0], cx.path, "view")


def repeat(cx: Context) -> AtenValue:
    """``repeat(x, sizes)``: a ``repeat`` operator; a dim repeated r times is (r copies, the
    dim), new leading dims are copies. The input's dims are shared axes."""
    x = tensor_arg(cx, 0, "self")
    reps = list(cx.arg(1, "repeats"))
    new = len(reps) - len(x.shape)
    labels = lead(len(reps))
    pieces: list[tuple[int | None, int, str]] = [
        (None, reps[k], f"{labels[k]}_rep") for k in range(new)
    ]
    for i, size in enumerate(x.shape):
        r, lab = reps[new + i], labels[new + i]
        if r != 1:
            pieces.append((None, r, f"{lab}_rep"))
        pieces.append((i, size, lab))
    return _copies(cx, "repeat", x, pieces)


def repeat_interleave(cx: Context) -> AtenValue:
    """``repeat_interleave(x, r, dim)`` with an integer ``r``: a ``repeat`` operator; ``dim``
    is (the dim, r copies), after flattening without ``dim``. Grouped-query attention's key
    and value heads repeated this way stay split by heads."""
    x = tensor_arg(cx, 0, "self")
    r = cx.arg(1, "repeats")
    if not isinstance(r, int):
        raise Unsupported("repeats given as a tensor")
    dim = cx.arg(2, "dim")
    labels = lead(len(x.shape))
    pieces: list[tuple[int | None, int, str]] = []
    last = len(x.shape) - 1 if dim is None else norm_dim(dim, len(x.shape))
    for i, (size, lab) in enumerate(zip(x.shape, labels)):
        pieces.append((i, size, lab))
        if i == last:
            pieces.append((None, r, f"{lab}_rep"))
    return _copies(cx, "repeat", x, pieces)
