"""The records of the graph IR: tensors, operands, operators (einsums over named axes) and edges,
and the value checks every way of building a graph shares."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from numbers import Integral
from typing import Any

from taps._core import GraphError
from taps._support.arguments import shown

TENSOR_KINDS = ("input", "parameter", "activation", "view")
#: The kind of the operator through which every use reads a parameter used more than once
#: (:meth:`taps.graph.ir.GraphIR.share_parameters`).
SHARE = "share"
#: The kinds of a mixture-of-experts block's operators in the GShard form (docs/moe.md): the
#: routing tensor (``gse -> gsec``), the dispatch (``gsec,gsm -> egcm``) and the combine
#: (``gsec,egcm -> gsm``), gathers whose first input is the routing tensor, and the experts'
#: projections (``egcm,emh -> egch``), whose ``e`` is the expert axis.
MOE_ROUTE, MOE_DISPATCH, MOE_COMBINE, MOE_EXPERT = (
    "moe_route",
    "moe_dispatch",
    "moe_combine",
    "moe_expert",
)

#: What an operator's backward keeps of its output (:attr:`Operator.saved`).
SAVED = ("output", "rows", "none")


@dataclass(frozen=True)
class Tensor:
    """A tensor of the graph.

    Attributes:
        name: unique among the graph's tensors and operators.
        shape: the dims, each a positive int.
        dtype_bytes: bytes per element.
        kind: ``"input"`` (data, or an earlier layer's output), ``"parameter"`` (a weight,
            trained or frozen), ``"activation"`` (the output of an operator) or ``"view"`` (a
            reshape of ``base``).
        producer: the operator that makes an activation; ``None`` for other kinds.
        base: the tensor a view reshapes (maybe itself a view); ``None`` for other kinds.
        requires_grad: whether a gradient flows back into it: for parameters but frozen ones,
            by choice for inputs, for an activation when some input of its operator requires
            one, for a view when its base does.
    """

    name: str
    shape: tuple[int, ...]
    dtype_bytes: int = 2
    kind: str = "input"
    producer: str | None = None
    base: str | None = None
    requires_grad: bool = False

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Operand:
    """One input or output of an operator.

    Attributes:
        tensor: the tensor's name.
        dims: the operator axis of each dim of the tensor, in the tensor's dim order.
        addend: an input added to the result after the contraction (a linear's bias): its axes
            are output axes, it takes no part in the partial sums of a split contracted axis, and
            its gradient is a sum over the output axes it lacks only.
    """

    tensor: str
    dims: tuple[str, ...]
    addend: bool = False


@dataclass(frozen=True)
class Operator:
    """An einsum over named axes.

    Attributes:
        name: unique among the graph's tensors and operators.
        kind: what it computes (``"einsum"``, ``"linear"``, ``"conv2d"``, ``"relu"``, ...); the
            search only reads the axes, so the kind is a label for reports.
        axes: every axis, in a fixed order (first appearance in the inputs, then output-only axes
            such as a convolution's output height).
        axis_sizes: the size of each axis, in ``axes`` order.
        partitionable: the axes a strategy may split, in ``axes`` order; the others stay whole.
        inputs: the input operands, in slot order.
        output: the output operand; its tensor is the activation named ``name + ".out"``.
        saved: what the training step keeps of the output for the backward (device memory):
            ``"output"`` the whole output (the default: an engine saves every activation some
            backward reads); ``"rows"`` one fp32 number per row of it (over every output dim but
            the last: fused attention's softmax keeps its logsumexp); ``"none"`` nothing (fused
            attention's scores, recomputed in the backward).
    """

    name: str
    kind: str
    axes: tuple[str, ...]
    axis_sizes: tuple[int, ...]
    partitionable: tuple[str, ...]
    inputs: tuple[Operand, ...]
    output: Operand
    saved: str = "output"

    def axis_size(self, axis: str) -> int:
        return self.axis_sizes[self.axes.index(axis)]

    @property
    def partitionable_sizes(self) -> tuple[int, ...]:
        """The sizes of the partitionable axes: what strategies are enumerated over."""
        return tuple(self.axis_size(a) for a in self.partitionable)

    @cached_property
    def contracted(self) -> tuple[str, ...]:
        """Axes in the inputs and not in the output: split, they leave partial sums. Worked out
        once (every candidate's partial output reads it)."""
        used = {d for operand in self.inputs for d in operand.dims}
        return tuple(a for a in self.axes if a in used and a not in self.output.dims)

    def gradient_axes(self, operand: Operand) -> tuple[str, ...]:
        """The axes the gradient of input ``operand`` is summed over: for a factor of the
        product, every axis it lacks; for an addend, the output axes it lacks."""
        over = self.output.dims if operand.addend else self.axes
        return tuple(a for a in self.axes if a in over and a not in operand.dims)

    @cached_property
    def input_gradient_axes(self) -> tuple[tuple[str, ...], ...]:
        """:meth:`gradient_axes` of each input, in slot order. Worked out once (every
        candidate's gradient reads it)."""
        return tuple(self.gradient_axes(o) for o in self.inputs)

    @property
    def input_tensors(self) -> tuple[str, ...]:
        return tuple(o.tensor for o in self.inputs)

    @property
    def output_tensor(self) -> str:
        return self.output.tensor


@dataclass(frozen=True)
class Edge:
    """An operator input made by another operator.

    Attributes:
        producer: the operator that makes the activation.
        consumer: the operator that reads it.
        slot: the index of the input in ``consumer.inputs``.
        tensor: the producer's output activation (the root of the views the consumer reads).
        producer_shape: that activation's shape.
        consumer_shape: the shape the consumer reads: different when the edge goes through views.
    """

    producer: str
    consumer: str
    slot: int
    tensor: str
    producer_shape: tuple[int, ...]
    consumer_shape: tuple[int, ...]


#: Sizes and element counts must fit the core's 64-bit signed integers.
MAX_INT = 2**63 - 1


def is_positive_int(value: Any) -> bool:
    """A positive int that fits the core's 64-bit integers."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_INT


def checked_size(where: str, name: str, value: object) -> int:
    """``value`` as a size: ``TypeError`` if it is not an int, :class:`GraphError` if it is not
    positive and below 2**63; both name ``where`` and ``name``."""
    if not isinstance(value, Integral) or isinstance(value, bool):
        raise TypeError(f"{where}: {name} must be an int, got {type(value).__name__}")
    if not is_positive_int(int(value)):
        raise GraphError(f"{where}: {name} must be a positive int below 2**63, got {shown(value)}")
    return int(value)


def checked_shape(name: str, shape: Iterable[int]) -> tuple[int, ...]:
    try:
        dims = tuple(shape)
    except TypeError:
        raise GraphError(f"tensor {name!r}: shape {shape!r} is not a sequence of ints") from None
    if not all(is_positive_int(d) for d in dims) or math.prod(dims) > MAX_INT:
        raise GraphError(
            f"tensor {name!r}: shape {shown(list(dims))} must hold positive ints whose product is "
            "below 2**63"
        )
    return dims


def checked_dtype(where: str, dtype_bytes: Any) -> int:
    if not is_positive_int(dtype_bytes):
        raise GraphError(f"{where}: dtype_bytes must be a positive int, got {dtype_bytes!r}")
    return int(dtype_bytes)
