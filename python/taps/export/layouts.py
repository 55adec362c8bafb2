"""The layout of every tensor and operand of a graph under an assignment of strategies."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from taps._core import Cluster, Layout, Redistribution, Strategy, plan_redistribution
from taps.graph import Edge, Graph
from taps.sharding import Candidate

from .mesh import ExportError, Mesh, mesh_for


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
        plans: per graph edge (``graph.edges`` order), the redistribution taps plans on it.
        mesh: the coarsest mesh every layout above and every layout of the plans fits on.
    """

    graph: Graph
    strategies: Mapping[str, Strategy]
    inputs: dict[str, list[Layout]]
    outputs: dict[str, Layout]
    tensors: dict[str, Layout]
    plans: list[tuple[Edge, Redistribution]]
    mesh: Mesh


def plan_layouts(
    graph: Graph, strategies: Mapping[str, Strategy], cluster: Cluster | None = None
) -> PlanLayouts:
    """Every operand's layout, every edge's plan and their common mesh."""
    missing = [op.name for op in graph.ops if op.name not in strategies]
    if missing:
        raise ExportError(f"no strategy given for operators {missing}")
    inputs: dict[str, list[Layout]] = {}
    outputs: dict[str, Layout] = {}
    tensors: dict[str, Layout] = {}
    for op in graph.ops:
        s = strategies[op.name]
        if cluster is not None and s.num_devices != cluster.num_devices:
            raise ExportError(
                f"operator {op.name!r}: strategy spans {s.num_devices} devices, the cluster "
                f"{cluster.num_devices}"
            )
        candidate = Candidate.of(op, s)
        inputs[op.name] = list(candidate.inputs)
        outputs[op.name] = candidate.output
        tensors[op.output.tensor] = outputs[op.name]
    for op in graph.ops:
        for o, layout in zip(op.inputs, inputs[op.name]):
            tensors.setdefault(o.tensor, layout)
    plans = []
    for edge in graph.edges:
        plans.append(
            (edge, plan_redistribution(outputs[edge.producer], inputs[edge.consumer][edge.slot]))
        )
    every = [*tensors.values(), *(x for ls in inputs.values() for x in ls)]
    for _, plan in plans:
        every += [plan.source, plan.target, *(op.layout for op in plan.all_ops)]
    n = next(iter(outputs.values())).num_devices if outputs else 1
    if cluster is not None:
        n = cluster.num_devices
    return PlanLayouts(graph, dict(strategies), inputs, outputs, tensors, plans, mesh_for(every, n))
