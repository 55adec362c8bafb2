"""Variable elimination (taps.elimination) against brute force over every assignment, on random
problems denser than series-parallel ones (complete graphs, parallel pair costs, shared classes),
and the search through it against the plain ILP on graphs the reductions leave a core of."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taps.elimination import plan
from taps.reductions import PairCost, Problem


@st.composite
def problems(draw) -> Problem:
    """Up to 7 operators of 1-4 candidates, any pairs of them joined (often all: K4 and up),
    classes shared by candidates, small integer costs (many ties)."""
    n = draw(st.integers(1, 7))
    names = [f"v{i}" for i in range(n)]
    sizes = {v: draw(st.integers(1, 4)) for v in names}
    costs = st.integers(0, 9).map(float)
    node = {v: np.array(draw(st.lists(costs, min_size=k, max_size=k))) for v, k in sizes.items()}
    every = list(itertools.combinations(names, 2))
    joined = draw(st.lists(st.sampled_from(every), max_size=12)) if every else []
    if every and draw(st.booleans()):
        joined += every  # the complete graph
    pairs = []
    for u, w in joined:
        if draw(st.booleans()):
            u, w = w, u
        classes = {}
        for v in (u, w):
            k = draw(st.integers(1, sizes[v]))
            classes[v] = np.array(
                draw(st.lists(st.integers(0, k - 1), min_size=sizes[v], max_size=sizes[v]))
            )
        shape = (int(classes[u].max()) + 1, int(classes[w].max()) + 1)
        flat = draw(st.lists(costs, min_size=math.prod(shape), max_size=math.prod(shape)))
        pairs.append(PairCost(u, w, classes[u], classes[w], np.array(flat).reshape(shape)))
    return Problem(node, pairs)


def _brute_force(problem: Problem) -> float:
    names = list(problem.node_cost)
    return min(
        problem.evaluate(dict(zip(names, c)))
        for c in itertools.product(*(range(len(problem.node_cost[v])) for v in names))
    )


@settings(max_examples=300, deadline=None)
@given(problems())
def test_elimination_equals_brute_force(problem):
    elimination = plan(problem)
    assert elimination is not None
    choice, cost = elimination.solve()
    assert set(choice) == set(problem.node_cost)
    assert all(0 <= choice[v] < len(c) for v, c in problem.node_cost.items())
    want = _brute_force(problem)
    assert cost == pytest.approx(want, abs=1e-9)
    # The choice attains the optimum it reports.
    assert problem.evaluate(choice) == pytest.approx(want, abs=1e-9)


def test_budget_refuses_wide_tables():
    """Five operators of 30 candidates, all joined: the first step of any order builds a table
    over four of them (30^4 entries) from 30 choices of the fifth, four tables each."""
    rng = np.random.default_rng(0)
    names = [f"v{i}" for i in range(5)]
    node = {v: rng.random(30) for v in names}
    pairs = [
        PairCost(u, w, np.arange(30), np.arange(30), rng.random((30, 30)))
        for u, w in itertools.combinations(names, 2)
    ]
    problem = Problem(node, pairs)
    assert plan(problem, max_table=30**4 - 1) is None
    assert plan(problem, max_work=4 * 30**5 - 1) is None
    elimination = plan(problem)
    assert elimination is not None and elimination.largest == 30**4
