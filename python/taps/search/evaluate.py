"""What an assignment costs, operator by operator: its collectives and the redistributions of its
inputs (forward and, in the training step, backward), planned directly from the layouts,
independently of the search's tables; its compute, and the communication the step waits for
(the timeline of the backward, :mod:`taps.search.timeline`)."""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace
from typing import cast

import numpy as np

from taps._core import Layout, Redistribution, Strategy, StrategyError
from taps.graph import Edge
from taps.plan.candidates import backward_redistributions, edge_redistributions
from taps.plan.layouts import PlanLayouts, layouts_of
from taps.plan.mesh import mesh_for_redistributions
from taps.plan.plan import Plan
from taps.search.checkpointing import checkpointing
from taps.search.compute import compute_times, roofline_of
from taps.search.prices import (
    BACKWARD_GATHER,
    FORWARD_GATHER,
    GATHERS,
    Collective,
    intra_collectives,
    partial_flows,
)
from taps.search.timeline import Gradient, backward_timeline


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
    """Where the time (or bytes) of one operator goes under a given assignment: its collectives,
    the redistributions of its inputs, its compute (forward and backward, seconds; 0 when the
    pricing counts none) and its exposed communication (what the step waits for: everything but
    the part of its parameters' gradient reductions the backward hides, from the timeline of the
    whole plan)."""

    name: str
    strategy: Strategy
    collectives: tuple[tuple[Collective, float], ...]
    incoming: tuple[Incoming, ...]
    forward_compute: float = 0.0
    backward_compute: float = 0.0
    exposed: float = 0.0

    @property
    def intra_cost(self) -> float:
        return sum(c for _, c in self.collectives)

    @property
    def incoming_cost(self) -> float:
        return sum(i.total for i in self.incoming)

    @property
    def communication(self) -> float:
        """Every collective and redistribution of the operator, each priced on its own."""
        return self.intra_cost + self.incoming_cost

    @property
    def gradient_cost(self) -> float:
        """Its parameters' gradient reductions (the part that may overlap the backward)."""
        return sum(cost for c, cost in self.collectives if c.parameter and c.reason == "gradient")

    @property
    def gather_cost(self) -> float:
        """Its parameters' all_gathers under sharded storage (FSDP), before the forward and the
        backward: on the communication stream, prefetched behind the operator before (the
        timeline's), whole in the search's additive form."""
        return sum(cost for c, cost in self.collectives if c.reason in GATHERS)

    @property
    def compute(self) -> float:
        return self.forward_compute + self.backward_compute

    @property
    def total(self) -> float:
        """What the search minimises for the operator: its compute and communication, less its
        gradient reductions up to its backward's length (the additive form of the overlap,
        :func:`taps.search.compute.overlapped_backward`)."""
        hidden = min(self.backward_compute, self.gradient_cost)
        return self.compute + self.communication - hidden

    @property
    def step_time(self) -> float:
        """The operator's share of the step: its compute and exposed communication."""
        return self.compute + self.exposed


@dataclass(frozen=True)
class StepTime:
    """A plan's step: its compute, its communication (every collective on its own), the part of
    that the step waits for (``exposed``), and the step time, compute plus exposed
    communication. Seconds; under the volume model bytes, with no compute."""

    compute: float
    communication: float
    exposed: float

    @property
    def step_time(self) -> float:
        return self.compute + self.exposed

    @classmethod
    def of(cls, rows: Sequence[OpCost]) -> StepTime:
        """The sums of a breakdown's rows."""
        return cls(
            sum(r.compute for r in rows),
            sum(r.communication for r in rows),
            sum(r.exposed for r in rows),
        )


#: A gradient reduction's group: the device matrix, the device dims its layout splits (the
#: reduction runs over the others), the bytes per element, the collective's kind, and for
#: sharded storage's reduce_scatters the operator (FSDP reduces each unit on its own, unbucketed).
Group = tuple[tuple[int, ...], tuple[int, ...], int, str, int]


def _group(c: Collective, owner: int) -> Group:
    used = tuple(sorted({m for m in c.layout.tensor_map if m >= 0}))
    unit = owner if c.kind == "reduce_scatter" else -1
    return tuple(c.layout.device_matrix), used, c.dtype_bytes, c.kind, unit


