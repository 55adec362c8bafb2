"""How a strategy shards an operator: the layout it gives every operand.

A strategy splits an operator's partitionable axes; each operand (input or output) takes the
device dims of the axes it has, so its tensor map follows from the operand's dims, and the
strategy's replica dims (device dims no axis uses) hold copies. This module is the one place that
rule lives. :func:`candidates` builds, once per operator, a :class:`Candidate`
per strategy with the layout of every operand (as DTensor's op strategies carry the placements of
their inputs and output); the cost model, the memory model, the reports and the exports read
those layouts rather than working them out again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from taps._core import (
    Cluster,
    Layout,
    Redistribution,
    Strategy,
    enumerate_strategies,
    plan_redistribution,
    tensor_layouts,
)
from taps._core import strategy_arrays as _strategy_arrays
from taps._support.arguments import flag, instance
from taps._support.limits import check_candidates
from taps.graph import Edge, Graph, Operand, Operator

if TYPE_CHECKING:
    from taps._core import _Planner as Planner


def operand_axis_indices(op: Operator, operand: Operand) -> list[int]:
    """For each dim of ``operand``, its axis's index in ``op.partitionable``, or -1 (whole).

    A strategy over the partitionable axes gives the tensor the map
    ``[strategy.device_map[i] if i >= 0 else -1 for i in indices]``.
    """
    return [op.partitionable.index(d) if d in op.partitionable else -1 for d in operand.dims]


def operand_shape(op: Operator, operand: Operand) -> list[int]:
    """The operand's shape, read from the operator's axis sizes."""
    return [op.axis_size(d) for d in operand.dims]


def operand_specs(op: Operator) -> list[tuple[list[int], list[int]]]:
    """Per input of ``op``, then its output: the axis indices and shape
    :meth:`taps.Strategy.tensor_layout` takes (the same for every strategy of ``op``)."""
    return [(operand_axis_indices(op, o), operand_shape(op, o)) for o in (*op.inputs, op.output)]


def split_dims(op: Operator, strategy: Strategy, axes: Iterable[str]) -> list[int]:
    """The device dims of those of ``axes`` that ``strategy`` splits, ascending."""
    # The strategy's lists read once: each read of a property builds the list anew.
    degrees, device_map = strategy.degrees, strategy.device_map
    return sorted(
        device_map[i] for i, a in enumerate(op.partitionable) if a in axes and degrees[i] > 1
    )


def strategy_arrays(cands: Sequence[Candidate]) -> tuple[np.ndarray, np.ndarray, list[list[int]]]:
    """The strategies of ``cands`` as the batch kernels take them: their degrees and device maps
    (one row per candidate) and their device matrices."""
    strategies = [c.strategy for c in cands]
    degrees, device_maps = _strategy_arrays(strategies)
    return degrees, device_maps, [s.device_matrix for s in strategies]


def partial_dims(
    op: Operator, degrees: np.ndarray, device_maps: np.ndarray, axes: Iterable[str]
) -> np.ndarray:
    """Per candidate of ``op`` (rows of ``degrees`` and ``device_maps``, :func:`strategy_arrays`),
    the device dims of those of ``axes`` it splits, -1 for the others: with ``op.contracted``, where
    its :attr:`Candidate.partial_output` holds partial sums, with an input's gradient axes its
    :meth:`Candidate.gradient`'s (:func:`split_dims`, unsorted and padded). The rows
    :func:`taps._core.layout_classes` builds those layouts from, in the core."""
    idx = [i for i, a in enumerate(op.partitionable) if a in axes]
    return np.where(degrees[:, idx] > 1, device_maps[:, idx], -1)


def with_partial(layout: Layout, partial: Sequence[int]) -> Layout:
    """``layout`` holding partial sums along the device dims ``partial`` (unused by its map)."""
    if not partial and not layout.partial:
        return layout  # already so: no second equal layout to build
    return Layout(layout.shape, layout.device_matrix, layout.tensor_map, partial)


@dataclass(frozen=True)
class Candidate:
    """One strategy of an operator with the layout it gives every operand.

    Attributes:
        strategy: the degrees and device dims of the partitionable axes.
        inputs: the layout of each input, in slot order.
        output: the layout of the output.
        op: the operator (operators of one signature share their candidates: any of them).
    """

    strategy: Strategy
    inputs: tuple[Layout, ...]
    output: Layout
    op: Operator = field(compare=False, repr=False)
    _gradients: dict[int, Layout] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, op: Operator, strategy: Strategy) -> Candidate:
        """The candidate of ``strategy``."""
        layouts = [strategy.tensor_layout(i, s) for i, s in operand_specs(op)]
        return cls(strategy, tuple(layouts[:-1]), layouts[-1], op)

    @classmethod
    def many(
        cls,
        op: Operator,
        strategies: Iterable[Strategy],
        inputs: Iterable[tuple[Layout, ...]],
        outputs: Iterable[Layout],
    ) -> list[Candidate]:
        """The candidates of ``strategies`` with their ``inputs`` and ``outputs``, one each, the
        fields set straight into each instance's dict: the frozen dataclass's ``__init__`` (an
        ``object.__setattr__`` per field) took twice as long, over some 32,000 candidates of a
        search (timm_swin)."""
        new = object.__new__
        found = []
        for strategy, ins, out in zip(strategies, inputs, outputs):
            c = new(cls)
            d = c.__dict__
            d["strategy"], d["inputs"], d["output"], d["op"] = strategy, ins, out, op
            d["_gradients"] = {}
            found.append(c)
        return found

    @cached_property
    def partial_output(self) -> Layout:
        """The output as the contraction leaves it: partial sums along the device dims of the
        split contracted axes (before any all_reduce). Worked out once, when first read."""
        return with_partial(self.output, split_dims(self.op, self.strategy, self.op.contracted))

    def gradient(self, slot: int) -> Layout:
        """The gradient of input ``slot`` as the backward pass computes it: in the input's
        layout, partial along the device dims of the split axes it is summed over
        (:meth:`taps.graph.Operator.gradient_axes`). Worked out once per slot, when first asked."""
        if slot not in self._gradients:
            partial = split_dims(self.op, self.strategy, self.op.input_gradient_axes[slot])
            self._gradients[slot] = with_partial(self.inputs[slot], partial)
        return self._gradients[slot]


def strategies(op: Operator, num_devices: int, replicas: bool = False) -> list[Strategy]:
    """The strategies of ``op`` on ``num_devices`` devices, in :func:`taps.enumerate_strategies`
    order: every power-of-two split of its partitionable axes over all the devices whose degrees
    divide the axis sizes, and with ``replicas`` also every split over fewer devices, the rest
    replicating the operator. An operator with no split over all the devices (no partitionable
    axis, or sizes the device count does not divide) takes the replicated ones either way. They
    are counted first: more than :data:`taps._support.limits.MAX_CANDIDATES` is a
    :class:`taps.errors.ResourceError` (enumerating them could exhaust the memory)."""
    sizes = list(op.partitionable_sizes)
    check_candidates(op.name, sizes, num_devices, replicas)
    found = enumerate_strategies(sizes, num_devices, replicas)
    # The replicated list always holds the fully replicated strategy, so it is never empty.
    return found or enumerate_strategies(sizes, num_devices, True)


def candidates(
    op: Operator, num_devices: int, replicas: bool = False, memo: dict[Any, Any] | None = None
) -> list[Candidate]:
    """The candidates the search considers for ``op``: one per strategy of :func:`strategies`.
    ``memo`` (a dict kept across the operators of one search) holds the strategies and operand
    layouts found so far: operators of the same axis sizes share their strategies, and operands
    of the same axes and shape their layouts (the objects themselves, immutable)."""
    if memo is None:
        memo = {}
    sizes = (op.partitionable_sizes, num_devices, replicas)
    if sizes not in memo:
        memo[sizes] = strategies(op, num_devices, replicas)
    found: list[Strategy] = memo[sizes]
    columns = []
    for axes, shape in operand_specs(op):
        spec = (sizes, tuple(axes), tuple(shape))
        if spec not in memo:
            memo[spec] = tensor_layouts(found, axes, shape)
        columns.append(memo[spec])
    return Candidate.many(op, found, zip(*columns[:-1]), columns[-1])


def edge_redistributions(
    graph: Graph,
    chosen: Mapping[str, Candidate],
    planner: Planner = "paper",
    cluster: Cluster | None = None,
    partial: Iterable[str] = (),
) -> list[tuple[Edge, Redistribution]]:
    """Per graph edge (``graph.edges`` order), the forward redistribution from the producer's
    output layout (:meth:`Candidate.partial_output` for the producers in ``partial``, whose
    partial sums flow to their consumer) to the layout the consumer's candidate wants, by
    ``planner`` (minimising seconds on ``cluster`` at the tensor's element size, or elements
    without one)."""
    flowing = set(partial)

    def source(e: Edge) -> Layout:
        c = chosen[e.producer]
        return c.partial_output if e.producer in flowing else c.output

    return [
        (
            e,
            plan_redistribution(
                source(e),
                chosen[e.consumer].inputs[e.slot],
                cluster,
                planner,
                graph.tensors[e.tensor].dtype_bytes,
            ),
        )
        for e in graph.edges
    ]


def backward_redistributions(
    graph: Graph,
    chosen: Mapping[str, Candidate],
    planner: Planner = "paper",
    cluster: Cluster | None = None,
) -> list[tuple[Edge, Redistribution | None]]:
    """Per graph edge, the backward redistribution of the gradient: from the consumer's
    :meth:`Candidate.gradient` of the input to the producer's output layout (None when the input
    takes no gradient, :meth:`taps.graph.Graph.takes_gradient`)."""
    return [
        (
            e,
            plan_redistribution(
                chosen[e.consumer].gradient(e.slot),
                chosen[e.producer].output,
                cluster,
                planner,
                graph.tensors[e.tensor].dtype_bytes,
            )
            if graph.takes_gradient(graph.op(e.consumer), e.slot)
            else None,
        )
        for e in graph.edges
    ]


def strategies_for(
    graph: Graph, op_name: str, cluster: Cluster, replicas: bool = False
) -> list[Strategy]:
    """The strategies the search considers for one operator of ``graph`` on ``cluster``
    (``replicas``: also those that split over fewer devices, see :func:`taps.search`)."""
    instance("strategies_for", "graph", graph, Graph)
    instance("strategies_for", "cluster", cluster, Cluster)
    flag("strategies_for", "replicas", replicas)
    return strategies(graph.op(op_name), cluster.num_devices, replicas)
