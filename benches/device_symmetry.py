"""Whether Algorithm 1's price of a layout pair on 8 x 8 is unchanged when one relabelling of the
devices that keeps the topology is applied to both layouts, and what a memo of row orbits would
save (issue 25; docs/performance.md, "Device relabellings as a symmetry of Algorithm 1's prices").

A relabelling is a permutation of the 6 rank bits that keeps the 3 intra-node bits (0-2) and the
3 inter-node bits (3-5) among themselves (3! x 3! = 36). It maps a layout to a layout when every
device dim's bits land on one run of consecutive bits in the same order (``--cut``: replicating
device dims are first cut into 2-device dims, which hold the same data, so more layouts map).

Prints, over the kernel calls of the model's cost tables (``redistribution_costs``, the default
pricing): per relabelling, the sampled pairs it maps and how many keep their price bit for bit;
the pairs a memo of row orbits would price (one row per orbit, each other row read off its
representative's through the relabelling, the columns it does not map priced as now), checked
against the full matrices; and the two pairs below whose price does change.

    python benches/device_symmetry.py timm_swin
    python benches/device_symmetry.py jax_llama --cut
"""

from __future__ import annotations

import argparse
import itertools
import pickle
import time
import warnings
from typing import Any

import numpy as np

import taps
from model_families import builders
from pair_census import recorded_calls
from taps._core import Layout
from taps.search import tables

GROUP = [
    a + b for a in itertools.permutations(range(3)) for b in itertools.permutations(range(3, 6))
]


def _cut(x: Layout) -> tuple[list[int], list[int], list[int], list[int]]:
    """``x``'s fields with each replicating device dim cut into 2-device dims."""
    dm, h = list(x.device_matrix), len(x.device_matrix)
    used = {m for m in x.tensor_map if m >= 0} | set(x.partial)
    sizes: list[int] = []  # from device dim 0 (the rightmost, lowest rank bits) up
    index = {}
    for k in range(h):
        d = dm[h - 1 - k]
        if k in used or d <= 2:
            index[k] = len(sizes)
            sizes.append(d)
        else:
            sizes += [2] * (d.bit_length() - 1)
    tmap = [index[m] if m >= 0 else -1 for m in x.tensor_map]
    return list(x.shape), sizes[::-1], tmap, sorted(index[p] for p in x.partial)


def relabel(x: Layout, pi: tuple[int, ...], cut: bool) -> Layout | None:
    """``x`` with rank bit ``b`` moved to ``pi[b]``, compacted; None if it is not a layout."""
    if cut:
        shape, dm, tmap, partial = _cut(x)
    else:
        shape, dm, tmap, partial = (
            list(x.shape),
            list(x.device_matrix),
            list(x.tensor_map),
            list(x.partial),
        )
    if 1 in dm:
        return None
    h, off = len(dm), [0]
    for d in reversed(dm):
        off.append(off[-1] + d.bit_length() - 1)
    starts = []
    for k in range(h):
        s = pi[off[k]]
        if any(pi[off[k] + t] != s + t for t in range(off[k + 1] - off[k])):
            return None
        starts.append(s)
    order = sorted(range(h), key=lambda k: starts[k])
    new = {k: i for i, k in enumerate(order)}
    return Layout(
        shape,
        [dm[h - 1 - k] for k in reversed(order)],
        [new[m] if m >= 0 else -1 for m in tmap],
        sorted(new[p] for p in partial),
    ).compacted()


