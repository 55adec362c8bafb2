"""The memory-limited problem solved over (cost, memory) Pareto frontiers (taps.solve.pareto)
against brute force over every assignment, with and without the Lagrangian cut, and the search
through it on stacks of distinct (untied) layers against the plain ILP."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import taps
from taps import models
from taps.search.tables import build_tables
from taps.solve import pareto
from taps.solve.pareto import solve_pareto
from taps.solve.pipeline import IlpOptions, solve
from taps.solve.problem import Problem
from test_elimination import problems


def _every(problem: Problem) -> list[dict[str, int]]:
    names = list(problem.node_cost)
    sizes = [range(len(problem.node_cost[v])) for v in names]
    return [dict(zip(names, c)) for c in itertools.product(*sizes)]


def _memory(problem: Problem, data: st.DataObject) -> dict[str, np.ndarray]:
    """Small integer memory per candidate (many equal levels, as real tables have)."""
    return {
        v: np.array(data.draw(st.lists(st.integers(0, 6), min_size=len(c), max_size=len(c))), float)
        for v, c in problem.node_cost.items()
    }


def _used(memory: dict[str, np.ndarray], choice: dict[str, int]) -> float:
    return sum(float(memory[v][i]) for v, i in choice.items())


def _check(problem, memory, limit, choice) -> None:
    """``choice`` fits and is the cheapest that fits, up to sums rounded in another order."""
    every = _every(problem)
    assert choice is not None
    assert _used(memory, choice) <= limit * (1 + 1e-12)
    strict = min(
        (problem.evaluate(c) for c in every if _used(memory, c) <= limit * (1 - 1e-12)),
        default=np.inf,
    )
    loose = min(problem.evaluate(c) for c in every if _used(memory, c) <= limit * (1 + 1e-12))
    assert loose <= problem.evaluate(choice) <= strict


@settings(max_examples=150, deadline=None)
@given(problems(), st.data(), st.floats(0.0, 1.0))
def test_frontiers_find_the_least_cost_that_fits(problem, data, position):
    memory = _memory(problem, data)
    every = _every(problem)
    lo = min(_used(memory, c) for c in every)
    hi = max(_used(memory, c) for c in every)
    limit = lo + position * (hi - lo)
    _check(problem, memory, limit, solve_pareto(problem, memory, limit))


def _priced_case(problem: Problem, data: st.DataObject, position: float, lam: float):
    """Memory, a limit at ``position`` between the least and the most any assignment uses, the
    fitting assignments, the Lagrangian bound at price ``lam`` and one fitting assignment."""
    memory = _memory(problem, data)
    every = _every(problem)
    lo = min(_used(memory, c) for c in every)
    hi = max(_used(memory, c) for c in every)
    limit = lo + position * (hi - lo)
    fitting = [c for c in every if _used(memory, c) <= limit]
    bound = min(problem.evaluate(c) + lam * (_used(memory, c) - limit) for c in every)
    return memory, limit, fitting, bound, data.draw(st.sampled_from(fitting))


@settings(max_examples=150, deadline=None)
@given(problems(), st.data(), st.floats(0.0, 1.0), st.floats(0.0, 3.0))
def test_the_cut_by_any_price_keeps_the_optimum(problem, data, position, lam):
    # Any price gives a valid Lagrangian bound and any fitting assignment a cutoff: the cut
    # (every ladder step of it) must never lose the optimum, whether the tables are made again
    # on the candidates the price keeps (rebuild share 2: always) or not (0: never).
    memory, limit, _, bound, known = _priced_case(problem, data, position, lam)
    for share in (0.0, 2.0):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(pareto, "_REBUILD", share)
            found = solve_pareto(problem, memory, limit, price=(lam, bound, known))
        _check(problem, memory, limit, found)


@settings(max_examples=150, deadline=None)
@given(problems(), st.data(), st.floats(0.0, 1.0), st.floats(0.0, 3.0))
def test_the_candidates_the_price_drops_are_in_no_cheaper_fitting_assignment(
    problem, data, position, lam
):
    # Reduced-cost fixing before the passes: a candidate goes only if every fitting assignment
    # with it costs at least the known one; the known assignment's candidates stay.
    memory, limit, fitting, _, known = _priced_case(problem, data, position, lam)
    cost = problem.evaluate(known)
    setup = pareto._Setup(problem, memory, limit)
    _, outside = pareto._priced_bounds(setup.tables, setup.plan, lam, setup.order)
    keep = setup.kept(lam, cost + lam * limit, known, outside)
    assert all(known[v] in keep[v] for v in problem.node_cost)
    for c in fitting:
        if problem.evaluate(c) < cost - 1e-9 * abs(cost) - 1e-12:
            assert all(c[v] in keep[v] for v in problem.node_cost)
    # Exactly those: a candidate kept has a priced completion within the floor.
    for v, kept in keep.items():
        for i in kept:
            if i == known[v]:
                continue
            least = min(
                problem.evaluate(c) + lam * (_used(memory, c) - limit)
                for c in _every(problem)
                if c[v] == i
            )
            assert least <= cost * (1 + 1e-9) + 1e-12


@settings(max_examples=100, deadline=None)
@given(problems(), st.data(), st.floats(0.0, 1.0), st.floats(0.0, 3.0))
def test_over_budget_at_the_known_assignment_the_lower_cutoffs_decide(problem, data, position, lam):
    # The first pass (cutoff at the known assignment) runs over its budget: the passes of lower
    # cutoffs follow; each finds the optimum when it lies below its cutoff, and the solver gives
    # up (None, SCIP next) only when the optimum is above the last of them.
    memory, limit, fitting, bound, known = _priced_case(problem, data, position, lam)
    calls = []
    plain = pareto._pass

    def first_over_budget(*args):
        calls.append(args)
        if len(calls) == 1:
            raise pareto._OverBudget
        return plain(*args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pareto, "_pass", first_over_budget)
        found = solve_pareto(problem, memory, limit, price=(lam, bound, known))
    if found is None:
        optimum = min(problem.evaluate(c) for c in fitting)
        last = bound + pareto._LADDER[-1] * (problem.evaluate(known) - bound)
        assert optimum > last - 1e-9 * abs(last) - 1e-12
        assert len(calls) == 1 + len(pareto._LADDER)
    else:
        _check(problem, memory, limit, found)


@pytest.mark.parametrize(
    ("blocks", "shape", "position"), [(3, (2, 4), 0.2), (2, (1, 8), 0.5), (3, (4, 4), 0.8)]
)
def test_distinct_layers_under_a_binding_limit_equal_the_plain_ilp(blocks, shape, position):
    # Untied layers: every layer decides on its own, the memory of all of them under one limit.
    graph = models.gpt(64, 4, 16, 8, blocks=blocks, layers=2)
    tables = build_tables(graph, taps.Cluster(*shape))
    free = solve(tables)
    lo = sum(float(m.min()) for m in tables.memory_per_op.values()) * tables.layers
    hi = tables.layers * sum(float(tables.memory_per_op[v][i]) for v, i in free.choice.items())
    assert hi > lo
    limit = lo + position * (hi - lo)
    fast = solve(tables, limit)
    plain = solve(tables, limit, options=IlpOptions(price=False))
    used = tables.layers * sum(float(tables.memory_per_op[v][i]) for v, i in fast.choice.items())
    assert used <= limit * (1 + 1e-9)
    assert fast.gap == 0 and fast.status == "optimal"
    assert tables.evaluate(fast.choice) == pytest.approx(tables.evaluate(plain.choice), rel=1e-9)


def test_over_budget_says_none(monkeypatch):
    # Beyond its budget the solver gives up (the pipeline then runs SCIP), it does not grow.
    graph = models.gpt(64, 4, 16, 8, blocks=3)
    tables = build_tables(graph, taps.Cluster(2, 4))
    problem = tables.problem()
    memory = {v: m * tables.layers for v, m in tables.memory_per_op.items()}
    limit = sum(float(m.max()) for m in memory.values())
    monkeypatch.setattr("taps.solve.pareto.MAX_WORK", 10)
    assert solve_pareto(problem, memory, limit) is None


# -- the frontiers' two steps against their definitions -----------------------------------------

_levels = st.lists(st.integers(0, 8), max_size=5).map(lambda x: np.unique(np.array(x, float) / 4))


@settings(max_examples=200, deadline=None)
@given(_levels, _levels, st.integers(0, 2), st.integers(0, 16), st.data())
def test_adding_two_frontiers_keeps_each_entrys_pareto_points(ma, mb, dims, cap, data):
    """``_added`` against the frontier of every sum by definition: per entry, at each memory
    level, the least cost of the sums at that level, kept when below every lower level's."""
    shape = tuple(data.draw(st.lists(st.integers(1, 3), min_size=dims, max_size=dims)))
    costs = st.sampled_from([0.0, 0.25, 0.5, 1.0, np.inf])

    def table(levels: np.ndarray, dims_of: tuple[int, ...]) -> np.ndarray:
        size = len(levels) * int(np.prod(dims_of))
        values = data.draw(st.lists(costs, min_size=size, max_size=size))
        return np.array(values, float).reshape(len(levels), *dims_of)

    a, b = table(ma, shape), table(mb, (1,) * dims)
    mems, out = pareto._added(a, ma, b, mb, cap / 4, pareto._Budget(None))
    sums = [(i, j) for i in range(len(ma)) for j in range(len(mb)) if mb[j] <= cap / 4 - ma[i]]
    levels = sorted({ma[i] + mb[j] for i, j in sums})
    expected = np.full((len(levels), *shape), np.inf)
    for index in np.ndindex(*shape):
        lower = np.inf
        for k, level in enumerate(levels):
            at = min(
                (
                    a[(i, *index)] + b[(j, *(0 for _ in index))]
                    for i, j in sums
                    if ma[i] + mb[j] == level
                ),
                default=np.inf,
            )
            if at < lower:
                expected[(k, *index)] = at
                lower = at
    alive = [k for k in range(len(levels)) if np.isfinite(expected[k]).any()]
    assert mems.tolist() == [levels[k] for k in alive]
    assert np.array_equal(out, expected[alive])


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3)), min_size=1, max_size=4),
        min_size=1,
        max_size=4,
    ),
    st.integers(0, 20),
    st.integers(0, 12),
)
def test_splitting_a_point_finds_the_first_combination_that_makes_it(points, mem, cost):
    """``_split`` against every combination in order (the first index first): the first whose
    memories add up to ``mem`` and costs to at most ``cost``."""
    entries = [(np.array([m / 10 for m, _ in e]), np.array([c / 10 for _, c in e])) for e in points]
    expected = None
    for combo in itertools.product(*(range(len(m)) for m, _ in entries)):
        m = sum(float(entries[k][0][i]) for k, i in enumerate(combo))
        c = sum(float(entries[k][1][i]) for k, i in enumerate(combo))
        if abs(m - mem / 10) <= 1e-9 and c <= cost / 10 + 1e-9 * max(cost / 10, 1e-300):
            expected = list(combo)
            break
    assert pareto._split(entries, mem / 10, cost / 10) == expected
