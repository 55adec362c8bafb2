"""The judge's pricing of a collective: a plain second implementation of the link-load model
(docs/conventions.md#steps-and-latency), from the collective's groups of ranks or its
``(source, target)`` pairs, sharing no code with taps' pricing.

Each collective runs as NCCL runs it: a ring over each group's ranks in rank order (NCCL builds
its rings along the topology, so a node's members are neighbours) for all_gather, reduce_scatter
(``p - 1`` steps) and all_reduce (``2 (p - 1)``), a pairwise exchange for all_to_all (``p - 1``
steps, step ``t`` sending to the member ``t`` places on), one step for a collective_permute. In a
step every transfer of every group runs at once. The step pays the latency of the outermost level
any of its transfers crosses, and the most bytes one unit of the level below sends out or takes
in over that level's bandwidth (at the innermost level, one device's).
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Sequence

Transfer = tuple[int, int, float]


def unit_sizes(levels: Sequence[tuple[int, float, float]]) -> list[int]:
    """Devices per unit of each level, from ``Cluster.levels`` (parts per level)."""
    return list(itertools.accumulate((parts for parts, _, _ in levels), lambda a, b: a * b))


def schedule(kind: str, groups: Sequence[Sequence[int]], in_bytes: float) -> list[list[Transfer]]:
    """The transfers of each step: ``in_bytes`` is what each device puts in (its block, or for a
    permute what each source sends)."""
    if kind == "collective_permute":
        return [[(a, b, in_bytes) for a, b in groups if a != b]]
    p = len(groups[0])
    ring = [sorted(g) for g in groups]
    if kind == "all_to_all":
        return [
            [(g[i], g[(i + t) % p], in_bytes / p) for g in ring for i in range(p)]
            for t in range(1, p)
        ]
    steps, chunk = {
        "all_gather": (p - 1, in_bytes),
        "reduce_scatter": (p - 1, in_bytes / p),
        "all_reduce": (2 * (p - 1), in_bytes / p),
    }[kind]
    one = [(g[i], g[(i + 1) % p], chunk) for g in ring for i in range(p)]
    return [one] * steps


def step_seconds(levels: Sequence[tuple[int, float, float]], transfers: list[Transfer]) -> float:
    """One step's seconds (module doc)."""
    sizes = unit_sizes(levels)
    moving = [(a, b, x) for a, b, x in transfers if a != b and x > 0]
    if not moving:
        return 0.0
    top = max(next(j for j, s in enumerate(sizes) if a // s == b // s) for a, b, _ in moving)
    unit = 1 if top == 0 else sizes[top - 1]
    out: dict[int, float] = defaultdict(float)
    into: dict[int, float] = defaultdict(float)
    for a, b, x in moving:
        if a // unit != b // unit:
            out[a // unit] += x
            into[b // unit] += x
    _, bandwidth, latency = levels[top]
    return latency + max(*out.values(), *into.values()) / bandwidth


def seconds(
    levels: Sequence[tuple[int, float, float]],
    kind: str,
    groups: Sequence[Sequence[int]],
    in_bytes: float,
    itemsize: int | None = None,
) -> float:
    """A collective's seconds: the sum of its steps'. With ``itemsize``, an all_reduce moves
    whole elements: its ``2 (p - 1) / p`` blocks received are rounded up to a whole number of
    elements and spread evenly over its steps (how taps and the HLO reader count a block that
    ``p`` does not divide)."""
    if kind == "all_reduce" and itemsize:
        p = len(groups[0])
        elements = -(-2 * (p - 1) * int(in_bytes // itemsize) // p)
        in_bytes = elements * itemsize * p / (2 * (p - 1)) if p > 1 else in_bytes
    return math.fsum(step_seconds(levels, s) for s in schedule(kind, groups, in_bytes))


def coordinates(rank: int, device_matrix: Sequence[int]) -> list[int]:
    """Rank ``rank``'s coordinate along each device dim, innermost (dim 0) first."""
    out = []
    for d in reversed(device_matrix):
        out.append(rank % d)
        rank //= d
    return out


def rank_of(coords: Sequence[int], device_matrix: Sequence[int]) -> int:
    """The rank at ``coords`` (innermost first)."""
    rank, stride = 0, 1
    for c, d in zip(coords, reversed(device_matrix)):
        rank += c * stride
        stride *= d
    return rank


def groups_along(device_matrix: Sequence[int], dims: Sequence[int]) -> list[list[int]]:
    """The groups of ranks that differ only along ``dims``, each in rank order."""
    n = math.prod(device_matrix)
    out: dict[tuple[int, ...], list[int]] = defaultdict(list)
    for r in range(n):
        c = coordinates(r, device_matrix)
        out[tuple(x for k, x in enumerate(c) if k not in dims)].append(r)
    return sorted(out.values())


def permute_pairs(device_matrix: Sequence[int], permutation: Sequence[int]) -> list[list[int]]:
    """The ``(source, target)`` pairs of a permute that hands dim ``k``'s coordinate to
    ``permutation[k]``."""
    n = math.prod(device_matrix)
    pairs = []
    for r in range(n):
        c = coordinates(r, device_matrix)
        to = [0] * len(c)
        for k, x in enumerate(c):
            to[permutation[k]] = x
        pairs.append([r, rank_of(to, device_matrix)])
    return pairs
