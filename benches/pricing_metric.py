"""Whether a planner's redistribution price is a metric: the structure exact reductions of the cost
tables would rest on (a zero-compute transpose eliminated between its neighbours needs the
triangle inequality; a memo of pairs up to a permutation of equal-size tensor dims needs the
price to be invariant under it).

Draws ``--layouts`` distinct random layouts of one tensor (``--shape``, by default Swin's window
tensor) on a device matrix of size-2 dims of ``--nodes`` x ``--devices-per-node`` (seeded, so the
same layouts every run), prices every pair with each planner, and prints how many pairs (x, z)
some y makes cheaper as x -> y -> z than x -> z directly (and by how much at most), how many
prices change when tensor dims 1 and 2 (equal sizes) are swapped at both ends, and the worst
triple's plans under the optimal planner. Run:
``.venv/bin/python benches/pricing_metric.py``.
"""

from __future__ import annotations

import argparse
import math
import random
import time

import numpy as np

import taps
from pair_census import swapped
from taps._core import Layout, plan_redistribution, redistribution_costs


def layouts(shape: list[int], matrix: list[int], count: int, seed: int) -> list[Layout]:
    """``count`` distinct valid layouts, each device dim splitting a random tensor dim or none."""
    rng = random.Random(seed)
    found: dict[Layout, None] = {}
    while len(found) < count:
        tensor_map = [-1] * len(shape)
        for k in rng.sample(range(len(matrix)), rng.randint(0, len(matrix))):
            tensor_map[rng.randrange(len(shape))] = k
        try:
            found.setdefault(Layout(shape, matrix, tensor_map))
        except taps.TapsError:
            continue
    return list(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", type=int, nargs="+", default=[2, 4, 4, 4, 4, 16])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--devices-per-node", type=int, default=8)
    parser.add_argument("--layouts", type=int, default=120)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    cluster = taps.Cluster(args.nodes, args.devices_per_node)
    matrix = [2] * int(math.log2(args.nodes * args.devices_per_node))
    xs = layouts(args.shape, matrix, args.layouts, args.seed)
    turned = [swapped(x, 1, 2) for x in xs]
    pairs = len(xs) ** 2
    for planner in ("paper", "optimal"):
        t0 = time.process_time()
        cost = redistribution_costs(xs, xs, cluster, 2.0, "topology", planner)
        seconds = time.process_time() - t0
        via = cost[:, :, None] + cost[None, :, :]
        best = via.min(axis=1)
        cheaper = best < cost * (1 - 1e-9)
        ratio = np.where(cheaper, cost / np.maximum(best, 1e-300), 1.0)
        changed = redistribution_costs(turned, turned, cluster, 2.0, "topology", planner)
        moved = int((np.abs(changed - cost) > 1e-12 * np.abs(cost)).sum())
        print(
            f"{planner}: {pairs} pairs in {seconds:.2f} s CPU; cheaper through a third layout: "
            f"{int(cheaper.sum())} (up to {ratio.max():.2f}x); changed by swapping dims 1 and 2: "
            f"{moved}"
        )
        if planner == "optimal" and cheaper.any():
            i, k = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
            j = int(np.argmin(via[i, :, k]))
            for a, b in ((i, k), (i, j), (j, k)):
                plan = plan_redistribution(xs[a], xs[b], cluster, "optimal")
                steps = ", ".join(f"{op.kind}@{op.device_dim}" for op in plan.ops)
                print(f"  {xs[a].tensor_map} -> {xs[b].tensor_map}: {cost[a, b]:.4g} s ({steps})")


if __name__ == "__main__":
    main()
