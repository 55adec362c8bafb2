"""The memory-limited problem solved exactly by dynamic programming over (cost, memory) Pareto
frontiers: what the Lagrangian price (:mod:`taps.solve.memory_price`) leaves, without SCIP.

Memory adds up per operator, so the limited problem is a knapsack whose items are the operators'
candidates, coupled by the pair costs. Variable elimination (as in :mod:`taps.solve.elimination`)
stays exact when every entry of a table is not one cost but the Pareto frontier of (cost,
memory) of the assignments it stands for: eliminating an operator adds the frontiers of its
tables (every pair of points, their costs and memories added) and keeps, per combination of the
other operators' choices, the points no other point beats in both. A chain of layers becomes a
knapsack over per-layer frontiers (a min-plus product over memory), a tree or a series-parallel
graph the same, and when every operator has gone the cheapest point within the limit is the
optimum. A table is stored as one cost table per memory level (``inf`` where the level has no
point), so that adding frontiers is adding tables.

Two things keep the frontiers short: points whose memory, with every operator not yet in them at
its least, exceeds the limit go; and only the candidates the price's reduced-cost fixing kept
(:func:`taps.solve.memory_price.prune_by_price`) enter. The work is bounded (:data:`MAX_TABLE`,
:data:`MAX_WORK`): beyond it :func:`solve_pareto` says None and the caller runs SCIP.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from taps._core import frontier_sum
from taps.solve.problem import Problem
from taps.solve.prune import restrict

#: Elements (float64) of the largest table one step may hold, its memory levels included.
MAX_TABLE = 8_000_000
#: Elements of all steps' tables together, in one pass.
MAX_WORK = 200_000_000
#: Relative tolerance of costs and memory recomputed in another order (choices, the limit).
_TOLERANCE = 1e-9


@dataclass(eq=False)
class _Table:
    """Per memory level ``mems[l]`` (ascending), the least cost ``costs[l, i0, i1, ...]`` of the
    assignments with that memory whose operators ``names`` take choices ``i0, i1, ...`` (classes
    of their candidates, :class:`_Classes`); ``least`` is the least memory of the operators whose
    memory is in it."""

    names: tuple[str, ...]
    mems: np.ndarray
    costs: np.ndarray
    least: float
    #: Of a table a step made: per level and entry, the class of the operator it minimised out
    #: that gives the cost.
    best: np.ndarray | None = None


@dataclass(eq=False)
class _Step:
    """``made`` is ``inputs`` added up, ``v`` minimised out."""

    v: str
    inputs: list[_Table]
    made: _Table


class _Budget:
    """Work left; :class:`_OverBudget` when it runs out or the deadline passes."""

    def __init__(self, deadline: float | None) -> None:
        self.left = MAX_WORK
        self.deadline = deadline

    def spend(self, elements: int, held: int | None = None) -> None:
        """``elements`` of work, of which ``held`` (all of them unless given) in one table."""
        self.left -= elements
        late = self.deadline is not None and time.perf_counter() > self.deadline
        if self.left < 0 or (elements if held is None else held) > MAX_TABLE or late:
            raise _OverBudget


class _OverBudget(Exception):
    pass


def _frontier(mems: np.ndarray, costs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The Pareto frontier of every entry: levels sorted and merged, and each entry's cost kept
    at a level only where it is below its cost at every lower level."""
    if len(mems) > 1 and not (mems[1:] >= mems[:-1]).all():
        order = np.argsort(mems, kind="stable")
        mems, costs = mems[order], costs[order]
    shape = costs.shape[1:]
    return _summed(costs, mems, np.zeros((1, *shape)), _NOTHING, np.inf, shape)


#: The levels of a table of one point of no memory (adding it leaves a table as it is).
_NOTHING = np.zeros(1)


def _summed(
    a: np.ndarray, ma: np.ndarray, b: np.ndarray, mb: np.ndarray, cap: float, shape: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray]:
    """The frontier of the sum of two tables of ascending levels (entries broadcast to
    ``shape``), levels above ``cap`` dropped: :func:`taps._core.frontier_sum`."""
    size = math.prod(shape)
    rows = [
        np.ascontiguousarray(np.broadcast_to(t, (len(m), *shape)).reshape(len(m), size), float)
        for t, m in ((a, ma), (b, mb))
    ]
    mems, costs = frontier_sum(rows[0], np.asarray(ma, float), rows[1], np.asarray(mb, float), cap)
    return mems, costs.reshape(len(mems), *shape)


