"""One device mesh for a set of taps layouts, and where each layout's device dims fall on it.

A taps device matrix of ``2**n`` devices cuts a rank's ``n`` bits into consecutive runs, device
dim 0 the lowest bits (``c_0 = r mod d_0``). Frameworks want one mesh for a whole program, so the
mesh here cuts the bits wherever any of the layouts cuts them: the coarsest mesh on which every
device dim of every layout is a run of whole mesh axes. A device dim that spans several mesh axes
becomes a tuple of axis names, outermost first, which is how both ``PartitionSpec`` and DTensor
order a dim sharded over several mesh axes (the first axis is the major one).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from taps._core import Layout, Redistribution
from taps.errors import ExportError


def _log2(n: int, what: str) -> int:
    if n < 1 or n & (n - 1):
        raise ExportError(f"{what} must be a power of two, got {n}")
    return n.bit_length() - 1


def _cuts(device_matrix: Iterable[int]) -> list[int]:
    """The bit positions where a device matrix cuts a rank, from the innermost dim out."""
    bits, out = 0, [0]
    for d in reversed(list(device_matrix)):
        bits += _log2(int(d), "a device-matrix entry")
        out.append(bits)
    return out


@dataclass(frozen=True)
class Mesh:
    """A device mesh over ranks ``0 .. num_devices - 1`` in rank order.

    Attributes:
        shape: axis sizes, outermost first (``np.arange(n).reshape(shape)`` gives each position's
            rank, so rank ``r`` holds coordinate ``r mod shape[-1]`` on the last axis).
        axis_names: ``"d0"`` is the innermost axis, ``"d1"`` the next, ...; listed outermost
            first like ``shape``.
        bits: per axis (outermost first), the half-open range of rank bits it covers.
    """

    shape: tuple[int, ...]
    axis_names: tuple[str, ...]
    bits: tuple[tuple[int, int], ...]

    @property
    def num_devices(self) -> int:
        return math.prod(self.shape)

    def axes(self, layout: Layout, device_dim: int) -> tuple[str, ...]:
        """The mesh axes (outermost first) that make up ``device_dim`` of ``layout``."""
        cuts = _cuts(layout.device_matrix)
        lo, hi = cuts[device_dim], cuts[device_dim + 1]
        names = tuple(n for n, (a, b) in zip(self.axis_names, self.bits) if lo <= a and b <= hi)
        covered = sum(b - a for n, (a, b) in zip(self.axis_names, self.bits) if n in names)
        if covered != hi - lo:
            raise ExportError(
                f"device dim {device_dim} of {layout!r} cuts inside a mesh axis of {self.shape}"
            )
        return names

    def dim_axes(self, layout: Layout) -> list[tuple[str, ...]]:
        """Per tensor dim of ``layout``: the mesh axes it is split over (empty: whole)."""
        self._check(layout)
        return [() if m < 0 else self.axes(layout, m) for m in layout.tensor_map]

    def used_axes(self, layout: Layout) -> frozenset[str]:
        """The mesh axes along which ``layout`` splits the tensor."""
        return frozenset(a for axes in self.dim_axes(layout) for a in axes)

    def unused_axes(self, layout: Layout) -> tuple[str, ...]:
        """The mesh axes along which ``layout`` is replicated, outermost first."""
        used = self.used_axes(layout)
        return tuple(a for a in self.axis_names if a not in used)

    def group_axes(self, layout: Layout, device_dims: Iterable[int]) -> tuple[str, ...]:
        """The mesh axes of several device dims of ``layout``, outermost first."""
        names = {a for k in device_dims for a in self.axes(layout, k)}
        return tuple(a for a in self.axis_names if a in names)

    def _check(self, layout: Layout) -> None:
        if layout.num_devices != self.num_devices:
            raise ExportError(
                f"{layout!r} spans {layout.num_devices} devices, the mesh {self.num_devices}"
            )

    def to_dict(self) -> dict:
        return {"shape": list(self.shape), "axis_names": list(self.axis_names)}


def mesh_for(layouts: Iterable[Layout], num_devices: int) -> Mesh:
    """The coarsest mesh of ``num_devices`` ranks on which every device dim of every layout is a
    run of whole axes (see the module doc). One axis of size 1 when nothing is split."""
    n = _log2(num_devices, "the device count")
    cuts = {0, n}
    for layout in layouts:
        if layout.num_devices != num_devices:
            raise ExportError(f"{layout!r} spans {layout.num_devices} devices, not {num_devices}")
        cuts.update(_cuts(layout.device_matrix))
    edges = sorted(cuts)
    bits = list(itertools.pairwise(edges))[::-1] or [(0, 0)]
    names = [f"d{i}" for i in range(len(bits))][::-1]
    return Mesh(tuple(2 ** (b - a) for a, b in bits), tuple(names), tuple(bits))


def mesh_for_redistributions(
    layouts: Sequence[Layout], plans: Sequence[Redistribution], n: int
) -> Mesh:
    """:func:`mesh_for` of ``layouts`` and of every layout the ``plans`` pass through."""
    every = list(layouts)
    for plan in plans:
        every += [plan.source, plan.target, *(op.layout for op in plan.all_ops)]
    return mesh_for(every, n)
