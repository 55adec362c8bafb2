"""A Lagrangian price on memory: the memory-limited search decided by the exact reductions.

Memory adds up per operator, so pricing it at ``lam`` per byte turns the limited problem into an
unlimited one with node costs ``cost + lam * memory``, which the exact reductions
(:mod:`taps.solve.reductions`) solve when they eliminate the whole graph (chains, trees,
series-parallel blocks). For every price the minimiser ``x`` gives a lower bound on the limited
optimum, ``cost(x) + lam * (memory(x) - limit)``, and, when ``memory(x)`` fits, a feasible
assignment. A
bisection on the price finds the cheapest feasible assignment this way and the best bound; when
they meet (the usual case when one price separates the fitting assignments from the others) the
assignment is optimal without an ILP. Otherwise the ILP gets the assignment as its first solution
and the bound says how far it can be from the optimum.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from taps.solve.elimination import MAX_WORK, WORK_PER_FLOW, elimination_order
from taps.solve.reductions import Problem, min_marginals, reduce

#: Prices tried at most; each is one run of the reductions.
MAX_STEPS = 40
#: Bound and assignment closer than this (relative) are taken as equal: the assignment is optimal.
TOLERANCE = 1e-9


@dataclass(frozen=True)
class Priced:
    """The outcome of the bisection."""

    #: The cheapest assignment found that fits the limit (None: none did).
    choice: dict[str, int] | None
    cost: float
    #: The best lower bound on the cost of any assignment that fits, and the price giving it.
    bound: float
    price: float
    steps: int

    @property
    def optimal(self) -> bool:
        return self.choice is not None and self.cost - self.bound <= TOLERANCE * max(
            abs(self.cost), abs(self.bound), 1e-300
        )


def _priced(problem: Problem, memory: Mapping[str, np.ndarray], lam: float) -> Problem:
    """The problem with memory priced at ``lam`` into every node cost."""
    return Problem({v: c + lam * memory[v] for v, c in problem.node_cost.items()}, problem.pairs)


def _minimise(
    problem: Problem, memory: Mapping[str, np.ndarray], lam: float
) -> dict[str, int] | None:
    """The assignment minimising cost + lam * memory, if the reductions decide the whole
    problem or variable elimination the core they leave (within its budget)."""
    reduction = reduce([_priced(problem, memory, lam)], list(problem.node_cost))
    core = reduction.cores[0]
    if not core.pairs:
        return reduction.expand(reduction.isolated_choice())
    flows = sum(p.cost.size for p in core.pairs)
    elimination = elimination_order(core, max_work=min(MAX_WORK, WORK_PER_FLOW * flows))
    solved = None if elimination is None else elimination.solve()
    return None if solved is None else reduction.expand(solved[0])


def price_memory(problem: Problem, memory: Mapping[str, np.ndarray], limit: float) -> Priced | None:
    """The best price of memory (``memory`` per operator and candidate, already scaled
    by the layer count; ``limit`` in the same unit). None if the reductions cannot decide the
    problem on their own (a core is left for the ILP)."""

    best: dict[str, int] | None = None
    best_cost = np.inf
    bound, price = -np.inf, 0.0
    steps = 0

    def visit(lam: float) -> tuple[float, float, dict[str, int]] | None:
        """Minimise at ``lam``; record the bound and any fitting assignment; return the
        minimiser's cost, memory and choice (None if the reductions leave a core)."""
        nonlocal best, best_cost, bound, price, steps
        steps += 1
        x = _minimise(problem, memory, lam)
        if x is None:
            return None
        cost, used = problem.evaluate(x), sum(float(memory[v][i]) for v, i in x.items())
        if cost + lam * (used - limit) > bound:
            bound, price = cost + lam * (used - limit), lam
        if used <= limit and cost < best_cost:
            best, best_cost = x, cost
        (overs if used > limit else unders).append((x, cost, used))
        return cost, used, x

    # The minimisers, with their cost and memory.
    overs: list[tuple[dict[str, int], float, float]] = []
    unders: list[tuple[dict[str, int], float, float]] = []

    at_zero = visit(0.0)
    if at_zero is None:
        return None
    if at_zero[1] <= limit:
        return Priced(best, best_cost, best_cost, 0.0, steps)
    # A price at which the least-memory assignments win: every cost spread over the smallest
    # step of memory.
    spread = sum(float(np.ptp(c)) for c in problem.node_cost.values())
    spread += sum(float(np.ptp(p.cost)) for p in problem.pairs)
    steps_of_memory = [np.diff(np.unique(m)) for m in memory.values()]
    smallest = min((float(d.min()) for d in steps_of_memory if d.size), default=1.0)
    at_top = visit(max(spread, 1e-300) / smallest * 2)
    if at_top is None or best is None:
        return Priced(None, np.inf, bound, price, steps)
    # The dual is concave and piecewise linear, one line cost(x) + lam * (memory(x) - limit) per
    # assignment: try the price where the lines of the last assignment that does not fit and of
    # the last that does cross; no assignment below both lines there means that price is the
    # best (Lagrangian) bound.
    over, under = at_zero, at_top
    while steps < MAX_STEPS and best_cost - bound > TOLERANCE * max(abs(best_cost), 1e-300):
        lam = (under[0] - over[0]) / (over[1] - under[1])
        x = visit(lam)
        if x is None:
            break
        line = over[0] + lam * over[1]  # = under's line there
        if x[0] + lam * x[1] >= line - TOLERANCE * abs(line):
            break
        if x[1] > limit:
            over = x
        else:
            under = x
    # Every minimiser that does not fit spliced with every one that does and with the best
    # splice so far (a splice may mix more than two plans that way).
    for over_choice in reversed(overs):
        for under_choice in [*reversed(unders), None]:
            if under_choice is None:
                used = sum(float(memory[v][i]) for v, i in best.items())
                under_choice = (best, best_cost, used)
            spliced = _splice(problem, memory, limit, over_choice, under_choice, best_cost)
            if spliced is not None and spliced[1] < best_cost:
                best, best_cost = spliced
    return Priced(best, best_cost, bound, price, steps)