def _placed(t: _Table, names: Sequence[str]) -> np.ndarray:
    """``t.costs`` with its axes in the order of ``names`` (a superset), size 1 on the others."""
    perm = sorted(range(len(t.names)), key=lambda i: names.index(t.names[i]))
    arranged = np.transpose(t.costs, [0, *(1 + i for i in perm)])
    shape = [len(t.mems)] + [1] * len(names)
    for i in perm:
        shape[1 + names.index(t.names[i])] = t.costs.shape[1 + i]
    return arranged.reshape(shape)


def _added(
    a: np.ndarray, ma: np.ndarray, b: np.ndarray, mb: np.ndarray, cap: float, budget: _Budget
) -> tuple[np.ndarray, np.ndarray]:
    """The frontier of the sum of two tables (levels first, broadcast against each other), levels
    above ``cap`` dropped."""
    shape = np.broadcast_shapes(a.shape[1:], b.shape[1:])
    # How many of b's levels fit with each of a's: the sums the kernel forms.
    fitting = np.searchsorted(mb, cap - ma, side="right")
    budget.spend(int(fitting.sum()) * max(1, math.prod(shape)), held=0)
    out_m, out_c = _summed(a, ma, b, mb, cap, shape)
    budget.spend(out_c.size)
    return out_m, out_c


class _Classes:
    """Per operator, its candidates grouped by the layout classes every pair cost sees (one
    choice of the tables per group)."""

    def __init__(self, problem: Problem) -> None:
        seen: dict[str, list[np.ndarray]] = {v: [] for v in problem.node_cost}
        for p in problem.pairs:
            seen[p.u].append(p.u_class)
            seen[p.w].append(p.w_class)
        self.of: dict[str, np.ndarray] = {}
        self.first: dict[str, np.ndarray] = {}
        for v, cost in problem.node_cost.items():
            if seen[v]:
                _, first, inverse = np.unique(
                    np.stack(seen[v], axis=1), axis=0, return_index=True, return_inverse=True
                )
            else:
                first, inverse = np.zeros(1, dtype=np.int64), np.zeros(len(cost), dtype=np.int64)
            self.of[v], self.first[v] = inverse.reshape(-1), first


def _tables(problem: Problem, memory: Mapping[str, np.ndarray], classes: _Classes) -> list[_Table]:
    """The problem's node costs and memory, and its pair costs, as tables over the classes."""
    out = []
    for v, cost in problem.node_cost.items():
        mems, level = np.unique(memory[v], return_inverse=True)
        costs = np.full((len(mems), len(classes.first[v])), np.inf)
        np.minimum.at(costs, (level.reshape(-1), classes.of[v]), cost)
        mems, costs = _frontier(mems, costs)
        out.append(_Table((v,), mems, costs, float(mems[0])))
    for p in problem.pairs:
        dense = p.cost[np.ix_(p.u_class[classes.first[p.u]], p.w_class[classes.first[p.w]])]
        out.append(_Table((p.u, p.w), np.zeros(1), dense[None].astype(np.float64), 0.0))
    return out


@dataclass(frozen=True)
class _Price:
    """The Lagrangian cut: a point of cost ``c`` and memory ``m`` whose every completion, priced
    (``outside``: at least the least ``cost + price * memory`` of the rest), gives a bound
    ``c + price * m + outside - price * limit`` above the cost of a fitting assignment already
    known is in no better fitting assignment. ``floor`` is that cost plus ``price * limit``."""

    price: float
    floor: float
    #: Per table (the plan's made tables after the others): the least priced cost of what it
    #: holds, and of everything else (:func:`_priced_bounds`).
    inner: list[np.ndarray]
    outside: list[np.ndarray]

    def cut(self, mems: np.ndarray, costs: np.ndarray, outside: np.ndarray) -> np.ndarray:
        """``costs`` (levels first) with the points the cut removes set to inf."""
        level = mems.reshape(-1, *([1] * (costs.ndim - 1)))
        return np.where(costs + self.price * level + outside[None] <= self.floor, costs, np.inf)


