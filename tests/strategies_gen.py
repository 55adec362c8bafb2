"""Reusable hypothesis strategies for layouts and layout pairs.

Layouts are generated as plain ``(shape, device_matrix, tensor_map)`` tuples of lists, always
valid (powers of two in the device matrix, splits that divide); tests turn them into
``taps.Layout`` with :func:`to_layout`.
"""

from __future__ import annotations

import itertools
from math import prod
from typing import Any

from hypothesis import strategies as st

POW2_ATOMS = (2, 4, 2, 8, 2, 4, 1)
MIXED_ATOMS = (2, 4, 3, 2, 8, 6, 2, 5, 4, 1)
MAX_ELEMENTS = 2048


def to_layout(t: Any) -> Any:
    import taps

    shape, dm, tm = t
    return taps.Layout(list(shape), list(dm), list(tm))


@st.composite
def device_matrices(draw: Any, log2_devices: int) -> list[int]:
    """A device matrix of ``2**log2_devices`` devices, outermost first; entries of 1 allowed."""
    exps: list[int] = []
    remaining = log2_devices
    while remaining > 0:
        e = draw(st.integers(1, remaining))
        exps.append(e)
        remaining -= e
    if not exps or draw(st.integers(0, 5)) == 0:
        exps.insert(draw(st.integers(0, len(exps))), 0)
    return [2**e for e in exps]


@st.composite
def tensor_maps(draw: Any, shape: list[int], dm: list[int]) -> list[int]:
    """A random valid tensor map for ``shape`` on ``dm`` (each device dim used at most once)."""
    h = len(dm)
    free = list(range(h))
    tm = [-1] * len(shape)
    order = draw(st.permutations(range(len(shape))))
    for i in order:
        options = [k for k in free if shape[i] % dm[h - 1 - k] == 0]
        if options and draw(st.integers(0, 3)) < 3:
            k = draw(st.sampled_from(options))
            tm[i] = k
            free.remove(k)
    return tm


@st.composite
def atom_lists(draw: Any, atoms: tuple[int, ...], max_atoms: int = 7) -> list[int]:
    out: list[int] = []
    n = draw(st.integers(1, max_atoms)) if draw(st.integers(0, 3)) == 0 else max_atoms
    for _ in range(n):
        a = draw(st.sampled_from(atoms))
        if prod(out) * a > MAX_ELEMENTS:
            break
        out.append(a)
    return out or [draw(st.sampled_from(atoms))]


@st.composite
def groupings(draw: Any, atoms: list[int], max_rank: int = 4) -> list[int]:
    """A shape made by grouping consecutive atoms into at most ``max_rank`` dims."""
    if len(atoms) == 1:
        return list(atoms)
    most = min(max_rank - 1, len(atoms) - 1)
    ncuts = draw(st.sampled_from(range(most, -1, -1)))  # shrinks towards more dims
    cuts = sorted(draw(st.sets(st.integers(1, len(atoms) - 1), min_size=ncuts, max_size=ncuts)))
    bounds = [0, *cuts, len(atoms)]
    return [prod(atoms[a:b]) for a, b in itertools.pairwise(bounds)]


@st.composite
def layouts(
    draw: Any, max_log2_devices: int = 6, atoms: tuple[int, ...] = MIXED_ATOMS, log2=None
) -> tuple[list[int], list[int], list[int]]:
    """A random valid layout (up to ``2**max_log2_devices`` devices, rank up to 4)."""
    n = log2 if log2 is not None else max_log2_devices - draw(st.integers(0, max_log2_devices))
    shape = draw(groupings(draw(atom_lists(atoms))))
    dm = draw(device_matrices(n))
    return shape, dm, draw(tensor_maps(shape, dm))


