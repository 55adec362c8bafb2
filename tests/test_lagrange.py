"""The Lagrangian price on memory (taps.solve.memory_price) against brute force: its bound is a
bound, its assignment fits, and its pruning keeps an optimal assignment."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import taps
from graphs_gen import CLUSTERS, small_enough, small_graphs
from taps.search.tables import build_tables
from taps.solve.memory_price import _splice, price_memory, prune_by_price
from taps.solve.pipeline import IlpOptions, solve
from taps.solve.reductions import PairCost, Problem, reduce


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_graphs(), st.sampled_from(CLUSTERS), st.floats(0.05, 0.95))
def test_price_bound_assignment_and_pruning(graph, shape, position):
    cluster = taps.Cluster(*shape)
    assume(small_enough(graph, cluster))
    tables = build_tables(graph, cluster)
    problem = tables.problem()
    memory = {n: t.memory * graph.layers for n, t in tables.ops.items()}
    names = list(tables.ops)
    every = [
        dict(zip(names, c)) for c in itertools.product(*(range(len(memory[n])) for n in names))
    ]

    def mem(choice):
        return sum(float(memory[n][i]) for n, i in choice.items())

    lo, hi = min(map(mem, every)), max(map(mem, every))
    limit = lo + position * (hi - lo)
    fitting = [c for c in every if mem(c) <= limit]
    best = min(problem.evaluate(c) for c in fitting)
    priced = price_memory(problem, memory, limit)
    assume(priced is not None)  # a core beyond variable elimination's budget
    assert priced.bound <= best * (1 + 1e-9) + 1e-15
    assert priced.choice is not None
    assert mem(priced.choice) <= limit
    assert priced.cost == problem.evaluate(priced.choice) >= best * (1 - 1e-9) - 1e-15
    if priced.optimal:
        assert priced.cost <= best * (1 + 1e-9) + 1e-15
    keep = prune_by_price(problem, memory, limit, priced.price, priced.cost)
    # Some optimal fitting assignment survives the pruning whole.
    optimal = [c for c in fitting if problem.evaluate(c) <= best * (1 + 1e-12) + 1e-18]
    assert any(all(c[v] in keep[v] for v in names) for c in optimal)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_graphs(), st.sampled_from(CLUSTERS), st.floats(0.0, 1.0))
def test_priced_search_equals_the_plain_ilp_and_brute_force(graph, shape, position):
    # The whole fast path under a binding limit (reductions, price, pruning by min-marginals,
    # then SCIP on what is left) against SCIP without the price and against every assignment.
    cluster = taps.Cluster(*shape)
    assume(small_enough(graph, cluster))
    tables = build_tables(graph, cluster)
    names = list(tables.ops)
    memory = {n: tables.ops[n].memory * graph.layers for n in names}
    every = [
        dict(zip(names, c)) for c in itertools.product(*(range(len(memory[n])) for n in names))
    ]

    def mem(choice):
        return sum(float(memory[n][i]) for n, i in choice.items())

    free = solve(tables).choice
    lo = min(map(mem, every))
    limit = lo + position * (mem(free) - lo)
    best = min(tables.evaluate(c) for c in every if mem(c) <= limit)
    fast = solve(tables, limit)
    plain = solve(tables, limit, options=IlpOptions(price=False))
    assert mem(fast.choice) <= limit * (1 + 1e-9)
    assert fast.gap == 0
    assert tables.evaluate(fast.choice) == pytest.approx(best, rel=1e-9, abs=1e-15)
    assert tables.evaluate(plain.choice) == pytest.approx(best, rel=1e-9, abs=1e-15)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.floats(0.0, 1.0))
def test_a_core_the_reductions_leave_is_priced_by_elimination(seed, position):
    # Four operators joined pairwise (K4: not series-parallel, the reductions leave it whole), as
    # an MoE layer's router joins its dispatch and combine: the price decides it anyway, and its
    # bound and assignment hold against every assignment.
    rng = np.random.default_rng(seed)
    names = ["a", "b", "c", "d"]
    sizes = {v: int(rng.integers(2, 5)) for v in names}
    node = {v: rng.random(sizes[v]) for v in names}
    pairs = [
        PairCost(u, w, np.arange(sizes[u]), np.arange(sizes[w]), rng.random((sizes[u], sizes[w])))
        for u, w in itertools.combinations(names, 2)
    ]
    problem = Problem(node, pairs)
    assert reduce([problem], names).cores[0].pairs  # a core is left
    memory = {v: rng.integers(1, 10, sizes[v]).astype(float) for v in names}
    every = [dict(zip(names, c)) for c in itertools.product(*(range(sizes[v]) for v in names))]

    def mem(choice):
        return sum(memory[v][i] for v, i in choice.items())

    lo, hi = min(map(mem, every)), max(map(mem, every))
    limit = lo + position * (hi - lo)
    best = min(problem.evaluate(c) for c in every if mem(c) <= limit)
    priced = price_memory(problem, memory, limit)
    assert priced is not None and priced.choice is not None
    assert mem(priced.choice) <= limit
    assert priced.bound <= best * (1 + 1e-9) + 1e-15
    assert priced.cost >= best * (1 - 1e-9) - 1e-15
    if priced.optimal:
        assert priced.cost == pytest.approx(best, rel=1e-9, abs=1e-15)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_graphs(), st.sampled_from(CLUSTERS), st.data())
def test_the_splice_is_the_cheapest_fitting_prefix_of_either(graph, shape, data):
    # Against every splice point of both orders, built and priced one by one.
    cluster = taps.Cluster(*shape)
    tables = build_tables(graph, cluster)
    problem = tables.problem()
    names = list(problem.node_cost)
    memory = {n: tables.ops[n].memory * graph.layers for n in names}
    pick = st.fixed_dictionaries({n: st.integers(0, len(memory[n]) - 1) for n in names})
    over, under = data.draw(pick), data.draw(pick)

    def mem(choice):
        return sum(float(memory[n][i]) for n, i in choice.items())

    limit = data.draw(st.sampled_from(sorted({mem(over), mem(under)})))
    splices = [
        {v: (first if k < cut else rest)[v] for k, v in enumerate(names)}
        for first, rest in ((over, under), (under, over))
        for cut in range(len(names) + 1)
    ]
    fitting = [problem.evaluate(c) for c in splices if mem(c) <= limit]
    ends = [(c, problem.evaluate(c), mem(c)) for c in (over, under)]
    found = _splice(problem, memory, limit, *ends, math.inf)
    if not fitting:
        assert found is None
        return
    # A splice must beat ``beat`` to be returned: below the cheapest, none is.
    low = min(fitting) - 1e-6 * abs(min(fitting)) - 1e-12
    assert _splice(problem, memory, limit, *ends, low) is None
    assert found is not None
    choice, cost = found
    assert mem(choice) <= limit
    assert cost == problem.evaluate(choice)
    assert cost == pytest.approx(min(fitting), rel=1e-12, abs=1e-18)
