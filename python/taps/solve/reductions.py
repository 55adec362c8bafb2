"""Exact graph reductions of the strategy-selection problem before the ILP.

Without a memory limit the problem is a sum of node costs (one vector per operator) and pair costs
(one matrix per graph edge, over the layout classes of its two ends), minimised over one choice per
operator. Four reductions keep the optimum exactly (the optimal reductions R1 and R2 of the
partitioned Boolean quadratic problem, with parallel edges merged and fixed operators folded):

- **parallel**: two pair costs between the same operators become one, over the pairs of classes;
- **leaf** (an operator with one neighbour): its best choice for each class of the neighbour is
  folded into the neighbour's node cost;
- **series** (an operator with two neighbours): eliminated by a min-plus product, leaving one pair
  cost between the neighbours;
- **fixed** (an operator with one candidate, any number of neighbours): its pair costs are node
  costs of its neighbours.

On a chain or a tree this is dynamic programming and leaves one operator; on a transformer layer
the residual connections reduce the same way. What is left (the core) goes to SCIP, and the
eliminated choices follow from the core's, in reverse order of elimination
(:meth:`Reduction.expand`). With two objectives (a lexicographic solve) every cost is a pair,
compared on the first and, on ties, on the second.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from taps._core import first_equal, min_plus
from taps._core import min_plus_one as _core_min_plus_one
from taps._support.deadline import check
from taps.solve.problem import PairCost, Problem

#: Eliminate an operator by a min-plus product only while its work (rows x columns x the operator's
#: distinct choices) stays below this (a fifth of it with two objectives, whose kernel is five to
#: seven times slower): a few seconds on one core at most, where SCIP would get the pair costs
#: around it as millions of variables (Llama-3 8B's attention on 1024 devices needs 1.1e9); above
#: it the operator stays for SCIP.
MAX_SERIES_WORK = 2_000_000_000
#: Odd 64-bit multipliers, one per column, of the hash that groups equal rows of a cost matrix.
_ROW_HASH = np.random.default_rng(0).integers(1, 2**63, size=1024, dtype=np.uint64) | np.uint64(1)
#: Relative difference of first objectives still taken as a tie in a lexicographic reduction.
_TIE = 1e-12
#: A one-objective min-plus product is remembered by its operands' values (:class:`Products`) when
#: its work (rows x inner x columns) is at least this many times its operands' entries: hashing
#: an entry costs about 20 sums of the kernel, so below this the hashing of products met once
#: (timm_swin: 2 repeats in 19 hashed at 128, in 25 at 64) costs about what the repeats save.
MEMO_RATIO = 128


def _lex_argmin(values: np.ndarray, axis: int) -> np.ndarray:
    """The index along ``axis`` of the least cost, the last axis holding the objectives: the
    first objective decides, up to a relative 1e-12 (float noise of sums taken in another
    order), then the second; the first index of equals."""
    primary = values[..., 0]
    if values.shape[-1] == 1:
        return primary.argmin(axis=axis)
    least = primary.min(axis=axis, keepdims=True)
    tied = primary <= least + _TIE * np.abs(least)
    return np.where(tied, values[..., 1], np.inf).argmin(axis=axis)


def _lex_min(values: np.ndarray, axis: int) -> np.ndarray:
    """The least cost along ``axis`` (see :func:`_lex_argmin`), that axis removed."""
    if values.shape[-1] == 1:
        # One objective: its least value, without gathering it at its index (the same number;
        # the ufunc's reduce is what ``values.min`` calls, without its wrappers).
        return np.minimum.reduce(values, axis=axis)
    index = np.expand_dims(_lex_argmin(values, axis), axis)
    return np.take_along_axis(values, index[..., None], axis).squeeze(axis)


def _class_min(values: np.ndarray, classes: np.ndarray, count: int) -> np.ndarray:
    """Per class ``0..count-1``, the least of the ``values`` (candidates x objectives) of its
    members."""
    if values.shape[-1] == 1:
        return _group_min(values, classes, count)
    member = classes[None, :] == np.arange(count)[:, None]
    return _lex_min(np.where(member[..., None], values[None], np.inf), axis=1)


def row_hashes(bits: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each row of a 2-D array of 64-bit words: equal rows, equal hashes."""
    return (bits * np.resize(_ROW_HASH, bits.shape[1])).sum(axis=1, dtype=np.uint64)


