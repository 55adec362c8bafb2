"""The training step as taps prices it, on local blocks under ``shard_map``: forward and backward,
every collective one of taps' own.

JAX differentiates only what is local. Everything that communicates is a ``jax.custom_vjp``
whose backward is taps' plan, so autodiff adds no collective of its own:

- an edge runs its forward plan (from the producer's partial sums where they flow) and, backward,
  the edge's backward plan on the local cotangent (the consumer's gradient of its input, partial
  over the device dims of the axes it is summed over: the plan's source layout), back to the
  producer's output layout (nothing when the tensor needs no gradient);
- an operator whose partial sums do not flow all_reduces them; backward, nothing (the output's
  gradient is already whole on every device that summed);
- an operator whose partial sums flow adds its bias (an addend) on one device of each group that
  holds partial sums, so that the sum counts it once; backward, the bias gets the whole output
  gradient on every device, as if added after the sum;
- a parameter or input read by an operator is the identity forward; backward, taps' gradient
  all_reduce (ZeRO: a reduce_scatter and an all_gather of the flattened gradient, padded to a
  multiple of the group when it does not divide);
- an operator that stores its parameters sharded (FSDP) is one unit (:mod:`.sharded`): its
  parameters gathered before its forward and again before its backward, their gradients
  reduce-scattered.

The shard_map runs without JAX's replication checks (``check_vma=False``), which would otherwise
make JAX add its own all_reduces for replicated operands. Every device's block of every output and
gradient is returned (stacked over the ranks) and checked, not one copy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from taps._core import Layout, Redistribution
from taps.graph import Operator
from taps.search.prices import Collective
from taps.steps.jax import all_reduce, redistribute
from taps.steps.kinds import layout_groups
from taps.verify.xla import sharded
from taps.verify.xla.operators import compute
from taps.verify.xla.program import GraphProgram


def _edge(
    prog: GraphProgram, i: int, forward: Redistribution, back: Redistribution | None
) -> Callable[[Any], Any]:
    """Edge ``i``: its forward plan; backward, its backward plan (no gradient without one)."""
    jax = prog.jax
    e = prog.layouts.redistributions[i][0]
    target = prog.layouts.inputs[e.consumer][e.slot]
    produced = prog.layouts.outputs[e.producer]

    @jax.custom_vjp
    def move(x: Any) -> Any:
        return redistribute(x, forward, target, prog.mesh)

    def fwd(x: Any) -> tuple[Any, None]:
        return move(x), None

    def bwd(_: None, g: Any) -> tuple[Any]:
        if back is None:
            return (jax.numpy.zeros(produced.shard_shape, g.dtype),)
        return (redistribute(g, back, produced, prog.mesh),)

    move.defvjp(fwd, bwd)
    return move


def _all_reduce(prog: GraphProgram, axes: tuple[str, ...]) -> Callable[[Any], Any]:
    """Forward partial sums all_reduced at their operator; the gradient passes through."""
    jax = prog.jax

    @jax.custom_vjp
    def total(y: Any) -> Any:
        return all_reduce(y, axes)

    total.defvjp(lambda y: (total(y), None), lambda _, g: (g,))
    return total


def _add_once(prog: GraphProgram, axes: tuple[str, ...]) -> Callable[[Any, Any], Any]:
    """``partial + addend`` where the devices along ``axes`` hold partial sums: the addend on the
    first of them only, its gradient the output's on all of them."""
    jax, jnp = prog.jax, prog.jax.numpy

    @jax.custom_vjp
    def add(y: Any, b: Any) -> Any:
        return y + jnp.where(jax.lax.axis_index(axes) == 0, b, jnp.zeros_like(b))

    def bwd(b: Any, g: Any) -> tuple[Any, Any]:
        over = tuple(k for k, n in enumerate(b.shape) if n == 1 and g.shape[k] != 1)
        return g, jnp.sum(g, axis=over, keepdims=True)

    add.defvjp(lambda y, b: (add(y, b), b), bwd)
    return add


def _gradient_sync(prog: GraphProgram, c: Collective) -> Callable[[Any], Any]:
    """The identity; backward, taps' all_reduce of the gradient (ZeRO: reduce_scatter and
    all_gather)."""
    jax, jnp = prog.jax, prog.jax.numpy
    axes = prog.mesh.unused_axes(c.layout)
    size = math.prod(prog.mesh.shape[prog.mesh.axis_names.index(a)] for a in axes)

    def sync(g: Any) -> Any:
        if not c.zero:
            return all_reduce(g, axes)
        flat = jnp.ravel(g)
        pad = -flat.size % size
        flat = jnp.pad(flat, (0, pad))
        shard = jax.lax.psum_scatter(flat, axes, scatter_dimension=0, tiled=True)
        whole = jax.lax.all_gather(shard, axes, axis=0, tiled=True)
        return jnp.reshape(whole[: g.size], g.shape)

    @jax.custom_vjp
    def leaf(x: Any) -> Any:
        return x

    leaf.defvjp(lambda x: (x, None), lambda _, g: (sync(g),))
    return leaf