def _arranged(array: np.ndarray, names: Sequence[str], into: Sequence[str]) -> np.ndarray:
    """A table without levels (axes ``names``) with its axes in the order of ``into``."""
    return _placed(_Table(tuple(names), np.zeros(1), np.asarray(array)[None], 0.0), into)[0]


def _union(tables: Sequence[tuple[str, ...]], order: Sequence[str]) -> list[str]:
    """The operators of the ``tables`` (their names) in ``order``."""
    return sorted({u for t in tables for u in t}, key=order.index)


def _eliminate(
    v: str,
    inputs: list[_Table],
    order: Sequence[str],
    cap: float,
    budget: _Budget,
    price: _Price | None,
    later: list[np.ndarray],
) -> _Table:
    """The table of ``inputs`` added up (in order) and ``v`` minimised out; with a ``price``,
    ``later[k]`` (over all the inputs' operators) bounds below the priced cost of everything but
    the first ``k + 1`` inputs."""
    names = _union([t.names for t in inputs], order)
    first = inputs[0]
    shape = [len(first.mems)]
    for u in names:
        shape.append(max(t.costs.shape[1 + t.names.index(u)] for t in inputs if u in t.names))
    budget.spend(math.prod(shape))
    mems, costs = first.mems, np.broadcast_to(_placed(first, names), shape).copy()
    least = first.least
    for k, t in enumerate(inputs):
        if k:
            least += t.least
            mems, costs = _added(costs, mems, _placed(t, names), t.mems, cap + least, budget)
        if price is not None:
            mems, costs = _frontier(mems, price.cut(mems, costs, later[k]))
    axis = 1 + names.index(v)
    rest = tuple(u for u in names if u != v)
    best = costs.argmin(axis=axis)
    # The levels are sorted and distinct already: the frontier only drops some.
    kept, costs = _frontier(
        mems, np.take_along_axis(costs, np.expand_dims(best, axis), axis).squeeze(axis)
    )
    return _Table(rest, kept, costs, least, best[np.searchsorted(mems, kept)])


def _entry(t: _Table, choice: Mapping[str, int]) -> tuple[np.ndarray, np.ndarray]:
    """The frontier of one entry of ``t`` (its operators' choices given): memories and costs of
    its points."""
    index: tuple[slice | int, ...] = (slice(None), *(choice[u] for u in t.names))
    costs = t.costs[index]
    finite = np.isfinite(costs)
    return t.mems[finite], costs[finite]


def _split(
    entries: list[tuple[np.ndarray, np.ndarray]], mem: float, cost: float
) -> list[int] | None:
    """One point per entry (an index into each) whose memories add up to ``mem`` and costs to at
    most ``cost`` (up to rounding), or None."""
    slack_m = _TOLERANCE * max(abs(mem), 1.0)
    slack_c = _TOLERANCE * max(abs(cost), 1e-300)
    # What the entries after each one can add at least and at most: a branch that cannot reach
    # the point even so is not tried (with twice the slack, so that no rounding of the sums in
    # another order drops a branch that reaches it: the search finds the same indices).
    last = len(entries)
    low_m, high_m, low_c = np.zeros(last + 1), np.zeros(last + 1), np.zeros(last + 1)
    for k in reversed(range(last)):
        mems, costs = entries[k]
        low_m[k] = low_m[k + 1] + (mems.min() if mems.size else np.inf)
        high_m[k] = high_m[k + 1] + (mems.max() if mems.size else -np.inf)
        low_c[k] = low_c[k + 1] + (costs.min() if costs.size else np.inf)

    def go(k: int, m: float, c: float) -> list[int] | None:
        mems, costs = entries[k]
        if k == last - 1:
            hit = np.flatnonzero(
                (np.abs(m + mems - mem) <= slack_m) & (c + costs <= cost + slack_c)
            )
            return [int(hit[0])] if hit.size else None
        reach_m, reach_c = m + mems, c + costs
        tried = np.flatnonzero(
            (reach_m <= mem + slack_m)
            & (reach_m + low_m[k + 1] <= mem + 2 * slack_m)
            & (reach_m + high_m[k + 1] >= mem - 2 * slack_m)
            & (reach_c + low_c[k + 1] <= cost + 2 * slack_c)
        )
        for i in tried:
            rest = go(k + 1, m + float(mems[i]), c + float(costs[i]))
            if rest is not None:
                return [int(i), *rest]
        return None

    return go(0, 0.0, 0.0)


