"""A compiled collective priced on a cluster by taps' topology model (docs/conventions.md#steps-and-
latency), from what the HLO gives: its kind, its groups of ranks (or a permute's pairs) and the
bytes each device puts in. taps prices its own steps from their layouts (the Rust core); XLA's
collectives have groups no layout names, so they are priced here by the model's definition: the
steps of a ring (a pairwise exchange for all_to_all, one step for a permute), each step paying the
latency of the outermost level it crosses and the bytes of the most loaded link of that level over
its bandwidth."""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Sequence

from taps._core import Cluster
from taps.verify.result import Measured


def _steps(c: Measured) -> list[list[tuple[int, int, float]]]:
    """Each step's transfers ``(source, target, bytes)``."""
    if c.kind == "collective_permute":
        return [[(a, b, float(c.in_bytes)) for a, b in c.groups if a != b]]
    p = len(c.groups[0])
    if c.kind == "all_to_all":
        piece = c.in_bytes / p
        return [
            [(g[i], g[(i + t) % p], piece) for g in c.groups for i in range(p)] for t in range(1, p)
        ]
    count, chunk = {
        "all_gather": (p - 1, float(c.in_bytes)),
        "reduce_scatter": (p - 1, c.in_bytes / p),
        "all_reduce": (2 * (p - 1), c.in_bytes / p),
    }.get(c.kind, (0, 0.0))
    # A ring over each group in rank order: a unit's members are neighbours, as NCCL builds it.
    ring = [(g[i], g[(i + 1) % p], chunk) for g in c.groups for i in range(p)]
    return [ring] * count


def _step_seconds(
    levels: Sequence[tuple[int, float, float]], sizes: list[int], step: list[tuple[int, int, float]]
) -> float:
    moving = [(a, b, x) for a, b, x in step if a != b and x > 0]
    if not moving:
        return 0.0
    top = max(next(j for j, s in enumerate(sizes) if a // s == b // s) for a, b, _ in moving)
    unit = 1 if top == 0 else sizes[top - 1]
    load: dict[tuple[bool, int], float] = defaultdict(float)
    for a, b, x in moving:
        if a // unit != b // unit:
            load[(True, a // unit)] += x
            load[(False, b // unit)] += x
    _, bandwidth, latency = levels[top]
    return latency + max(load.values()) / bandwidth


def collective_seconds(cluster: Cluster, c: Measured) -> float:
    """Seconds of the compiled collective ``c`` on ``cluster`` (module doc; every copy sends its
    own data, as XLA runs it)."""
    levels = cluster.levels
    sizes = list(itertools.accumulate((parts for parts, _, _ in levels), lambda a, b: a * b))
    return math.fsum(_step_seconds(levels, sizes, s) for s in _steps(c))
