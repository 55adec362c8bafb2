"""taps' steps as JAX collectives under ``shard_map``, on a device's local block: each kind of
step (:mod:`.kinds`) as the ``jax.lax`` collective it runs, and a redistribution's plan walked
step by step.

``axes`` are the mesh axes of the step's device dims (:attr:`StepKind.dims`), outermost first, so
a group is exactly the ranks that differ only in those device dims. Replication is tracked by JAX
(``shard_map`` checks that every output is replicated where its layout says): a gathered tensor is
replicated along the gathered axes (``all_gather_invariant``, whose transpose is a free slice), a
sliced one varies along the slicing axes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from taps._core import CommOp, Layout, Redistribution
from taps.errors import VerifyError
from taps.plan.mesh import Mesh
from taps.steps.kinds import permutation_pairs, step_kind


def _lax() -> Any:
    from jax import lax

    return lax


def _slice(x: Any, op: Any, axes: tuple[str, ...]) -> Any:
    lax = _lax()
    block = x.shape[op.tensor_dim] // op.group_size
    return lax.dynamic_slice_in_dim(x, lax.axis_index(axes) * block, block, axis=op.tensor_dim)


def _all_gather(x: Any, op: Any, axes: tuple[str, ...]) -> Any:
    try:
        # The public all_gather leaves its result "varying"; this one marks it replicated, as the
        # layout after the gather is.
        from jax._src.lax.parallel import all_gather_invariant
    except ImportError:  # pragma: no cover - depends on the JAX version
        raise VerifyError("this JAX has no all_gather_invariant: pip install 'jax>=0.6'") from None
    return all_gather_invariant(x, axes, axis=op.tensor_dim, tiled=True)


def _all_to_all(x: Any, op: Any, axes: tuple[str, ...]) -> Any:
    return _lax().all_to_all(
        x, axes, split_axis=op.to_tensor_dim, concat_axis=op.tensor_dim, tiled=True
    )


def _all_reduce(x: Any, op: Any, axes: tuple[str, ...]) -> Any:
    return all_reduce(x, axes)


def _reduce_scatter(x: Any, op: Any, axes: tuple[str, ...]) -> Any:
    return _lax().psum_scatter(x, axes, scatter_dimension=op.tensor_dim, tiled=True)


def _collective_permute(x: Any, op: Any, axes: tuple[str, ...]) -> Any:
    return _lax().ppermute(x, axes, permutation_pairs(op))


#: Each kind of step as JAX code: ``run(local_block, op, mesh_axes) -> local_block``.
RUN: dict[str, Callable[[Any, Any, tuple[str, ...]], Any]] = {
    "slice": _slice,
    "all_gather": _all_gather,
    "all_to_all": _all_to_all,
    "all_reduce": _all_reduce,
    "reduce_scatter": _reduce_scatter,
    "collective_permute": _collective_permute,
}


def all_reduce(x: Any, axes: tuple[str, ...]) -> Any:
    """``x`` summed over the mesh axes ``axes`` (an operator's partial sums, a gradient)."""
    return _lax().psum(x, axes)


def run_step(x: Any, op: CommOp, mesh: Mesh) -> Any:
    """One step on a device's block in ``op.layout``'s shard shape, or a :class:`VerifyError`
    for a kind with no JAX form."""
    if op.kind not in RUN:
        raise VerifyError(f"no JAX form for the step kind {op.kind!r} (known: {sorted(RUN)})")
    return RUN[op.kind](x, op, mesh.group_axes(op.layout, step_kind(op.kind).dims(op)))


def redistribute(x: Any, plan: Redistribution, target: Layout, mesh: Mesh) -> Any:
    """A device's block of the plan's source, taken to its block of ``target`` by the plan's
    steps (prelude on the source's shape, the unified steps, epilogue on the target's)."""
    import jax.numpy as jnp

    for op in plan.prelude:
        x = run_step(x, op, mesh)
    x = jnp.reshape(x, plan.source.shard_shape)
    for op in plan.ops:
        x = run_step(x, op, mesh)
    x = jnp.reshape(x, (plan.epilogue[0].layout if plan.epilogue else target).shard_shape)
    for op in plan.epilogue:
        x = run_step(x, op, mesh)
    return x