def _plan(
    tables: list[_Table], counts: Mapping[str, int], order: Sequence[str]
) -> list[tuple[str, list[int]]]:
    """The elimination order, greedy (the operator whose tables span the fewest choices first),
    with the tables each step adds (by index: step ``s`` makes table ``len(tables) + s``), those
    of fewest operators first (the operator's own node table first of all)."""
    position = {v: k for k, v in enumerate(order)}
    names = [t.names for t in tables]
    having: dict[str, set[int]] = {v: set() for v in order}
    for k, t in enumerate(names):
        for u in t:
            having[u].add(k)

    def size(v: str) -> int:
        return math.prod(counts[u] for u in {u for k in having[v] for u in names[k]})

    # The least (size, position) first: a heap whose stale entries (an operator whose tables
    # changed since) are skipped; only the operators of a step's new table change size.
    current = {v: size(v) for v in order}
    heap = [(n, position[v], v) for v, n in current.items()]
    heapq.heapify(heap)
    steps = []
    while having:
        n, _, v = heapq.heappop(heap)
        if v not in having or current[v] != n:
            continue
        inputs = sorted(having.pop(v), key=lambda k: (len(names[k]), k))
        for k in inputs:
            for u in names[k]:
                if u != v:
                    having[u].discard(k)
        made = tuple(u for u in _union([names[k] for k in inputs], order) if u != v)
        for u in made:
            having[u].add(len(names))
        names.append(made)
        steps.append((v, inputs))
        for u in made:
            current[u] = size(u)
            heapq.heappush(heap, (current[u], position[u], u))
    return steps


