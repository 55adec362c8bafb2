"""What every ATen rule is written in: the :class:`Context` a rule reads its node from, the
:class:`Unsupported` it raises, and the labelling helpers the rule families share.

A rule reads its arguments from the context, labels every dim of every operand and of the output
with an axis, and builds operators through the builder; it returns the value of the node (an
:class:`~taps.frontends.torch.builder.AtenValue`, a list of them, or a Python value).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from taps.frontends.torch.builder import AtenGraphBuilder, AtenValue


class Unsupported(Exception):
    """A rule cannot convert this use of its operator; the message says why."""


class Context(Protocol):
    """What a rule sees of the node it converts."""

    b: AtenGraphBuilder
    kind: str  # the operator's name without overload (``add`` for ``aten.add_.Tensor``)
    path: str  # the module path of the node
    args: list[Any]
    kwargs: dict[str, Any]
    shapes: list[tuple[int, ...]]  # of each tensor output
    dtypes: list[int]  # bytes per element (per real part) of each tensor output
    complex_out: bool
    rows: bool  # see (batch, seq, ...) tensors as (batch * seq, ...) rows (:func:`rowable`)

    def arg(self, i: int, name: str, default: Any = None) -> Any:
        """Argument ``i`` (positional), else keyword ``name``, else ``default``."""
        ...

    def order(self) -> list[int] | None:
        """The dims of the output in the order the transposes that read it want, if any."""
        ...


#: A rule: the value of the node its context describes.
Rule = Callable[[Context], Any]


def lead(n: int) -> list[str]:
    """Readable labels for ``n`` leading dims."""
    return list("bstu")[:n] if n <= 4 else dim_labels(n)


def dim_labels(rank: int) -> list[str]:
    """Labels ``d0``, ``d1``, ... for ``rank`` dims."""
    return [f"d{i}" for i in range(rank)]


def norm_dim(d: int, rank: int) -> int:
    """Dim ``d`` (negative from the end) as a position among ``rank`` dims."""
    return d % rank if rank else 0


def live(values: Sequence[Any]) -> list[AtenValue]:
    """The values among ``values`` that are graph tensors (not constants, not Python values)."""
    return [v for v in values if isinstance(v, AtenValue) and not v.constant]


def flat(args: Sequence[Any]) -> list[Any]:
    """``args`` with its lists and tuples opened, recursively."""
    out: list[Any] = []
    for a in args:
        if isinstance(a, (list, tuple)):
            out.extend(flat(a))
        else:
            out.append(a)
    return out


def broadcast_labels(
    v: AtenValue, out_labels: Sequence[str], out_shape: Sequence[int]
) -> list[str]:
    """Labels for ``v`` broadcast against the output: aligned from the right; a dim of size 1
    facing a larger one gets a label of its own (a whole axis of size 1)."""
    offset = len(out_shape) - len(v.shape)
    labels = []
    for i, size in enumerate(v.shape):
        j = i + offset
        labels.append(out_labels[j] if size == out_shape[j] else f"one{j}")
    return labels


def rowable(cx: Context, v: AtenValue) -> int:
    """How many leading dims of ``v``, an operand of a node whose output no transpose reads,
    can be seen as one rows dim (0: none). They are the output's leading dims and follow each
    other in ``v``'s graph tensor; two of them (batch, seq) when the output has rank 3 (batch,
    seq, features), else as many as make the rows of the graph tensor behind ``v`` (the heads of
    a projection's output; not the channels and pixels of a convolution's), dims of size 1
    included: DeepSeek-V3's latent ``(batch, 1, seq, rank)`` is rows."""
    out = cx.shapes[0]
    if not (cx.rows and len(out) >= 3 and cx.order() is None and len(v.shape) == len(out)):
        return 0
    for k in range(2, len(out)):
        if v.shape[:k] != out[:k] or v.perm[k - 1] != v.perm[k - 2] + 1:
            return 0
        if len(out) == 3 or from_rows(cx, v, k):
            return k
    return 0


def from_rows(cx: Context, v: AtenValue, k: int = 2) -> bool:
    """Whether the graph tensor behind ``v`` has rows first that ``v``'s first ``k`` dims make."""
    return v.tensor is None or cx.b.shape(cx.b.root(v.tensor))[0] == math.prod(v.shape[:k])


def rows(cx: Context, v: AtenValue, k: int = 2) -> AtenValue:
    """``v`` with its first ``k`` dims (batch, seq) seen as one rows dim (a view)."""
    return cx.b.reshape(v, (math.prod(v.shape[:k]), *v.shape[k:]), cx.path, "rows")


def unrows(cx: Context, out: AtenValue) -> AtenValue:
    """An operator's rows output seen with the node's (batch, seq) dims again (a view)."""
    return cx.b.reshape(out, cx.shapes[0], cx.path, "view")


def elementwise(cx: Context, kind: str, values: Sequence[Any]) -> AtenValue:
    """An elementwise operator over the live tensors among ``values`` (constants are computed
    on every device and need no operand), broadcast to the output shape; every axis
    partitionable but a complex tensor's real/imaginary pair. A (batch, seq, ...) operator
    sees (batch * seq, ...) rows, as Megatron-LM's 2-D matmuls do."""
    shape = cx.shapes[0]
    values = live(values)
    hidden = (2,) if cx.complex_out else ()
    k = _common_rows(cx, values)
    if values and k:
        shape2 = (math.prod(shape[:k]), *shape[k:])
        operands = [rows(cx, v, k) if len(v.shape) == len(shape) else v for v in values]
        labels = lead(len(shape2))
        inputs = [(v, broadcast_labels(v, labels, shape2)) for v in operands]
        made = cx.b.op(kind, cx.path, inputs, shape2, labels, cx.dtypes[0], hidden=hidden)
        return unrows(cx, made)
    labels = lead(len(shape))
    inputs = [(v, broadcast_labels(v, labels, shape)) for v in values]
    return cx.b.op(
        kind, cx.path, inputs, shape, labels, cx.dtypes[0], order=cx.order(), hidden=hidden
    )


def _common_rows(cx: Context, values: Sequence[AtenValue]) -> int:
    """The leading dims that every operand of the output's rank sees as rows (:func:`rowable`;
    two if there is none), if the others are broadcast within the remaining dims; else 0."""
    n = len(cx.shapes[0])
    ks = {rowable(cx, v) for v in values if len(v.shape) == n}
    k = ks.pop() if len(ks) == 1 else 0 if ks else 2
    return k if all(len(v.shape) in (n, *range(n - k + 1)) for v in values) else 0


def tensor_arg(cx: Context, i: int, name: str) -> AtenValue:
    """Argument ``i`` or ``name``, which must be a tensor."""
    v = cx.arg(i, name)
    if not isinstance(v, AtenValue):
        raise Unsupported(f"argument {name} is not a tensor")
    return v


def op(
    cx: Context,
    kind: str,
    inputs: Sequence[tuple[AtenValue | None, Sequence[str]]],
    out_labels: Sequence[str],
    partitionable: Sequence[str] | None = None,
    addends: Sequence[tuple[AtenValue | None, Sequence[str]]] = (),
) -> AtenValue:
    """An operator of the node's (first) output shape; ``None`` inputs and addends (absent
    optional arguments, such as a missing bias) are left out."""
    return cx.b.op(
        kind,
        cx.path,
        [(v, labels) for v, labels in inputs if v is not None],
        cx.shapes[0],
        out_labels,
        cx.dtypes[0],
        partitionable,
        cx.order(),
        addends=[(v, labels) for v, labels in addends if v is not None],
    )
