"""The layout of every tensor and operand of a graph under a plan."""

from __future__ import annotations

from dataclasses import dataclass

from taps._core import Layout, Redistribution
from taps.errors import ExportError
from taps.graph import Edge
from taps.plan.candidates import edge_redistributions
from taps.plan.mesh import Mesh, mesh_for_redistributions
from taps.plan.plan import Plan


@dataclass(frozen=True)
class PlanLayouts:
    """Where every tensor lives under one plan.

    Attributes:
        plan: what the layouts come from.
        inputs: per operator, the layout each input slot wants (after its redistribution).
        outputs: per operator, the layout of its output.
        tensors: per tensor name: an activation's producer layout; a parameter's, an input's or a
            view's layout at its first reader (a parameter read twice in different layouts has
            the others in ``inputs``).
        redistributions: per graph edge (``graph.edges`` order), the redistribution taps plans
            on it.
        mesh: the coarsest mesh every layout above and every layout of the plans fits on.
    """

    plan: Plan
    inputs: dict[str, list[Layout]]
    outputs: dict[str, Layout]
    tensors: dict[str, Layout]
    redistributions: list[tuple[Edge, Redistribution]]
    mesh: Mesh


def layouts_of(plan: Plan) -> PlanLayouts:
    """Every tensor's layout under ``plan``, every edge's redistribution and their common mesh."""
    if not isinstance(plan, Plan):
        raise TypeError(f"expected a taps.Plan, got {type(plan).__name__}")
    if plan.stages:
        # Its strategies span each stage's devices, not one mesh of the whole cluster.
        raise ExportError(
            f"the plan has {len(plan.stages)} pipeline stages: export it with "
            "taps.to_jax_pipeline or taps.to_pipeline, stage by stage"
        )
    graph, chosen = plan.graph, plan.candidates
    inputs = {v: list(c.inputs) for v, c in chosen.items()}
    outputs = {v: c.output for v, c in chosen.items()}
    tensors = {graph.op(v).output.tensor: layout for v, layout in outputs.items()}
    for op in graph.ops:
        for o, layout in zip(op.inputs, inputs[op.name]):
            tensors.setdefault(o.tensor, layout)
    moves = edge_redistributions(graph, chosen)
    every = [*tensors.values(), *(x for ls in inputs.values() for x in ls)]
    mesh = mesh_for_redistributions(every, [r for _, r in moves], plan.cluster.num_devices)
    return PlanLayouts(plan, inputs, outputs, tensors, moves, mesh)
