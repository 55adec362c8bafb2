"""taps' communication steps as JAX collectives under ``shard_map``: the one table that says how
each kind of step runs and what XLA shows for it.

A step acts on a device's local block. Redistribution steps (``taps.CommOp``) act along one device
dim of ``op.layout`` (``op.device_dim``): ``slice``, ``all_gather``, ``all_to_all``, and, for
layouts that hold partial sums, ``reduce_scatter`` (sum and split ``op.tensor_dim``) and
``all_reduce`` (sum, keep the whole); an operator's ``all_reduce`` sums its partial output over a
set of device dims. A ``collective_permute`` moves whole blocks along several device dims at
once: the block at coordinate ``c`` along device dim ``k`` goes to coordinate ``c`` along
``op.permutation[k]``. ``axes`` are the mesh axes of the step's device dims (:attr:`Step.dims`),
outermost first, so a group is exactly the ranks that differ only in those device dims.

Replication is tracked by JAX (``shard_map`` checks that every output is replicated where its
layout says): a gathered tensor is replicated along the gathered axes (``all_gather_invariant``,
whose transpose is a free slice), a sliced one varies along the slicing axes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from taps.errors import VerifyError


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


def _reduce_scatter(x: Any, op: Any, axes: tuple[str, ...]) -> Any:
    return _lax().psum_scatter(x, axes, scatter_dimension=op.tensor_dim, tiled=True)


def layout_groups(layout: Any, device_dims: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    """The groups of ranks that differ only in ``device_dims`` of ``layout``, from the rank
    coordinates (``c_k = (r // (d_0 ... d_{k-1})) mod d_k``), sorted."""
    sizes = layout.device_matrix[::-1]
    strides = [math.prod(sizes[:k]) for k in range(len(sizes))]
    groups: dict[tuple[int, ...], list[int]] = {}
    for r in range(math.prod(sizes)):
        key = tuple((r // strides[k]) % sizes[k] for k in range(len(sizes)) if k not in device_dims)
        groups.setdefault(key, []).append(r)
    return tuple(sorted(tuple(g) for g in groups.values()))


def _one_dim(op: Any) -> list[int]:
    return [op.device_dim]


def _moved_dims(op: Any) -> list[int]:
    """The device dims a collective-permute moves, innermost first."""
    return [k for k, to in enumerate(op.permutation) if to != k]


def permutation_pairs(op: Any) -> list[tuple[int, int]]:
    """``(source, target)`` positions of a collective-permute within its group: positions count
    the moved device dims' coordinates in mixed radix, the outermost dim the most significant
    (the order of the mesh axes of those dims)."""
    dims = _moved_dims(op)
    sizes = {k: op.layout.device_dim_size(k) for k in dims}

    def position(coords: dict[int, int]) -> int:
        out = 0
        for k in reversed(dims):
            out = out * sizes[k] + coords[k]
        return out

    pairs = []
    for pos in range(math.prod(sizes.values())):
        coords, rest = {}, pos
        for k in dims:
            coords[k], rest = rest % sizes[k], rest // sizes[k]
        pairs.append((pos, position({op.permutation[k]: c for k, c in coords.items()})))
    return pairs


def _collective_permute(x: Any, op: Any, axes: tuple[str, ...]) -> Any:
    return _lax().ppermute(x, axes, permutation_pairs(op))


def _groups(op: Any) -> tuple[tuple[int, ...], ...]:
    return layout_groups(op.layout, _one_dim(op))


def _rank_pairs(op: Any) -> tuple[tuple[int, ...], ...]:
    """A collective-permute's ``(source, target)`` ranks: a rank's coordinate along each moved
    device dim ``k`` becomes the target's coordinate along ``op.permutation[k]``."""
    sizes = op.layout.device_matrix[::-1]
    strides = [math.prod(sizes[:k]) for k in range(len(sizes))]
    pairs = []
    for r in range(math.prod(sizes)):
        coords = [(r // strides[k]) % sizes[k] for k in range(len(sizes))]
        target = list(coords)
        for k in _moved_dims(op):
            target[op.permutation[k]] = coords[k]
        pairs.append((r, sum(c * s for c, s in zip(target, strides))))
    return tuple(sorted(pairs))


@dataclass(frozen=True)
class Step:
    """How one kind of taps step runs and shows up.

    Attributes:
        run: ``run(local_block, op, mesh_axes) -> local_block``.
        hlo_kind: the collective XLA compiles it to (``None``: local, no communication).
        dims: ``dims(op)``, the device dims of ``op.layout`` the step communicates along.
        groups: ``groups(op)``, the groups of ranks it runs in, as the compiled collective lists
            them (for a collective-permute, its ``(source, target)`` rank pairs).
    """

    run: Callable[[Any, Any, tuple[str, ...]], Any]
    hlo_kind: str | None
    dims: Callable[[Any], list[int]] = _one_dim
    groups: Callable[[Any], tuple[tuple[int, ...], ...]] = _groups


STEPS: dict[str, Step] = {
    "slice": Step(_slice, None),
    "all_gather": Step(_all_gather, "all_gather"),
    "all_to_all": Step(_all_to_all, "all_to_all"),
    "all_reduce": Step(_all_reduce, "all_reduce"),
    "reduce_scatter": Step(_reduce_scatter, "reduce_scatter"),
    "collective_permute": Step(_collective_permute, "collective_permute", _moved_dims, _rank_pairs),
}


def step(kind: str) -> Step:
    """The row of :data:`STEPS` for ``kind``, or a :class:`VerifyError` naming it."""
    if kind not in STEPS:
        raise VerifyError(f"no JAX form for the step kind {kind!r} (known: {sorted(STEPS)})")
    return STEPS[kind]
