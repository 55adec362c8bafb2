"""The counts of ``benches/lazy_pairs.py`` (docs/performance.md cites them): each step's entries
against a plain loop that prices entries one by one as a lazy evaluator would, and the whole
count against the reductions themselves (the entries it leaves out replaced by their bounds, the
reductions and the plan are the same bit for bit)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from graphs_gen import pair_cost
from taps.solve.reductions import PairCost, Problem, _class_min, _class_pairs, reduce

sys.path.insert(0, str(Path(__file__).parents[1] / "benches"))

from lazy_pairs import leaf_needed, needed_in_order, reduction_demand, series_needed

# Small integer costs: many ties between exact values and between bounds.
COSTS = st.integers(0, 4).map(float)


def _lazy_loop(bound: list[float], exact: list[float]) -> set[int]:
    """The entries a lazy minimum prices: in order of (bound, index), until the next bound is
    not below the least exact value priced so far."""
    priced: set[int] = set()
    least = math.inf
    for m in sorted(range(len(bound)), key=lambda m: (bound[m], m)):
        if bound[m] >= least:
            break
        priced.add(m)
        least = min(least, exact[m])
    return priced


def arrays(shape: tuple[int, ...]) -> st.SearchStrategy[np.ndarray]:
    size = math.prod(shape)
    return st.lists(COSTS, min_size=size, max_size=size).map(lambda x: np.array(x).reshape(shape))


@st.composite
def exact_and_bound(draw, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    exact = draw(arrays(shape))
    return exact, exact - draw(arrays(shape))


@given(st.data(), st.integers(1, 4), st.integers(1, 7))
def test_needed_in_order_is_the_loop(data, rows: int, n: int) -> None:
    exact, bound = data.draw(exact_and_bound((rows, n)))
    need = needed_in_order(bound, exact)
    for i in range(rows):
        assert set(np.flatnonzero(need[i])) == _lazy_loop(list(bound[i]), list(exact[i]))


@given(st.data(), st.integers(1, 4), st.integers(1, 6))
def test_leaf_is_the_loop(data, rows: int, cands: int) -> None:
    w_class = np.array(
        data.draw(st.lists(st.integers(0, cands - 1), min_size=cands, max_size=cands))
    )
    cols = int(w_class.max()) + 1
    exact, bound = data.draw(exact_and_bound((rows, cols)))
    node = np.array(data.draw(st.lists(COSTS, min_size=cands, max_size=cands)))
    need = leaf_needed(exact, bound, node, w_class)
    for i in range(rows):
        # A class's cost is its cheapest candidate's.
        least = [min(node[w_class == j], default=math.inf) for j in range(cols)]
        b = [bound[i, j] + least[j] for j in range(cols)]
        v = [exact[i, j] + least[j] for j in range(cols)]
        assert set(np.flatnonzero(need[i])) == _lazy_loop(b, v)


@given(st.data(), st.integers(1, 3), st.integers(1, 5), st.integers(1, 3))
def test_series_is_the_loop(data, u: int, v: int, w: int) -> None:
    sizes = {"u": u, "v": v, "w": w}
    left = pair_cost(data.draw, "u", "v", sizes, COSTS)
    right = pair_cost(data.draw, "v", "w", sizes, COSTS)
    lower_l = left.cost - data.draw(arrays(left.cost.shape))
    lower_r = right.cost - data.draw(arrays(right.cost.shape))
    node = np.array(data.draw(st.lists(COSTS, min_size=v, max_size=v)))
    stacked = [PairCost(p.u, p.w, p.u_class, p.w_class, p.cost[..., None]) for p in (left, right)]
    need_l, need_r = series_needed(stacked[0], lower_l, node, stacked[1], lower_r)
    mid, p, q = _class_pairs(left.w_class, right.u_class)
    least = _class_min(node[:, None], mid, len(p))[:, 0]
    want_l = np.zeros(left.cost.shape, dtype=bool)
    want_r = np.zeros(right.cost.shape, dtype=bool)
    for i in range(left.cost.shape[0]):
        for k in range(right.cost.shape[1]):
            b = [lower_l[i, p[m]] + least[m] + lower_r[q[m], k] for m in range(len(p))]
            x = [left.cost[i, p[m]] + least[m] + right.cost[q[m], k] for m in range(len(p))]
            for m in _lazy_loop(b, x):
                want_l[i, p[m]] = want_r[q[m], k] = True
    assert np.array_equal(need_l, want_l)
    assert np.array_equal(need_r, want_r)


@st.composite
def problems(draw) -> Problem:
    """Chains and trees (leaves, series), parallel edges, operators of one candidate, and
    cycles left for the core."""
    n = draw(st.integers(2, 7))
    names = [f"v{i}" for i in range(n)]
    sizes = {v: draw(st.integers(1, 4)) for v in names}
    node = {v: np.array(draw(st.lists(COSTS, min_size=k, max_size=k))) for v, k in sizes.items()}
    pairs = [
        pair_cost(draw, names[draw(st.integers(0, i - 1))], names[i], sizes, COSTS)
        for i in range(1, n)
    ]
    for _ in range(draw(st.integers(0, 4))):
        u, w = draw(st.permutations(names))[:2]
        pairs.append(pair_cost(draw, u, w, sizes, COSTS))
    return Problem(node, pairs)


def _core_choice(core: Problem) -> dict[str, int]:
    """The core's optimum, the first assignment of least cost in a plain enumeration."""
    names = list(core.node_cost)
    best, arg = math.inf, {}
    for c in np.ndindex(*(len(core.node_cost[v]) for v in names)):
        choice = dict(zip(names, map(int, c), strict=True))
        cost = core.evaluate(choice)
        if cost < best:
            best, arg = cost, choice
    return arg


@settings(max_examples=300)
@given(problems(), st.data())
def test_entries_left_out_change_nothing(problem: Problem, data) -> None:
    """Every entry the count leaves out replaced by its bound: the same reductions bit for bit
    (core node costs and pair costs) and the same plan."""
    lower = [p.cost - data.draw(arrays(p.cost.shape)) for p in problem.pairs]
    order = list(problem.node_cost)
    reduction = reduce([problem], order)
    choice = reduction.expand(_core_choice(reduction.cores[0]))
    demand = reduction_demand(reduction, len(problem.pairs), lower.__getitem__, choice)
    need = [np.zeros(p.cost.shape, dtype=bool) for p in problem.pairs]
    for per in demand.by.values():
        for k, mask in per.items():
            need[k] |= mask
    lazy = Problem(
        problem.node_cost,
        [
            PairCost(p.u, p.w, p.u_class, p.w_class, np.where(n, p.cost, b))
            for p, n, b in zip(problem.pairs, need, lower, strict=True)
        ],
    )
    again = reduce([lazy], order)
    core, core_again = reduction.cores[0], again.cores[0]
    assert core.node_cost.keys() == core_again.node_cost.keys()
    for v, c in core.node_cost.items():
        assert np.array_equal(c, core_again.node_cost[v])
    assert len(core.pairs) == len(core_again.pairs)
    for p, q in zip(core.pairs, core_again.pairs, strict=True):
        # What the candidates read (a class no candidate has is never read).
        assert (p.u, p.w) == (q.u, q.w)
        read = np.ix_(p.u_class, p.w_class)
        assert np.array_equal(p.cost[read], q.cost[np.ix_(q.u_class, q.w_class)])
    assert again.expand(_core_choice(core_again)) == choice