def _calls(model: str, graph_file: str | None, cluster: taps.Cluster) -> list[tuple[Any, ...]]:
    if graph_file:
        with open(graph_file, "rb") as f:
            graph = pickle.load(f)
    else:
        graph = builders()[model]()
    return recorded_calls(graph, cluster)[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a name of benches/model_families.py")
    parser.add_argument("--graph", help="a pickled taps.Graph instead of building the model")
    parser.add_argument("--cut", action="store_true", help="cut replicating dims first")
    parser.add_argument("--sample", type=int, default=120, help="rows and columns per call")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    cluster = taps.Cluster(8, 8)
    calls = _calls(args.model, args.graph, cluster)
    cache: dict[Layout, list[Layout | None]] = {}

    def images(x: Layout) -> list[Layout | None]:
        if x not in cache:
            cache[x] = [relabel(x, pi, args.cut) for pi in GROUP]
        return cache[x]

    rng = np.random.default_rng(0)
    mapped, equal = np.zeros(len(GROUP), int), np.zeros(len(GROUP), int)
    for s, t, *how in calls:
        rows = [s[i] for i in rng.choice(len(s), min(args.sample, len(s)), replace=False)]
        cols = [t[j] for j in rng.choice(len(t), min(args.sample, len(t)), replace=False)]
        base = np.asarray(tables.redistribution_costs(rows, cols, cluster, *how))
        for g in range(1, len(GROUP)):
            r = [(i, z) for i, x in enumerate(rows) if (z := images(x)[g]) is not None]
            c = [(j, z) for j, y in enumerate(cols) if (z := images(y)[g]) is not None]
            if r and c:
                got = tables.redistribution_costs(
                    [z for _, z in r], [z for _, z in c], cluster, *how
                )
                ref = base[np.ix_([i for i, _ in r], [j for j, _ in c])]
                mapped[g] += ref.size
                equal[g] += int((np.asarray(got) == ref).sum())
    print(
        f"{args.model}, cut {args.cut}: sampled pairs each relabelling maps, and keep their price"
    )
    for g in range(1, len(GROUP)):
        if mapped[g]:
            print(f"  {GROUP[g]}: {mapped[g]} mapped, {equal[g]} equal")

    total = priced = checked = differ = representatives = 0
    start = time.process_time()
    for s, t, *how in calls:
        full = np.asarray(tables.redistribution_costs(s, t, cluster, *how))
        column = {y.compacted(): j for j, y in enumerate(t)}
        # Per relabelling, the column each column maps to (-1: none, or not in the set).
        colmap = np.array(
            [
                [column.get(z, -1) if (z := images(y)[g]) is not None else -1 for y in t]
                for g in range(len(GROUP))
            ]
        )
        reps: dict[Any, tuple[int, int]] = {}
        for i, x in enumerate(s):
            cands = [
                (tuple(map(tuple, (z.device_matrix, z.tensor_map, z.partial))), g)
                for g, z in enumerate(images(x))
                if z is not None
            ]
            canon = min(k for k, _ in cands)
            g = max((g for k, g in cands if k == canon), key=lambda g: int((colmap[g] >= 0).sum()))
            if canon not in reps:
                reps[canon] = (i, g)
                priced += len(t)
                continue
            # cost(x, y) = cost(g x, g y) = cost(g0 rep, g y) = cost(rep, g0^-1 g y).
            i0, g0 = reps[canon]
            back = [GROUP[g0].index(b) for b in range(6)]
            h = GROUP.index(tuple(back[GROUP[g][b]] for b in range(6)))
            ok = colmap[h] >= 0
            priced += int((~ok).sum())
            checked += int(ok.sum())
            differ += int((full[i0, colmap[h][ok]] != full[i, ok]).sum())
        representatives += len(reps)
        total += len(s) * len(t)
    print(
        f"row memo: {sum(len(c[0]) for c in calls)} rows -> {representatives} representatives; "
        f"{total / 1e6:.2f} M pairs -> {priced / 1e6:.2f} M priced ({total / priced:.2f}x fewer); "
        f"{checked} read-offs checked against the full matrices, {differ} differ "
        f"({time.process_time() - start:.0f} s CPU)"
    )

    # The most any memo keyed by pair orbits could save (exact or not): the sum over pairs of one
    # over the pairs of their call's rows and columns in their orbit, sampled.
    weights = np.array([len(c[0]) * len(c[1]) for c in calls], dtype=float)
    shares = []
    sets: dict[int, tuple[set[Layout], set[Layout]]] = {}
    for ci in rng.choice(len(calls), 20000, p=weights / weights.sum()):
        s, t, *_ = calls[ci]
        if ci not in sets:
            sets[ci] = ({x.compacted() for x in s}, {y.compacted() for y in t})
        x, y = s[rng.integers(len(s))], t[rng.integers(len(t))]
        orbit = {(p, q) for p, q in zip(images(x), images(y), strict=True) if p and q}
        shares.append(1 / max(1, sum(p in sets[ci][0] and q in sets[ci][1] for p, q in orbit)))
    orbits = float(np.mean(shares)) * weights.sum()
    print(
        f"pair orbits in the calls' sets: ~{orbits / 1e6:.2f} M of {weights.sum() / 1e6:.2f} M "
        f"({weights.sum() / orbits:.2f}x fewer), from 20,000 sampled pairs"
    )

    # Pairs whose price a relabelling changes: it makes two partial dims adjacent (or not), and
    # the unified layouts all-reduce them as one collective (or two).
    dm = [8, 2, 2, 2]
    a = Layout([64, 64], dm, [1, -1], [0, 2])
    b = Layout([64, 64], dm, [-1, -1], [])
    swapped = relabel(a, (0, 2, 1, 3, 4, 5), False)  # rank bits 1 and 2 swapped; b is fixed
    assert swapped is not None
    print("bits 1, 2 swapped:", tables.redistribution_costs([a, swapped], [b], cluster).ravel())
    dm = [2, 2, 2, 2, 2, 2]
    a = Layout([64, 64], dm, [1, -1], [2, 3])
    b = Layout([64, 64], dm, [1, -1], [])
    turned = relabel(a, (2, 1, 0, 3, 4, 5), False)  # the intra-node bits reversed; b is fixed
    assert turned is not None and relabel(b, (2, 1, 0, 3, 4, 5), False) == b.compacted()
    print("bits 0-2 reversed:", tables.redistribution_costs([a, turned], [b], cluster).ravel())


if __name__ == "__main__":
    main()
