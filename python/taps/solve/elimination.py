"""Exact variable elimination of the strategy-selection problem: dynamic programming over an
elimination order, for what the series-parallel reductions leave.

The problem (node costs per operator, pair costs between operators, :mod:`taps.solve.reductions`) is
a sum of cost tables ("factors"), each over the choices of a few operators. Eliminating an operator
``v`` replaces the factors that mention it by one factor over the other operators they mention, the
least of their sum over ``v``'s choices; the optimum is what is left when every operator has
gone, and the choices follow in reverse order, each the best given the operators eliminated after
it. The leaf and series reductions are the cases of one and two neighbours; here an operator may
have any number, and the new factor's table is as large as the product of their choice counts.

That product decides whether elimination is affordable. The order is chosen greedily, each step
eliminating the operator whose step costs least, about the size of its new table (the
"min-weight" heuristic for a tree decomposition of small width), first on estimates: an
operator's choices in a table are the distinct combinations of its layout classes in the tables
it comes from, at most its candidate count. When the estimated work of the whole order stays
under a budget, the tables are computed (graphs whose skip connections span a few blocks have
width 3 or 4 and tables of a few million entries); otherwise :func:`plan` says no and the caller
solves the ILP.

Choices of one operator that every table treats alike (the same layout class in each) are one
choice here, so tables are over classes, not candidates; the operator's own node cost keeps the
cheapest candidate of each class.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

from taps.solve.problem import PairCost, Problem
from taps.solve.reductions import Products, along, hash_groups, in_order, row_hashes

#: Elements of the largest table (float64) one step may build.
MAX_TABLE = 20_000_000
#: Additions of all steps together (about a second of numpy per 1e8).
MAX_WORK = 400_000_000
#: Variable elimination is tried when its estimated work (additions) is below this many per flow
#: variable the core's ILP would have: numpy adds about 1e8 a second, SCIP builds and solves
#: about 2e4 flows a second (a skip ladder of 500 operators on 64 devices: 55,000 flows, 4 s in
#: SCIP, 0.8 s eliminated; a dense block of 7 layers on 32 devices: 0.27 s in SCIP, 0.58 s
#: eliminated).
WORK_PER_FLOW = 5_000
#: A step whose factors fall apart into two groups of operators (:func:`_sides`) is one min-plus
#: product in the core's kernel on all cores, one addition and comparison per entry of its work
#: where numpy adds each factor in turn: counted as this many times cheaper per entry (measured:
#: ShuffleNetV2's core on 8 x 8, 4.2e8 entries of three factors in 0.7 s, 3.2 s in numpy).
KERNEL_SPEEDUP = 4
#: Cores of at most this many operators may get the elimination order of least work, searched
#: over the sets of operators (2^n of them): DeBERTa-v2's core of 14 on 8 x 8, whose greedy
#: order is estimated 27 times the work of the best. Larger ones get a beam search's.
EXACT_ORDER = 14
#: The order searches' cost per set and operator they visit, in additions of elimination work
#: (measured: 2 to 8 us of Python a visit, elimination about 1e8 additions a second).
VISIT_WORK = 1_000
#: Sets of eliminated operators the beam search keeps per step (:func:`_beam_order`), and its
#: weight on the tables a set leaves over its boundary against the work done. ALBERT's core of
#: 24 operators on 8 x 8: 1.3e8 to 1.5e8 at weights 3 to 30 with a beam of 32 (the greedy order
#: 5.6e8); a beam of 16 finds such an order at some weights only.
BEAM = 32
BOUNDARY_WEIGHT = 10
#: Elements of the temporary of one chunk of a step.
_CHUNK = 4_000_000


@dataclass
class _Factor:
    """A cost table over the choices of ``names``: ``table[classes[0][i0], classes[1][i1], ...]``
    for candidate ``i0`` of ``names[0]`` and so on."""

    names: tuple[str, ...]
    classes: tuple[np.ndarray, ...]
    table: np.ndarray

    def axis(self, v: str) -> int:
        return self.names.index(v)


@dataclass
class _Step:
    """How to choose ``v`` once the operators of its factors are chosen."""

    v: str
    factors: list[_Factor]
    node: np.ndarray

    def choose(self, choice: dict[str, int]) -> int:
        total = self.node.copy()
        for f in self.factors:
            index = tuple(c if u == self.v else c[choice[u]] for u, c in zip(f.names, f.classes))
            total += f.table[index]
        return int(np.argmin(total))


@dataclass
class Elimination:
    """An elimination order whose estimated work fits the budget, ready to run."""

    problem: Problem
    order: list[str]
    #: Estimated additions and largest table of the order (upper bounds).
    work: float
    largest: float

    def solve(self, deadline: float | None = None) -> tuple[dict[str, int], float] | None:
        """The optimal choice of every operator and its cost; None if ``deadline``
        (``time.perf_counter()``) passes first."""
        run = _run(self.problem, self.order, deadline)
        if run is None:
            return None
        node, factors, steps, constant = run
        assert not factors
        choice = {v: int(np.argmin(c)) for v, c in node.items()}
        constant += sum(float(c.min()) for c in node.values())
        return Part(Problem(node, []), steps).expand(choice), constant

    def part(self, deadline: float | None = None) -> Part | None:
        """The operators of the order eliminated, the others kept (an order of
        :func:`elimination_order` with ``keep``): the problem left, whose tables must be over
        at most two operators (pair costs), and how to complete its choices. None if
        ``deadline`` passes first."""
        run = _run(self.problem, self.order, deadline)
        if run is None:
            return None
        node, factors, steps, constant = run
        # A piece with no operator left around it would leave a constant: not a part.
        assert constant == 0.0 and node
        pairs = []
        for f in factors.values():
            (u, w), (u_class, w_class) = f.names, f.classes
            pairs.append(PairCost(u, w, u_class, w_class, f.table))
        return Part(Problem(node, pairs), steps)


@dataclass
class Part:
    """What eliminating some operators leaves: the problem of the others, and the steps that
    choose the eliminated ones given theirs."""

    problem: Problem
    steps: list[_Step]

    def expand(self, choice: dict[str, int]) -> dict[str, int]:
        """The best choice of every operator given a choice of the problem left's."""
        choice = dict(choice)
        for step in reversed(self.steps):
            choice[step.v] = step.choose(choice)
        return choice


