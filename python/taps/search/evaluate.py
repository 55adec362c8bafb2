"""What an assignment costs, operator by operator: its collectives and the redistributions of its
inputs (forward and, in the training step, backward), planned directly from the layouts,
independently of the search's tables."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from taps._core import Redistribution, Strategy
from taps.graph import Edge
from taps.plan.candidates import backward_redistributions, edge_redistributions
from taps.plan.layouts import PlanLayouts, layouts_of
from taps.plan.mesh import mesh_for_redistributions
from taps.plan.plan import Plan
from taps.search.prices import Collective, intra_collectives, partial_flows


@dataclass(frozen=True)
class Incoming:
    """The redistributions of one input of an operator: forward from its producer's layout and,
    in the training step, the gradient's back to it."""

    edge: Edge
    redistribution: Redistribution
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


def breakdown(plan: Plan) -> list[OpCost]:
    """Per operator of ``plan``, in topological order: its collectives and incoming
    redistributions (forward and, in the training step, backward) with their costs under the
    plan's pricing. Computed directly from the plans, independently of the search's tables."""
    if not isinstance(plan, Plan):
        raise TypeError(f"breakdown takes a taps.Plan, got {type(plan).__name__}")
    graph, cluster, pricing = plan.graph, plan.cluster, plan.pricing
    cost_model, step = pricing.cost_model, pricing.step
    chosen = plan.candidates
    flows = partial_flows(graph, step)
    # The optimal planner minimises what the cost model measures: seconds on the cluster, or
    # elements without one.
    on = cluster if cost_model == "topology" else None
    forward = edge_redistributions(graph, chosen, pricing.planner, on, flows)
    backward = (
        backward_redistributions(graph, chosen, pricing.planner, on)
        if step == "training"
        else [(e, None) for e in graph.edges]
    )
    incoming: dict[str, list[Incoming]] = {op.name: [] for op in graph.ops}
    for (edge, redistribution), (_, back) in zip(forward, backward):
        dtype = graph.tensors[edge.tensor].dtype_bytes
        incoming[edge.consumer].append(
            Incoming(
                edge,
                redistribution,
                redistribution.cost(cluster, dtype, cost_model),
                back,
                0.0 if back is None else back.cost(cluster, dtype, cost_model),
            )
        )
    out = []
    for op in graph.ops:
        colls = tuple(
            (c, c.cost(cluster, cost_model))
            for c in intra_collectives(
                graph, op, chosen[op.name], step, op.name in flows, pricing.zero
            )
        )
        out.append(OpCost(op.name, plan.strategies[op.name], colls, tuple(incoming[op.name])))
    return out


def evaluate(plan: Plan) -> float:
    """The communication cost of ``plan`` under its pricing: seconds ("topology") or bytes
    ("volume") of one training step (``step="training"``) or of the paper's model
    (``step="forward"``)."""
    return sum(c.total for c in breakdown(plan))


@dataclass(frozen=True)
class StepLayouts:
    """A plan as its step runs, for the engines that replay it (docs/verify.md).

    Attributes:
        layouts: the plan's layouts, with the forward plan of every edge as :func:`breakdown`
            prices it (in the training step from the producer's partial sums where they flow)
            and a mesh that fits every layout those plans, the backward plans, the partial outputs
            and the operators' collectives pass through.
        backward: per graph edge, the backward plan of the gradient (``None``: no gradient, or
            the paper's model).
        intra: per operator, its collectives (forward partial sums and gradients).
        flows: the operators whose partial sums flow to their consumer.
    """

    layouts: PlanLayouts
    backward: list[Redistribution | None]
    intra: dict[str, list[Collective]]
    flows: frozenset[str]


def step_layouts(plan: Plan) -> StepLayouts:
    """``plan``'s layouts and plans as its pricing's step runs them (:class:`StepLayouts`)."""
    graph, step = plan.graph, plan.pricing.step
    layouts = layouts_of(plan)
    rows = breakdown(plan)
    incoming = {(i.edge.consumer, i.edge.slot): i for r in rows for i in r.incoming}
    backward = [incoming[(e.consumer, e.slot)].backward for e in graph.edges]
    intra = {r.name: [c for c, _ in r.collectives] for r in rows}
    if step == "training":
        forward = [(e, incoming[(e.consumer, e.slot)].redistribution) for e in graph.edges]
        every = [
            *layouts.tensors.values(),
            *(x for ls in layouts.inputs.values() for x in ls),
            *(c.partial_output for c in plan.candidates.values()),
            *(c.layout for cs in intra.values() for c in cs),
        ]
        plans = [p for _, p in forward] + [p for p in backward if p is not None]
        mesh = mesh_for_redistributions(every, plans, plan.cluster.num_devices)
        layouts = dataclasses.replace(layouts, redistributions=forward, mesh=mesh)
    return StepLayouts(layouts, backward, intra, partial_flows(graph, step))