def hash_groups(keys: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """``rows`` grouped by their ``keys`` (:func:`row_hashes`: several times faster than sorting
    the rows as np.unique does): the first row of each group and each row's group, or None if a
    group holds rows that differ (a collision; the caller compares them the slow way)."""
    _, first, group = np.unique(keys, return_index=True, return_inverse=True)
    group = group.reshape(-1)
    return (first, group) if np.array_equal(rows[first[group]], rows) else None


def _first_equal(flat: np.ndarray) -> np.ndarray:
    """Per row of ``flat``, the index of the first row equal to it, entries compared as numbers
    (the core's one pass over the rows in place: numpy's hashing and checking made five copies)."""
    return first_equal(np.asarray(flat, dtype=np.float64))


def _compact(classes: np.ndarray, cost: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Merge classes whose slices of ``cost`` along ``axis`` are equal: (new class per
    candidate, ``cost`` of the distinct slices, in order of first appearance; ``cost`` itself if
    all are distinct)."""
    slices = np.moveaxis(cost, axis, 0)
    firsts, inverse = np.unique(_first_equal(slices.reshape(len(slices), -1)), return_inverse=True)
    return inverse.reshape(-1)[classes], along(cost, firsts, axis)


def _pair(u: str, w: str, u_class: np.ndarray, w_class: np.ndarray, cost: np.ndarray) -> PairCost:
    """A pair cost with equal rows and equal columns merged (a smaller ILP, the same costs)."""
    u_class, cost = _compact(u_class, cost, 0)
    w_class, cost = _compact(w_class, cost, 1)
    return PairCost(u, w, u_class, w_class, np.ascontiguousarray(cost))


def _class_pairs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Number the distinct pairs ``(a[i], b[i])``: (pair per i, a of each pair, b of each pair)."""
    keys = a.astype(np.int64) * (int(b.max(initial=0)) + 1) + b
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    return inverse.reshape(-1), a[first], b[first]


def _merge(p: PairCost, q: PairCost) -> PairCost:
    """Two pair costs between the same operators as one."""
    q = q.oriented(p.u)
    u_class, pu, qu = _class_pairs(p.u_class, q.u_class)
    w_class, pw, qw = _class_pairs(p.w_class, q.w_class)
    # An axis at a time (numpy's indexing by two arrays at once is twice as slow).
    cost = along(along(p.cost, pu, 0), pw, 1) + along(along(q.cost, qu, 0), qw, 1)
    return _pair(p.u, p.w, u_class, w_class, cost)


def in_order(index: np.ndarray, size: int) -> bool:
    """Whether indexing an axis of ``size`` by ``index`` keeps every slice in its place."""
    # Compared without np.array_equal's wrappers: called per step of every round's solve.
    return index.shape == (size,) and bool((index == np.arange(size)).all())


def along(array: np.ndarray, index: np.ndarray, axis: int) -> np.ndarray:
    """``array`` indexed by ``index`` along ``axis``: ``array`` itself if that keeps every slice
    in its place (a copy saved)."""
    if in_order(index, array.shape[axis]):
        return array
    # np.take, not indexing: twice as fast along an inner axis (the same copy).
    return np.take(array, index, axis=axis)


def _min_plus(x: np.ndarray, shift: np.ndarray, y: np.ndarray, products: Products) -> np.ndarray:
    """``out[a, b] = min_k (x[a, k] + shift[k]) + y[k, b]`` (objectives on the last axis,
    compared as :func:`_lex_min` compares them), by the core's kernel on all cores (one
    objective: by ``products``, the shift added as the kernel packs ``x``)."""
    if x.shape[-1] == 1:
        return products(x[..., 0], y[..., 0], shift[:, 0])[..., None]
    x = np.ascontiguousarray(x + shift[None], dtype=np.float64)
    y = np.ascontiguousarray(y, dtype=np.float64)
    return min_plus(x, y, _TIE)


def min_plus_one(x: np.ndarray, y: np.ndarray, shift: np.ndarray | None = None) -> np.ndarray:
    """``out[a, b] = min_k x[a, k] + y[k, b]`` of one objective (a transposed view read in
    place), ``x + shift`` (``shift`` along ``k``) in place of ``x`` if given (no copy of it)."""
    return _core_min_plus_one(
        np.asarray(x, dtype=np.float64),
        np.asarray(y, dtype=np.float64),
        None if shift is None else np.asarray(shift, dtype=np.float64),
    )


def _in_memory(a: np.ndarray) -> tuple[bool, np.ndarray]:
    """Whether ``a`` is read in Fortran order, and its entries in that order as unsigned words
    (a copy only if ``a`` is neither C- nor Fortran-contiguous)."""
    fortran = not a.flags.c_contiguous and a.flags.f_contiguous
    memory = a.T if fortran else np.ascontiguousarray(a)
    return fortran, memory.reshape(-1).view(f"u{a.itemsize}")


def _digest(a: np.ndarray) -> tuple[object, ...]:
    """A key of an array's values: its shape, its order in memory and the SHA-256 of its bytes
    (equal keys, equal values to the bit)."""
    fortran, words = _in_memory(a)
    return (a.shape, a.dtype.str, fortran, hashlib.sha256(words.data).digest())


def _fingerprint(a: np.ndarray) -> tuple[object, ...]:
    """A cheap key of an array's values: its shape, its order in memory, the wrapping sum of its
    words and a sample of them (equal values, equal keys; a match is then checked entry by
    entry, :func:`_same`). A sum is some twenty times cheaper than SHA-256."""
    fortran, words = _in_memory(a)
    sample = words[:: max(1, len(words) // _SAMPLE)].tobytes()
    return (a.shape, a.dtype.str, fortran, int(words.sum(dtype=np.uint64)), sample)


#: The words of an array :func:`_fingerprint` samples.
_SAMPLE = 64


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two arrays of one :func:`_fingerprint` are equal to the bit."""
    return bool(np.array_equal(_in_memory(a)[1], _in_memory(b)[1]))


#: A product with its operands (``x``, ``y``, ``shift``).
_Entry = tuple[tuple[np.ndarray, np.ndarray, np.ndarray | None], np.ndarray]


class Products:
    """One-objective min-plus products (:func:`min_plus_one`), each computed once per operands'
    values (and shift's): the repeated layers of a model reduce to equal operands that are not the
    same arrays (jax_llama's two layers: every large product twice). Only products whose work
    is :data:`MEMO_RATIO` times their operands' entries are looked up. The results are shared:
    callers must not change them in place. Inside a round, a product is found by its operands'
    :func:`_fingerprint` s and their values compared (the operands are kept until the round ends:
    nothing changes them in place in a reduction); kept from one round to the next
    (:meth:`next_round`, called before any operand changes), by their SHA-256 digests, it also
    gives a round the products whose operands the last round's changes left equal."""

    def __init__(self) -> None:
        self._done: dict[tuple[object, ...], list[_Entry]] = {}
        #: Of the products looked up by digest, the digests of their operands (by the
        #: product's id: ``_done`` keeps it alive).
        self._digests: dict[int, tuple[object, ...]] = {}
        self._last: dict[tuple[object, ...], np.ndarray] = {}

    def next_round(self) -> None:
        """Keep only the products of the round just ended (those the next is likely to ask
        for again), by the digests of their operands as they are now (the next round may
        change them in place), so that the memo does not grow round after round."""
        last: dict[tuple[object, ...], np.ndarray] = {}
        for entries in self._done.values():
            for operands, product in entries:
                key = self._digests.get(id(product)) or _digests(operands)
                last[key] = product
        self._last, self._done, self._digests = last, {}, {}

    def __call__(self, x: np.ndarray, y: np.ndarray, shift: np.ndarray | None = None) -> np.ndarray:
        (rows, inner), cols = x.shape, y.shape[1]
        if rows * inner * cols < MEMO_RATIO * (x.size + y.size):
            return min_plus_one(x, y, shift)
        operands = (x, y, shift)
        key = tuple(None if a is None else _fingerprint(a) for a in operands)
        entries = self._done.setdefault(key, [])
        for (ex, ey, es), found in entries:
            # (Of one fingerprint, both have a shift or neither.)
            if _same(x, ex) and _same(y, ey) and (shift is None or es is None or _same(shift, es)):
                return found
        digests = _digests(operands) if self._last else None
        taken = None if digests is None else self._last.get(digests)
        product = taken if taken is not None else min_plus_one(x, y, shift)
        # Shared between steps: a write in place would change another step's operand.
        product.flags.writeable = False
        if digests is not None:
            self._digests[id(product)] = digests
        entries.append((operands, product))
        return product


def _digests(operands: tuple[np.ndarray, np.ndarray, np.ndarray | None]) -> tuple[object, ...]:
    """The :func:`_digest` of each operand of a product."""
    return tuple(None if a is None else _digest(a) for a in operands)


def _group_min(values: np.ndarray, classes: np.ndarray, count: int) -> np.ndarray:
    """Per class ``0..count-1``, the least of the rows of ``values`` whose candidate is in it
    (inf for a class with no candidate): ``values`` itself where each class is its one candidate
    in order (the callers only read it)."""
    if in_order(classes, count):
        return np.asarray(values, dtype=np.float64)
    out = np.full((count, *values.shape[1:]), np.inf)
    if values.size == len(values):
        # One number per row (a node cost): scattered into the classes, three to seven times
        # faster than sorting them (wider rows the other way: twice as fast as scattering).
        np.minimum.at(out, classes, values)
        return out
    order = np.argsort(classes, kind="stable")
    ordered = classes[order]
    starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1])))
    out[ordered[starts]] = np.minimum.reduceat(values[order], starts, axis=0)
    return out


def _without(total: np.ndarray, part: np.ndarray) -> np.ndarray:
    """``total - part``, where ``part`` (a term of ``total``) is finite; inf where it is not
    (there any completion costs inf whatever the rest is)."""
    finite = np.isfinite(part)
    return np.where(finite, total - np.where(finite, part, 0.0), np.inf)


@dataclass
class _Merge:
    """Parallel pair costs ``parts`` (their ids) merged into the pair ``made``."""

    parts: list[int]
    made: int


@dataclass
class _Leaf:
    v: str
    edge: PairCost  # oriented (neighbour, v)
    node: np.ndarray
    edge_id: int
    #: Whether the edge's classes of the neighbour and of ``v`` are its candidates in order
    #: (:func:`in_order`), once known: :func:`reduce_again` takes them from round to round.
    ordered: tuple[bool, bool] | None = None

    def choose(self, choice: dict[str, int]) -> int:
        row = self.edge.cost[self.edge.u_class[choice[self.edge.u]]]
        if self.ordered is None or not self.ordered[1]:
            row = row[self.edge.w_class]
        return int(_lex_argmin(row + self.node, axis=0))


@dataclass
class _Fixed:
    v: str
    edges: list[tuple[int, PairCost]]  # (id, oriented (neighbour, v))

    def choose(self, choice: dict[str, int]) -> int:
        del choice
        return 0


@dataclass
class _Series:
    v: str
    left: PairCost  # oriented (u, v)
    right: PairCost  # oriented (v, w)
    node: np.ndarray
    left_id: int
    right_id: int
    made: int  # the pair (u, w) left in v's place

    def choose(self, choice: dict[str, int]) -> int:
        into = self.left.cost[self.left.u_class[choice[self.left.u]]][self.left.w_class]
        out = self.right.cost[:, self.right.w_class[choice[self.right.w]]][self.right.u_class]
        return int(_lex_argmin(into + self.node + out, axis=0))


@dataclass
class Reduction:
    """The core left for SCIP (one problem per objective, alike but for their costs), and how to
    complete its solution."""

    cores: list[Problem]
    #: Eliminations and merges of parallel pair costs, in order.
    steps: list[_Fixed | _Leaf | _Series | _Merge] = field(default_factory=list)
    #: Every pair cost the reductions saw, by id (the first ones are the problem's, in order).
    pairs: dict[int, PairCost] = field(default_factory=dict)
    #: The (first objective's) problem reduced, if every operator was open to the reductions,
    #: and the order of the operators visited (:func:`reduce_again` takes the same steps on a
    #: problem of its form).
    problem: Problem | None = None
    order: list[str] = field(default_factory=list)

    @property
    def eliminated(self) -> int:
        return sum(not isinstance(step, _Merge) for step in self.steps)

    def isolated_choice(self) -> dict[str, int]:
        """The best choice of a core whose operators no pair cost joins: each its cheapest."""
        assert not self.cores[0].pairs
        names = list(self.cores[0].node_cost)
        return {
            v: int(_lex_argmin(_stacked_cost([c.node_cost[v] for c in self.cores]), axis=0))
            for v in names
        }

    def expand(self, core_choice: dict[str, int]) -> dict[str, int]:
        """The optimal choice of every operator, given an optimal choice of the core's."""
        choice = dict(core_choice)
        for step in reversed(self.steps):
            if not isinstance(step, _Merge):
                choice[step.v] = step.choose(choice)
        return choice


def _identity(array: np.ndarray) -> tuple[int, tuple[int, ...], tuple[int, ...], str]:
    """Where an array's memory is and how it is laid out: equal for the same array or any view
    of it alike."""
    return (array.ctypes.data, array.shape, array.strides, array.dtype.str)


def _identities(p: PairCost) -> tuple[object, ...]:
    """The identities of a pair cost's arrays (:func:`_identity`)."""
    return (_identity(p.cost), _identity(p.u_class), _identity(p.w_class))


def _series(
    left: PairCost, right: PairCost, node: np.ndarray, objectives: int, products: Products
) -> PairCost | None:
    """The pair cost ``(u, w)`` that eliminating ``v`` between ``left (u, v)`` and
    ``right (v, w)`` leaves (the names are ``left.u`` and ``right.w``), its product by
    ``products``; None when its work is beyond :data:`MAX_SERIES_WORK` (a fifth of it with two
    objectives)."""
    mid, p, q = _class_pairs(left.w_class, right.u_class)
    work = left.cost.shape[0] * len(p) * right.cost.shape[1]
    if work > (MAX_SERIES_WORK if objectives == 1 else MAX_SERIES_WORK // 5):
        return None
    best = _class_min(node, mid, len(p))
    cost = _min_plus(along(left.cost, p, 1), best, along(right.cost, q, 0), products)
    return _pair(left.u, right.w, left.u_class, right.w_class, cost)


#: The eliminations a reduction made, by their inputs' arrays (:func:`reduce`'s ``memo``).
Memo = dict[tuple[object, ...], object]


def reduce(
    objectives: Sequence[Problem],
    order: list[str],
    eliminable: Collection[str] | None = None,
    deadline: float | None = None,
    products: Products | None = None,
    memo: Memo | None = None,
) -> Reduction:
    """Apply the reductions until none applies, visiting operators in ``order`` (deterministic).
    Only operators in ``eliminable`` (all if None) are eliminated; the others may still take in
    what is folded into them. Past ``deadline`` (checked before each operator),
    :class:`taps.errors.TimeLimitError`. ``products`` (a fresh memo if None) computes the
    min-plus products; one kept across solves reuses the last solve's. ``memo`` (a fresh one
    if None) holds the eliminations made, by the identities of their arrays: one shared with
    another reduction takes its eliminations of the same arrays, while that reduction is alive
    (it keeps them from being freed, their addresses taken) and no array changed in place.

    ``objectives`` are one problem, or two alike but for their costs to be minimised
    lexicographically (the second among the optima of the first)."""
    first = objectives[0]
    if len(objectives) > 2 or any(
        len(o.pairs) != len(first.pairs) or o.node_cost.keys() != first.node_cost.keys()
        for o in objectives
    ):
        raise ValueError("reduce takes one or two problems over the same operators and pairs")
    node = _stacked_nodes(objectives)
    # The layers of a model share their pair costs (one array for every copy) and, inside a
    # layer, have equal node costs: an elimination whose inputs are the same arrays and equal
    # node costs is made once (the result shared; no array is changed in place). Arrays are
    # known by their memory; every one keyed stays alive in ``seen``, so no other takes its
    # address.
    if memo is None:
        memo = {}
    if products is None:
        products = Products()

    def stacked(k: int) -> np.ndarray:
        key = ("stack", *(_identity(o.pairs[k].cost) for o in objectives))
        if key not in memo:
            memo[key] = _stacked_cost([o.pairs[k].cost for o in objectives])
        return cast("np.ndarray", memo[key])

    pairs: dict[int, PairCost] = {
        k: PairCost(p.u, p.w, p.u_class, p.w_class, stacked(k)) for k, p in enumerate(first.pairs)
    }
    incident: dict[str, set[int]] = {v: set() for v in node}
    for k, p in pairs.items():
        incident[p.u].add(k)
        incident[p.w].add(k)
    seen = dict(pairs)
    steps: list[_Fixed | _Leaf | _Series | _Merge] = []

    def add(p: PairCost) -> int:
        k = len(seen)
        pairs[k] = seen[k] = p
        incident[p.u].add(k)
        incident[p.w].add(k)
        return k

    def drop(k: int) -> PairCost:
        p = pairs.pop(k)
        incident[p.u].discard(k)
        incident[p.w].discard(k)
        return p

    def neighbours(v: str) -> dict[str, int]:
        """The id of the one pair cost towards each neighbour, merging parallel ones first."""
        by: dict[str, list[int]] = {}
        for k in sorted(incident[v]):
            by.setdefault(pairs[k].other(v), []).append(k)
        out = {}
        for other, ks in by.items():
            if len(ks) > 1:
                merged = pairs[ks[0]]
                for k in ks[1:]:
                    merged = _merge(merged, pairs[k])
                for k in ks:
                    drop(k)
                steps.append(_Merge(ks, add(merged)))
            out[other] = max(incident[v] & incident[other])
        return out

    def narrow(v: str) -> float | None:
        """The work of eliminating ``v`` by series if it is narrow: fewer candidates than the
        pair cost it would leave between its two neighbours has entries per their sum (ConvNeXt's
        elementwise operators of 257 candidates between convolutions of 1,649 on 8 x 8). Such an
        elimination waits for every other reduction: those may still remove a wide neighbour."""
        near = neighbours(v)
        if len(near) != 2 or len(node[v]) == 1:
            return None
        (u, kl), (_, kr) = near.items()
        rows, cols = pairs[kl].oriented(u).cost.shape[0], pairs[kr].oriented(v).cost.shape[1]
        n = len(node[v])
        return float(rows * n * cols) if n * (rows + cols) < rows * cols else None

    def eliminate(v: str, wait: bool = True) -> bool:
        if wait and narrow(v) is not None:
            return False
        near = neighbours(v)
        if len(node[v]) == 1:
            # One candidate, whatever the degree: each pair cost is a node cost of the neighbour
            # (the operator's own cost goes to one of them, to keep the total).
            edges = [(k, pairs[k].oriented(u)) for u, k in near.items()]
            _fixed_fold(edges, node)
            steps.append(_Fixed(v, edges))
        elif len(near) == 1:
            ((u, k),) = near.items()
            e = pairs[k].oriented(u)
            key = ("leaf", *_identities(e), node[v].shape, node[v].tobytes())
            if key not in memo:
                memo[key] = _leaf_fold(e, node[v])
            node[u] += cast("np.ndarray", memo[key])
            steps.append(_Leaf(v, e, node[v], k))
        elif len(near) == 2:
            (u, kl), (w, kr) = near.items()
            left, right = pairs[kl].oriented(u), pairs[kr].oriented(v)
            key = ("series", *_identities(left), *_identities(right), node[v].tobytes())
            if key not in memo:
                memo[key] = _series(left, right, node[v], len(objectives), products)
            series = cast("PairCost | None", memo[key])
            if series is None:
                return False
            made = add(PairCost(u, w, series.u_class, series.w_class, series.cost))
            steps.append(_Series(v, left, right, node[v], kl, kr, made))
        else:
            return False
        for k in list(incident[v]):
            drop(k)
        del node[v]
        return True

    visit = order if eliminable is None else [v for v in order if v in eliminable]
    changed = True
    while changed:
        changed = False
        for v in visit:
            check(deadline, "reducing the problem")
            if v in node and incident[v] and eliminate(v):
                changed = True
        if not changed:
            # Only narrow series are left: they go least work first (ties in order), but one
            # whose neighbourhood an earlier one of them changed waits again (its neighbours
            # may no longer be wide), so that repeated layers go in one pass, not one by one.
            work = {v: w for v in visit if v in node and (w := narrow(v)) is not None}
            touched: set[str] = set()
            for v in sorted(work, key=work.__getitem__):
                near = {v, *neighbours(v)}
                if not near & touched and eliminate(v, wait=False):
                    touched |= near
                    changed = True
    # Reduced whole, it can be taken again (reduce_again).
    again = first if eliminable is None else None
    return Reduction(_cores(node, pairs, len(objectives)), steps, seen, again, list(order))


def _stacked_nodes(objectives: Sequence[Problem]) -> dict[str, np.ndarray]:
    """Each operator's node costs, objectives on the last axis (a copy: the reductions add to
    it)."""
    return {
        v: _stacked_cost([o.node_cost[v] for o in objectives]).astype(np.float64)
        for v in objectives[0].node_cost
    }


def _stacked_cost(costs: list[np.ndarray]) -> np.ndarray:
    """Costs of each objective (a pair's, or an operator's), objectives on the last axis."""
    # One objective: a view (nothing changes the arrays in place), not a copy.
    return costs[0][..., None] if len(costs) == 1 else np.stack(costs, -1)


def _leaf_fold(
    e: PairCost, node: np.ndarray, ordered: tuple[bool, bool] = (False, False)
) -> np.ndarray:
    """What eliminating the leaf ``e.w`` of node costs ``node`` adds to ``e.u``'s node costs:
    per candidate of ``e.u``, the leaf's best completion. ``ordered`` says which of ``e.u``'s
    and ``e.w``'s classes are known to be their candidates in order: no gather by them (the same
    numbers)."""
    if ordered[1] and node.shape[-1] == 1:
        best = node  # each class its one candidate's cost (read, not changed)
    else:
        best = _class_min(node, e.w_class, e.cost.shape[1])
    least = _lex_min(e.cost + best[None], axis=1)
    return least if ordered[0] else least[e.u_class]


def _fixed_fold(edges: list[tuple[int, PairCost]], node: dict[str, np.ndarray]) -> None:
    """Eliminating an operator of one candidate (each of ``edges`` oriented towards it): each
    pair cost added to its neighbour's node costs, the operator's own cost to the first's."""
    own = node[edges[0][1].w][0]
    for _, e in edges:
        node[e.u] += e.cost[:, e.w_class[0]][e.u_class] + own
        own = np.zeros_like(own)


def _cores(node: dict[str, np.ndarray], pairs: dict[int, PairCost], count: int) -> list[Problem]:
    """The problem left, one per objective."""
    return [
        Problem(
            {v: c[:, i] for v, c in node.items()},
            [
                PairCost(p.u, p.w, p.u_class, p.w_class, p.cost[..., i])
                for _, p in sorted(pairs.items())
            ],
        )
        for i in range(count)
    ]


def reduce_again(
    objectives: Sequence[Problem], order: list[str], like: Reduction
) -> Reduction | None:
    """:func:`reduce` of every operator in ``order``, for problems of the form of those ``like``
    reduced in that order (the same operators, candidates, pairs and classes: the optimal
    search's rounds change a few pair costs' values between solves), by ``like``'s steps
    without looking for them again:
    the same operations in the same order, so the same numbers. None (reduce them afresh) if the
    form differs or a step of ``like`` is a merge or a series (its pair compacted by its values,
    after which the reductions may take another way)."""
    first, before = objectives[0], like.problem
    if (
        before is None
        or order != like.order
        or list(first.node_cost) != list(before.node_cost)
        or len(objectives) != len(like.cores)
        or any(isinstance(step, (_Merge, _Series)) for step in like.steps)
        or len(first.pairs) != len(before.pairs)
        or any(len(c) != len(before.node_cost.get(v, ())) for v, c in first.node_cost.items())
        or not all(_alike(p, q) for p, q in zip(first.pairs, before.pairs, strict=True))
    ):
        return None
    node = _stacked_nodes(objectives)
    pairs = {
        k: PairCost(
            p.u, p.w, p.u_class, p.w_class, _stacked_cost([o.pairs[k].cost for o in objectives])
        )
        for k, p in enumerate(first.pairs)
    }
    seen = dict(pairs)
    steps: list[_Fixed | _Leaf | _Series | _Merge] = []
    for step in like.steps:
        if isinstance(step, _Leaf):
            e = pairs.pop(step.edge_id).oriented(step.edge.u)
            # The classes are the same from round to round (checked above).
            ordered = step.ordered or (
                in_order(e.u_class, e.cost.shape[0]),
                in_order(e.w_class, e.cost.shape[1]),
            )
            node[e.u] += _leaf_fold(e, node[step.v], ordered)
            steps.append(_Leaf(step.v, e, node[step.v], step.edge_id, ordered))
        else:
            assert isinstance(step, _Fixed)
            edges = [(k, pairs.pop(k).oriented(e.u)) for k, e in step.edges]
            _fixed_fold(edges, node)
            steps.append(_Fixed(step.v, edges))
        del node[step.v]
    return Reduction(_cores(node, pairs, len(objectives)), steps, seen, first, order)


def _alike(p: PairCost, q: PairCost) -> bool:
    """Whether two pair costs join the same operators by the same classes."""
    return (
        p.u == q.u
        and p.w == q.w
        and p.cost.shape == q.cost.shape
        and all(
            a is b or np.array_equal(a, b)
            for a, b in ((p.u_class, q.u_class), (p.w_class, q.w_class))
        )
    )


def _dense(p: PairCost, u: str) -> np.ndarray:
    """The pair cost of one objective per candidate pair (not per class pair), ``u``'s first."""
    e = p.oriented(u)
    return e.cost[..., 0][np.ix_(e.u_class, e.w_class)]


def _as(outside: np.ndarray, first: str, p: PairCost) -> np.ndarray:
    """An outside given with ``first``'s candidates on the rows, in ``p``'s orientation."""
    return outside if p.u == first else outside.T


def min_marginals(problem: Problem, order: list[str]) -> dict[str, np.ndarray] | None:
    """Per operator and candidate, the least cost of any assignment giving the operator that
    candidate (its min-marginal), from one run of the reductions and one pass back over them
    (min-sum belief propagation on the series-parallel decomposition); None if the reductions
    leave pair costs for SCIP.

    The pass back keeps, for every pair cost an elimination made, its *outside*: per pair of
    candidates of its two ends, the least cost of everything but that pair cost. An eliminated
    operator's min-marginal follows from the outside (or the min-marginal) of what it was folded
    into, exactly as its choice does in :meth:`Reduction.expand`."""
    passed = _pass_back(problem, order, False)
    return None if passed is None else passed[0]


def pair_min_marginals(
    problem: Problem, order: list[str], products: Products | None = None, memo: Memo | None = None
) -> tuple[dict[str, np.ndarray], list[np.ndarray]] | None:
    """:func:`min_marginals`, and per pair cost of ``problem`` (in order) and pair of its
    classes the least cost of any assignment whose two ends take candidates of those classes
    (inf where no candidate is of one of them), by the same pass back keeping the outside of
    every pair cost; None if the reductions leave pair costs for SCIP. The reductions take their
    min-plus products by ``products`` and their eliminations by ``memo`` (:func:`reduce`)."""
    passed = _pass_back(problem, order, True, products, memo)
    if passed is None:
        return None
    marginal, outside = passed
    return marginal, [outside[k] for k in range(len(problem.pairs))]


def _pass_back(
    problem: Problem,
    order: list[str],
    every: bool,
    products: Products | None = None,
    memo: Memo | None = None,
) -> tuple[dict[str, np.ndarray], dict[int, np.ndarray]] | None:
    """The min-marginals of :func:`min_marginals` and the outsides the pass back kept: of the
    pair costs that hold eliminated operators; with ``every`` also, per pair cost of
    ``problem``, its min-marginal per pair of its classes (of :func:`pair_min_marginals`: its
    outside taken per class pair as soon as it is known, which no other step reads, so that the
    outsides per candidate pair are not all held at once)."""
    reduction = reduce([problem], order, products=products, memo=memo)
    core = reduction.cores[0]
    if core.pairs:
        return None
    least = {v: float(c.min()) for v, c in core.node_cost.items()}
    optimum = sum(least.values())
    marginal = {v: c + (optimum - least[v]) for v, c in core.node_cost.items()}
    # The outsides worth keeping: of pair costs that hold eliminated operators.
    needed: set[int] = set(reduction.pairs) if every else set()
    for step in reduction.steps:
        if isinstance(step, _Series):
            needed.add(step.made)
        if isinstance(step, _Merge) and needed.intersection(step.parts):
            needed.add(step.made)
    outside: dict[int, np.ndarray] = {}
    pairs = reduction.pairs
    given = len(problem.pairs) if every else 0

    def put(k: int, around: np.ndarray) -> None:
        if k < given:
            p = problem.pairs[k]
            by_u = _group_min(around, p.u_class, p.cost.shape[0])
            around = p.cost + _group_min(by_u.T, p.w_class, p.cost.shape[1]).T
        outside[k] = around

    for step in reversed(reduction.steps):
        if isinstance(step, _Merge):
            merged = pairs[step.made]
            around = outside.pop(step.made, None)
            if around is None:
                continue
            dense = {k: _dense(pairs[k], merged.u) for k in step.parts}
            for k in needed.intersection(step.parts):
                rest = around + sum(d for j, d in dense.items() if j != k)
                put(k, _as(rest, merged.u, pairs[k]))
        elif isinstance(step, _Fixed):
            marginal[step.v] = np.array([optimum])
            for k, e in step.edges:
                if k in needed:
                    own = e.cost[:, e.w_class[0], 0][e.u_class]
                    put(k, _as(_without(marginal[e.u], own)[:, None], e.u, pairs[k]))
        elif isinstance(step, _Leaf):
            e, node = step.edge, step.node[:, 0]
            cost = e.cost[..., 0]
            best = _group_min(node, e.w_class, cost.shape[1])
            folded = (cost + best[None]).min(axis=1)
            rest = _without(marginal[e.u], folded[e.u_class])
            into = _group_min(rest, e.u_class, cost.shape[0])
            marginal[step.v] = node + (cost + into[:, None]).min(axis=0)[e.w_class]
            if step.edge_id in needed:
                both = rest[:, None] + node[None]
                put(step.edge_id, _as(both, e.u, pairs[step.edge_id]))
        else:
            left, right, node = step.left, step.right, step.node[:, 0]
            lcost, rcost = left.cost[..., 0], right.cost[..., 0]
            around = outside.pop(step.made)  # (u's candidates, w's)
            by_w = _group_min(around.T, right.w_class, rcost.shape[1]).T  # (u's, w's classes)
            back = np.ascontiguousarray(rcost.T)
            if step.left_id in needed:
                to_w = min_plus_one(by_w, back)  # (u's candidates, v's classes)
                # Per class of u, the least of its candidates' rows: the same numbers as the
                # product of the least rows (a sum's rounding keeps the order).
                through = _group_min(to_w, left.u_class, lcost.shape[0])
                put(
                    step.left_id,
                    _as(to_w[:, right.u_class] + node[None], left.u, pairs[step.left_id]),
                )
            else:
                by_uw = _group_min(by_w, left.u_class, lcost.shape[0])  # (u's classes, w's)
                through = min_plus_one(by_uw, back)  # (u's classes, v's classes)
            mid, p, q = _class_pairs(left.w_class, right.u_class)
            marginal[step.v] = node + (lcost[:, p] + through[:, q]).min(axis=0)[mid]
            if step.right_id in needed:
                by_u = _group_min(around, left.u_class, lcost.shape[0])  # (u's classes, w's)
                to_u = min_plus_one(np.ascontiguousarray(lcost.T), by_u)[left.w_class]
                put(step.right_id, _as(to_u + node[:, None], left.w, pairs[step.right_id]))
    return marginal, outside