def _priced_bounds(
    tables: list[_Table], plan: list[tuple[str, list[int]]], lam: float, order: Sequence[str]
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per table (the plan's made tables after the others), over its operators' choices: the
    least priced cost (``cost + lam * memory``) of what it holds, and of everything else (its
    outside): plain elimination of the priced costs forward, then back."""
    inner = [
        np.min(t.costs + lam * t.mems.reshape(-1, *[1] * len(t.names)), axis=0) for t in tables
    ]
    names = [t.names for t in tables]
    for v, inputs in plan:
        union = _union([names[k] for k in inputs], order)
        total = sum(_arranged(inner[k], names[k], union) for k in inputs)
        inner.append(np.min(total, axis=union.index(v)))
        names.append(tuple(u for u in union if u != v))
    outside = [np.zeros(())] * len(inner)
    roots = [k for k in range(len(tables), len(inner)) if not names[k]]
    whole = sum(float(inner[k]) for k in roots)
    for k in roots:
        outside[k] = np.asarray(whole - float(inner[k]))
    for s in reversed(range(len(plan))):
        v, inputs = plan[s]
        union = _union([names[k] for k in inputs], order)
        made = len(tables) + s
        parts = {k: _arranged(inner[k], names[k], union) for k in inputs}
        total = _arranged(outside[made], names[made], union) + sum(parts.values())
        for k in inputs:
            rest = total - parts[k]
            drop = tuple(a for a, u in enumerate(union) if u not in names[k])
            rest = np.min(rest, axis=drop) if drop else rest
            kept = [u for u in union if u in names[k]]
            outside[k] = np.transpose(rest, [kept.index(u) for u in names[k]])
    return inner, outside


#: Cutoffs tried when the pass at the known assignment runs over its budget, as fractions of the
#: gap between the price's bound and that assignment: a pass with a low cutoff keeps far fewer
#: points, and what it finds below its cutoff is optimal.
_LADDER = (4.0**-6, 4.0**-4, 4.0**-2)
#: The tables and the plan are made again on the candidates the price keeps when it keeps fewer
#: than this share of them (DeepSeek-V3 at batch 16: 128 of 5,565 classes; a stack of layers
#: the price's reduced-cost fixing pruned already keeps nearly all, and making them again would
#: cost about what one pass does).
_REBUILD = 0.5


def solve_pareto(
    problem: Problem,
    memory: Mapping[str, np.ndarray],
    limit: float,
    deadline: float | None = None,
    price: tuple[float, float, dict[str, int]] | None = None,
) -> dict[str, int] | None:
    """The least-cost assignment whose memory (``memory`` per operator and candidate, summed)
    is at most ``limit``; None if the work would exceed the budget or the deadline passes first,
    or if nothing fits.

    ``price=(lam, bound, known)``: a price of memory, the Lagrangian bound it gives and an
    assignment known to fit. A pass keeps only the points that could be in a fitting assignment
    cheaper than its cutoff. The first pass's cutoff is ``known`` itself: within its budget, it
    decides (what it finds is optimal, and if it finds nothing, ``known`` is). Beyond its budget,
    passes with cutoffs rising from the bound follow, each with a budget of its own: the first
    that finds an assignment below its cutoff has the optimum."""
    if price is None:
        try:
            return _Setup(problem, memory, limit).run(None, np.inf, deadline)
        except _OverBudget:
            return None
    lam, bound, known = price
    cost = problem.evaluate(known)
    # Only strictly better assignments matter (by more than rounding); a best point not cheaper
    # than the known assignment (beyond rounding) is of no use: it is not traced back.
    best = cost - _TOLERANCE * max(abs(cost), 1e-300)
    wanted = cost + _TOLERANCE * max(abs(cost), 1e-300)
    setup = _Setup(problem, memory, limit)
    bounds = _priced_bounds(setup.tables, setup.plan, lam, setup.order)
    keep = setup.kept(lam, cost + lam * limit, known, bounds[1])
    kept = sum(len(k) for k in keep.values())
    if kept < _REBUILD * sum(len(c) for c in problem.node_cost.values()):
        setup = _Setup(restrict(problem, keep), {v: m[keep[v]] for v, m in memory.items()}, limit)
        bounds = _priced_bounds(setup.tables, setup.plan, lam, setup.order)
    else:
        keep = {v: np.arange(len(c)) for v, c in problem.node_cost.items()}
    small = setup.problem
    for fraction in (1.0, *_LADDER):
        cutoff = min(bound + fraction * (cost - bound), best)
        try:
            found = setup.run(_Price(lam, cutoff + lam * limit, *bounds), wanted, deadline)
        except _OverBudget:
            continue
        if found is not None and small.evaluate(found) <= cutoff:
            return {v: int(keep[v][i]) for v, i in found.items()}
        if cutoff == best:
            return known
    return None


class _Setup:
    """A problem's tables over the classes of its candidates and the elimination plan."""

    def __init__(self, problem: Problem, memory: Mapping[str, np.ndarray], limit: float) -> None:
        self.problem, self.memory, self.limit = problem, memory, limit
        self.classes = _Classes(problem)
        self.order = list(problem.node_cost)
        self.tables = _tables(problem, memory, self.classes)
        counts = {v: len(self.classes.first[v]) for v in self.order}
        self.plan = _plan(self.tables, counts, self.order)
        self.cap = limit * (1 + _TOLERANCE) - sum(t.least for t in self.tables)

    def run(
        self, cut: _Price | None, wanted: float, deadline: float | None
    ) -> dict[str, int] | None:
        """One pass (:func:`_pass`) with a budget of its own."""
        return _pass(
            self.problem,
            self.memory,
            self.limit,
            self.classes,
            self.order,
            self.tables,
            self.plan,
            self.cap,
            _Budget(deadline),
            cut,
            wanted,
        )

    def kept(
        self, lam: float, floor: float, known: Mapping[str, int], outside: list[np.ndarray]
    ) -> dict[str, np.ndarray]:
        """Per operator, the candidates (indices) whose least priced cost of any assignment with
        them (their min-marginal, from the plan's priced bounds) is at most ``floor``, and
        ``known``'s: the others are in no fitting assignment cheaper than
        ``floor - lam * limit`` (reduced-cost fixing). Dropping them before a pass makes every
        table smaller, not only their entries inf. ``outside``: the plan's priced bounds'
        (:func:`_priced_bounds`) at ``lam``."""
        slack = _TOLERANCE * max(abs(floor), 1e-300)
        keep = {}
        for k, v in enumerate(self.order):
            # The operator's own node table is the k-th (see _tables): its outside is the
            # least priced cost of everything else, per class of the operator.
            priced = self.problem.node_cost[v] + lam * self.memory[v]
            marginal = priced + outside[k][self.classes.of[v]]
            alive = np.flatnonzero(marginal <= floor + slack)
            keep[v] = np.union1d(alive, [known[v]])
        return keep


def _pass(
    problem: Problem,
    memory: Mapping[str, np.ndarray],
    limit: float,
    classes: _Classes,
    order: list[str],
    originals: list[_Table],
    plan: list[tuple[str, list[int]]],
    cap: float,
    budget: _Budget,
    cut: _Price | None,
    wanted: float,
) -> dict[str, int] | None:
    """One run of the plan (with the cut if given): the best fitting assignment left, if any and
    if its cost (as the tables sum it) is below ``wanted``."""
    made = list(originals)
    if cut is not None:
        made = [
            _Table(t.names, *_frontier(t.mems, cut.cut(t.mems, t.costs, cut.outside[k])), t.least)
            for k, t in enumerate(originals)
        ]
    steps: list[_Step] = []
    for v, inputs in plan:
        union = _union([made[k].names for k in inputs], order)
        later: list[np.ndarray] = []
        if cut is not None:
            # Everything outside the new table, and the inputs not yet added.
            rest = _arranged(cut.outside[len(made)], _union_minus(union, v), union)
            for k in reversed(inputs):
                later.append(rest)
                rest = rest + _arranged(cut.inner[k], made[k].names, union)
            later.reverse()
        tables = [made[k] for k in inputs]
        step = _Step(v, tables, _eliminate(v, tables, order, cap, budget, cut, later))
        steps.append(step)
        made.append(step.made)
    constants = [t for t in made[len(originals) :] if not t.names]
    mems, costs = np.zeros(1), np.zeros(1)
    least = 0.0
    for t in constants:
        least += t.least
        mems, costs = _added(costs, mems, t.costs, t.mems, cap + least, budget)
    # Within the limit as summed here (the slack above only kept points through the steps).
    costs = np.where(mems <= limit, costs, np.inf)
    if not np.isfinite(costs).any():
        return None
    best = int(np.argmin(costs))
    if costs[best] >= wanted:
        return None
    return _choose(
        steps, constants, classes, problem, memory, float(mems[best]), float(costs[best])
    )


def _union_minus(union: Sequence[str], v: str) -> list[str]:
    return [u for u in union if u != v]


def _choose(
    steps: list[_Step],
    constants: list[_Table],
    classes: _Classes,
    problem: Problem,
    memory: Mapping[str, np.ndarray],
    mem: float,
    cost: float,
) -> dict[str, int] | None:
    """The assignment behind the point (``mem``, ``cost``) of the last table: back through the
    steps, each operator's class and the point of every table it came from."""
    target: dict[int, tuple[float, float]] = {}
    picks = _split([(t.mems, t.costs) for t in constants], mem, cost)
    if picks is None:
        return None
    for t, i in zip(constants, picks):
        target[id(t)] = (float(t.mems[i]), float(t.costs[i]))
    chosen: dict[str, int] = {}
    choice: dict[str, int] = {}
    for step in reversed(steps):
        made = step.made
        mem, cost = target[id(made)]
        assert made.best is not None
        level = int(np.searchsorted(made.mems, mem))
        at = (level, *(chosen[u] for u in made.names))
        j = chosen[step.v] = int(made.best[at])
        entries = [_entry(t, chosen) for t in step.inputs]
        picks = _split(entries, mem, cost)
        if picks is None:
            return None
        for t, (mems, costs), i in zip(step.inputs, entries, picks):
            target[id(t)] = (float(mems[i]), float(costs[i]))
        # The operator's own node table was made first of its inputs (see _tables).
        node = step.inputs[0]
        m, c = target[id(node)]
        v = step.v
        fits = (
            (classes.of[v] == j)
            & (np.abs(memory[v] - m) <= _TOLERANCE * max(abs(m), 1.0))
            & (problem.node_cost[v] <= c + _TOLERANCE * max(abs(c), 1e-300))
        )
        choice[v] = int(np.flatnonzero(fits)[0])
    return choice