def _run(
    problem: Problem, order: list[str], deadline: float | None
) -> tuple[dict[str, np.ndarray], dict[int, _Factor], list[_Step], float] | None:
    """Eliminate the operators of ``order`` in turn: the node costs and the tables of the
    operators left, the steps, and the constant of the tables left over no operator; None if
    ``deadline`` passes first."""
    node = {v: np.asarray(c, dtype=np.float64).copy() for v, c in problem.node_cost.items()}
    factors: dict[int, _Factor] = {}
    incident: dict[str, set[int]] = {v: set() for v in node}
    for k, p in enumerate(problem.pairs):
        factors[k] = _Factor((p.u, p.w), (p.u_class, p.w_class), p.cost)
        incident[p.u].add(k)
        incident[p.w].add(k)
    next_id = len(factors)
    steps = []
    constant = 0.0
    # Repeated layers eliminate equal tables: their products are computed once.
    products = Products()
    for v in order:
        if deadline is not None and time.perf_counter() > deadline:
            return None
        mine = [factors.pop(k) for k in sorted(incident.pop(v))]
        if not mine:
            continue  # joined to nothing: takes its cheapest candidate at the end
        for f in mine:
            for u in f.names:
                if u != v:
                    incident[u] &= factors.keys()
        steps.append(_Step(v, mine, node[v]))
        new = _eliminate(v, mine, node.pop(v), deadline, products)
        if new is None:
            return None
        if not new.names:
            constant += float(new.table)
        elif len(new.names) == 1:
            (u,) = new.names
            node[u] = node[u] + new.table[new.classes[0]]
        else:
            factors[next_id] = new
            for u in new.names:
                incident[u].add(next_id)
            next_id += 1
    return node, factors, steps, constant


