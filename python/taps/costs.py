"""What a strategy costs: the intra-operator collectives of an operator (node cost), the memory it
needs per device, and the redistributions between operators (edge cost). SPEC sections 5 and 6."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from taps._core import (
    Cluster,
    Layout,
    Redistribution,
    Strategy,
    StrategyError,
    TopologyError,
    allreduce_costs,
    enumerate_strategies,
    plan_redistribution,
    redistribution_costs,
)
from taps.graph import Edge, Graph, Operand, Operator
from taps.limits import check_candidates
from taps.reductions import PairCost, Problem

#: Bytes of device memory per parameter: fp16 weight and gradient, fp32 master weight and the two
#: Adam moments (mixed-precision Adam).
BYTES_PER_PARAMETER = 16

COST_MODELS = ("topology", "volume")


def check_cost_model(cost_model: str) -> None:
    if cost_model not in COST_MODELS:
        raise TopologyError(f"unknown cost model {cost_model!r}: expected 'topology' or 'volume'")


def candidates(op: Operator, num_devices: int) -> list[Strategy]:
    """The strategies the search considers for ``op``: every power-of-two split of its
    partitionable axes over ``num_devices`` whose degrees divide the axis sizes."""
    check_candidates(op, num_devices)  # counted first: too many would exhaust the memory
    strategies = enumerate_strategies(list(op.partitionable_sizes), num_devices)
    if not strategies:
        raise StrategyError(
            f"operator {op.name!r}: no split of its partitionable axes "
            f"{dict(zip(op.partitionable, op.partitionable_sizes))} onto {num_devices} devices "
            "has degrees that divide the axis sizes"
        )
    return strategies


def strategies_for(graph: Graph, op_name: str, cluster: Cluster) -> list[Strategy]:
    """The candidate list the search uses for one operator of ``graph`` on ``cluster``."""
    return candidates(graph.op(op_name), cluster.num_devices)


def operand_layout(op: Operator, operand: Operand, strategy: Strategy) -> Layout:
    """The layout a strategy gives one operand (input or output) of ``op``."""
    sizes = dict(zip(op.axes, op.axis_sizes))
    return strategy.tensor_layout(
        op.operand_axis_indices(operand), [sizes[d] for d in operand.dims]
    )


def needs_gradient(graph: Graph, tensor: str) -> bool:
    """Parameters always get a gradient; an input only if it asks for one (an earlier layer's
    output); an activation or view if anything upstream of it needs one."""
    return graph.tensors[tensor].requires_grad


@dataclass(frozen=True)
class Collective:
    """One intra-operator collective: an all_reduce of partial sums over the device dims the
    tensor's map does not use."""

    tensor: str
    reason: str  # "forward partial sum" or "gradient"
    layout: Layout
    dtype_bytes: int
    kind: str = "all_reduce"

    def cost(self, cluster: Cluster, cost_model: str = "topology") -> float:
        return cluster.collective_cost(self.layout, self.kind, None, self.dtype_bytes, cost_model)


def _replicated(layout: Layout) -> bool:
    """Whether some device dim is unused by the map (so a reduction over it is needed)."""
    return len(layout.device_matrix) > sum(m >= 0 for m in layout.tensor_map)


def _reducible(graph: Graph, op: Operator) -> list[tuple[Operand, str]]:
    """SPEC section 5: the operands of ``op`` whose shard can be a partial sum, in order: the
    output if a contracted axis can be split (forward), and every input that needs a gradient
    (backward). Each needs an all_reduce over the device dims its layout leaves unused; for the
    output that is exactly when a contracted axis is split."""
    out = [(op.output, "forward partial sum")] if set(op.contracted) & set(op.partitionable) else []
    return out + [(o, "gradient") for o in op.inputs if needs_gradient(graph, o.tensor)]


def intra_collectives(graph: Graph, op: Operator, strategy: Strategy) -> list[Collective]:
    """The all_reduces a strategy of ``op`` needs (:func:`_reducible`), one per operand whose
    layout leaves a device dim unused."""
    out: list[Collective] = []
    for operand, reason in _reducible(graph, op):
        layout = operand_layout(op, operand, strategy)
        if _replicated(layout):
            t = graph.tensors[operand.tensor]
            out.append(Collective(t.name, reason, layout, t.dtype_bytes))
    return out


def _reduced_tensors(graph: Graph, op: Operator) -> list[tuple[list[int], list[int], float]]:
    """The operands of :func:`_reducible` as ``(strategy axes, shape, dtype bytes)`` for the Rust
    kernel ``allreduce_costs``, which prices a reduction over no device dim at 0."""
    sizes = dict(zip(op.axes, op.axis_sizes))
    return [
        (
            op.operand_axis_indices(o),
            [sizes[d] for d in o.dims],
            float(graph.tensors[o.tensor].dtype_bytes),
        )
        for o, _ in _reducible(graph, op)
    ]


