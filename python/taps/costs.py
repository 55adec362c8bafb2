"""What a strategy costs: the intra-operator collectives of an operator (node cost), the memory it
needs per device, and the redistributions between operators (edge cost). The layouts come from
:mod:`taps.sharding`; this module only prices them (docs/conventions.md: "Intra-operator
communication" and "Topology-aware cost")."""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from taps import sharding
from taps._core import (
    COST_MODELS,
    PLANNERS,
    Cluster,
    Layout,
    LayoutError,
    Redistribution,
    Strategy,
    TopologyError,
    allreduce_costs,
    redistribution_costs,
)
from taps.graph import Edge, Graph, Operand, Operator
from taps.reductions import PairCost, Problem
from taps.sharding import (
    Candidate,
    assigned,
    backward_plans,
    candidates,
    edge_plans,
    operand_axis_indices,
    operand_shape,
    split_dims,
)

if TYPE_CHECKING:
    from taps._core import _CostModel as CostModel
    from taps._core import _Planner as Planner

#: What a cost prices: the whole training step (docs/search.md#the-training-step) or the paper's
#: model, ``"forward"`` (forward redistributions, gradients all_reduced at the operators).
STEPS = ("training", "forward")
Step = Literal["training", "forward"]

#: Bytes of device memory per parameter: fp16 weight and gradient, fp32 master weight and the two
#: Adam moments (mixed-precision Adam).
BYTES_PER_PARAMETER = 16


def check_cost_model(cost_model: object) -> None:
    """Refuse an unknown cost model before any work (the core's list is the one source)."""
    if cost_model not in COST_MODELS:
        raise TopologyError(
            f"unknown cost model {cost_model!r}: expected one of {', '.join(COST_MODELS)}"
        )


def check_step(step: object) -> None:
    """Refuse an unknown step before any work."""
    if step not in STEPS:
        raise TopologyError(f"unknown step {step!r}: expected one of {', '.join(STEPS)}")


def check_planner(planner: object) -> None:
    """Refuse an unknown planner before any work (the core's list is the one source)."""
    if planner not in PLANNERS:
        raise LayoutError(f"unknown planner {planner!r}: expected one of {', '.join(PLANNERS)}")


def partial_flows(graph: Graph, step: Step = "training") -> frozenset[str]:
    """The operators whose output partial sums flow to their consumer (training step): those with
    a partitionable contracted axis whose output has exactly one consumer (one graph edge). The
    edge then plans from the partial layout (a reduce_scatter where the consumer splits the
    tensor, an all_reduce where it does not). An output with no consumer, or with several, is
    all_reduced once at its operator, as in the paper."""
    if step != "training":
        return frozenset()
    uses = Counter(e.tensor for e in graph.edges)
    return frozenset(
        op.name
        for op in graph.ops
        if set(op.contracted) & set(op.partitionable) and uses[op.output.tensor] == 1
    )


def strategies_for(
    graph: Graph, op_name: str, cluster: Cluster, replicas: bool = False
) -> list[Strategy]:
    """The strategies the search considers for one operator of ``graph`` on ``cluster``
    (``replicas``: also those that split over fewer devices, see :func:`taps.search`)."""
    return sharding.strategies(graph.op(op_name), cluster.num_devices, replicas)


@dataclass(frozen=True)
class Collective:
    """One intra-operator collective: an all_reduce of partial sums over the device dims the
    tensor's map does not use. Each replica of a replicated operator reduces on its own: the layout
    stacks the replicas' copies along leading dims split over the replica dims, so those dims are
    outside the group."""

    tensor: str
    reason: str  # "forward partial sum" or "gradient"
    layout: Layout
    dtype_bytes: int
    kind: Literal["all_reduce"] = "all_reduce"
    #: A parameter's gradient under ZeRO (``zero=True``): a reduce_scatter over the group and an
    #: all_gather of the updated shards, the all_reduce's bytes over its group, priced as it.
    zero: bool = False

    def cost(self, cluster: Cluster, cost_model: CostModel = "topology") -> float:
        return cluster.collective_cost(self.layout, self.kind, None, self.dtype_bytes, cost_model)


def _replicated(layout: Layout) -> bool:
    """Whether some device dim is unused by the map (so an all_reduce over it is needed)."""
    return len(layout.device_matrix) > sum(m >= 0 for m in layout.tensor_map)