def _reduction(prog: GraphProgram, op: Operator) -> Callable[..., Any]:
    """The operator's ``reduce`` (:mod:`.operators`): an all_reduce of its partial sums where they
    do not flow, nothing where they flow (a bias added once)."""
    summed = [c for c in prog.intra[op.name] if c.reason == "forward partial sum"]
    total = _all_reduce(prog, prog.mesh.unused_axes(summed[0].layout)) if summed else None
    partial = output_layout(prog, op)
    axes = prog.mesh.group_axes(partial, partial.partial) if partial.partial else ()
    add = _add_once(prog, axes) if axes else None

    def reduce(y: Any, addend: Any = None) -> Any:
        if total is not None:
            y = total(y)
        if addend is None:
            return y
        return add(y, addend) if add is not None else y + addend

    return reduce


def output_layout(prog: GraphProgram, op: Operator) -> Layout:
    """The layout of ``op``'s output as the training step leaves it: partial where it flows."""
    if op.name in prog.flows:
        return prog.layouts.plan.candidates[op.name].partial_output
    return prog.layouts.outputs[op.name]


def training_step(prog: GraphProgram) -> Callable[[Any, Any, Any], Any]:
    """``(d, f, cts) -> (outputs, gradients)`` on a device's local blocks (run it under
    ``shard_map`` with :meth:`GraphProgram.stacked_spec` outputs): every output and gradient
    comes back as the device's block with a leading dim of 1 (a leaf stored sharded: its
    piece's gradient)."""
    jax = prog.jax
    edges = {
        key: _edge(prog, i, plan, prog.backward[i]) for key, (i, _, plan) in prog.edges.items()
    }
    syncs: dict[str, Callable[[Any], Any]] = {}
    for op in prog.graph.ops:
        grads = [c for c in prog.intra[op.name] if c.reason == "gradient"]
        for slot, o in enumerate(op.inputs):
            c = next((c for c in grads if c.tensor == o.tensor), None)
            if c is not None:
                grads.remove(c)
                if f"{op.name}#{slot}" not in prog.stored:  # those: the unit's reduce_scatter
                    syncs[f"{op.name}#{slot}"] = _gradient_sync(prog, c)
    reductions = {op.name: _reduction(prog, op) for op in prog.graph.ops}
    blocks = {op.name: prog.block(op) for op in prog.graph.ops}
    units = {
        op.name: sharded.unit(jax, op, slots, reductions[op.name], blocks[op.name])
        for op in prog.graph.ops
        if (slots := sharded.unit_slots(prog.stored, op))
    }

    def forward(d: Mapping[str, Any], f: Mapping[str, Any]) -> dict[str, Any]:
        vals: dict[str, Any] = {}
        for j, op in enumerate(prog.graph.ops):
            xs = []
            for slot in range(len(op.inputs)):
                key = f"{op.name}#{slot}"
                if key in f:
                    xs.append(f[key])
                elif key in prog.stored:
                    xs.append(d[key][0])  # the device's piece (stacked: a leading dim of 1)
                elif key in d:
                    with jax.named_scope(f"taps_o{j}"):
                        xs.append(syncs[key](d[key]) if key in syncs else d[key])
                else:
                    i, e, _ = prog.edges[(op.name, slot)]
                    with jax.named_scope(f"taps_e{i}"):
                        xs.append(edges[(op.name, slot)](vals[e.producer]))
            with jax.named_scope(f"taps_o{j}"):
                if op.name in units:
                    vals[op.name] = units[op.name](xs)
                else:
                    vals[op.name] = compute(op, xs, reductions[op.name], blocks[op.name])
        return vals

    def run(d: Any, f: Any, cts: Any) -> Any:
        outs, pull = jax.vjp(lambda d: forward(d, f), d)
        (grads,) = pull(cts)
        stacked = {k: v if k in prog.stored else v[None] for k, v in grads.items()}
        return {k: v[None] for k, v in outs.items()}, stacked

    return run


def block_error(blocks: np.ndarray, layout: Layout, want: Any) -> float:
    """The largest difference of any device's block (``blocks[r]``, rank order) from its block of
    ``want``, the blocks of devices holding partial sums added up first, relative to the largest
    magnitude of ``want``."""
    want = np.asarray(want, dtype=np.float64).reshape(layout.shape)
    worst = 0.0
    for group in layout_groups(layout, layout.partial):
        got = sum(np.asarray(blocks[r], dtype=np.float64) for r in group)
        block = tuple(slice(lo, hi) for lo, hi in layout.shard_index(group[0]))
        worst = max(worst, float(np.max(np.abs(got - want[block]), initial=0.0)))
    scale = float(np.max(np.abs(want), initial=0.0)) or 1.0
    return worst / scale


def errors(
    prog: GraphProgram, outs: Mapping[str, Any], grads: Mapping[str, Any]
) -> dict[str, float]:
    """Per output tensor and per gradient, :func:`block_error` of the stacked blocks against the
    unsharded run."""
    ref_outs, ref_grads = prog.reference()
    out = {}
    for op in prog.graph.ops:
        layout = output_layout(prog, op)
        out[op.output.tensor] = block_error(np.asarray(outs[op.name]), layout, ref_outs[op.name])
    for key, g in grads.items():
        if key in prog.stored:
            out[f"grad {key}"] = prog.stored[key].error(g, ref_grads[key])
        else:
            layout = prog.leaf_layouts[key]
            out[f"grad {key}"] = block_error(np.asarray(g), layout, ref_grads[key])
    return out
