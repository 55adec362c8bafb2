"""What a strategy costs: the intra-operator collectives of an operator (node cost), the memory it
needs per device, and the redistributions between operators (edge cost). The layouts come from
:mod:`taps.sharding`; this module only prices them (docs/conventions.md: "Intra-operator
communication" and "Topology-aware cost")."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from taps import sharding
from taps._core import (
    COST_MODELS,
    Cluster,
    Layout,
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
    candidates,
    edge_plans,
    operand_axis_indices,
    operand_shape,
)

if TYPE_CHECKING:
    from taps._core import _CostModel as CostModel

#: Bytes of device memory per parameter: fp16 weight and gradient, fp32 master weight and the two
#: Adam moments (mixed-precision Adam).
BYTES_PER_PARAMETER = 16


def check_cost_model(cost_model: object) -> None:
    """Refuse an unknown cost model before any work (the core's list is the one source)."""
    if cost_model not in COST_MODELS:
        raise TopologyError(
            f"unknown cost model {cost_model!r}: expected one of {', '.join(COST_MODELS)}"
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

    def cost(self, cluster: Cluster, cost_model: CostModel = "topology") -> float:
        return cluster.collective_cost(self.layout, self.kind, None, self.dtype_bytes, cost_model)


def _replicated(layout: Layout) -> bool:
    """Whether some device dim is unused by the map (so an all_reduce over it is needed)."""
    return len(layout.device_matrix) > sum(m >= 0 for m in layout.tensor_map)


def _all_reduced_operands(graph: Graph, op: Operator) -> list[tuple[Operand, str]]:
    """The operands of ``op`` whose shard can be a partial sum, in order: the
    output if a contracted axis can be split (forward), and every input that needs a gradient
    (backward). Each needs an all_reduce over the device dims its per-replica layout leaves unused
    (the replicas of a replicated operator see the same output gradient, so they compute the same
    input gradients: nothing is partial over the replica dims); for the output that is exactly
    when a contracted axis is split."""
    out = [(op.output, "forward partial sum")] if set(op.contracted) & set(op.partitionable) else []
    return out + [(o, "gradient") for o in op.inputs if graph.tensors[o.tensor].requires_grad]


def intra_collectives(graph: Graph, op: Operator, candidate: Candidate) -> list[Collective]:
    """The all_reduces a candidate of ``op`` needs (:func:`_all_reduced_operands`), one per
    operand whose layout leaves a device dim unused."""
    out: list[Collective] = []
    for operand, reason in _all_reduced_operands(graph, op):
        layout = sharding.operand_layout(op, operand, candidate.strategy, per_replica=True)
        if _replicated(layout):
            t = graph.tensors[operand.tensor]
            out.append(Collective(t.name, reason, layout, t.dtype_bytes))
    return out


def all_reduce_operands(graph: Graph, op: Operator) -> list[tuple[list[int], list[int], float]]:
    """The operands of :func:`_all_reduced_operands` as ``(strategy axes, shape, dtype bytes)``
    for the Rust kernel ``allreduce_costs``, which prices an all_reduce over no device dim at 0
    (in the per-replica layout, as :func:`intra_collectives`)."""
    return [
        (
            operand_axis_indices(op, o),
            operand_shape(op, o),
            float(graph.tensors[o.tensor].dtype_bytes),
        )
        for o, _ in _all_reduced_operands(graph, op)
    ]


def memory(
    graph: Graph,
    op: Operator,
    candidate: Candidate,
    bytes_per_parameter: float = BYTES_PER_PARAMETER,
) -> float:
    """Bytes per device for one layer of ``op``: its parameter shards with their gradients and
    optimizer state, and its output shard, saved for the backward pass. A device of a replicated
    strategy holds its replica's whole blocks: the layouts' replica dims split nothing."""
    total = 0.0
    for operand, layout in zip(op.inputs, candidate.inputs):
        if graph.root(operand.tensor).kind == "parameter":  # a view of one too
            total += float(np.prod(layout.shard_shape)) * bytes_per_parameter
    out = graph.tensors[op.output.tensor]
    return total + float(np.prod(candidate.output.shard_shape)) * out.dtype_bytes


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
    """Everything the ILP needs, computed once per (graph, cluster, cost model)."""

    graph: Graph
    cluster: Cluster
    cost_model: CostModel
    ops: dict[str, OpTable]
    edges: list[EdgeTable]
    bytes_per_parameter: float = BYTES_PER_PARAMETER
    timings: dict[str, float] = field(default_factory=dict)

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


def _classes(layouts: list[Layout]) -> tuple[np.ndarray, list[Layout]]:
    """Group layouts by the distribution they describe, written as Algorithm 1 plans it (the
    compacted form: the canonical form would also merge tensor dims, which changes the paper's
    plans)."""
    index: dict[Layout, int] = {}
    cls = np.empty(len(layouts), dtype=np.int64)
    for i, layout in enumerate(layouts):
        cls[i] = index.setdefault(layout.compacted(), len(index))
    return cls, list(index)


def build_tables(
    graph: Graph,
    cluster: Cluster,
    cost_model: CostModel = "topology",
    bytes_per_parameter: float = BYTES_PER_PARAMETER,
    share: bool = True,
    replicas: bool = False,
) -> CostTables:
    """Enumerate candidates and compute node costs, memory and edge costs for the search.

    Operators of one signature (:meth:`Graph.signature`: the repeated layers of a model) share one
    candidate list, node cost and memory vector, and edges between operators of the same two
    signatures share one cost matrix, so the tables cost what the distinct operators do, whatever
    the depth. ``share=False`` computes every operator and edge on its own (for the benchmark).
    ``replicas`` also enumerates the strategies over fewer devices (:func:`sharding.strategies`)."""
    check_cost_model(cost_model)
    n = cluster.num_devices
    timings = {"enumerate": 0.0, "costs": 0.0}
    signature = {op.name: graph.signature(op.name) if share else op.name for op in graph.ops}
    distinct: dict[Any, OpTable] = {}
    ops: dict[str, OpTable] = {}
    for op in graph.ops:
        key = signature[op.name]
        if key not in distinct:
            t0 = time.perf_counter()
            cands = candidates(op, n, replicas)
            t1 = time.perf_counter()
            node = allreduce_costs(
                np.array([c.strategy.degrees for c in cands], dtype=np.int64),
                np.array([c.strategy.device_map for c in cands], dtype=np.int64),
                all_reduce_operands(graph, op),
                cluster,
                cost_model,
                [c.strategy.device_matrix for c in cands],
            )
            mem = np.array([memory(graph, op, c, bytes_per_parameter) for c in cands])
            distinct[key] = OpTable(op, cands, node, mem)
            timings["enumerate"] += t1 - t0
            timings["costs"] += time.perf_counter() - t1
        shared = distinct[key]
        ops[op.name] = shared if shared.op is op else replace(shared, op=op)
    t0 = time.perf_counter()
    cache: dict[Any, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    # Different operators can still give a tensor the same layout classes at both ends.
    by_layouts: dict[Any, np.ndarray] = {}
    edges: list[EdgeTable] = []
    for edge in graph.edges:
        key = (signature[edge.producer], signature[edge.consumer], edge.slot)
        if key not in cache:
            src_cls, src_layouts = _classes([c.output for c in ops[edge.producer].candidates])
            dst = [c.inputs[edge.slot] for c in ops[edge.consumer].candidates]
            dst_cls, dst_layouts = _classes(dst)
            dtype = graph.tensors[edge.tensor].dtype_bytes
            layouts = (tuple(src_layouts), tuple(dst_layouts), dtype)
            if layouts not in by_layouts:
                by_layouts[layouts] = redistribution_costs(
                    src_layouts, dst_layouts, cluster, dtype, cost_model
                )
            cache[key] = (src_cls, dst_cls, by_layouts[layouts])
        edges.append(EdgeTable(edge, *cache[key]))
    timings["costs"] += time.perf_counter() - t0
    return CostTables(graph, cluster, cost_model, ops, edges, bytes_per_parameter, timings)


@dataclass(frozen=True)
class Incoming:
    """The redistribution of one input of an operator from its producer's layout."""

    edge: Edge
    plan: Redistribution
    cost: float


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
        return sum(i.cost for i in self.incoming)

    @property
    def total(self) -> float:
        return self.intra_cost + self.incoming_cost


def breakdown(
    graph: Graph,
    cluster: Cluster,
    strategies: Mapping[str, Strategy],
    cost_model: CostModel = "topology",
) -> list[OpCost]:
    """Per operator, in topological order: its collectives and incoming redistributions with
    their costs. Computed directly from the plans, independently of the search's tables."""
    check_cost_model(cost_model)
    chosen = assigned(graph, strategies, cluster.num_devices)
    incoming: dict[str, list[Incoming]] = {op.name: [] for op in graph.ops}
    for edge, plan in edge_plans(graph, chosen):
        dtype = graph.tensors[edge.tensor].dtype_bytes
        incoming[edge.consumer].append(Incoming(edge, plan, plan.cost(cluster, dtype, cost_model)))
    out = []
    for op in graph.ops:
        colls = tuple(
            (c, c.cost(cluster, cost_model)) for c in intra_collectives(graph, op, chosen[op.name])
        )
        out.append(OpCost(op.name, strategies[op.name], colls, tuple(incoming[op.name])))
    return out


def evaluate(
    graph: Graph,
    cluster: Cluster,
    strategies: Mapping[str, Strategy],
    cost_model: CostModel = "topology",
) -> float:
    """The communication cost of an assignment: seconds ("topology") or bytes ("volume")."""
    return sum(c.total for c in breakdown(graph, cluster, strategies, cost_model))
