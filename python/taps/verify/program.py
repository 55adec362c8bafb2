"""A taps graph as a JAX program, in three forms: under ``shard_map`` with taps' own steps
(the exact replay), as whole-tensor code with taps' layouts as sharding constraints (for the
compiler's partitioner), and as plain whole-tensor code (the reference).

Every edge and operator runs in its own ``jax.named_scope`` (``taps_e<i>``, ``taps_o<j>``), which
XLA keeps in each instruction's ``op_name``: that is how a compiled collective is traced to the
edge or operator it serves, and ``transpose(`` in the name marks the backward pass. The program is
a training step: ``jax.vjp`` of every operator output, with random cotangents, with respect to
every parameter and every input that needs a gradient. :class:`GraphProgram` holds taps' plans and
collectives of either step it prices; the training step's own body is :mod:`.training`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from taps._core import Cluster, CommOp, Layout, Redistribution, Strategy
from taps.errors import VerifyError
from taps.export.jax import import_jax, jax_mesh, layout_spec
from taps.graph import Graph
from taps.plan.candidates import Candidate, assigned
from taps.plan.layouts import PlanLayouts, plan_layouts
from taps.plan.mesh import Mesh, mesh_for_plans
from taps.plan.plan import Plan
from taps.plan.pricing import Pricing, Step
from taps.search.evaluate import breakdown
from taps.search.prices import Collective, intra_collectives, partial_flows
from taps.verify import hlo
from taps.verify.devices import jax_with_devices
from taps.verify.operators import compute
from taps.verify.result import Predicted
from taps.verify.steps import layout_groups, step

if TYPE_CHECKING:
    from taps._core import _CostModel as CostModel
    from taps._core import _Planner as Planner

#: Relative error allowed per dtype (float sums run in another order when sharded).
TOLERANCE = {"float32": 1e-4, "bfloat16": 5e-2, "float16": 1e-2}

_SCOPE = re.compile(r"taps_([eo]\d+)")

MODES = ("shard_map", "gspmd", "reference")


def _unused_dims(layout: Layout) -> list[int]:
    return [k for k in range(len(layout.device_matrix)) if k not in layout.tensor_map]


def _volume_bytes(cluster: Cluster, op: CommOp, itemsize: int) -> int:
    return round(op.cost(cluster, itemsize, "volume"))


def redistribute(x: Any, plan: Redistribution, target: Layout, mesh: Mesh) -> Any:
    """A device's block of the plan's source, taken to its block of ``target`` by the plan's
    steps (prelude on the source's shape, the unified steps, epilogue on the target's)."""
    jnp = import_jax().numpy

    def run(x: Any, op: CommOp) -> Any:
        row = step(op.kind)
        return row.run(x, op, mesh.group_axes(op.layout, row.dims(op)))

    for op in plan.prelude:
        x = run(x, op)
    x = jnp.reshape(x, plan.source.shard_shape)
    for op in plan.ops:
        x = run(x, op)
    x = jnp.reshape(x, (plan.epilogue[0].layout if plan.epilogue else target).shard_shape)
    for op in plan.epilogue:
        x = run(x, op)
    return x


def predicted_steps(
    plan: Redistribution,
    cluster: Cluster,
    itemsize: int,
    scope: str,
    what: str,
    phase: str = "forward",
    origin: str | None = None,
) -> list[Predicted]:
    """The collectives of a plan's steps (slices are free and compile to none). With ``origin``
    (what the plan's input is: the producer of a forward edge), each step's ``same`` key is the
    origin and the distributions before and after the step (normal forms, whatever shapes the
    plans write them in): plans that take one tensor through the same move compute the same
    blocks."""
    ops = plan.all_ops
    after = [op.layout for op in ops[1:]] + [plan.target]
    return [
        Predicted(
            step(op.kind).hlo_kind or "",
            step(op.kind).groups(op),
            _volume_bytes(cluster, op, itemsize),
            scope,
            phase,
            f"{what}: {op.kind}"
            + (f" of dim {op.tensor_dim}" if op.tensor_dim is not None else "")
            + (f" to dim {op.to_tensor_dim}" if op.to_tensor_dim is not None else ""),
            None if origin is None else (origin, op.layout.normalized(), after[k].normalized()),
        )
        for k, op in enumerate(ops)
        if step(op.kind).hlo_kind is not None
    ]


def operator_collectives(
    graph: Graph, strategies: Mapping[str, Strategy]
) -> dict[str, list[Collective]]:
    """taps' all_reduces of every operator (forward partial sums and gradients)."""
    return {
        op.name: intra_collectives(graph, op, Candidate.of(op, strategies[op.name]))
        for op in graph.ops
    }


def describe_scopes(layouts: PlanLayouts) -> dict[str, str]:
    """What each scope is: ``e<i>`` the redistribution of edge ``i``, ``o<j>`` operator ``j``."""
    out = {f"e{i}": f"edge {e.producer} -> {e.consumer}" for i, (e, _) in enumerate(layouts.plans)}
    out.update({f"o{j}": f"operator {op.name}" for j, op in enumerate(layouts.graph.ops)})
    return out


def predicted_collectives(
    layouts: PlanLayouts,
    intra: Mapping[str, list[Collective]],
    itemsize: int,
    describe: Mapping[str, str],
    backward: Sequence[Redistribution | None] = (),
) -> list[Predicted]:
    """taps' collectives of a plan at ``itemsize`` bytes per element: every edge's steps (scope
    ``e<i>``), every operator's all_reduces (``o<j>``; gradients in the backward phase, a ZeRO
    gradient as its reduce_scatter and all_gather, each half the all_reduce's bytes), and the
    steps of the edges' ``backward`` plans (backward phase), if given."""
    one_node = Cluster(1, layouts.mesh.num_devices)
    out = []
    for j, op in enumerate(layouts.graph.ops):
        for c in intra[op.name]:
            cost = round(one_node.collective_cost(c.layout, "all_reduce", None, itemsize, "volume"))
            groups = layout_groups(c.layout, _unused_dims(c.layout))
            phase = "forward" if c.reason == "forward partial sum" else "backward"
            what = f"{c.reason} of {c.tensor}"
            if c.zero:
                out.append(Predicted("reduce_scatter", groups, cost // 2, f"o{j}", phase, what))
                out.append(Predicted("all_gather", groups, cost - cost // 2, f"o{j}", phase, what))
            else:
                out.append(Predicted("all_reduce", groups, cost, f"o{j}", phase, what))
    for i, (e, plan) in enumerate(layouts.plans):
        out += predicted_steps(
            plan, one_node, itemsize, f"e{i}", describe[f"e{i}"], "forward", e.producer
        )
    for i, ((e, _), back) in enumerate(zip(layouts.plans, backward)):
        if back is not None:
            what = f"{describe[f'e{i}']} (gradient)"
            # An add hands its output's gradient to every operand: one tensor for all its edges.
            add = layouts.graph.op(e.consumer).kind == "add"
            origin = f"gradient of {e.consumer}" + ("" if add else f"#{e.slot}")
            out += predicted_steps(back, one_node, itemsize, f"e{i}", what, "backward", origin)
    return out


def measured(text: str, n: int) -> list[tuple[str, str, hlo.HloCollective]]:
    """The collectives of a compiled program as ``(scope, phase, collective)``."""
    out = []
    for c in hlo.collectives(text, n):
        scopes = _SCOPE.findall(c.op_name)
        phase = "backward" if "transpose(" in c.op_name else "forward"
        out.append((scopes[-1] if scopes else "", phase, c))
    return out


def relative_error(got: Any, want: Any) -> float:
    """The largest difference, relative to the largest magnitude of ``want`` (0 for equal)."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    scale = float(np.max(np.abs(want), initial=0.0)) or 1.0
    return float(np.max(np.abs(got - want), initial=0.0)) / scale


def run_dtype(name: str) -> Any:
    """The JAX dtype a replay runs in, by name (one of :data:`TOLERANCE`)."""
    if name not in TOLERANCE:
        raise VerifyError(f"unknown dtype {name!r}: expected one of {sorted(TOLERANCE)}")
    return import_jax().numpy.dtype(name)


class GraphProgram:
    """Everything the replays of one plan share: layouts and mesh, taps' plans and collectives of
    ``step`` (:func:`taps.breakdown`; in the training step the edges plan from flowing partial
    sums and each has a backward plan, and the mesh fits every layout they pass through), the
    input values (one per operator slot that reads a parameter or an input, keyed
    ``"op#slot"``), the cotangents, the predicted collectives, and :meth:`body` in each mode."""

    def __init__(
        self,
        graph: Graph,
        cluster: Cluster,
        strategies: Mapping[str, Strategy],
        dtype: str = "float32",
        seed: int = 0,
        step: Step = "forward",
        planner: Planner = "paper",
        zero: bool = False,
        cost_model: CostModel = "topology",
    ) -> None:
        self.graph, self.cluster, self.strategies = graph, cluster, dict(strategies)
        self.step, self.planner, self.zero = step, planner, zero
        self.layouts = plan_layouts(graph, strategies, cluster)
        # taps' own plans and collectives of the step, as the search priced them (the optimal
        # planner minimises what ``cost_model`` measures: seconds on the cluster, or elements);
        # in the paper's model they are plan_layouts' plans.
        rows = breakdown(
            Plan(
                graph,
                cluster,
                strategies,
                Pricing(cost_model=cost_model, step=step, planner=planner, zero=zero),
            )
        )
        incoming = {(i.edge.consumer, i.edge.slot): i for r in rows for i in r.incoming}
        #: Per graph edge, the backward plan of the gradient (training step; None: no gradient).
        self.backward: list[Redistribution | None] = [
            incoming[(e.consumer, e.slot)].backward for e in graph.edges
        ]
        #: taps' collectives of every operator (forward partial sums and gradients).
        self.intra = {r.name: [c for c, _ in r.collectives] for r in rows}
        self.flows = partial_flows(graph, step)
        self.candidates = assigned(graph, strategies)
        if step == "training":
            forward = [(e, incoming[(e.consumer, e.slot)].redistribution) for e in graph.edges]
            every = [
                *self.layouts.tensors.values(),
                *(x for ls in self.layouts.inputs.values() for x in ls),
                *(c.partial_output for c in self.candidates.values()),
                *(c.layout for cs in self.intra.values() for c in cs),
            ]
            plans = [p for _, p in forward] + [p for p in self.backward if p is not None]
            mesh = mesh_for_plans(every, plans, cluster.num_devices)
            self.layouts = dataclasses.replace(self.layouts, plans=forward, mesh=mesh)
        self.mesh = self.layouts.mesh
        self.jax = jax_with_devices(self.mesh.num_devices)
        self.dtype = run_dtype(dtype)
        self.jmesh = jax_mesh(self.mesh)
        self.edges = {
            (e.consumer, e.slot): (i, e, p) for i, (e, p) in enumerate(self.layouts.plans)
        }
        self.describe = describe_scopes(self.layouts)
        rng = np.random.default_rng(seed)
        roots: dict[str, np.ndarray] = {}
        self.diff: dict[str, np.ndarray] = {}
        self.fixed: dict[str, np.ndarray] = {}
        self.leaf_layouts: dict[str, Layout] = {}
        for op in graph.ops:
            for slot, o in enumerate(op.inputs):
                root = graph.root(o.tensor)
                if root.kind == "activation":
                    continue
                if root.name not in roots:
                    scale = 1 / math.sqrt(root.shape[0]) if len(root.shape) > 1 else 1.0
                    roots[root.name] = (rng.standard_normal(root.shape) * scale).astype(self.dtype)
                key = f"{op.name}#{slot}"
                self.leaf_layouts[key] = self.layouts.inputs[op.name][slot]
                value = roots[root.name].reshape(graph.tensors[o.tensor].shape)
                (self.diff if root.requires_grad else self.fixed)[key] = value
        self.cts = {
            op.name: rng.standard_normal(graph.tensors[op.output.tensor].shape).astype(self.dtype)
            for op in graph.ops
        }
        self.out_specs = {op.name: self.spec(self.layouts.outputs[op.name]) for op in graph.ops}
        self._reference: tuple[Any, Any] | None = None

    def spec(self, layout: Layout) -> Any:
        return self.jax.sharding.PartitionSpec(*layout_spec(self.mesh, layout))

    def specs_of(self, leaves: Mapping[str, Any]) -> dict[str, Any]:
        return {k: self.spec(self.leaf_layouts[k]) for k in leaves}

    def sharding(self, spec: Any) -> Any:
        return self.jax.sharding.NamedSharding(self.jmesh, spec)

    def placed(self) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """The differentiated leaves, the other leaves and the cotangents, on the devices in
        taps' layouts."""

        def put(values: dict[str, Any], specs: dict[str, Any]) -> dict[str, Any]:
            return {k: self.jax.device_put(v, self.sharding(specs[k])) for k, v in values.items()}

        return (
            put(self.diff, self.specs_of(self.diff)),
            put(self.fixed, self.specs_of(self.fixed)),
            put(self.cts, self.out_specs),
        )

    def predicted(self) -> list[Predicted]:
        """taps' collectives: every edge's steps, every operator's all_reduces."""
        return predicted_collectives(
            self.layouts, self.intra, self.dtype.itemsize, self.describe, self.backward
        )

    def body(self, d: Mapping[str, Any], f: Mapping[str, Any], mode: str) -> dict[str, Any]:
        """Every operator's output from the leaves ``d`` and ``f``: on local blocks with taps'
        steps (``"shard_map"``), on whole tensors constrained to taps' layouts at every operator
        input and output (``"gspmd"``), or on whole tensors alone (``"reference"``)."""
        if mode not in MODES:
            raise VerifyError(f"unknown mode {mode!r}: expected one of {MODES}")
        jax, jnp = self.jax, self.jax.numpy
        constrain = mode == "gspmd"

        def fix(x: Any, layout: Layout) -> Any:
            if not constrain:
                return x
            return jax.lax.with_sharding_constraint(x, self.sharding(self.spec(layout)))

        vals: dict[str, Any] = {}
        for j, op in enumerate(self.graph.ops):
            xs = []
            for slot, o in enumerate(op.inputs):
                key = f"{op.name}#{slot}"
                if key in d or key in f:
                    xs.append(d[key] if key in d else f[key])
                    continue
                i, e, plan = self.edges[(op.name, slot)]
                target = self.layouts.inputs[op.name][slot]
                with jax.named_scope(f"taps_e{i}"):
                    if mode == "shard_map":
                        xs.append(redistribute(vals[e.producer], plan, target, self.mesh))
                    else:
                        x = jnp.reshape(vals[e.producer], self.graph.tensors[o.tensor].shape)
                        xs.append(fix(x, target))
            axes: tuple[str, ...] = ()
            if mode == "shard_map":
                for c in self.intra[op.name]:
                    if c.reason == "forward partial sum":
                        axes = self.mesh.unused_axes(c.layout)

            def reduce(y: Any, addend: Any = None, axes: tuple[str, ...] = axes) -> Any:
                y = step("all_reduce").run(y, None, axes) if axes else y
                return y if addend is None else y + addend

            with jax.named_scope(f"taps_o{j}"):
                vals[op.name] = fix(compute(op, xs, reduce), self.layouts.outputs[op.name])
        return vals

    def train(self, fn: Any) -> Any:
        """``(d, f, cts) -> (outputs, gradients of d)`` for a forward ``fn(d, f)``."""

        def run(d: Any, f: Any, ct: Any) -> Any:
            outs, pull = self.jax.vjp(lambda d: fn(d, f), d)
            return outs, pull(ct)[0]

        return run

    def reference(self) -> tuple[Any, Any]:
        """Outputs and gradients of the unsharded run (computed once)."""
        if self._reference is None:
            fn = self.train(lambda d, f: self.body(d, f, "reference"))
            self._reference = self.jax.jit(fn)(self.diff, self.fixed, self.cts)
        return self._reference

    def errors(self, outs: Mapping[str, Any], grads: Mapping[str, Any]) -> dict[str, float]:
        """Per output tensor and per gradient, the relative error against :meth:`reference`."""
        ref_outs, ref_grads = self.reference()
        errors = {
            self.graph.op(k).output.tensor: relative_error(outs[k], ref_outs[k]) for k in outs
        }
        errors.update({f"grad {k}": relative_error(grads[k], ref_grads[k]) for k in grads})
        return errors