def _unique_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The index of the first of each distinct row of a 2-D array, and the distinct row of each
    row, the distinct rows numbered in the order of their bytes (as numpy's ``unique`` of the
    rows as bytes numbers them). Rows of 8-byte entries are grouped by a hash of their bits, the
    grouping checked, and one row of each group sorted as bytes (distinct: no ties); others (or
    on a collision) all sorted by numpy as bytes (whose sort of many long rows is the slower)."""
    rows = np.ascontiguousarray(rows)
    keys = rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).reshape(-1)
    if rows.dtype.itemsize == 8 and rows.size:
        bits = rows.view(np.uint64)
        groups = hash_groups(row_hashes(bits), bits)
        if groups is not None:
            first, group = groups
            # numpy's sort of the distinct rows as bytes: 2 to 5 times Python's sort by them.
            order = np.argsort(keys[first])
            rank = np.empty(len(first), dtype=np.intp)
            rank[order] = np.arange(len(first))
            return first[order], rank[group]
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    return first, inverse.reshape(-1)


def _joint(classes: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The distinct combinations of one operator's classes in several tables: (combination per
    candidate, each combination's class in each table as rows)."""
    stacked = np.stack(classes)
    first, inverse = _unique_rows(stacked.T)
    return inverse, stacked[:, first]


