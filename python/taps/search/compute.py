"""What an operator computes, and how long it takes: a roofline of its FLOPs over the device's peak
and its bytes over the device's memory bandwidth (the larger of the two), forward and backward,
per device (docs/search.md#compute).

Every operator is an einsum over named axes; what it counts depends on its kind:

- a **contraction** (two or more factor inputs: linear, matmul, einsum, conv2d, attention's scores
  and context) does 2 FLOPs (a multiply and an add) per point of its iteration space: the product
  of its axis sizes, but for a sliding window (an operator with output-only axes, a convolution)
  the input's own spatial axes, which the output's and the kernel's axes already cover. Its
  backward computes the gradient of every factor input that needs one by a contraction of the
  same size, and of every addend (a bias) by a sum over the output;
- an **embedding** (a lookup of table rows, modelled as a one-hot matmul) moves its output's rows,
  forward and (summed into the table's gradient) backward: no FLOPs;
- a mixture-of-experts **dispatch or combine** (``moe_dispatch``, ``moe_combine``: einsums with
  the routing tensor ``gsec``, docs/moe.md) is a gather: it moves its tokens, forward and
  backward, and does no FLOPs; the routing tensor is read as its top-k indices and weights (k
  per token), not whole, so its bytes are not counted. The combine's backward also takes the
  gradient of its weights (the router's, when it is trained): a dot of the output's gradient
  with each routed slot's expert output, 2 FLOPs per element of ``egcm``; the dispatch takes
  none (:meth:`taps.graph.Graph.takes_gradient`);
- **every other operator** (pointwise, normalisations, softmax, pooling, reductions, slices) does
  one FLOP per element of its largest operand; its backward as much per input that needs a
  gradient.

Bytes are each operand read or written once: forward the inputs and the output; backward the
output's gradient, and per input that needs a gradient the operands it is computed from and the
gradient written.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from taps._core import Cluster
from taps.graph import MOE_COMBINE, MOE_DISPATCH, Graph, Operand, Operator

#: FLOPs per point of a contraction's iteration space: a multiply and an add.
CONTRACTION_FLOPS = 2

#: Gathers written as einsums whose first input is the routing tensor (docs/moe.md).
GATHERS = (MOE_DISPATCH, MOE_COMBINE)


@dataclass(frozen=True)
class Work:
    """FLOPs and bytes of memory traffic."""

    flops: float
    bytes: float

    def __add__(self, other: Work) -> Work:
        return Work(self.flops + other.flops, self.bytes + other.bytes)

    def seconds(self, peak_flops: float, memory_bandwidth: float) -> float:
        """The roofline: the longer of computing the FLOPs and moving the bytes."""
        return max(self.flops / peak_flops, self.bytes / memory_bandwidth)


NO_WORK = Work(0.0, 0.0)


def factors(op: Operator) -> list[Operand]:
    """The inputs multiplied together (every input but the addends)."""
    return [o for o in op.inputs if not o.addend]


def is_contraction(op: Operator) -> bool:
    """Whether ``op`` multiplies two or more inputs (an embedding and the gathers of a
    mixture of experts are lookups, not counted so)."""
    return op.kind != "embedding" and op.kind not in GATHERS and len(factors(op)) >= 2


def iteration_space(op: Operator) -> int:
    """The points a contraction visits: the product of its axis sizes, without the first factor
    input's own axes when the operator slides a window (has output-only axes): the output's and
    the kernel's axes index them already."""
    used = {d for o in op.inputs for d in o.dims}
    skip: set[str] = set()
    if any(a not in used for a in op.output.dims):
        first, *others = factors(op)
        elsewhere = {d for o in others for d in o.dims} | set(op.output.dims)
        skip = {d for d in first.dims if d not in elsewhere}
    return math.prod(n for a, n in zip(op.axes, op.axis_sizes) if a not in skip)


def _bytes(graph: Graph, op: Operator, operand: Operand) -> float:
    numel = math.prod(op.axis_size(d) for d in operand.dims)
    return float(numel * graph.tensors[operand.tensor].dtype_bytes)


