"""What taps predicts a plan runs, whatever the engine: every collective of every edge's steps
(forward, and backward in the training step) and of every operator (forward partial sums and
gradients), with its groups of ranks and the bytes each device receives at the run's element
size, in the scope it runs in (``e<i>`` the redistribution of edge ``i``, ``o<j>`` operator
``j``)."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

from taps._core import Cluster, CommOp, Layout, Redistribution
from taps._support.arguments import shown
from taps.errors import VerifyError
from taps.graph import Graph
from taps.plan.layouts import PlanLayouts
from taps.plan.plan import Plan
from taps.search.prices import FORWARD_GATHER, Collective, intra_collectives
from taps.steps.kinds import layout_groups, step_kind
from taps.verify.result import Predicted

#: The operators' collectives that run in the forward pass: partial sums, and under sharded storage
#: (FSDP) a parameter's gather before the forward.
FORWARD = ("forward partial sum", FORWARD_GATHER)


def check_plan(plan: object, who: str, seed: object = 0) -> None:
    """A one-line :class:`TypeError` unless ``plan`` is a :class:`taps.Plan` and ``seed`` an
    int, a :class:`VerifyError` for a pipelined plan (its stages run apart) or a seed that is
    not a 64-bit unsigned int (what numpy, JAX and torch all take)."""
    if not isinstance(plan, Plan):
        raise TypeError(
            f"{who} takes a taps.Plan (a search result's .plan), got {type(plan).__name__}"
        )
    if plan.stages:
        raise VerifyError(
            f"{who} runs a plan without pipeline stages: verify a pipelined plan with "
            "taps.verify.torch.pipeline.verify_pipeline"
        )
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"{who}: seed must be an int, got {type(seed).__name__}")
    if not 0 <= seed < 2**64:
        raise VerifyError(f"{who}: seed must be from 0 to 2**64 - 1, got {shown(seed)}")


def _unused_dims(layout: Layout) -> list[int]:
    return [k for k in range(len(layout.device_matrix)) if k not in layout.tensor_map]


def _volume_bytes(cluster: Cluster, op: CommOp, itemsize: int) -> int:
    return round(op.cost(cluster, itemsize, "volume"))


def predicted_steps(
    plan: Redistribution,
    cluster: Cluster,
    itemsize: int,
    scope: str,
    what: str,
    phase: str = "forward",
    origin: Hashable | None = None,
) -> list[Predicted]:
    """The collectives of a plan's steps (slices are free and run none), priced on ``cluster``.
    With ``origin``
    (what the plan's input is: the producer of a forward edge), each step's ``same`` key is the
    origin and the distributions before and after the step (normal forms, whatever shapes the
    plans write them in): plans that take one tensor through the same move compute the same
    blocks."""
    ops = plan.all_ops
    after = [op.layout for op in ops[1:]] + [plan.target]
    return [
        Predicted(
            step_kind(op.kind).collective or "",
            step_kind(op.kind).groups(op),
            _volume_bytes(cluster, op, itemsize),
            scope,
            phase,
            f"{what}: {op.kind}"
            + (f" of dim {op.tensor_dim}" if op.tensor_dim is not None else "")
            + (f" to dim {op.to_tensor_dim}" if op.to_tensor_dim is not None else ""),
            None if origin is None else (origin, op.layout.normalized(), after[k].normalized()),
            op.cost(cluster, itemsize),
        )
        for k, op in enumerate(ops)
        if step_kind(op.kind).collective is not None
    ]


def operator_collectives(plan: Plan) -> dict[str, list[Collective]]:
    """taps' all_reduces of every operator in the paper's model (forward partial sums and
    gradients)."""
    return {
        op.name: intra_collectives(plan.graph, op, plan.candidates[op.name])
        for op in plan.graph.ops
    }


def describe_scopes(layouts: PlanLayouts) -> dict[str, str]:
    """What each scope is: ``e<i>`` the redistribution of edge ``i``, ``o<j>`` operator ``j``."""
    out = {
        f"e{i}": f"edge {e.producer} -> {e.consumer}"
        for i, (e, _) in enumerate(layouts.redistributions)
    }
    out.update({f"o{j}": f"operator {op.name}" for j, op in enumerate(layouts.plan.graph.ops)})
    return out


def values(graph: Graph) -> dict[str, int]:
    """Per operator, what its output is as far as the graph tells: its kind, axes and
    operands, each operand a parameter or input by name, a view by its base's value and shape,
    an operator's output by that operator's value. Operators the model runs twice on one value
    (T5's position bias masked by every layer's attention) have one value, and a compiler may
    compute them, and their edges' steps, once. Each distinct value is a number, given in the
    order first met: the same value, the same number. (As nested tuples, a residual stream
    would double its key at each layer: hashing a deep model's keys never ends.)"""
    numbers: dict[Hashable, int] = {}
    out: dict[str, int] = {}

    def number(key: Hashable) -> int:
        return numbers.setdefault(key, len(numbers))

    def tensor(name: str) -> int:
        t = graph.tensors[name]
        if t.producer is not None:
            return out[t.producer]
        if t.base is not None:
            return number(("view", tensor(t.base), t.shape))
        return number(("leaf", name))

    for op in graph.ops:  # in topological order: every operand's producer comes first
        operands = tuple((tensor(o.tensor), o.dims, o.addend) for o in op.inputs)
        out[op.name] = number((op.kind, op.output.dims, op.axes, op.axis_sizes, operands))
    return out


def predicted_collectives(
    layouts: PlanLayouts,
    intra: Mapping[str, list[Collective]],
    itemsize: int,
    describe: Mapping[str, str],
    backward: Sequence[Redistribution | None] = (),
    itemsizes: Mapping[object, int] | None = None,
) -> list[Predicted]:
    """taps' collectives of a plan at ``itemsize`` bytes per element: every edge's steps (scope
    ``e<i>``), every operator's all_reduces (``o<j>``; gradients in the backward phase, a ZeRO
    gradient as its reduce_scatter and all_gather, each half the all_reduce's bytes; under
    sharded storage, FSDP, a parameter's gathers before the forward and the backward and its
    gradient's reduce_scatter, each half the gradient all_reduce's bytes), and the
    steps of the edges' ``backward`` plans (backward phase), if given. ``itemsizes``: the
    element sizes that differ from ``itemsize`` (integer tensors keep their width), by tensor
    name (an operator's collectives) or by ``(consumer, slot)`` (an edge's steps)."""
    cluster = layouts.plan.cluster
    graph = layouts.plan.graph
    sizes = itemsizes or {}
    out = []
    for j, op in enumerate(graph.ops):
        for c in intra[op.name]:
            size = sizes.get(c.tensor, itemsize)
            cost = round(cluster.collective_cost(c.layout, "all_reduce", None, size, "volume"))
            seconds = cluster.collective_cost(c.layout, "all_reduce", None, size)
            groups = layout_groups(c.layout, _unused_dims(c.layout))
            phase = "forward" if c.reason in FORWARD else "backward"
            what = f"{c.reason} of {c.tensor}"
            # A ZeRO gradient: the ring all_reduce's two halves, each half its steps and bytes;
            # sharded storage's gathers and reduce_scatter (FSDP) are one half each.
            halves = [("reduce_scatter", cost // 2), ("all_gather", cost - cost // 2)]
            if c.zero:
                kinds = halves
            elif c.kind == "all_reduce":
                kinds = [("all_reduce", cost)]
            else:
                kinds = [h for h in halves if h[0] == c.kind]
            for kind, b in kinds:
                share = seconds if kind == "all_reduce" else seconds / 2
                out.append(Predicted(kind, groups, b, f"o{j}", phase, what, seconds=share))
    value = values(graph)
    for i, (e, plan) in enumerate(layouts.redistributions):
        size = sizes.get((e.consumer, e.slot), itemsize)
        out += predicted_steps(
            plan, cluster, size, f"e{i}", describe[f"e{i}"], "forward", value[e.producer]
        )
    for i, ((e, _), back) in enumerate(zip(layouts.redistributions, backward)):
        if back is not None:
            what = f"{describe[f'e{i}']} (gradient)"
            # An add hands its output's gradient to every operand: one tensor for all its edges.
            add = layouts.plan.graph.op(e.consumer).kind == "add"
            origin = f"gradient of {e.consumer}" + ("" if add else f"#{e.slot}")
            out += predicted_steps(back, cluster, itemsize, f"e{i}", what, "backward", origin)
    return out