def memory(
    graph: Graph, op: Operator, strategy: Strategy, bytes_per_parameter: float = BYTES_PER_PARAMETER
) -> float:
    """Bytes per device for one layer of ``op``: its parameter shards with their gradients and
    optimizer state, and its output shard, saved for the backward pass."""
    total = 0.0
    for operand in op.inputs:
        if graph.tensors[operand.tensor].kind == "parameter":
            shard = operand_layout(op, operand, strategy).shard_shape
            total += float(np.prod(shard)) * bytes_per_parameter
    out = graph.tensors[op.output.tensor]
    total += float(np.prod(operand_layout(op, op.output, strategy).shard_shape)) * out.dtype_bytes
    return total


@dataclass
class OpTable:
    """The candidates of one operator with their node costs and memory."""

    op: Operator
    strategies: list[Strategy]
    node_cost: np.ndarray
    memory: np.ndarray


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
    cost_model: str
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
    """Group layouts by the distribution they describe."""
    index: dict[Layout, int] = {}
    cls = np.empty(len(layouts), dtype=np.int64)
    for i, layout in enumerate(layouts):
        cls[i] = index.setdefault(layout.normalized(), len(index))
    return cls, list(index)


def build_tables(
    graph: Graph,
    cluster: Cluster,
    cost_model: str = "topology",
    bytes_per_parameter: float = BYTES_PER_PARAMETER,
    share_edge_costs: bool = True,
) -> CostTables:
    """Enumerate candidates and compute node costs, memory and edge costs for the search.

    Edges whose two ends give the same lists of layout classes (the same tensor between operators
    of the same kind, as in repeated blocks) share one cost matrix unless ``share_edge_costs`` is
    off (for the benchmark)."""
    check_cost_model(cost_model)
    n = cluster.num_devices
    t0 = time.perf_counter()
    strategies = {op.name: candidates(op, n) for op in graph.ops}
    t1 = time.perf_counter()
    ops: dict[str, OpTable] = {}
    for op in graph.ops:
        cands = strategies[op.name]
        node = allreduce_costs(
            np.array([s.degrees for s in cands], dtype=np.int64),
            np.array([s.device_map for s in cands], dtype=np.int64),
            _reduced_tensors(graph, op),
            cluster,
            cost_model,
        )
        mem = np.array([memory(graph, op, s, bytes_per_parameter) for s in cands])
        ops[op.name] = OpTable(op, cands, node, mem)
    cache: dict[tuple, np.ndarray] = {}
    edges: list[EdgeTable] = []
    for edge in graph.edges:
        producer, consumer = graph.op(edge.producer), graph.op(edge.consumer)
        src = [operand_layout(producer, producer.output, s) for s in strategies[producer.name]]
        dst_operand = consumer.inputs[edge.slot]
        dst = [operand_layout(consumer, dst_operand, s) for s in strategies[consumer.name]]
        src_cls, src_layouts = _classes(src)
        dst_cls, dst_layouts = _classes(dst)
        dtype = graph.tensors[edge.tensor].dtype_bytes
        key = (tuple(src_layouts), tuple(dst_layouts), dtype)
        if key not in cache or not share_edge_costs:
            cache[key] = redistribution_costs(src_layouts, dst_layouts, cluster, dtype, cost_model)
        edges.append(EdgeTable(edge, src_cls, dst_cls, cache[key]))
    t2 = time.perf_counter()
    return CostTables(
        graph,
        cluster,
        cost_model,
        ops,
        edges,
        bytes_per_parameter,
        {"enumerate": t1 - t0, "costs": t2 - t1},
    )


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
    graph: Graph, cluster: Cluster, strategies: Mapping[str, Strategy], cost_model: str = "topology"
) -> list[OpCost]:
    """Per operator, in topological order: its collectives and incoming redistributions with
    their costs. Computed directly from the plans, independently of the search's tables."""
    check_cost_model(cost_model)
    missing = [op.name for op in graph.ops if op.name not in strategies]
    if missing:
        raise StrategyError(f"no strategy given for operators {missing}")
    incoming: dict[str, list[Incoming]] = {op.name: [] for op in graph.ops}
    for edge in graph.edges:
        producer, consumer = graph.op(edge.producer), graph.op(edge.consumer)
        a = operand_layout(producer, producer.output, strategies[producer.name])
        b = operand_layout(consumer, consumer.inputs[edge.slot], strategies[consumer.name])
        plan = plan_redistribution(a, b)
        dtype = graph.tensors[edge.tensor].dtype_bytes
        incoming[consumer.name].append(Incoming(edge, plan, plan.cost(cluster, dtype, cost_model)))
    out = []
    for op in graph.ops:
        s = strategies[op.name]
        if s.num_devices != cluster.num_devices:
            raise StrategyError(
                f"operator {op.name!r}: strategy {s} spans {s.num_devices} devices, the cluster "
                f"{cluster.num_devices}"
            )
        colls = tuple((c, c.cost(cluster, cost_model)) for c in intra_collectives(graph, op, s))
        out.append(OpCost(op.name, s, colls, tuple(incoming[op.name])))
    return out


def evaluate(
    graph: Graph, cluster: Cluster, strategies: Mapping[str, Strategy], cost_model: str = "topology"
) -> float:
    """The communication cost of an assignment: seconds ("topology") or bytes ("volume")."""
    return sum(c.total for c in breakdown(graph, cluster, strategies, cost_model))