def _numel(op: Operator, operand: Operand) -> float:
    return float(math.prod(op.axis_size(d) for d in operand.dims))


def forward_work(graph: Graph, op: Operator) -> Work:
    """The whole operator's forward work (all devices together)."""
    moved = sum(_bytes(graph, op, o) for o in (*op.inputs, op.output))
    if op.kind == "embedding":
        return Work(0.0, 2 * _bytes(graph, op, op.output) + _bytes(graph, op, op.inputs[0]))
    if op.kind in GATHERS:
        return Work(0.0, sum(_bytes(graph, op, o) for o in (*op.inputs[1:], op.output)))
    if is_contraction(op):
        addends = len(op.inputs) - len(factors(op))
        flops = CONTRACTION_FLOPS * iteration_space(op) + addends * _numel(op, op.output)
        return Work(float(flops), moved)
    return Work(max(_numel(op, o) for o in (*op.inputs, op.output)), moved)


def backward_work(graph: Graph, op: Operator) -> Work:
    """The whole operator's backward work: the gradient of every input that needs one."""
    needed = [o for slot, o in enumerate(op.inputs) if graph.takes_gradient(op, slot)]
    if not needed:
        return NO_WORK
    grad_out = _bytes(graph, op, op.output)
    if op.kind == "embedding":
        return Work(0.0, 2 * grad_out) if any(o is not op.inputs[0] for o in needed) else NO_WORK
    if op.kind in GATHERS:
        tokens = [o for o in needed if o is not op.inputs[0]]
        total = Work(0.0, sum(grad_out + _bytes(graph, op, o) for o in tokens))
        if op.inputs[0] in needed:  # the combine's weights: a dot of m per routed slot
            slots = op.inputs[1]
            dots = CONTRACTION_FLOPS * _numel(op, slots)
            total += Work(dots, grad_out + _bytes(graph, op, slots))
        return total
    if is_contraction(op):
        total = NO_WORK
        space = float(CONTRACTION_FLOPS * iteration_space(op))
        for o in needed:
            if o.addend:
                total += Work(_numel(op, op.output), grad_out + _bytes(graph, op, o))
                continue
            others = sum(_bytes(graph, op, f) for f in factors(op) if f is not o)
            total += Work(space, grad_out + others + _bytes(graph, op, o))
        return total
    largest = max(_numel(op, o) for o in (*op.inputs, op.output))
    return Work(largest * len(needed), grad_out + 2 * sum(_bytes(graph, op, o) for o in needed))


def compute_times(
    graph: Graph,
    op: Operator,
    degrees: np.ndarray,
    peak_flops: float,
    memory_bandwidth: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Per strategy (rows of ``degrees``, the split degree of every partitionable axis), the
    seconds one device spends on ``op``'s forward and on its backward: the operator's roofline
    divided by the product of the split degrees, so that the devices of a replicated strategy
    (split over fewer devices than the cluster has) each do their replica's share."""
    shares = np.prod(np.asarray(degrees, dtype=np.float64).reshape(len(degrees), -1), axis=1)
    fwd = forward_work(graph, op).seconds(peak_flops, memory_bandwidth)
    bwd = backward_work(graph, op).seconds(peak_flops, memory_bandwidth)
    return fwd / shares, bwd / shares


def overlapped_backward(backward: np.ndarray, reductions: np.ndarray) -> np.ndarray:
    """The additive form of an operator's backward with its parameters' gradient reductions
    overlapped: the longer of the two. The reductions run on their own stream while the backward
    goes on; in a stack of layers, the compute that follows one operator's gradients is about as
    long as its own backward, so each reduction is taken as hidden up to that long (docs/search.md
    #the-step-time: the exact exposed time comes from :mod:`taps.search.timeline`)."""
    return np.maximum(backward, reductions)


def roofline_of(cluster: Cluster) -> tuple[float, float]:
    """The cluster's device peak FLOP/s and memory bandwidth (bytes/s), the roofline's numbers."""
    return cluster.device.peak_flops, cluster.device.memory_bandwidth