@st.composite
def layout_pairs(
    draw: Any,
    max_log2_devices: int = 6,
    atoms: tuple[int, ...] = MIXED_ATOMS,
    reshape: bool = True,
    log2=None,
) -> tuple[tuple[list[int], list[int], list[int]], tuple[list[int], list[int], list[int]]]:
    """Two layouts with the same device count and element count.

    The second shape is the first (same shape), a different grouping of the same factors (a
    reshape), or -- when ``reshape`` -- a grouping of the factors in another order.
    """
    n = log2 if log2 is not None else max_log2_devices - draw(st.integers(0, max_log2_devices))
    base = draw(atom_lists(atoms))
    shape_a = draw(groupings(base))
    mode = draw(st.sampled_from(["same", "regroup", "permute"] if reshape else ["same"]))
    if mode == "same":
        shape_b = list(shape_a)
    elif mode == "regroup":
        shape_b = draw(groupings(base))
    else:
        shape_b = draw(groupings(list(draw(st.permutations(base)))))
    dm_a = draw(device_matrices(n))
    dm_b = draw(device_matrices(n)) if draw(st.integers(0, 4)) > 0 else list(dm_a)
    a = (shape_a, dm_a, draw(tensor_maps(shape_a, dm_a)))
    b = (shape_b, dm_b, draw(tensor_maps(shape_b, dm_b)))
    return a, b


@st.composite
def layout_sets(
    draw: Any, log2: int, max_count: int = 3, atoms: tuple[int, ...] = MIXED_ATOMS
) -> tuple[list[Any], list[Any]]:
    """Lists of sources and targets on ``2**log2`` devices, all with one element count."""
    base = draw(atom_lists(atoms))

    def one() -> Any:
        shape = draw(groupings(base))
        dm = draw(device_matrices(log2))
        return shape, dm, draw(tensor_maps(shape, dm))

    ns = draw(st.integers(1, max_count))
    nt = draw(st.integers(1, max_count))
    return [one() for _ in range(ns)], [one() for _ in range(nt)]


@st.composite
def dense_pairs(
    draw: Any, min_log2_devices: int = 2, max_log2_devices: int = 6, max_rank: int = 5
) -> tuple[tuple[list[int], list[int], list[int]], tuple[list[int], list[int], list[int]]]:
    """Two layouts on ONE device matrix and ONE shape that split along most device dims: the
    shape is sized so that both maps divide (Algorithm 1's own ground, no unification needed)."""
    n = draw(st.integers(min_log2_devices, max_log2_devices))
    dm = draw(device_matrices(n))
    h = len(dm)
    rank = draw(st.integers(1, max_rank))

    def one_map() -> list[int]:
        tm = [-1] * rank
        for k in draw(st.permutations(range(h))):
            free = [i for i in range(rank) if tm[i] == -1]
            if free and draw(st.integers(0, 4)) < 4:
                tm[draw(st.sampled_from(free))] = k
        return tm

    ta, tb = one_map(), one_map()
    need = [max(dm[h - 1 - m] if m >= 0 else 1 for m in (ta[i], tb[i])) for i in range(rank)]
    shape = [d * draw(st.sampled_from([1, 2, 3])) for d in need]
    if prod(shape) > 4 * MAX_ELEMENTS:
        shape = need  # at most 64 * 64 elements
    return (shape, dm, ta), (list(shape), list(dm), tb)


@st.composite
def clusters(draw, log2: int):
    """A cluster of 2 or 3 levels of ``2**log2`` devices, flat replicas, latencies given."""
    nlevels = draw(st.integers(2, 3))
    cuts = sorted(draw(st.lists(st.integers(0, log2), min_size=nlevels - 1, max_size=nlevels - 1)))
    exps = [b - a for a, b in zip([0, *cuts], [*cuts, log2])]
    levels = [
        (
            2**e,
            draw(st.sampled_from([25e9, 50e9, 100e9, 450e9])),
            draw(st.sampled_from([0.0, 2e-6, 1e-5])),
        )
        for e in exps
    ]
    import taps

    return taps.Cluster.hierarchy(levels, replicas="flat")