def _all_reduced_operands(
    graph: Graph, op: Operator, step: Step = "forward", flowing: bool = False
) -> list[tuple[Operand, str, tuple[str, ...]]]:
    """The operands of ``op`` whose shard can be a partial sum that the operator all_reduces, in
    order, each with the partitionable axes it lacks that the reduction does not run over:

    - the output, if a contracted axis can be split and its partial sums do not flow to the
      consumer (``flowing``, :func:`partial_flows`);
    - every input that needs a gradient; in the training step only those no operator produces
      (parameters and graph inputs: an activation's gradient goes back on its edge), and an
      addend's gradient is summed over the output axes it lacks only (the others are kept apart).

    Each needs an all_reduce over the device dims its per-replica layout leaves unused, but for
    the axes kept apart (the replicas of a replicated operator see the same output gradient, so
    they compute the same input gradients: nothing is partial over the replica dims); for the
    output that is exactly when a contracted axis is split."""
    out: list[tuple[Operand, str, tuple[str, ...]]] = []
    if set(op.contracted) & set(op.partitionable) and not flowing:
        out.append((op.output, "forward partial sum", ()))
    for o in op.inputs:
        if not graph.tensors[o.tensor].requires_grad:
            continue
        apart: tuple[str, ...] = ()
        if step == "training":
            if graph.root(o.tensor).producer is not None:
                continue
            summed = op.gradient_axes(o)
            apart = tuple(a for a in op.partitionable if a not in o.dims and a not in summed)
        out.append((o, "gradient", apart))
    return out


def _reduction_layout(
    op: Operator, operand: Operand, strategy: Strategy, apart: Sequence[str]
) -> Layout:
    """The per-replica layout of ``operand`` whose unused device dims are the group of its
    all_reduce: the axes kept ``apart`` stacked as leading dims of their degree, so that their
    device dims split something and stay outside the group (each of their coordinates runs its
    own all_reduce), as the replica dims do."""
    idx = [op.partitionable.index(a) for a in apart]
    return strategy.tensor_layout(
        [*idx, *operand_axis_indices(op, operand)],
        [*(strategy.degrees[i] for i in idx), *operand_shape(op, operand)],
        per_replica=True,
    )


def _collective(
    graph: Graph,
    op: Operator,
    strategy: Strategy,
    reduced: tuple[Operand, str, tuple[str, ...]],
    zero: bool = False,
) -> Collective | None:
    """The all_reduce of one of :func:`_all_reduced_operands` under ``strategy``, or None if its
    layout leaves no device dim of the group unused."""
    operand, reason, apart = reduced
    layout = _reduction_layout(op, operand, strategy, apart)
    if not _replicated(layout):
        return None
    t = graph.tensors[operand.tensor]
    param = reason == "gradient" and graph.root(operand.tensor).kind == "parameter"
    return Collective(t.name, reason, layout, t.dtype_bytes, zero=zero and param)


def intra_collectives(
    graph: Graph,
    op: Operator,
    candidate: Candidate,
    step: Step = "forward",
    flowing: bool = False,
    zero: bool = False,
) -> list[Collective]:
    """The all_reduces a candidate of ``op`` needs (:func:`_all_reduced_operands`), one per
    operand whose layout leaves a device dim of its group unused; with ``zero``, a parameter's
    gradient is marked as ZeRO's reduce_scatter and all_gather."""
    found = (
        _collective(graph, op, candidate.strategy, r, zero)
        for r in _all_reduced_operands(graph, op, step, flowing)
    )
    return [c for c in found if c is not None]


def all_reduce_operands(
    graph: Graph, op: Operator, step: Step = "forward", flowing: bool = False
) -> list[tuple[list[int], list[int], float]]:
    """The operands of :func:`_all_reduced_operands` that keep no axis apart, as
    ``(strategy axes, shape, dtype bytes)`` for the Rust kernel ``allreduce_costs``, which prices
    an all_reduce over no device dim at 0 (in the per-replica layout, as
    :func:`intra_collectives`)."""
    return [
        (
            operand_axis_indices(op, o),
            operand_shape(op, o),
            float(graph.tensors[o.tensor].dtype_bytes),
        )
        for o, _, apart in _all_reduced_operands(graph, op, step, flowing)
        if not apart
    ]


