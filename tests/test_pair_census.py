"""The census of ``benches/pair_census.py`` (docs/performance.md cites its counts) against a plain
loop over every pair."""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "benches"))

from pair_census import _distinct_without_whole_dims
from taps import Layout

MATRICES = ([8], [2, 4], [4, 2], [2, 2, 2])


def _layouts(shape: list[int]) -> list[Layout]:
    """Every layout of ``shape`` on 8 devices over the matrices above whose splits divide their
    dims, and each also with partial sums on the device dims it leaves unused."""
    out = []
    for matrix in MATRICES:
        dims = len(matrix)
        for tmap in itertools.product(range(-1, dims), repeat=len(shape)):
            used = [k for k in tmap if k != -1]
            if len(set(used)) < len(used):
                continue
            # Device dim k is matrix[-1 - k] (dim 0 innermost).
            if any(k != -1 and shape[i] % matrix[-1 - k] for i, k in enumerate(tmap)):
                continue
            out.append(Layout(shape, matrix, list(tmap)))
            free = [k for k in range(dims) if k not in used]
            if free:
                out.append(Layout(shape, matrix, list(tmap), free[:1]))
    return out


def _plain(calls: list[tuple]) -> tuple[int, int]:
    keys = set()
    pairs = 0
    for sources, targets, dtype, *_ in calls:
        if sources[0].shape != targets[0].shape:
            continue
        for a, b in itertools.product(sources, targets):
            kept = [
                i for i in range(len(a.shape)) if a.tensor_map[i] != -1 or b.tensor_map[i] != -1
            ]

            def side(x: Layout, kept: list[int] = kept) -> tuple:
                return (
                    tuple(x.tensor_map[i] for i in kept),
                    tuple(x.device_matrix),
                    tuple(x.partial),
                )

            keys.add(
                (
                    tuple(a.shape[i] for i in kept),
                    side(a),
                    side(b),
                    math.prod(a.shape),
                    dtype,
                )
            )
            pairs += 1
    return pairs, len(keys)


def test_distinct_pairs_without_whole_dims_are_the_plain_loops() -> None:
    # Two shapes of one element count with dims of equal sizes (keys shared across the calls),
    # one of twice the elements with the same sizes, a reshape call (skipped) and a second
    # element size.
    a, b, c = _layouts([4, 2, 4]), _layouts([2, 4, 4]), _layouts([4, 2, 4, 2])
    calls = [
        (a, a[::3], 2, "topology", "paper"),
        (b[1::2], b, 2, "topology", "paper"),
        (a, _layouts([8, 4]), 2, "topology", "paper"),
        (c[::2], c, 2, "topology", "paper"),
        (a[::2], a, 4, "topology", "paper"),
    ]
    got = _distinct_without_whole_dims(calls)
    assert got == _plain(calls)
    # Keys do collapse (else the test could not tell a key that keeps every dim).
    assert got[1] < got[0]