def _joint_in_place(
    classes: Sequence[np.ndarray], sizes: Sequence[int]
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_joint` numbered for the operator eliminated, whose choices' order no result
    depends on (the step takes the least over them): ascending by the class in the largest of
    the tables (``sizes`` their entries), then in the others in turn, so that table is read in
    its own order (no copy of it) when the operator has a combination per class of it."""
    stacked = np.stack(classes)
    largest = int(np.argmax(sizes))
    keys = [largest, *(k for k in range(len(classes)) if k != largest)]
    # numpy's unique of the combinations as rows orders them lexicographically, keys[0] first.
    combos, inverse = np.unique(stacked[keys].T, axis=0, return_inverse=True)
    rows = np.empty_like(combos.T)
    rows[keys] = combos.T
    return inverse.reshape(-1), rows


def _compact(classes: np.ndarray, table: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Merge equal slices of ``table`` along ``axis``: (new class per candidate, new table)."""
    moved = np.moveaxis(table, axis, 0)
    first, inverse = _unique_rows(moved.reshape(len(moved), -1))
    return inverse[classes], np.moveaxis(moved[first], 0, axis)


def _eliminate(
    v: str, factors: list[_Factor], node: np.ndarray, deadline: float | None, products: Products
) -> _Factor | None:
    """The factor over the other operators of ``factors``: the least over ``v``'s choices of
    ``node`` plus their sum (min-plus products by ``products``). None if ``deadline`` passes
    first."""
    others = list(dict.fromkeys(u for f in factors for u in f.names if u != v))
    v_class, v_rows = _joint_in_place(
        [f.classes[f.axis(v)] for f in factors], [f.table.size for f in factors]
    )
    best = np.full(v_rows.shape[1], np.inf)
    np.minimum.at(best, v_class, node)
    classes, joint, shape = [], [], [len(best)]
    for u in others:
        having = [k for k, f in enumerate(factors) if u in f.names]
        u_class, u_rows = _joint([factors[k].classes[factors[k].axis(u)] for k in having])
        classes.append(u_class)
        joint.append((having, u_rows))
        shape.append(u_rows.shape[1])
    # An operator's joint classes are numbered by their bytes (as the rows of the tables that
    # follow): indexing a factor's table by them reorders it. Where that copies more than
    # reordering the new table, the new table is built over them in ascending order of their
    # classes (often the tables' own order: no copy) and reordered after (``back``).
    rows, back = {}, []
    for u, (having, u_rows) in zip(others, joint):
        axes = [factors[k].axis(u) for k in having]
        reordered = sum(
            factors[k].table.size
            for k, r, a in zip(having, u_rows, axes)
            if not in_order(r, factors[k].table.shape[a])
        )
        ascending = np.lexsort(u_rows[::-1])
        if reordered > math.prod(shape[1:]):
            u_rows = u_rows[:, ascending]
        else:
            ascending = np.arange(u_rows.shape[1])
        back.append(np.argsort(ascending))
        rows[u] = dict(zip(having, u_rows))
    # Each factor's table over the joint classes, with the axis of each of its operators in the
    # new table (v's is 0).
    terms = []
    for k, f in enumerate(factors):
        index = [v_rows[k] if u == v else rows[u][k] for u in f.names]
        terms.append(
            ([0 if u == v else 1 + others.index(u) for u in f.names], _taken(f.table, index))
        )
    sides = _sides(terms, len(others))
    if sides is not None:
        out = _min_plus_step(best, terms, shape, sides, deadline, products)
        if out is None:
            return None
        return _compacted(others, classes, _taken(out, back))
    out = np.full(shape[1:], np.inf)
    rest = max(1, math.prod(shape[1:]))
    step = max(1, _CHUNK // rest)
    for start in range(0, shape[0], step):
        if deadline is not None and time.perf_counter() > deadline:
            return None
        stop = min(start + step, shape[0])
        rows_of_v = best[start:stop].reshape(-1, *([1] * (len(shape) - 1)))
        # ``best`` plus the first term fills the block (the same sums as adding it to a copy).
        (axes, table), *rest_terms = terms
        block = np.broadcast_to(
            rows_of_v + _placed(table, axes, len(shape), start, stop), (stop - start, *shape[1:])
        ).copy()
        for axes, table in rest_terms:
            block += _placed(table, axes, len(shape), start, stop)
        np.minimum(out, block.min(axis=0), out=out)
    return _compacted(others, classes, _taken(out, back))


def _taken(table: np.ndarray, index: list[np.ndarray]) -> np.ndarray:
    """``table[np.ix_(*index)]``, an axis at a time (numpy's indexing by several arrays at once
    is several times slower)."""
    for axis, i in enumerate(index):
        table = along(table, i, axis)
    return table


def _compacted(others: list[str], classes: list[np.ndarray], out: np.ndarray) -> _Factor:
    """The new factor over ``others``, equal slices of ``out`` merged along every axis."""
    new_classes = []
    for axis, c in enumerate(classes):
        c, out = _compact(c, out, axis)
        new_classes.append(c)
    return _Factor(tuple(others), tuple(new_classes), out)


def _sides(
    terms: list[tuple[list[int], np.ndarray]], count: int
) -> tuple[list[int], list[int]] | None:
    """The axes ``1 .. count`` of the new factor in two groups that no term spans (each term's
    axes, but ``v``'s 0, within one group): the largest group of axes the terms connect, and the
    rest. None if the terms connect them all (or there are none)."""
    parent = list(range(count + 1))

    def root(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for axes, _ in terms:
        joined = [a for a in axes if a]
        for a in joined[1:]:
            parent[root(a)] = root(joined[0])
    groups: dict[int, list[int]] = {}
    for a in range(1, count + 1):
        groups.setdefault(root(a), []).append(a)
    if len(groups) < 2:
        return None
    largest = max(groups.values(), key=len)
    return [a for a in range(1, count + 1) if a not in largest], largest


def _min_plus_step(
    best: np.ndarray,
    terms: list[tuple[list[int], np.ndarray]],
    shape: list[int],
    sides: tuple[list[int], list[int]],
    deadline: float | None,
    products: Products,
) -> np.ndarray | None:
    """The least over ``v``'s choices (axis 0 of ``shape``) of ``best`` plus the ``terms``, when
    no term spans both ``sides`` (axes of the new factor): a min-plus product of the sum of the
    terms over one side by that over the other, ``v`` the inner index, by the core's kernel on
    all cores, a block of ``v``'s choices at a time. The new factor's table over ``shape[1:]``;
    None if ``deadline`` passes first."""
    rows, cols = sides
    ndim = len(shape)
    height, width = math.prod(shape[a] for a in rows), math.prod(shape[a] for a in cols)
    out = None
    step = max(1, _CHUNK // max(height, width))
    for start in range(0, shape[0], step):
        if deadline is not None and time.perf_counter() > deadline:
            return None
        stop = min(start + step, shape[0])
        shift: np.ndarray | None = best[start:stop]
        ones = [1] * (ndim - 1)
        xs: list[np.ndarray] = []
        ys: list[np.ndarray] = []
        for axes, table in terms:
            placed = _placed(table, axes, ndim, start, stop)
            (ys if any(a in cols for a in axes) else xs).append(placed)
        # One term a side is that side's operand, no full-size sum: v's ``best`` goes in as the
        # kernel's shift (``t + best``, the sum numpy's ``best + t`` gives, to the bit), and a
        # term with no sign bit set is what ``0.0 + t`` gives (only -0.0 would change).
        x: np.ndarray
        if len(xs) == 1:
            (x,) = xs
        else:
            x, shift = best[start:stop].reshape(-1, *ones), None
            for placed in xs:
                x = x + placed
        y: np.ndarray
        if len(ys) == 1 and not np.signbit(ys[0]).any():
            (y,) = ys
        else:
            y = np.zeros((stop - start, *ones))
            for placed in ys:
                y = y + placed
        # Rows (the one side's axes) by v's choices, and v's choices by columns.
        x = np.broadcast_to(
            x, [stop - start] + [shape[a] if a in rows else 1 for a in range(1, ndim)]
        )
        y = np.broadcast_to(
            y, [stop - start] + [shape[a] if a in cols else 1 for a in range(1, ndim)]
        )
        part = products(x.reshape(stop - start, height).T, y.reshape(stop - start, width), shift)
        # The first block's product is the running minimum (numpy's minimum with inf keeps it;
        # not in place: ``products`` may hand the same array to another step).
        out = part if out is None else np.minimum(out, part)
    assert out is not None
    # Back to the axes in order: the rows' axes, then the columns', each in its order.
    table = out.reshape([shape[a] for a in rows] + [shape[a] for a in cols])
    return np.transpose(table, np.argsort([a - 1 for a in rows + cols]))


def _placed(table: np.ndarray, order: list[int], ndim: int, start: int, stop: int) -> np.ndarray:
    """``table`` (axes ``order`` of the full shape, axis 0 being ``v``'s) viewed for broadcasting
    against the rows ``start:stop`` of the full table."""
    positions = sorted(range(len(order)), key=lambda i: order[i])
    arranged = np.transpose(table, positions)
    axes = sorted(order)
    if 0 in axes:
        arranged = arranged[start:stop]
    shape = [1] * ndim
    for axis, size in zip(axes, arranged.shape):
        shape[axis] = size
    return arranged.reshape(shape)


def _split(factors: Sequence[dict[str, int]], v: str) -> bool:
    """Whether the operators but ``v`` of ``factors`` (their names) fall into two groups no factor
    spans (:func:`_sides` of the step that eliminates ``v``)."""
    groups: list[set[str]] = []
    for f in factors:
        names = {u for u in f if u != v}
        joined = [g for g in groups if g & names]
        for g in joined:
            groups.remove(g)
            names |= g
        groups.append(names)
    return len([g for g in groups if g]) > 1


class _Estimates:
    """The estimated cost of each elimination step as operators go: per factor, its operators
    and the estimated choice count of each in it (at most the operator's candidate count)."""

    def __init__(self, problem: Problem) -> None:
        self.candidates = {v: len(c) for v, c in problem.node_cost.items()}
        self.sizes: dict[int, dict[str, int]] = {}
        self.incident: dict[str, set[int]] = {v: set() for v in problem.node_cost}
        for k, p in enumerate(problem.pairs):
            self.sizes[k] = {p.u: p.cost.shape[0], p.w: p.cost.shape[1]}
            self.incident[p.u].add(k)
            self.incident[p.w].add(k)
        self.next_id = len(self.sizes)

    def estimate(self, v: str) -> tuple[float, dict[str, int]]:
        """The work of eliminating ``v`` and the choice counts of its new factor."""
        mine = [self.sizes[k] for k in self.incident[v]]
        own = min(self.candidates[v], math.prod(s[v] for s in mine))
        new: dict[str, int] = {}
        for s in mine:
            for u, n in s.items():
                if u != v:
                    new[u] = new.get(u, 1) * n
        new = {u: min(n, self.candidates[u]) for u, n in new.items()}
        entries = own * math.prod(new.values())
        if _split(mine, v):
            return entries / KERNEL_SPEEDUP, new
        return entries * len(mine), new

    def eliminate(self, v: str) -> tuple[float, float, set[str]]:
        """Eliminate ``v``: its work, the size of its new table, the operators it touched."""
        cost, new = self.estimate(v)
        for k in self.incident.pop(v):
            for u in self.sizes.pop(k):
                if u != v:
                    self.incident[u].discard(k)
        if len(new) > 1:
            self.sizes[self.next_id] = new
            for u in new:
                self.incident[u].add(self.next_id)
            self.next_id += 1
        return cost, math.prod(new.values()) if new else 1, set(new)


def _greedy(problem: Problem, keep: Collection[str] = ()) -> Elimination:
    """The greedy order: each step eliminates the operator whose step costs least, ties to the
    smaller new table, then in the problem's operator order. The operators in ``keep`` are not
    eliminated."""
    names = [v for v in problem.node_cost if v not in keep]
    position = {v: k for k, v in enumerate(names)}
    est = _Estimates(problem)

    def rank(v: str) -> tuple[float, int]:
        """The step's estimated work, then its new table's size: of two steps of one work, the
        smaller table is the cheaper to build and compact (and the smaller to hold)."""
        cost, new = est.estimate(v)
        return cost, math.prod(new.values())

    heap = [(rank(v), position[v], v) for v in names]
    heapq.heapify(heap)
    current = {v: r for r, _, v in heap}
    order: list[str] = []
    work = largest = 0.0
    while heap:
        r, _, v = heapq.heappop(heap)
        if v not in current or current[v] != r:
            continue
        del current[v]
        cost, table, touched = est.eliminate(v)
        work += cost
        largest = max(largest, table)
        order.append(v)
        for u in sorted(touched.difference(keep), key=position.__getitem__):
            current[u] = rank(u)
            heapq.heappush(heap, (current[u], position[u], u))
    return Elimination(problem, order, work, largest)


def _estimated(problem: Problem, order: list[str]) -> Elimination:
    """``order`` with its estimated work and largest table."""
    est = _Estimates(problem)
    work = largest = 0.0
    for v in order:
        cost, table, _ = est.eliminate(v)
        work += cost
        largest = max(largest, table)
    return Elimination(problem, order, work, largest)


def _bits(mask: int) -> list[int]:
    """The positions of the set bits of ``mask``, lowest first."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


class _Sets:
    """The elimination game over sets of operators: the table a step builds depends only on
    which operators went before it (the outside neighbours of the part of the graph they and
    the eliminated operator form), not on their order. A step costs the operator's candidates
    times its new table's entries, each operator of the table at its candidate count. The
    operators in ``keep`` are not eliminated: their bits come last, above the sets searched."""

    def __init__(self, problem: Problem, keep: Collection[str] = ()) -> None:
        self.names = [v for v in problem.node_cost if v not in keep]
        #: The operators eliminated: the first bits.
        self.eliminated = len(self.names)
        self.names += [v for v in problem.node_cost if v in keep]
        index = {v: i for i, v in enumerate(self.names)}
        self.size = [len(problem.node_cost[v]) for v in self.names]
        self.adj = [0] * len(self.names)
        for p in problem.pairs:
            a, b = index[p.u], index[p.w]
            self.adj[a] |= 1 << b
            self.adj[b] |= 1 << a
        self.full = (1 << self.eliminated) - 1

    def parts(self, done: int) -> tuple[dict[int, int], list[int]]:
        """Per operator of ``done``, the outside neighbours of the part of ``done`` it lies in
        (parts joined through ``done``), and the outside neighbours of each part."""
        adj = self.adj
        beyond: dict[int, int] = {}
        bounds = []
        rest = done
        while rest:
            part = frontier = rest & -rest
            while frontier:
                grown = 0
                for i in _bits(frontier):
                    grown |= adj[i]
                frontier = grown & done & ~part
                part |= frontier
            out = 0
            for i in _bits(part):
                out |= adj[i]
            out &= ~done
            for i in _bits(part):
                beyond[i] = out
            bounds.append(out)
            rest &= ~part
        return beyond, bounds

    def table(self, done: int, beyond: dict[int, int], v: int) -> int:
        """The entries of the table eliminating ``v`` after ``done`` builds (``beyond`` its
        :meth:`parts`)."""
        reach = self.adj[v]
        for i in _bits(self.adj[v] & done):
            reach |= beyond[i]
        return math.prod(self.size[i] for i in _bits(reach & ~(done | 1 << v)))

    def ahead(self, done: int) -> int:
        """The entries of the tables the parts of ``done`` leave over their outside neighbours."""
        _, bounds = self.parts(done)
        return sum(math.prod(self.size[i] for i in _bits(b)) for b in bounds)

    def order(self, path: Sequence[int]) -> list[str]:
        """The operators of ``path`` (positions) by name."""
        return [self.names[i] for i in path]


def _exact_order(
    problem: Problem, max_table: float, keep: Collection[str] = ()
) -> list[str] | None:
    """The order of least work (:class:`_Sets`' count) of the operators not in ``keep``, no
    table over ``max_table``: dynamic programming over the sets of operators eliminated. None
    if no order keeps within the table limit."""
    sets = _Sets(problem, keep)
    full = sets.full
    best = [math.inf] * (full + 1)
    last = [0] * (full + 1)
    best[0] = 0.0
    # A set's subsets are smaller numbers: each set is final when reached in numeric order.
    for done in range(full + 1):
        if best[done] == math.inf:
            continue
        beyond, _ = sets.parts(done)
        for v in _bits(full & ~done):
            table = sets.table(done, beyond, v)
            if table > max_table:
                continue
            after = done | 1 << v
            work = best[done] + sets.size[v] * table
            if work < best[after]:
                best[after], last[after] = work, v
    if best[full] == math.inf:
        return None
    path = []
    done = full
    while done:
        path.append(last[done])
        done &= ~(1 << last[done])
    return sets.order(path[::-1])


def _beam_order(
    problem: Problem, max_table: float, keep: Collection[str] = (), width: int = BEAM
) -> list[str] | None:
    """An order found by a beam search over the sets of operators eliminated
    (:class:`_Sets`): after each step the ``width`` sets of least rank are kept, a set's rank
    its work so far plus :data:`BOUNDARY_WEIGHT` times the tables its parts leave over their
    outside neighbours (each such table is summed again when the next of those neighbours
    goes, so a set with a wide boundary has work ahead of it). Ties in the order of the sets'
    bits (deterministic). None if no set kept can go on within the table limit. The operators
    in ``keep`` are not eliminated."""
    sets = _Sets(problem, keep)
    layer: dict[int, tuple[float, tuple[int, ...]]] = {0: (0.0, ())}
    for _ in range(sets.eliminated):
        grown: dict[int, tuple[float, tuple[int, ...]]] = {}
        for done, (work, path) in layer.items():
            beyond, _ = sets.parts(done)
            for v in _bits(sets.full & ~done):
                table = sets.table(done, beyond, v)
                after = done | 1 << v
                total = work + sets.size[v] * table
                if table <= max_table and total < grown.get(after, (math.inf,))[0]:
                    grown[after] = (total, (*path, v))
        if not grown:
            return None
        ranked = sorted(
            (work + BOUNDARY_WEIGHT * sets.ahead(after), after)
            for after, (work, _) in grown.items()
        )
        layer = {after: grown[after] for _, after in ranked[:width]}
    ((_, path),) = layer.values()
    return sets.order(path)


def elimination_order(
    problem: Problem,
    max_work: float = MAX_WORK,
    max_table: float = MAX_TABLE,
    keep: Collection[str] = (),
) -> Elimination | None:
    """An elimination order of ``problem`` whose estimated work and largest table fit the budget,
    or None. Greedy: each step eliminates the operator whose step costs least (its choices times
    the size of its new table times the tables it sums), ties in the problem's operator order.
    Where a searched order is worth its time (its visits, at :data:`VISIT_WORK` each, below the
    greedy order's work, or below ``max_work`` if that order is over budget), it is tried too
    and the one of less estimated work kept: on a core of at most :data:`EXACT_ORDER` operators
    the order of least work (:func:`_exact_order`: DeBERTa-v2's core on 8 x 8, estimated 27
    times less work than the greedy's; DeepSeek-V3's rotary piece, 3.4e9 against 1.9e9), on a
    larger one the beam search's (:func:`_beam_order`: ALBERT's, 4 times less). With ``keep``,
    the order eliminates every other operator (:meth:`Elimination.part`)."""
    greedy = _greedy(problem, keep)
    fits = greedy.work <= max_work and greedy.largest <= max_table
    n = len(problem.node_cost.keys() - set(keep))
    exact = n <= EXACT_ORDER
    visits = (2**n if exact else BEAM * n) * n
    if VISIT_WORK * visits >= (greedy.work if fits else max_work):
        return greedy if fits else None
    searched = (_exact_order if exact else _beam_order)(problem, max_table, keep)
    found = [greedy] if fits else []
    if searched is not None:
        found.append(_estimated(problem, searched))
    return min(
        (e for e in found if e.work <= max_work and e.largest <= max_table),
        key=lambda e: e.work,
        default=None,
    )
