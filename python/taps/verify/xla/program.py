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

import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from taps._core import Layout, Redistribution
from taps.errors import VerifyError
from taps.export.jax import import_jax, jax_mesh, layout_spec
from taps.graph import Operator
from taps.plan.plan import Plan
from taps.search.evaluate import step_layouts
from taps.steps.jax import all_reduce, redistribute
from taps.verify.prediction import describe_scopes, predicted_collectives
from taps.verify.result import Predicted, check_dtype, relative_error
from taps.verify.xla import hlo, sharded
from taps.verify.xla.devices import jax_with_devices
from taps.verify.xla.operators import Block, compute, index_bounds, narrow_offsets, whole

_SCOPE = re.compile(r"taps_([eo]\d+)")

MODES = ("shard_map", "gspmd", "reference")


def measured(text: str, n: int) -> list[tuple[str, str, hlo.HloCollective]]:
    """The collectives of a compiled program as ``(scope, phase, collective)``."""
    out = []
    for c in hlo.collectives(text, n):
        scopes = _SCOPE.findall(c.op_name)
        phase = "backward" if "transpose(" in c.op_name else "forward"
        out.append((scopes[-1] if scopes else "", phase, c))
    return out


def given(values: Mapping[str, Any], tensor: Any) -> np.ndarray:
    """The value given for a parameter or input, checked against its shape."""
    value = np.asarray(values[tensor.name])
    if value.shape != tuple(tensor.shape):
        raise VerifyError(
            f"value of {tensor.name!r} has shape {list(value.shape)}, the graph's is "
            f"{list(tensor.shape)}"
        )
    return value


def run_dtype(name: str) -> Any:
    """The JAX dtype a replay runs in, by name (one of :data:`~taps.verify.result.TOLERANCE`)."""
    check_dtype(name)
    return import_jax().numpy.dtype(name)


