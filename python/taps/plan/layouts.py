"""The layout of every tensor and operand of a graph under an assignment of strategies."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from taps._core import Cluster, Layout, Redistribution, Strategy
from taps.errors import ExportError
from taps.graph import Edge, Graph
from taps.plan.candidates import assigned, edge_redistributions
from taps.plan.mesh import Mesh, mesh_for_redistributions
from taps.plan.plan import Plan


@dataclass(frozen=True)
class PlanLayouts:
    """Where every tensor lives under one assignment.

    Attributes:
        graph, strategies: what the layouts come from.
        inputs: per operator, the layout each input slot wants (after its redistribution).
        outputs: per operator, the layout of its output.
        tensors: per tensor name: an activation's producer layout; a parameter's, an input's or a
            view's layout at its first reader (a parameter read twice in different layouts has
            the others in ``inputs``).
        redistributions: per graph edge (``graph.edges`` order), the redistribution taps plans
            on it.
        mesh: the coarsest mesh every layout above and every layout of the plans fits on.
    """

    graph: Graph
    strategies: Mapping[str, Strategy]
    inputs: dict[str, list[Layout]]
    outputs: dict[str, Layout]
    tensors: dict[str, Layout]
    redistributions: list[tuple[Edge, Redistribution]]
    mesh: Mesh


def plan_layouts(
    graph: Graph, strategies: Mapping[str, Strategy], cluster: Cluster | None = None
) -> PlanLayouts:
    """Every operand's layout, every edge's plan and their common mesh."""
    n = None if cluster is None else cluster.num_devices
    chosen = assigned(graph, strategies, n, ExportError)
    inputs = {v: list(c.inputs) for v, c in chosen.items()}
    outputs = {v: c.output for v, c in chosen.items()}
    tensors = {graph.op(v).output.tensor: layout for v, layout in outputs.items()}
    for op in graph.ops:
        for o, layout in zip(op.inputs, inputs[op.name]):
            tensors.setdefault(o.tensor, layout)
    plans = edge_redistributions(graph, chosen)
    every = [*tensors.values(), *(x for ls in inputs.values() for x in ls)]
    if n is None:
        n = next(iter(outputs.values())).num_devices if outputs else 1
    mesh = mesh_for_redistributions(every, [plan for _, plan in plans], n)
    return PlanLayouts(graph, dict(strategies), inputs, outputs, tensors, plans, mesh)


def layouts_of(plan: Plan) -> PlanLayouts:
    """Every tensor's layout under ``plan``, every edge's redistribution and their common mesh."""
    if not isinstance(plan, Plan):
        raise TypeError(f"expected a taps.Plan, got {type(plan).__name__}")
    return plan_layouts(plan.graph, plan.strategies, plan.cluster)
