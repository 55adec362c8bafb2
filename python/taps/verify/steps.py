"""taps' communication steps as JAX collectives under ``shard_map``: the one table that says how
each kind of step runs and what XLA shows for it.

A step acts on a device's local block. Redistribution steps (``taps.CommOp``: ``slice``,
``all_gather``, ``all_to_all``) act along one device dim of ``op.layout``; an ``all_reduce`` sums
partial results over a set of device dims. ``axes`` are the mesh axes of those device dims,
outermost first, so a group is exactly the ranks that differ only in those device dims. A new
kind of planner step (a reduce-scatter of partial sums, a collective-permute) is one more row.

Replication is tracked by JAX (``shard_map`` checks that every output is replicated where its
layout says): a gathered tensor is replicated along the gathered axes (``all_gather_invariant``,
whose transpose is a free slice), a sliced one varies along the slicing axes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .devices import VerifyError


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
    return _lax().psum(x, axes)


@dataclass(frozen=True)
class Step:
    """How one kind of taps step runs and shows up.

    Attributes:
        run: ``run(local_block, op, mesh_axes) -> local_block``.
        hlo_kind: the collective XLA compiles it to (``None``: local, no communication).
    """

    run: Callable[[Any, Any, tuple[str, ...]], Any]
    hlo_kind: str | None


STEPS: dict[str, Step] = {
    "slice": Step(_slice, None),
    "all_gather": Step(_all_gather, "all_gather"),
    "all_to_all": Step(_all_to_all, "all_to_all"),
    "all_reduce": Step(_all_reduce, "all_reduce"),
}


def step(kind: str) -> Step:
    """The row of :data:`STEPS` for ``kind``, or a :class:`VerifyError` naming it."""
    if kind not in STEPS:
        raise VerifyError(f"no JAX form for the step kind {kind!r} (known: {sorted(STEPS)})")
    return STEPS[kind]
