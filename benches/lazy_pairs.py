"""How many of the layout pairs the costs stage prices an exact lazy pricing inside the reductions
would have to price (issue 25).

Runs the default search of a model of ``benches/model_families.py`` on ``taps.Cluster(8, 8)``
with every edge matrix of the cost tables, every ``redistribution_costs`` call and every reduction
the solve pipeline takes recorded, then counts, for each edge matrix, the entries a lazy evaluator
must price to make the same reductions bit for bit and the same plan:

- a **leaf** fold of ``v`` into ``u`` (row ``i`` of ``u``, column ``j`` of ``v``'s class, ``c_j``
  the least node cost of the class) prices row ``i``'s entries in order of ``(c_j + L_ij, j)``
  while that bound is below the least exact value priced so far (:func:`needed_in_order`; the
  fold adds only the least value, whatever index holds it); the expand, which picks ``v``'s
  candidate in the row its neighbour chose, also prices every entry of that row whose bound is at
  most the row's least (any of them could tie, and the first candidate of the tie wins);
- a **series** elimination ``C_ik = min_m A_im + n_m + B_mk`` does the same per ``(i, k)`` over
  ``m`` (a needed ``m`` needs both ``A_im`` and ``B_mk``), the union over every ``(i, k)``; its
  expand as the leaf's;
- a **fixed** fold reads one column; a **parallel** merge, what reaches the core (variable
  elimination or SCIP) and every table a reduction makes (it is compacted, merging equal rows:
  full rows needed) need every entry.

The bound ``L`` is one of: ``zero``; ``allreduce`` (per direction, the least price Algorithm 1
can pay for the all-reduces of the partial sums the target drops, which it does first: over
every way of cutting those rank bits into device dims, each all-reduce priced by Algorithm 1
itself on a pair of layouts, per source and target partial bits, not per pair; a cheap bound,
tight only where partial sums are dropped); ``exact`` (the pair's own cost: the floor of any
bound); and, as hypothetical bounds, ``0.5x``, ``0.9x``, ``0.99x`` the exact cost (how tight a
bound would have to be). Every bound is checked to be at most the exact cost on every entry of
every table (the ``allreduce`` bound is so checked, not proven in general). Entries are counted
as distinct kernel pairs (source layout, target layout, bytes per element; an edge's backward
pair is its own pair), as the costs stage dedupes them.

    python benches/lazy_pairs.py timm_swin
    python benches/lazy_pairs.py tv_swin gemma2 jax_llama
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import taps
from model_families import builders
from taps._core import Layout, redistribution_pair_costs
from taps.search import tables
from taps.solve import pipeline
from taps.solve.problem import PairCost, Problem
from taps.solve.reductions import Reduction, _class_min, _class_pairs, _Fixed, _Leaf, _Merge
from taps.solve.ties import Ties

BOUNDS = ("zero", "allreduce", "exact")
#: Hypothetical bounds: the exact cost times these (how tight a bound would have to be).
SCALED = ("0.5x", "0.9x", "0.99x")


def needed_in_order(bound: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """Along the last axis, the entries a lazy minimum prices: in order of ``(bound, index)``,
    each while its bound is below the least exact value priced before it (``bound <= exact``
    everywhere). Closed form: every entry whose bound is below the least value, and, if no such
    entry holds the least, the entries of bound equal to it up to the first that holds it."""
    best = exact.min(axis=-1, keepdims=True)
    below = bound < best
    held_below = (below & (exact == best)).any(axis=-1, keepdims=True)
    equal = bound == best
    holds = equal & (exact == best)
    n = bound.shape[-1]
    first = np.where(holds.any(axis=-1, keepdims=True), holds.argmax(axis=-1)[..., None], n)
    return below | (equal & (np.arange(n) <= first) & ~held_below)


def at_most_least(bound: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """The entries of one row an argmin with the first index among ties must price: every one
    whose bound is at most the least exact value."""
    return bound <= exact.min()


def leaf_needed(
    cost: np.ndarray, bound: np.ndarray, node: np.ndarray, w_class: np.ndarray
) -> np.ndarray:
    """The entries of a leaf's table (its neighbour's classes x its own) the fold prices."""
    least = _class_min(node[:, None], w_class, cost.shape[1])[:, 0]
    return needed_in_order(bound + least[None], cost + least[None])


def leaf_choice_needed(
    cost: np.ndarray, bound: np.ndarray, node: np.ndarray, w_class: np.ndarray, row: int
) -> np.ndarray:
    """The classes of row ``row`` the expand prices to pick the leaf's candidate."""
    chosen = np.zeros(cost.shape[1], dtype=bool)
    pick = at_most_least(bound[row, w_class] + node, cost[row, w_class] + node)
    chosen[w_class[pick]] = True
    return chosen


