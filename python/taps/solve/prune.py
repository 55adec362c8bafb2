"""Exact pruning of the search space: drop every candidate that another candidate of the same
operator dominates (no more node cost, no more memory when memory is limited, and no more pair cost
towards every remaining candidate of every neighbour, under every objective given). Any assignment
that uses a dominated candidate can switch to its dominator without costing more, so the optimum is
unchanged. Pruning an operator shrinks its neighbours' profiles, so it repeats to a fixpoint."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from taps._support.deadline import passed
from taps.solve.reductions import PairCost, Problem


def _dominated(profile: np.ndarray) -> np.ndarray:
    """Rows dominated by another row (no entry larger); of equal rows the first survives."""
    keep = np.ones(len(profile), dtype=bool)
    for i in range(len(profile)):
        if keep[i]:
            worse = np.all(profile[i] <= profile, axis=1)
            # An equal row earlier in the list is the survivor, not a victim.
            worse[: i + 1] = False
            keep &= ~worse
    return ~keep


def negated(problem: Problem) -> Problem:
    """The problem with every cost negated: what dominance must see of an objective maximised."""
    return Problem(
        {v: -c for v, c in problem.node_cost.items()},
        [PairCost(p.u, p.w, p.u_class, p.w_class, -p.cost) for p in problem.pairs],
    )


def dominance_survivors(
    problems: Sequence[Problem],
    memory: Mapping[str, np.ndarray] | None = None,
    budget: float | None = None,
    deadline: float | None = None,
) -> dict[str, np.ndarray]:
    """Per operator, the candidate indices no other candidate dominates in all of ``problems``
    (problems over the same operators and candidates to be minimised, e.g. both objectives of a
    lexicographic solve; pass :func:`negated` problems for an objective that is maximised), and
    in ``memory`` (per operator and candidate) if given.

    With a ``budget`` (the memory limit in the units of ``memory``), candidates that exceed it even
    with every other operator at its least memory go first. Past ``deadline`` (a
    ``time.perf_counter()`` value) the pruning stops where it is: what it kept so far holds the
    optimum all the same."""
    first = problems[0]
    alive = {v: np.ones(len(c), dtype=bool) for v, c in first.node_cost.items()}
    if memory is not None and budget is not None:
        least = {v: float(m.min()) for v, m in memory.items()}
        rest = sum(least.values())
        for v, m in memory.items():
            alive[v] = m <= budget - (rest - least[v])
            # Rounding must not drop the least candidate, which fits whenever anything does.
            alive[v][np.argmin(m)] = True
    changed = True
    while changed:
        changed = False
        for v in first.node_cost:
            if passed(deadline):
                return {v: np.flatnonzero(a) for v, a in alive.items()}
            idx = np.flatnonzero(alive[v])
            parts = [] if memory is None else [memory[v][idx, None]]
            for problem in problems:
                parts.append(problem.node_cost[v][idx, None])
                for p in problem.pairs:
                    if p.u == v:
                        cols = np.unique(p.w_class[alive[p.w]])
                        parts.append(p.cost[np.ix_(p.u_class[idx], cols)])
                    if p.w == v:
                        rows = np.unique(p.u_class[alive[p.u]])
                        parts.append(p.cost[np.ix_(rows, p.w_class[idx])].T)
            dead = _dominated(np.hstack(parts))
            if dead.any():
                alive[v][idx[dead]] = False
                changed = True
    return {v: np.flatnonzero(a) for v, a in alive.items()}


def restrict(problem: Problem, keep: Mapping[str, np.ndarray]) -> Problem:
    """The problem with only the candidates ``keep`` (indices per operator), and only the
    classes those candidates use."""
    pairs = []
    for p in problem.pairs:
        rows, u_class = np.unique(p.u_class[keep[p.u]], return_inverse=True)
        cols, w_class = np.unique(p.w_class[keep[p.w]], return_inverse=True)
        pairs.append(
            PairCost(p.u, p.w, u_class.reshape(-1), w_class.reshape(-1), p.cost[np.ix_(rows, cols)])
        )
    return Problem({v: c[keep[v]] for v, c in problem.node_cost.items()}, pairs)
