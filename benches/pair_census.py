"""Where Algorithm 1's cost kernel spends a model's cost tables on 8 x 8, and what a memo of
canonical pairs could save there.

Builds the cost tables of a model of ``benches/model_families.py`` on ``taps.Cluster(8, 8)``
(the default pricing) while keeping the arguments of every ``redistribution_costs`` call, then
prints:

- the largest distinct edge tables (rows x columns of layout classes, the ends' operator kinds,
  the tensor's shape, the edges sharing the matrix) and the layout pairs the kernel priced;
- the distinct pairs among those of one shape when the tensor dims whole in both layouts are
  dropped (the dims Algorithm 1's passes never visit): the most a memo keyed by that form could
  save;
- with ``--swap``, on the largest table of one shape with two tensor dims of equal size, how many
  pairs change their cost when the two dims are swapped in every layout (Algorithm 1 visits the
  dims in order: a memo keyed up to such a swap would not be exact).

    python benches/pair_census.py jax_llama --swap
    python benches/pair_census.py gemma2
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import time
import warnings
from typing import Any

import numpy as np

import taps
from model_families import builders
from taps._core import Layout
from taps.search import tables


def _distinct_without_whole_dims(calls: list[tuple[Any, ...]]) -> tuple[int, int]:
    """Pairs of the calls whose two sides have one shape, and how many distinct keys they have
    once the dims whole in both layouts are dropped (the kept dims' sizes, both maps on them,
    both device matrices and partial dims, the element count and the element size)."""
    # Ids shared by every call: a layout restricted to some dims, and the kept dims' sizes
    # with the element count and size. A pair is one int64 of three ids (numpy, not a set of
    # tuples: tens of millions of pairs).
    layouts: dict[tuple[Any, ...], int] = {}
    sizes: dict[tuple[Any, ...], int] = {}
    codes = []
    pairs = 0

    def restricted(layout: Layout, mask: int) -> int:
        key = (
            tuple(m for i, m in enumerate(layout.tensor_map) if mask >> i & 1),
            tuple(layout.device_matrix),
            tuple(layout.partial),
        )
        return layouts.setdefault(key, len(layouts))

    def split_mask(layout: Layout) -> int:
        return sum(1 << i for i, m in enumerate(layout.tensor_map) if m != -1)

    for sources, targets, dtype, *_ in calls:
        shape = sources[0].shape
        if targets[0].shape != shape:
            continue
        masks = range(1 << len(shape))
        kept = np.array(
            [
                sizes.setdefault(
                    (tuple(s for i, s in enumerate(shape) if m >> i & 1), math.prod(shape), dtype),
                    len(sizes),
                )
                for m in masks
            ],
            dtype=np.int64,
        )
        src = np.array([[restricted(x, m) for m in masks] for x in sources], dtype=np.int64)
        dst = np.array([[restricted(y, m) for m in masks] for y in targets], dtype=np.int64)
        union = (
            np.array([split_mask(x) for x in sources])[:, None]
            | np.array([split_mask(y) for y in targets])[None, :]
        )
        rows, cols = np.arange(len(sources))[:, None], np.arange(len(targets))[None, :]
        codes.append(np.unique((kept[union] << 42) | (src[rows, union] << 21) | dst[cols, union]))
        pairs += len(sources) * len(targets)
    # 21 bits per layout id, 21 for the sizes' id.
    assert len(layouts) < 1 << 21 and len(sizes) < 1 << 21
    return pairs, len(np.unique(np.concatenate(codes))) if codes else 0


def swapped(layout: Layout, i: int, j: int) -> Layout:
    """``layout`` with tensor dims ``i`` and ``j`` swapped (shape, map, partial sums kept)."""
    order = list(range(len(layout.shape)))
    order[i], order[j] = j, i
    return Layout(
        [layout.shape[k] for k in order],
        layout.device_matrix,
        [layout.tensor_map[k] for k in order],
        layout.partial,
    )


def _swap_census(calls: list[tuple[Any, ...]], cluster: taps.Cluster) -> None:
    """The largest call of one shape with two dims of equal size, priced again with them
    swapped in every layout: the pairs whose cost changes."""
    same = [c for c in calls if c[0][0].shape == c[1][0].shape]
    for sources, targets, *how in sorted(same, key=lambda c: -len(c[0]) * len(c[1])):
        shape = sources[0].shape
        dims = [
            (i, j) for i, j in itertools.combinations(range(len(shape)), 2) if shape[i] == shape[j]
        ]
        if not dims:
            continue
        base = np.asarray(tables.redistribution_costs(sources, targets, cluster, *how))
        for i, j in dims:
            turned = np.asarray(
                tables.redistribution_costs(
                    [swapped(x, i, j) for x in sources],
                    [swapped(y, i, j) for y in targets],
                    cluster,
                    *how,
                )
            )
            changed = base != turned
            worst = np.max(np.abs(base - turned)[changed] / base[changed]) if changed.any() else 0.0
            print(
                f"  {len(sources)} x {len(targets)} on {shape}, dims {i} and {j} swapped: "
                f"{int(changed.sum())} pairs change (of {changed.size}), by up to {worst:.1%}"
            )
        return


def recorded_calls(graph: taps.Graph, cluster: taps.Cluster) -> tuple[Any, list[tuple[Any, ...]]]:
    """The search's cost tables of ``graph`` on ``cluster``, and every call of the pair kernel
    they made: ``(sources, targets, *the rest of its positional arguments)``."""
    calls: list[tuple[Any, ...]] = []
    priced = tables.redistribution_costs

    def keep(s: Any, t: Any, cluster: Any, *how: Any, **kw: Any) -> Any:
        calls.append((list(s), list(t), *how))
        return priced(s, t, cluster, *how, **kw)

    tables.redistribution_costs = keep  # type: ignore[assignment]
    try:
        built = tables.build_tables(graph, cluster)
    finally:
        tables.redistribution_costs = priced
    return built, calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a name of benches/model_families.py")
    parser.add_argument("--top", type=int, default=8, help="edge tables listed")
    parser.add_argument("--swap", action="store_true", help="price the swapped dims too")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    graph = builders()[args.model]()
    cluster = taps.Cluster(8, 8)
    start = time.process_time()
    built, calls = recorded_calls(graph, cluster)
    cpu = time.process_time() - start
    total = sum(len(s) * len(t) for s, t, *_ in calls)
    print(
        f"{args.model}: {len(calls)} kernel calls, {total / 1e6:.2f} M layout pairs, tables "
        f"{cpu:.2f} s CPU, load average {os.getloadavg()[0]:.2f}"
    )
    shared: dict[int, list[Any]] = {}
    for e in built.edges:
        shared.setdefault(id(e.cost), []).append(e)
    print("largest edge tables (classes, each direction priced; distinct rows and columns):")
    for group in sorted(shared.values(), key=lambda g: -g[0].cost.size)[: args.top]:
        edge, cost = group[0].edge, group[0].cost
        kinds = f"{graph.op(edge.producer).kind} -> {graph.op(edge.consumer).kind}"
        # Classes with equal rows (or columns) could be merged before pricing if one knew.
        rows, cols = len(np.unique(cost, axis=0)), np.unique(cost, axis=1).shape[1]
        print(
            f"  {cost.shape[0]:5d} x {cost.shape[1]:5d}  {kinds:34s} "
            f"{graph.tensors[edge.tensor].shape}  ({len(group)} edges, first {edge.consumer}; "
            f"{rows} x {cols} distinct)"
        )
    del built, shared  # the tables' memory, before the census's arrays
    pairs, distinct = _distinct_without_whole_dims(calls)
    print(
        f"pairs of one shape: {pairs / 1e6:.2f} M; distinct with the dims whole in both "
        f"dropped: {distinct / 1e6:.2f} M ({1 - distinct / pairs:.1%} fewer)"
    )
    if args.swap:
        _swap_census(calls, cluster)


if __name__ == "__main__":
    main()