def memory(
    graph: Graph,
    op: Operator,
    candidate: Candidate,
    bytes_per_parameter: float = BYTES_PER_PARAMETER,
    zero: bool = False,
) -> float:
    """Bytes per device for one layer of ``op``: its parameter shards with their gradients and
    optimizer state, and its output shard, saved for the backward pass. A device of a replicated
    strategy holds its replica's whole blocks: the layouts' replica dims split nothing. With
    ``zero``, all of a parameter's bytes but its weight (``dtype_bytes``) are divided among the
    ``g`` devices its gradient is reduced over (ZeRO: gradient and optimizer state sharded)."""
    total = 0.0
    for operand, layout in zip(op.inputs, candidate.inputs):
        if graph.root(operand.tensor).kind == "parameter":  # a view of one too
            per = bytes_per_parameter
            if zero:
                dims = split_dims(op, candidate.strategy, op.gradient_axes(operand))
                g = float(np.prod([layout.device_dim_size(k) for k in dims]))
                weight = min(float(graph.tensors[operand.tensor].dtype_bytes), per)
                per = weight + (per - weight) / g
            total += math.prod(layout.shard_shape) * per
    out = graph.tensors[op.output.tensor]
    return total + math.prod(candidate.output.shard_shape) * out.dtype_bytes


@dataclass
class OpTable:
    """The candidates of one operator with their node costs and memory."""

    op: Operator
    candidates: list[Candidate]
    node_cost: np.ndarray
    memory: np.ndarray

    @property
    def strategies(self) -> list[Strategy]:
        return [c.strategy for c in self.candidates]


@dataclass
class EdgeTable:
    """One graph edge: each producer strategy's output layout class, each consumer strategy's
    input layout class, and the cost of every class pair. Strategies that give a tensor the same
    distribution share a class, so the ILP needs one flow variable per class pair."""

    edge: Edge
    source_class: np.ndarray
    target_class: np.ndarray
    cost: np.ndarray

    @property
    def num_aux_edges(self) -> int:
        """The paper's count: one auxiliary edge per pair of strategies."""
        return len(self.source_class) * len(self.target_class)


@dataclass
class CostTables:
    """Everything the ILP needs, computed once per (graph, cluster, cost model, step)."""

    graph: Graph
    cluster: Cluster
    cost_model: CostModel
    ops: dict[str, OpTable]
    edges: list[EdgeTable]
    bytes_per_parameter: float = BYTES_PER_PARAMETER
    timings: dict[str, float] = field(default_factory=dict)
    step: Step = "forward"
    planner: Planner = "paper"
    zero: bool = False

    @property
    def num_aux_edges(self) -> int:
        return sum(e.num_aux_edges for e in self.edges)

    def problem(self) -> Problem:
        """The tables as the problem the ILP and the reductions decide: a pair cost per edge."""
        return Problem(
            {name: t.node_cost for name, t in self.ops.items()},
            [
                PairCost(e.edge.producer, e.edge.consumer, e.source_class, e.target_class, e.cost)
                for e in self.edges
            ],
        )

    def evaluate(self, choice: Mapping[str, int]) -> float:
        """The objective of one assignment (op name -> index into its candidates)."""
        return self.problem().evaluate(choice)


def _classes(rows: Sequence[tuple[Layout, ...]]) -> tuple[np.ndarray, list[tuple[Layout, ...]]]:
    """Group the candidates of one end of an edge by the distributions they give the tensor (the
    forward layout, and in the training step the gradient's), each written as Algorithm 1 plans
    it (the compacted form: the canonical form would also merge tensor dims, which changes the
    paper's plans)."""
    index: dict[tuple[Layout, ...], int] = {}
    cls = np.empty(len(rows), dtype=np.int64)
    for i, row in enumerate(rows):
        cls[i] = index.setdefault(tuple(layout.compacted() for layout in row), len(index))
    return cls, list(index)


def _order(layout: Layout) -> tuple[list[int], ...]:
    return (layout.shape, layout.device_matrix, layout.tensor_map, layout.partial)


class _Priced:
    """``redistribution_costs`` computed once per pair of layout lists that hold the same
    layouts in any order: the kernel prices each pair on its own, so the matrix of the lists in
    one canonical order, read back in the order asked for, is the same matrix."""

    def __init__(self) -> None:
        self._memo: dict[Any, np.ndarray] = {}

    def __call__(
        self,
        sources: Sequence[Layout],
        targets: Sequence[Layout],
        cluster: Cluster,
        dtype: float,
        cost_model: CostModel,
        planner: Planner,
    ) -> np.ndarray:
        rows = sorted(range(len(sources)), key=lambda i: _order(sources[i]))
        cols = sorted(range(len(targets)), key=lambda j: _order(targets[j]))
        srcs, dsts = tuple(sources[i] for i in rows), tuple(targets[j] for j in cols)
        key = (srcs, dsts, dtype)
        if key not in self._memo:
            self._memo[key] = redistribution_costs(srcs, dsts, cluster, dtype, cost_model, planner)
        return self._memo[key][np.ix_(np.argsort(rows), np.argsort(cols))]