def series_needed(
    left: PairCost,
    left_bound: np.ndarray,
    node: np.ndarray,
    right: PairCost,
    right_bound: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The entries of ``left`` (u's classes x v's) and ``right`` (v's x w's) that eliminating
    ``v`` between them prices, every ``(i, k)`` of the result wanted (as
    :func:`taps.solve.reductions._series` sums them: ``(A + n) + B``)."""
    a, b = left.cost[..., 0], right.cost[..., 0]
    mid, p, q = _class_pairs(left.w_class, right.u_class)
    least = _class_min(node[:, None], mid, len(p))[:, 0]
    into, into_bound = a[:, p] + least[None], left_bound[:, p] + least[None]
    out, out_bound = b[q].T, right_bound[q].T  # (w's classes, mid)
    need_a = np.zeros(a.shape, dtype=bool)
    need_b = np.zeros(b.shape, dtype=bool)
    for i in range(a.shape[0]):
        need = needed_in_order(into_bound[i][None] + out_bound, into[i][None] + out)
        np.logical_or.at(need_a[i], p, need.any(axis=0))
        np.logical_or.at(need_b, q, need.T)
    return need_a, need_b


def series_choice_needed(
    left: PairCost,
    left_bound: np.ndarray,
    node: np.ndarray,
    right: PairCost,
    right_bound: np.ndarray,
    i: int,
    k: int,
) -> tuple[np.ndarray, np.ndarray]:
    """The entries of row ``i`` of ``left`` and column ``k`` of ``right`` the expand prices to
    pick ``v``'s candidate."""
    a, b = left.cost[..., 0], right.cost[..., 0]
    lw, ru = left.w_class, right.u_class
    pick = at_most_least(left_bound[i, lw] + node + right_bound[ru, k], a[i, lw] + node + b[ru, k])
    need_a = np.zeros(a.shape, dtype=bool)
    need_b = np.zeros(b.shape, dtype=bool)
    need_a[i, lw[pick]] = True
    need_b[ru[pick], k] = True
    return need_a, need_b


def every_entry(p: PairCost) -> np.ndarray:
    """The entries of ``p`` some pair of candidates reads."""
    need = np.zeros(p.cost.shape[:2], dtype=bool)
    need[np.ix_(np.unique(p.u_class), np.unique(p.w_class))] = True
    return need


@dataclass
class Demand:
    """Per table of the problem (its pair index in the reduced problem), the entries needed, by
    what needs them."""

    by: dict[str, dict[int, np.ndarray]] = field(default_factory=dict)

    def add(self, kind: str, k: int, need: np.ndarray) -> None:
        into = self.by.setdefault(kind, {})
        into[k] = need if k not in into else into[k] | need


def reduction_demand(
    reduction: Reduction,
    originals: int,
    bound: Callable[[int], np.ndarray],
    choice: dict[str, int] | None,
) -> Demand:
    """The entries of the first ``originals`` pair costs of a reduced problem that an exact lazy
    evaluator of ``reduction``'s steps prices, under the lower bound ``bound(k)`` of pair ``k``
    (in its own orientation), the expand picking ``choice`` (None: the expands not counted).
    Tables the reductions made are full (they are compacted); so are those left in the core."""
    assert reduction.cores[0].node_cost and len(reduction.cores) == 1, "one objective only"
    seen = reduction.pairs
    demand = Demand()
    used: set[int] = set()

    def oriented(k: int, u: str) -> tuple[PairCost, np.ndarray, bool]:
        flip = seen[k].u != u
        lower = bound(k) if k < originals else seen[k].cost[..., 0]
        return seen[k].oriented(u), lower.T if flip else lower, flip

    def add(kind: str, k: int, need: np.ndarray, flip: bool) -> None:
        if k < originals:
            demand.add(kind, k, need.T if flip else need)

    for step in reduction.steps:
        if isinstance(step, _Merge):
            used.update(step.parts)
            for k in step.parts:
                add("merge", k, every_entry(seen[k]), False)
        elif isinstance(step, _Fixed):
            for k, e in step.edges:
                used.add(k)
                need = np.zeros(e.cost.shape[:2], dtype=bool)
                need[np.unique(e.u_class), e.w_class[0]] = True
                add("fixed", k, need, seen[k].u != e.u)
        elif isinstance(step, _Leaf):
            used.add(step.edge_id)
            e, lower, flip = oriented(step.edge_id, step.edge.u)
            node = step.node[:, 0]
            need = leaf_needed(e.cost[..., 0], lower, node, e.w_class)
            if choice is not None:
                row = int(e.u_class[choice[e.u]])
                need[row] |= leaf_choice_needed(e.cost[..., 0], lower, node, e.w_class, row)
            add("leaf", step.edge_id, need, flip)
        else:
            used.update((step.left_id, step.right_id))
            left, lower_l, flip_l = oriented(step.left_id, step.left.u)
            right, lower_r, flip_r = oriented(step.right_id, step.right.u)
            node = step.node[:, 0]
            need_l, need_r = series_needed(left, lower_l, node, right, lower_r)
            if choice is not None:
                i, k = int(left.u_class[choice[left.u]]), int(right.w_class[choice[right.w]])
                more_l, more_r = series_choice_needed(left, lower_l, node, right, lower_r, i, k)
                need_l, need_r = need_l | more_l, need_r | more_r
            add("series", step.left_id, need_l, flip_l)
            add("series", step.right_id, need_r, flip_r)
    for k in seen:
        if k not in used:
            add("core", k, every_entry(seen[k]), False)
    return demand


# The recording of a real search.


@dataclass
class Matrix:
    """One edge matrix of the cost tables: its ends' layout classes, its element size, whether
    the gradient goes back, and what priced it."""

    src: list[tuple[Layout, ...]]
    dst: list[tuple[Layout, ...]]
    backward: bool
    how: tuple[Any, ...]  # cluster, dtype, cost model, planner, deadline
    cost: np.ndarray


@dataclass
class Recorded:
    matrices: dict[int, Matrix] = field(default_factory=dict)
    priced: int = 0  # layout pairs the kernel was asked for
    reduced: list[tuple[Any, Reduction, Any]] = field(default_factory=list)
    #: Per pair cost the tied repeats' fold made (by id), the matrices it sums, in order; and
    #: the pairs it folded into node costs (a repeat's pair within one block).
    folded: dict[int, list[int]] = field(default_factory=dict)
    within: list[PairCost] = field(default_factory=list)
    chosen: dict[int, dict[str, int]] = field(default_factory=dict)
    result: Any = None


def record(graph: taps.Graph, cluster: taps.Cluster) -> Recorded:
    """The default search of ``graph`` on ``cluster``, with what :class:`Recorded` keeps."""
    rec = Recorded()
    saved = (
        tables._directions,
        tables._edge_costs,
        tables.redistribution_costs,
        pipeline.reduce,
        Reduction.expand,
        Ties.fold,
    )
    directions, edge_costs, kernel, reduce, expand, fold = saved
    #: Per edge matrix's terms (by id), its ends, direction and what priced it.
    ends: dict[int, tuple[Any, ...]] = {}

    def directions_kept(price: Any, src: Any, dst: Any, backward: bool) -> Any:
        terms = directions(price, src, dst, backward)
        ends[id(terms)] = (list(src), list(dst), backward, price.__defaults__[0])
        return terms

    def edge_costs_kept(sums: Any) -> list[np.ndarray]:
        costs = edge_costs(sums)
        for terms, cost in zip(sums, costs, strict=True):
            rec.matrices[id(cost)] = Matrix(*ends[id(terms)], cost)
        return costs

    def kernel_kept(s: Sequence[Layout], t: Sequence[Layout], *a: Any, **kw: Any) -> Any:
        rec.priced += len(s) * len(t)
        return kernel(s, t, *a, **kw)

    def reduce_kept(objectives: Any, order: Any, eliminable: Any = None, deadline: Any = None):
        if eliminable is not None:
            raise NotImplementedError("the memory-limited path is not counted")
        out = reduce(objectives, order, eliminable, deadline)
        rec.reduced.append((objectives[0], out, eliminable))
        return out

    def expand_kept(self: Reduction, core_choice: dict[str, int]) -> dict[str, int]:
        out = expand(self, core_choice)
        rec.chosen[id(self)] = out
        return out

    def fold_kept(self: Ties, problems: Sequence[Problem]) -> list[Problem]:
        out = fold(self, problems)
        # The groups of Ties.fold, in its order: pairs of one table between the same
        # representatives.
        rep = self.representative
        groups: dict[tuple[Any, ...], list[int]] = {}
        for p in problems[0].pairs:
            if rep[p.u] == rep[p.w]:
                rec.within.append(p)
            else:
                key = (rep[p.u], rep[p.w], id(p.u_class), id(p.w_class))
                groups.setdefault(key, []).append(id(p.cost))
        for p, members in zip(out[0].pairs, groups.values(), strict=True):
            rec.folded[id(p.cost)] = members
        return out

    tables._directions = directions_kept  # type: ignore[assignment]
    tables._edge_costs = edge_costs_kept  # type: ignore[assignment]
    tables.redistribution_costs = kernel_kept  # type: ignore[assignment]
    pipeline.reduce = reduce_kept  # type: ignore[assignment]
    Reduction.expand = expand_kept  # type: ignore[method-assign]
    Ties.fold = fold_kept  # type: ignore[method-assign]
    try:
        rec.result = taps.search(graph, cluster)
    finally:
        (
            tables._directions,
            tables._edge_costs,
            tables.redistribution_costs,
            pipeline.reduce,
            Reduction.expand,
            Ties.fold,
        ) = saved
    return rec


def _widths(layout: Layout) -> list[int]:
    """The rank bits each device dim holds, dim 0 (the innermost, the last of the matrix)
    first."""
    return [int(d).bit_length() - 1 for d in reversed(layout.device_matrix)]


def _rank_bits(layout: Layout, dims: Sequence[int]) -> int:
    """The rank bits of the device dims ``dims`` of ``layout``."""
    mask, lo = 0, 0
    for k, width in enumerate(_widths(layout)):
        if k in dims:
            mask |= ((1 << width) - 1) << lo
        lo += width
    return mask


def _cut(source: Layout, cuts: int, partial: int) -> Layout:
    """``source`` with its partial dims cut at the rank bits ``cuts`` (bits), the pieces inside
    the rank bits ``partial`` holding partial sums."""
    sizes: list[int] = []
    renamed: dict[int, int] = {}
    pieces: list[tuple[int, int]] = []  # (new dim, its bits) of the partial dims
    lo = 0
    for k, width in enumerate(_widths(source)):
        starts = [lo]
        if k in source.partial:
            starts += [b for b in range(lo + 1, lo + width) if cuts >> b & 1]
        renamed[k] = len(sizes)
        for a, b in zip(starts, [*starts[1:], lo + width], strict=True):
            if k in source.partial:
                pieces.append((len(sizes), ((1 << (b - a)) - 1) << a))
            sizes.append(1 << (b - a))
        lo += width
    return Layout(
        source.shape,
        list(reversed(sizes)),
        [-1 if k == -1 else renamed[k] for k in source.tensor_map],
        [d for d, bits in pieces if bits & partial == bits],
    )


def _runs(bits: int) -> list[tuple[int, int]]:
    """The maximal runs of consecutive set bits, as (first, past the last), lowest first."""
    out = []
    b = 0
    while bits >> b:
        if bits >> b & 1:
            a = b
            while bits >> b & 1:
                b += 1
            out.append((a, b))
        else:
            b += 1
    return out


def _allreduce_steps(source: Layout, kept: int) -> list[tuple[int, int, Layout, Layout]]:
    """Every all-reduce Algorithm 1 may start a redistribution from ``source`` with, to a target
    holding partial sums on the rank bits ``kept``: it reduces the partial sums the target drops
    one device dim of the unified pair at a time, innermost first, and those dims are cut where
    either layout's dims start (the target's cuts depend on both layouts' splits). Each possible
    dim, the rank bits ``[a, b)`` inside one run of dropped bits, as a pair of layouts on the
    source's device matrix so cut: the sums below ``a`` already reduced, those of ``[a, b)``
    reduced by the pair."""
    partial = _rank_bits(source, source.partial)
    dropped = partial & ~kept
    out = []
    for r0, r1 in _runs(dropped):
        for a in range(r0, r1):
            for b in range(a + 1, r1 + 1):
                before = partial & ~(dropped & ((1 << a) - 1))
                after = before & ~(((1 << (b - a)) - 1) << a)
                cuts = 1 << a | 1 << b
                out.append((a, b, _cut(source, cuts, before), _cut(source, cuts, after)))
    return out


def allreduce_bound(
    sources: list[Layout], targets: list[Layout], how: tuple[Any, ...]
) -> np.ndarray:
    """Per pair, the least price of the all-reduces Algorithm 1 starts with, over every way of
    cutting the dropped partial sums into device dims (:func:`_allreduce_steps`; a shortest path
    over the cuts of each run of dropped bits, runs innermost first)."""
    cluster, dtype, cost_model, planner, _ = how
    kinds: dict[int, int] = {}  # the targets' partial bits, numbered
    col = np.array(
        [kinds.setdefault(_rank_bits(t, t.partial), len(kinds)) for t in targets], dtype=np.int64
    )
    at: dict[tuple[Layout, Layout], int] = {}
    steps: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
    for i, s in enumerate(sources):
        if s.partial:
            for j, kept in enumerate(kinds):
                steps[i, j] = [
                    (a, b, at.setdefault((x, y), len(at)))
                    for a, b, x, y in _allreduce_steps(s, kept)
                ]
    prices = np.zeros(len(at))
    if at:
        prices[:] = redistribution_pair_costs(
            [x for x, _ in at], [y for _, y in at], [dtype] * len(at), cluster, cost_model, planner
        )
    per_kind = np.zeros((len(sources), len(kinds)))
    for (i, j), todo in steps.items():
        runs = _runs(_rank_bits(sources[i], sources[i].partial) & ~list(kinds)[j])
        starts = {r0 for r0, _ in runs}
        # Per cut, the least cost of the dropped bits below it in its run, and the last step.
        least: dict[int, tuple[float, int, int]] = {}
        for a, b, k in sorted(todo, key=lambda x: (x[1], x[0])):
            cost = (0.0 if a in starts else least[a][0]) + float(prices[k])
            if b not in least or cost < least[b][0]:
                least[b] = (cost, a, k)
        chosen: list[int] = []
        for r0, r1 in runs:
            path, b = [], r1
            while b != r0:
                _, b, k = least[b]
                path.append(k)
            chosen += reversed(path)
        total = 0.0
        for k in chosen:  # summed innermost first, as the kernel sums the steps
            total += float(prices[k])
        per_kind[i, j] = total
    return per_kind[:, col]


def directions(m: Matrix, bound: str) -> list[np.ndarray]:
    """The lower bound (``zero`` or ``allreduce``) of each direction of ``m`` (a row per source
    class)."""
    sides = [([x[0] for x in m.src], [y[0] for y in m.dst])]
    if m.backward:
        sides.append(([y[1] for y in m.dst], [x[1] for x in m.src]))
    out = []
    for k, (s, t) in enumerate(sides):
        part = np.zeros((len(s), len(t))) if bound == "zero" else allreduce_bound(s, t, m.how)
        out.append(part if k == 0 else part.T)
    return out


def matrix_bound(m: Matrix, bound: str) -> np.ndarray:
    """The lower bound of ``m``'s entries, summed as the tables sum the directions."""
    if bound == "exact":
        return m.cost
    if bound in SCALED:
        return m.cost * float(bound[:-1])
    parts = directions(m, bound)
    return parts[0] if len(parts) == 1 else parts[0] + parts[1]


def pair_codes(m: Matrix, need: np.ndarray, ids: dict[Any, int]) -> np.ndarray:
    """The distinct kernel pairs behind the entries ``need`` of ``m`` as int64 codes: the
    element size's id, the source's and the target's (21 bits each), a direction's pairs on
    their own."""
    dtype = ids.setdefault(("dtype", m.how[1]), len(ids))
    rows, cols = np.nonzero(need)

    def code(s: list[Layout], t: list[Layout], i: np.ndarray, j: np.ndarray) -> np.ndarray:
        a = np.array([ids.setdefault(x, len(ids)) for x in s], dtype=np.int64)
        b = np.array([ids.setdefault(y, len(ids)) for y in t], dtype=np.int64)
        return (dtype << 42) | (a[i] << 21) | b[j]

    out = [code([x[0] for x in m.src], [y[0] for y in m.dst], rows, cols)]
    if m.backward:
        out.append(code([y[1] for y in m.dst], [x[1] for x in m.src], cols, rows))
    return np.unique(np.concatenate(out))


def census(rec: Recorded, bound: str) -> dict[str, Any]:
    """The entries needed per matrix under ``bound`` (by kind and in all), as distinct kernel
    pairs, and the largest violation of ``bound <= cost``."""
    lower: dict[int, np.ndarray] = {}
    worst = 0.0

    def lower_of(key: int) -> np.ndarray:
        nonlocal worst
        if key not in lower:
            m = rec.matrices[key]
            lower[key] = matrix_bound(m, bound)
            worst = max(worst, float((lower[key] - m.cost).max(initial=0.0)))
        return lower[key]

    need: dict[str, dict[int, np.ndarray]] = {}

    def add(kind: str, key: int, mask: np.ndarray) -> None:
        into = need.setdefault(kind, {})
        into[key] = mask if key not in into else into[key] | mask

    for p in rec.within:
        # Folded into the node costs: each candidate's own entry.
        mask = np.zeros(p.cost.shape, dtype=bool)
        mask[p.u_class, p.w_class] = True
        add("within", id(p.cost), mask)
    for problem, reduction, _ in rec.reduced:
        # Each pair's matrices: the tables' own, or those the fold summed (in its order).
        members = [rec.folded.get(id(p.cost), [id(p.cost)]) for p in problem.pairs]

        def bound_of(k: int, members: list[list[int]] = members) -> np.ndarray:
            first, *rest = members[k]
            out = np.array(lower_of(first), dtype=np.float64)
            for key in rest:
                out += lower_of(key)
            return out

        demand = reduction_demand(
            reduction, len(problem.pairs), bound_of, rec.chosen.get(id(reduction))
        )
        for kind, per in demand.by.items():
            for k, mask in per.items():
                for key in members[k]:
                    add(kind, key, mask)
    ids: dict[Any, int] = {}
    every = np.unique(
        np.concatenate(
            [pair_codes(m, np.ones(m.cost.shape, dtype=bool), ids) for m in rec.matrices.values()]
        )
    )
    by_kind = {}
    union: dict[int, np.ndarray] = {}
    for kind, per in need.items():
        codes = [pair_codes(rec.matrices[key], mask, ids) for key, mask in per.items()]
        by_kind[kind] = len(np.unique(np.concatenate(codes))) if codes else 0
        for key, mask in per.items():
            union[key] = mask if key not in union else union[key] | mask
    codes = [pair_codes(rec.matrices[key], mask, ids) for key, mask in union.items()]
    needed = len(np.unique(np.concatenate(codes))) if codes else 0
    return {"distinct": len(every), "needed": needed, "by_kind": by_kind, "worst": worst}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", help="names of benches/model_families.py")
    parser.add_argument("--bounds", nargs="+", default=list(BOUNDS), choices=BOUNDS + SCALED)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    for name in args.models:
        graph = builders()[name]()
        start = time.process_time()
        rec = record(graph, taps.Cluster(8, 8))
        cpu = time.process_time() - start
        steps: dict[str, int] = {}
        for _, reduction, _ in rec.reduced:
            for step in reduction.steps:
                steps[type(step).__name__] = steps.get(type(step).__name__, 0) + 1
        print(
            f"{name}: search {cpu:.1f} s CPU (load average {os.getloadavg()[0]:.1f}), "
            f"cost {rec.result.cost!r}, {rec.priced:,} layout pairs priced, "
            f"{len(rec.matrices)} matrices, {len(rec.reduced)} reductions, steps {steps}",
            flush=True,
        )
        for bound in args.bounds:
            start = time.process_time()
            out = census(rec, bound)
            print(
                f"  bound {bound:9s}: {out['needed']:,} of {out['distinct']:,} distinct pairs "
                f"needed ({out['needed'] / out['distinct']:.1%}); by what needs them: "
                + ", ".join(f"{k} {v:,}" for k, v in sorted(out["by_kind"].items()))
                + f"; bound over cost by at most {out['worst']:.3g}"
                f" ({time.process_time() - start:.1f} s CPU)",
                flush=True,
            )


if __name__ == "__main__":
    main()