def _splice(
    problem: Problem,
    memory: Mapping[str, np.ndarray],
    limit: float,
    over: tuple[dict[str, int], float, float],
    under: tuple[dict[str, int], float, float],
    beat: float,
) -> tuple[dict[str, int], float] | None:
    """The cheapest fitting assignment that takes ``over``'s choices (a minimiser that does not
    fit; with its cost and memory) for a run of the operators in their order and ``under``'s
    (one that fits) for the rest, if any fits and costs less than ``beat`` (a splice costing
    more, beyond rounding, is not summed afresh).

    The price's minimisers bracket the limit; between them lie the assignments mixing the two.
    On a stack of layers a prefix of them as ``over`` and the rest as ``under`` is close to the
    bound (one layer's worth of rounding and one seam), far closer than ``under`` alone, and a
    close assignment is what lets the reduced-cost fixing and the Pareto cutoffs prune."""
    order = list(problem.node_cost)
    position = {v: n for n, v in enumerate(order)}
    found: tuple[dict[str, int], float] | None = None
    # A prefix of ``over`` then ``under``, and a prefix of ``under`` then ``over``.
    for (first, _, _), (rest, start_cost, start_used) in ((over, under), (under, over)):
        # The change of cost and memory as each operator in turn takes ``first``'s choice; a
        # pair cost changes when its earlier end switches and again when its later end does.
        cost = np.zeros(len(order))
        used = np.zeros(len(order))
        for n, v in enumerate(order):
            if first[v] != rest[v]:
                cost[n] = problem.node_cost[v][first[v]] - problem.node_cost[v][rest[v]]
                used[n] = memory[v][first[v]] - memory[v][rest[v]]
        for p in problem.pairs:
            if first[p.u] == rest[p.u] and first[p.w] == rest[p.w]:
                continue
            before = float(p.cost[p.u_class[rest[p.u]], p.w_class[rest[p.w]]])
            after = float(p.cost[p.u_class[first[p.u]], p.w_class[first[p.w]]])
            if position[p.u] == position[p.w]:
                cost[position[p.u]] += after - before
                continue
            # Between the two switches the earlier end has ``first``'s choice, the later
            # ``rest``'s.
            u_first = position[p.u] < position[p.w]
            between = float(
                p.cost[
                    p.u_class[(first if u_first else rest)[p.u]],
                    p.w_class[(rest if u_first else first)[p.w]],
                ]
            )
            lo, hi = sorted((position[p.u], position[p.w]))
            cost[lo] += between - before
            cost[hi] += after - between
        cost = start_cost + np.cumsum(cost)
        used = start_used + np.cumsum(used)
        fitting = np.flatnonzero(used <= limit)
        if not fitting.size:
            continue
        # The cheapest cut, then the least memory, then the first.
        n = int(fitting[np.lexsort((fitting, used[fitting], cost[fitting]))[0]])
        if cost[n] >= beat + TOLERANCE * max(abs(beat), 1e-300):
            continue
        choice = {v: (first[v] if k <= n else rest[v]) for k, v in enumerate(order)}
        # Summed afresh: the running sums may have drifted past the limit by rounding.
        exact = problem.evaluate(choice)
        fits = sum(float(memory[v][i]) for v, i in choice.items()) <= limit
        if fits and (found is None or exact < found[1]):
            found = (choice, exact)
    return found


def prune_by_price(
    problem: Problem,
    memory: Mapping[str, np.ndarray],
    limit: float,
    price: float,
    cutoff: float,
) -> dict[str, np.ndarray]:
    """The candidates that can still be in an assignment that fits and costs less than
    ``cutoff`` (exact: Lagrangian reduced-cost fixing).

    For any fitting assignment ``x``, ``cost(x) >= cost(x) + price * (memory(x) - limit)``. The
    least of the right side over the assignments giving operator ``v`` candidate ``i`` (its
    min-marginal, :func:`taps.solve.reductions.min_marginals`, all of them from one forward and one
    backward pass over the reductions) bounds every fitting assignment with that choice; above
    ``cutoff``, the candidate goes. When the reductions leave pair costs for SCIP, every operator
    keeps every candidate."""
    marginals = min_marginals(_priced(problem, memory, price), list(problem.node_cost))
    keep = {}
    slack = TOLERANCE * max(abs(cutoff), 1e-300)
    for v, cost in problem.node_cost.items():
        everything = np.arange(len(cost))
        if marginals is None:
            keep[v] = everything
            continue
        keep[v] = np.flatnonzero(marginals[v] - price * limit <= cutoff + slack)
        if not keep[v].size:
            keep[v] = everything  # nothing fits below the cutoff: leave it to the ILP
    return keep