class GraphProgram:
    """Everything the replays of one plan share: layouts and mesh, taps' plans and collectives of
    the plan's step (:func:`taps.breakdown`; in the training step the edges plan from flowing
    partial sums and each has a backward plan, and the mesh fits every layout they pass through),
    the input values (one per operator slot that reads a parameter or an input, keyed
    ``"op#slot"``: seeded random ones, or ``values[name]`` for the parameters and inputs given
    there, such as a fixed routing mask), the cotangents, the predicted collectives, and
    :meth:`body` in each mode."""

    def __init__(
        self,
        plan: Plan,
        dtype: str = "float32",
        seed: int = 0,
        values: Mapping[str, Any] | None = None,
    ) -> None:
        graph = plan.graph
        # taps' own plans and collectives of the step, as the search priced them (the optimal
        # planner minimises what the cost model measures: seconds on the cluster, or elements);
        # in the paper's model they are layouts_of's.
        step = step_layouts(plan)
        self.graph = graph
        self.layouts = step.layouts
        #: Per graph edge, the backward plan of the gradient (training step; None: no gradient).
        self.backward: list[Redistribution | None] = step.backward
        #: taps' collectives of every operator (forward partial sums and gradients).
        self.intra = step.intra
        self.flows = step.flows
        self.mesh = self.layouts.mesh
        self.jax = jax_with_devices(self.mesh.num_devices)
        self.dtype = run_dtype(dtype)
        self.jmesh = jax_mesh(self.mesh)
        self.edges = {
            (e.consumer, e.slot): (i, e, p) for i, (e, p) in enumerate(self.layouts.redistributions)
        }
        self.describe = describe_scopes(self.layouts)
        #: Where each narrowing operator starts in its input axis.
        self.offsets = narrow_offsets(graph.ops)
        rng = np.random.default_rng(seed)
        bounds, chained = self._index_bounds()
        ids = np.random.default_rng([seed, 1])
        roots: dict[str, np.ndarray] = {}
        self.diff: dict[str, np.ndarray] = {}
        self.fixed: dict[str, np.ndarray] = {}
        self.leaf_layouts: dict[str, Layout] = {}
        for op in graph.ops:
            read_as_ids = {*index_bounds(op), *(k for o, k in chained if o == op.name)}
            for slot, o in enumerate(op.inputs):
                root = graph.root(o.tensor)
                if root.kind == "activation":
                    continue
                if root.name not in roots:
                    scale = 1 / math.sqrt(root.shape[0]) if len(root.shape) > 1 else 1.0
                    # Drawn anyway, given or not: the same seeds for the other leaves.
                    drawn: np.ndarray = rng.standard_normal(root.shape) * scale
                    if values and root.name in values:
                        drawn = given(values, root)
                    elif root.name in bounds:
                        drawn = ids.integers(0, bounds[root.name], root.shape)
                    roots[root.name] = drawn
                key = f"{op.name}#{slot}"
                self.leaf_layouts[key] = self.layouts.inputs[op.name][slot]
                value = roots[root.name].reshape(graph.tensors[o.tensor].shape)
                if root.name in bounds:  # index values: integers where read as indices
                    self.fixed[key] = value.astype(np.int32 if slot in read_as_ids else self.dtype)
                else:
                    value = value.astype(self.dtype)
                    (self.diff if root.requires_grad else self.fixed)[key] = value
        #: The leaves an operator stores sharded (FSDP, training step): each device holds its
        #: piece, stacked in rank order (:mod:`.sharded`).
        self.stored = (
            sharded.stored_leaves(graph, self.intra, self.leaf_layouts, self.mesh)
            if plan.pricing.step == "training"
            else {}
        )
        self.cts = {
            op.name: rng.standard_normal(graph.tensors[op.output.tensor].shape).astype(self.dtype)
            for op in graph.ops
        }
        self.out_specs = {op.name: self.spec(self.layouts.outputs[op.name]) for op in graph.ops}
        self._reference: tuple[Any, Any] | None = None

    def _index_bounds(self) -> tuple[dict[str, int], set[tuple[str, int]]]:
        """Per parameter or input read as index values (token ids), the least size it indexes;
        and the operand slots ``(operator, slot)`` that carry such a leaf to an index read
        through elementwise operators of one operand each (JAX wraps a negative id, ``where(i <
        0, i + n, i)``, before every lookup), which read it as integers too."""
        bounds: dict[str, int] = {}
        chained: set[tuple[str, int]] = set()
        for op in self.graph.ops:
            for slot, bound in index_bounds(op).items():
                root = self.graph.root(op.inputs[slot].tensor)
                path: list[tuple[str, int]] = []
                while root.kind == "activation" and root.producer is not None:
                    producer = self.graph.op(root.producer)
                    if len(producer.inputs) != 1 or producer.contracted:
                        break
                    path.append((producer.name, 0))
                    root = self.graph.root(producer.inputs[0].tensor)
                if root.kind != "activation":
                    bounds[root.name] = min(bound, bounds.get(root.name, bound))
                    chained.update(path)
        return bounds, chained

    def block(self, op: Operator) -> Block:
        """Where a device's block of ``op``'s axes lies under ``shard_map``: each axis split as
        the first operand (or the output) having it whole-sized is laid out."""
        splits: dict[str, list[tuple[str, int]]] = {}
        pairs = [
            *zip(op.inputs, self.layouts.inputs[op.name]),
            (op.output, self.layouts.outputs[op.name]),
        ]
        for o, layout in pairs:
            shape = self.graph.tensors[o.tensor].shape
            for d, n, axes in zip(o.dims, shape, self.mesh.dim_axes(layout)):
                if d not in splits and n == op.axis_size(d):
                    splits[d] = [(a, self.jmesh.shape[a]) for a in axes]
        return Block(op, splits, self.offsets.get(op.name))

    def spec(self, layout: Layout) -> Any:
        return self.jax.sharding.PartitionSpec(*layout_spec(self.mesh, layout))

    def stacked_spec(self) -> Any:
        """The spec of a per-device block stacked along a leading dim over every mesh axis (rank
        order)."""
        return self.jax.sharding.PartitionSpec(self.mesh.axis_names)

    def specs_of(self, leaves: Mapping[str, Any]) -> dict[str, Any]:
        """The specs of leaves as placed: in their reader's layout, stored ones stacked."""
        return {
            k: self.stacked_spec() if k in self.stored else self.spec(self.leaf_layouts[k])
            for k in leaves
        }

    def sharding(self, spec: Any) -> Any:
        return self.jax.sharding.NamedSharding(self.jmesh, spec)

    def placed(self) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """The differentiated leaves, the other leaves and the cotangents, on the devices in
        taps' layouts (a leaf stored sharded as every device's piece)."""

        def put(values: dict[str, Any], specs: dict[str, Any]) -> dict[str, Any]:
            return {
                k: self.jax.device_put(
                    self.stored[k].shards(v) if k in self.stored else v, self.sharding(specs[k])
                )
                for k, v in values.items()
            }

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
                y = all_reduce(y, axes) if axes else y
                return y if addend is None else y + addend

            block = self.block(op) if mode == "shard_map" else whole(op, self.offsets.get(op.name))
            with jax.named_scope(f"taps_o{j}"):
                vals[op.name] = fix(compute(op, xs, reduce, block), self.layouts.outputs[op.name])
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
