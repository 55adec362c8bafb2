"""What each kind of taps step communicates, whichever framework runs it: the collective it is
(none for a slice, which is local), the device dims of its layout it moves along, and the groups of
ranks it runs in, as an engine lists them (for a collective-permute, its ``(source, target)`` rank
pairs).

Redistribution steps (``taps.CommOp``) act along one device dim of ``op.layout``
(``op.device_dim``): ``slice``, ``all_gather``, ``all_to_all``, and, for layouts that hold partial
sums, ``reduce_scatter`` (sum and split ``op.tensor_dim``) and ``all_reduce`` (sum, keep the
whole). A ``collective_permute`` moves whole blocks along several device dims at once: the block
at coordinate ``c`` along device dim ``k`` goes to coordinate ``c`` along ``op.permutation[k]``.
A rank's coordinate along device dim ``k`` is ``(r // (d_0 ... d_{k-1})) mod d_k``, ``d_0`` the
innermost size.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from taps.errors import LayoutError

Groups = tuple[tuple[int, ...], ...]


def layout_groups(layout: Any, device_dims: Sequence[int]) -> Groups:
    """The groups of ranks that differ only in ``device_dims`` of ``layout``, sorted."""
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


def _groups(op: Any) -> Groups:
    return layout_groups(op.layout, _one_dim(op))


def _rank_pairs(op: Any) -> Groups:
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
class StepKind:
    """What one kind of taps step communicates.

    Attributes:
        collective: the collective it runs (``None``: local, no communication).
        dims: ``dims(op)``, the device dims of ``op.layout`` the step communicates along.
        groups: ``groups(op)``, the groups of ranks it runs in (for a collective-permute, its
            ``(source, target)`` rank pairs).
    """

    collective: str | None
    dims: Callable[[Any], list[int]] = _one_dim
    groups: Callable[[Any], Groups] = _groups


KINDS: dict[str, StepKind] = {
    "slice": StepKind(None),
    "all_gather": StepKind("all_gather"),
    "all_to_all": StepKind("all_to_all"),
    "all_reduce": StepKind("all_reduce"),
    "reduce_scatter": StepKind("reduce_scatter"),
    "collective_permute": StepKind("collective_permute", _moved_dims, _rank_pairs),
}


def step_kind(kind: str) -> StepKind:
    """The row of :data:`KINDS` for ``kind``, or a :class:`LayoutError` naming it."""
    if kind not in KINDS:
        raise LayoutError(f"unknown step kind {kind!r} (known: {sorted(KINDS)})")
    return KINDS[kind]
