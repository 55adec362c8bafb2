"""Steady pieces (taps.solve.steady) eliminated exactly: every choice of the operators left costs
the least completion of the pieces (brute force over every assignment), on random problems and
on the shape of DeepSeek-V3's rotary embedding; the order that eliminates a piece is the least
work of every order of its operators; and the memory-limited solve through the pieces is the
brute-force optimum."""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taps.solve import elimination
from taps.solve.pipeline import solve
from taps.solve.problem import PairCost, Problem
from taps.solve.steady import eliminate_pieces
from test_elimination import _game_work, graphs, problems


def _least_completions(problem: Problem, left: list[str]) -> dict[tuple[int, ...], float]:
    """Per choice of the operators ``left``, the least cost of any assignment with it."""
    names = list(problem.node_cost)
    best: dict[tuple[int, ...], float] = {}
    for c in itertools.product(*(range(len(problem.node_cost[v])) for v in names)):
        choice = dict(zip(names, c))
        key = tuple(choice[v] for v in left)
        best[key] = min(best.get(key, math.inf), problem.evaluate(choice))
    return best


def _check(problem: Problem, steady: set[str]) -> Problem:
    """The pieces of ``problem`` eliminated: only steady operators go, the pair costs left join
    operators left, and every choice of theirs costs (and completes to) its least completion."""
    pieces = eliminate_pieces(problem, steady)
    assert pieces is not None
    left = pieces.problem
    gone = problem.node_cost.keys() - left.node_cost.keys()
    assert gone <= steady
    assert pieces.eliminated == len(gone)
    assert all(p.u in left.node_cost and p.w in left.node_cost for p in left.pairs)
    names = list(left.node_cost)
    for key, want in _least_completions(problem, names).items():
        choice = dict(zip(names, key))
        assert left.evaluate(choice) == pytest.approx(want, abs=1e-9)
        full = pieces.expand(choice)
        assert full.keys() == problem.node_cost.keys()
        assert problem.evaluate(full) == pytest.approx(want, abs=1e-9)
    return left


@settings(max_examples=200, deadline=None)
@given(problems(), st.data())
def test_every_choice_left_costs_its_least_completion(problem, data):
    steady = set(data.draw(st.lists(st.sampled_from(list(problem.node_cost)), unique=True)))
    _check(problem, steady)


def _rotary(seed: int) -> Problem:
    """DeepSeek-V3's rotary embedding in shape: the query's projection ``q`` split into the two
    halves ``slice`` and ``slice_2``, each read by the rotation's ``sub`` and ``add``, whose
    ``cat`` joins the query again (``cat_3``) with the attention's ``context``, which
    ``kv_b_proj`` feeds and ``o_proj`` reads. Random costs; 2 or 3 candidates each."""
    rng = np.random.default_rng(seed)
    names = ["q", "split", "slice", "slice_2", "sub", "add", "cat", "cat_3", "context", "kv", "o"]
    sizes = {v: int(rng.integers(2, 4)) for v in names}
    edges = [
        ("q", "split"),
        ("split", "slice"),
        ("split", "slice_2"),
        ("slice", "sub"),
        ("slice_2", "sub"),
        ("slice", "add"),
        ("slice_2", "add"),
        ("sub", "cat"),
        ("add", "cat"),
        ("cat", "cat_3"),
        ("q", "cat_3"),
        ("context", "cat_3"),
        ("kv", "context"),
        ("context", "o"),
    ]
    pairs = [
        PairCost(u, w, np.arange(sizes[u]), np.arange(sizes[w]), rng.random((sizes[u], sizes[w])))
        for u, w in edges
    ]
    return Problem({v: rng.random(sizes[v]) for v in names}, pairs)


#: The rotary's operators whose memory does not depend on their candidate.
_STEADY = {"split", "slice", "slice_2", "sub", "add", "cat", "cat_3", "context"}


@pytest.mark.parametrize("seed", range(4))
def test_the_rotary_embedding_is_one_piece_between_the_query_and_the_context(seed):
    # The steady operators have three around them (q, kv, o): the component is no piece, but
    # all of it apart from the context is, between the query's projection and the context.
    left = _check(_rotary(seed), _STEADY)
    assert set(left.node_cost) == {"q", "context", "kv", "o"}
    assert sorted(tuple(sorted((p.u, p.w))) for p in left.pairs) == [
        ("context", "kv"),
        ("context", "o"),
        ("context", "q"),
    ]


@settings(max_examples=200, deadline=None)
@given(graphs(), st.data())
def test_a_pieces_order_is_the_least_work_of_every_order_of_its_operators(problem, data):
    keep = set(data.draw(st.lists(st.sampled_from(list(problem.node_cost)), unique=True)))
    others = [v for v in problem.node_cost if v not in keep]
    order = elimination._exact_order(problem, math.inf, keep)
    assert order is not None and sorted(order) == sorted(others)
    least = min(_game_work(problem, p) for p in itertools.permutations(others))
    assert _game_work(problem, order) == least


@dataclass
class _Instance:
    of: Problem
    memory_per_op: dict[str, np.ndarray]
    layers: int = 1
    tied: tuple = ()

    def problem(self) -> Problem:
        return self.of


@pytest.mark.parametrize(("seed", "position"), [(s, p) for s in range(3) for p in (0.2, 0.5, 0.8)])
def test_a_binding_limit_through_the_pieces_equals_brute_force(seed, position):
    problem = _rotary(seed)
    rng = np.random.default_rng(seed + 100)
    memory = {
        v: np.full(len(c), 5.0) if v in _STEADY else rng.integers(1, 20, len(c)).astype(float)
        for v, c in problem.node_cost.items()
    }
    names = list(problem.node_cost)
    every = [
        dict(zip(names, c))
        for c in itertools.product(*(range(len(problem.node_cost[v])) for v in names))
    ]

    def used(choice):
        return sum(float(memory[v][i]) for v, i in choice.items())

    lo, hi = min(map(used, every)), max(map(used, every))
    limit = lo + position * (hi - lo)
    best = min(problem.evaluate(c) for c in every if used(c) <= limit)
    found = solve(_Instance(problem, memory), memory_limit=limit)
    assert found.status == "optimal" and found.gap == 0
    assert used(found.choice) <= limit
    assert problem.evaluate(found.choice) == pytest.approx(best, rel=1e-9)


def test_a_passed_deadline_stops_the_pieces():
    # Past the deadline the elimination of a piece stops (the solve then returns its first
    # assignment, docs/errors.md#time); before it, the same pieces go.
    problem = _rotary(0)
    assert eliminate_pieces(problem, _STEADY, deadline=time.perf_counter() - 1) is None
    pieces = eliminate_pieces(problem, _STEADY, deadline=time.perf_counter() + 60)
    assert pieces is not None and pieces.eliminated == 7