def _exposed(plan: Plan, rows: Sequence[OpCost]) -> list[float]:
    """Each operator's exposed communication under ``plan``: without compute counted all it
    communicates; with it, all but what runs on the communication stream (its parameters'
    gradient reductions, and under sharded storage their gathers), plus its share (by bytes) of
    the exposed part of the buckets those reductions are in and how long its compute waits for its
    gathers (:func:`taps.search.timeline.backward_timeline`: the forward's compute stream runs the
    operators in order, each with its forward redistributions and partial sums; the backward's
    runs their backwards in reverse order, each with the redistributions of its inputs' gradients
    and its other reductions of gradients)."""
    cluster, cost_model = plan.cluster, plan.pricing.cost_model
    if not plan.pricing.counts_compute:
        # No compute to hide behind: the step waits for all of it, as the objective says.
        return [r.communication for r in rows]
    exposed = [r.communication - r.gradient_cost - r.gather_cost for r in rows]
    forward = [
        r.forward_compute
        + sum(i.cost for i in r.incoming)
        + sum(cost for c, cost in r.collectives if c.reason == "forward partial sum")
        for r in rows
    ]

    def cost(group: Hashable, size: float) -> float:
        matrix, used, dtype, kind, _ = cast(Group, group)
        layout = Layout(
            [*(matrix[len(matrix) - 1 - k] for k in used), max(1, round(size / dtype))],
            list(matrix),
            [*used, -1],
        )
        whole = cluster.collective_cost(layout, "all_reduce", None, dtype, cost_model)
        return whole if kind == "all_reduce" else whole / 2  # as Collective.cost

    before = backward_timeline(
        forward, [], cost, gathers=[_gathers(r, FORWARD_GATHER) for r in rows]
    )
    durations: list[float] = []
    gathers: list[float] = []
    gradients: list[Gradient] = []
    owner: list[int] = []
    for step, (index, r) in enumerate(reversed(list(enumerate(rows)))):
        durations.append(
            r.backward_compute
            + sum(i.backward_cost for i in r.incoming)
            + sum(cost for c, cost in r.collectives if c.reason == "gradient" and not c.parameter)
        )
        gathers.append(_gathers(r, BACKWARD_GATHER))
        for c, _ in r.collectives:
            if c.parameter and c.reason == "gradient":
                size = math.prod(c.layout.shard_shape) * c.dtype_bytes
                gradients.append(Gradient(step, _group(c, index), float(size)))
                owner.append(index)

    timeline = backward_timeline(durations, gradients, cost, gathers=gathers)
    for index, wait in enumerate(before.waits):
        exposed[index] += wait
    for step, wait in enumerate(timeline.waits):
        exposed[len(rows) - 1 - step] += wait
    for bucket in timeline.buckets:
        for i in bucket.members:
            exposed[owner[i]] += bucket.exposed * gradients[i].bytes / bucket.bytes
    return exposed


def _gathers(row: OpCost, reason: str) -> float:
    """The seconds of a row's parameter gathers before its forward or its backward."""
    return sum(cost for c, cost in row.collectives if c.reason == reason)


def breakdown(plan: Plan) -> list[OpCost]:
    """Per operator of ``plan``, in topological order: its collectives and incoming
    redistributions (forward and, in the training step, backward) with their costs under the
    plan's pricing, its compute and its exposed communication. Computed directly from the plans,
    independently of the search's tables."""
    rows = _priced_rows(plan)
    return [replace(r, exposed=e) for r, e in zip(rows, _exposed(plan, rows))]


def _priced_rows(plan: Plan) -> list[OpCost]:
    """:func:`breakdown`'s rows before the backward's timeline gives their exposed part (what
    :func:`evaluate` and :func:`step_layouts` need, without running the timeline)."""
    if not isinstance(plan, Plan):
        raise TypeError(f"breakdown takes a taps.Plan, got {type(plan).__name__}")
    if plan.stages:
        raise StrategyError(
            "a pipelined plan is priced stage by stage: evaluate each of plan.stage_plans"
        )
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
    device = roofline_of(cluster) if pricing.counts_compute else None
    again = checkpointing(graph, pricing.checkpoint).recomputed
    out = []
    for op in graph.ops:
        strategy = plan.strategies[op.name]
        colls = tuple(
            (c, c.cost(cluster, cost_model))
            for c in intra_collectives(
                graph,
                op,
                chosen[op.name],
                step,
                op.name in flows,
                pricing.zero,
                pricing.gradient_bytes,
                pricing.shards(op.name),
                pricing.parameter_bytes,
            )
        )
        fwd, bwd = (0.0, 0.0)
        if device is not None:
            times = compute_times(graph, op, np.array([strategy.degrees]), *device)
            # A checkpointed layer runs its forward again (counted as forward compute).
            fwd, bwd = float(times[0][0]) * (1 + again[op.name]), float(times[1][0])
        out.append(OpCost(op.name, strategy, colls, tuple(incoming[op.name]), fwd, bwd))
    return out


def evaluate(plan: Plan) -> float:
    """What the search minimises for ``plan`` under its pricing: seconds ("topology") or bytes
    ("volume") of one training step (``step="training"``) or of the paper's model
    (``step="forward"``); with compute counted, communication and compute with the gradient
    reductions' additive overlap (:attr:`OpCost.total`). The step time itself is
    :func:`step_time`."""
    return sum(c.total for c in _priced_rows(plan))


def step_time(plan: Plan) -> StepTime:
    """The step of ``plan`` under its pricing: compute, communication and exposed communication
    (the gradient reductions' overlap with the backward from its timeline)."""
    return StepTime.of(breakdown(plan))


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
    rows = _priced_rows(plan)
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
        layouts = replace(layouts, redistributions=forward, mesh=mesh)
    return StepLayouts(layouts, backward, intra, partial_flows(graph, step))