def _check_pricing(cost_model: object, step: object, planner: object) -> None:
    check_cost_model(cost_model)
    check_step(step)
    check_planner(planner)


def build_tables(
    graph: Graph,
    cluster: Cluster,
    cost_model: CostModel = "topology",
    bytes_per_parameter: float = BYTES_PER_PARAMETER,
    share: bool = True,
    replicas: bool = False,
    step: Step = "training",
    planner: Planner = "paper",
    zero: bool = False,
) -> CostTables:
    """Enumerate candidates and compute node costs, memory and edge costs for the search.

    ``step`` says what is priced (docs/search.md): ``"training"`` (partial sums flowing to the
    consumer, every edge's backward redistribution, the gradients of parameters and inputs at
    their operators) or ``"forward"`` (the paper's model); ``planner`` plans the edges (``"paper"``,
    Algorithm 1, by default); ``zero`` shards parameters' gradients and optimizer state (ZeRO).

    Operators of one signature (:meth:`Graph.signature`: the repeated layers of a model) share one
    candidate list, node cost and memory vector, and edges between operators of the same two
    signatures share one cost matrix, so the tables cost what the distinct operators do, whatever
    the depth. ``share=False`` computes every operator and edge on its own (for the benchmark).
    ``replicas`` also enumerates the strategies over fewer devices (:func:`sharding.strategies`)."""
    _check_pricing(cost_model, step, planner)
    n = cluster.num_devices
    timings = {"enumerate": 0.0, "costs": 0.0}
    flows = partial_flows(graph, step)
    training = step == "training"

    def key_of(op: Operator) -> Any:
        if not share:
            return op.name
        if not training:
            return graph.signature(op.name)
        # The training step also depends on whether the output's partial sums flow and on which
        # inputs have a producer (their gradients go back on the edge).
        made = tuple(graph.root(o.tensor).producer is not None for o in op.inputs)
        return (graph.signature(op.name), op.name in flows, made)

    signature = {op.name: key_of(op) for op in graph.ops}
    distinct: dict[Any, OpTable] = {}
    ops: dict[str, OpTable] = {}
    for op in graph.ops:
        key = signature[op.name]
        if key not in distinct:
            t0 = time.perf_counter()
            cands = candidates(op, n, replicas)
            t1 = time.perf_counter()
            flowing = op.name in flows
            node = allreduce_costs(
                np.array([c.strategy.degrees for c in cands], dtype=np.int64),
                np.array([c.strategy.device_map for c in cands], dtype=np.int64),
                all_reduce_operands(graph, op, step, flowing),
                cluster,
                cost_model,
                [c.strategy.device_matrix for c in cands],
            )
            apart = [r for r in _all_reduced_operands(graph, op, step, flowing) if r[2]]
            if apart:
                # Addends' gradients keep some axes apart: priced one candidate at a time.
                found = [[_collective(graph, op, c.strategy, r) for r in apart] for c in cands]
                node = node + np.array(
                    [sum(col.cost(cluster, cost_model) for col in row if col) for row in found]
                )
            mem = np.array([memory(graph, op, c, bytes_per_parameter, zero) for c in cands])
            distinct[key] = OpTable(op, cands, node, mem)
            timings["enumerate"] += t1 - t0
            timings["costs"] += time.perf_counter() - t1
        shared = distinct[key]
        ops[op.name] = shared if shared.op is op else replace(shared, op=op)
    t0 = time.perf_counter()
    cache: dict[Any, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    # Different operators can still give a tensor the same layout classes at both ends, and one
    # direction of an edge can be another edge's (the gradient of a softmax's input is priced
    # from the classes its output is priced to).
    by_layouts: dict[Any, np.ndarray] = {}
    priced = _Priced()
    edges: list[EdgeTable] = []
    for edge in graph.edges:
        key = (signature[edge.producer], signature[edge.consumer], edge.slot)
        if key not in cache:
            producer, consumer = graph.op(edge.producer), graph.op(edge.consumer)
            backward = training and graph.tensors[edge.tensor].requires_grad
            flowing = edge.producer in flows
            src_cls, src = _classes(
                [
                    (
                        c.partial_output(producer) if flowing else c.output,
                        *((c.output,) if backward else ()),
                    )
                    for c in ops[edge.producer].candidates
                ]
            )
            dst_cls, dst = _classes(
                [
                    (c.inputs[edge.slot], *((c.gradient(consumer, edge.slot),) if backward else ()))
                    for c in ops[edge.consumer].candidates
                ]
            )
            dtype = graph.tensors[edge.tensor].dtype_bytes
            layouts = (tuple(src), tuple(dst), dtype)
            if layouts not in by_layouts:
                pricing = (cluster, dtype, cost_model, planner)
                cost = priced([r[0] for r in src], [r[0] for r in dst], *pricing)
                if backward:
                    cost = cost + priced([r[1] for r in dst], [r[1] for r in src], *pricing).T
                by_layouts[layouts] = cost
            cache[key] = (src_cls, dst_cls, by_layouts[layouts])
        edges.append(EdgeTable(edge, *cache[key]))
    timings["costs"] += time.perf_counter() - t0
    return CostTables(
        graph,
        cluster,
        cost_model,
        ops,
        edges,
        bytes_per_parameter,
        timings,
        step,
        planner,
        zero,
    )


@dataclass(frozen=True)
class Incoming:
    """The redistributions of one input of an operator: forward from its producer's layout and,
    in the training step, the gradient's back to it."""

    edge: Edge
    plan: Redistribution
    cost: float
    backward: Redistribution | None = None
    backward_cost: float = 0.0

    @property
    def total(self) -> float:
        return self.cost + self.backward_cost


@dataclass(frozen=True)
class OpCost:
    """Where the time (or bytes) of one operator goes under a given assignment."""

    name: str
    strategy: Strategy
    collectives: tuple[tuple[Collective, float], ...]
    incoming: tuple[Incoming, ...]

    @property
    def intra_cost(self) -> float:
        return sum(c for _, c in self.collectives)

    @property
    def incoming_cost(self) -> float:
        return sum(i.total for i in self.incoming)

    @property
    def total(self) -> float:
        return self.intra_cost + self.incoming_cost


def breakdown(
    graph: Graph,
    cluster: Cluster,
    strategies: Mapping[str, Strategy],
    cost_model: CostModel = "topology",
    step: Step = "training",
    planner: Planner = "paper",
    zero: bool = False,
) -> list[OpCost]:
    """Per operator, in topological order: its collectives and incoming redistributions (forward
    and, in the training step, backward) with their costs. Computed directly from the plans,
    independently of the search's tables."""
    _check_pricing(cost_model, step, planner)
    chosen = assigned(graph, strategies, cluster.num_devices)
    flows = partial_flows(graph, step)
    # The optimal planner minimises what the cost model measures: seconds on the cluster, or
    # elements without one.
    on = cluster if cost_model == "topology" else None
    forward = edge_plans(graph, chosen, planner, on, flows)
    backward = (
        backward_plans(graph, chosen, planner, on)
        if step == "training"
        else [(e, None) for e in graph.edges]
    )
    incoming: dict[str, list[Incoming]] = {op.name: [] for op in graph.ops}
    for (edge, plan), (_, back) in zip(forward, backward):
        dtype = graph.tensors[edge.tensor].dtype_bytes
        incoming[edge.consumer].append(
            Incoming(
                edge,
                plan,
                plan.cost(cluster, dtype, cost_model),
                back,
                0.0 if back is None else back.cost(cluster, dtype, cost_model),
            )
        )
    out = []
    for op in graph.ops:
        colls = tuple(
            (c, c.cost(cluster, cost_model))
            for c in intra_collectives(graph, op, chosen[op.name], step, op.name in flows, zero)
        )
        out.append(OpCost(op.name, strategies[op.name], colls, tuple(incoming[op.name])))
    return out


def evaluate(
    graph: Graph,
    cluster: Cluster,
    strategies: Mapping[str, Strategy],
    cost_model: CostModel = "topology",
    step: Step = "training",
    planner: Planner = "paper",
    zero: bool = False,
) -> float:
    """The communication cost of an assignment: seconds ("topology") or bytes ("volume") of one
    training step (``step="training"``) or of the paper's model (``step="forward"``)."""
    return sum(
        c.total for c in breakdown(graph, cluster, strategies, cost_model, step, planner, zero)
    )
