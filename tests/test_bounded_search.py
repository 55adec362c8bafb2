"""The optimal planner's search on bounded edge tables (each edge priced at a lower bound, the
assignment's pairs made exact until all are) against the full tables' brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

import strategies_gen as sg
import taps
from graphs_gen import CLUSTERS, small_enough, small_graphs
from taps._core import (
    redistribution_pair_bounds,
    redistribution_pair_costs,
    redistribution_pair_estimates,
)
from taps.reproduce import DEVICES_PER_NODE, timing_cases
from taps.reproduce.cases import paper_cluster
from taps.search import tables
from taps.search.tables import build_tables
from taps.solve.pipeline import solve
from taps.solve.reductions import reduce
from taps.solve.ties import Ties
from test_search import _brute_force

OPTIMAL = taps.Pricing(planner="optimal")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_graphs(), st.sampled_from(CLUSTERS))
def test_bounded_search_equals_the_full_tables_brute_force(graph, shape):
    cluster = paper_cluster(*shape)
    assume(small_enough(graph, cluster, 200_000))
    result = taps.search(graph, cluster, OPTIMAL)
    assert result.status == "optimal"
    _is_the_full_tables_optimum(result, graph, cluster)


def _is_the_full_tables_optimum(
    result: taps.SearchResult, graph: taps.Graph, cluster: taps.Cluster
) -> None:
    # The full tables' brute-force optimum, and its plan priced on them is what it reports.
    full = build_tables(graph, cluster, OPTIMAL)
    assert result.cost == pytest.approx(_brute_force(full), rel=1e-9, abs=1e-18)
    choice = {
        name: full.ops[name].strategies.index(s) for name, s in result.plan.strategies.items()
    }
    assert full.evaluate(choice) == pytest.approx(result.cost, rel=1e-12, abs=1e-18)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_graphs(), st.sampled_from(CLUSTERS), st.sampled_from([1, 7, 200]))
def test_rounds_pricing_spare_pairs_find_the_full_tables_optimum(graph, shape, entries):
    # Every round prices one directed pair more per ``entries`` of the tables beside the
    # assignment's (both directions): still the optimum of the full tables, every pair of its
    # assignment exact.
    cluster = paper_cluster(*shape)
    assume(small_enough(graph, cluster, 200_000))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tables, "ENTRIES_PER_SPARE_PAIR", entries)
        patch.setattr(tables, "MIN_SPARE", 1)
        result = taps.search(graph, cluster, OPTIMAL)
    _is_the_full_tables_optimum(result, graph, cluster)


@settings(max_examples=40, deadline=None)
@given(st.integers(3, 5), st.data())
def test_bounds_lie_between_nothing_and_the_optimal_cost(log2, data):
    sources, targets = data.draw(sg.layout_sets(log2, max_count=4))
    sources, targets = [sg.to_layout(t) for t in sources], [sg.to_layout(t) for t in targets]
    per_node = data.draw(st.sampled_from([1, 2, 4]))
    cluster = taps.Cluster(2**log2 // per_node, per_node)
    bound, exact = taps.redistribution_bounds(sources, targets, cluster)
    optimal = taps.redistribution_costs(sources, targets, cluster, planner="optimal")
    paper = taps.redistribution_costs(sources, targets, cluster, planner="paper")
    assert (bound >= 0).all()
    assert (bound <= optimal).all()
    assert (optimal <= paper * (1 + 1e-12)).all()
    # A bound said to be exact is the optimal planner's cost to the last digit.
    assert (bound[exact] == optimal[exact]).all()


@settings(max_examples=30, deadline=None)
@given(st.integers(3, 5), st.data())
def test_pair_costs_are_each_pairs_cost(log2, data):
    # Two tensors' pairs and element sizes in one call, each priced as its own 1 x 1 call.
    pairs, sizes = [], []
    for dtype in data.draw(st.lists(st.sampled_from([1.0, 2.0, 4.0]), min_size=1, max_size=2)):
        sources, targets = data.draw(sg.layout_sets(log2, max_count=3))
        pairs += [(sg.to_layout(s), sg.to_layout(t)) for s in sources for t in targets]
        sizes += [dtype] * (len(sources) * len(targets))
    cluster = taps.Cluster(2 ** (log2 - 1), 2)
    for planner in ("paper", "optimal"):
        for model in ("topology", "volume"):
            got = redistribution_pair_costs(
                [s for s, _ in pairs], [t for _, t in pairs], sizes, cluster, model, planner
            )
            want = [
                taps.redistribution_costs([s], [t], cluster, b, model, planner)[0, 0]
                for (s, t), b in zip(pairs, sizes, strict=True)
            ]
            assert got.tolist() == want


def test_estimates_stop_a_partial_sums_search_short_and_rise_to_its_cost():
    """AlexNet 64's pair from the first linear layer's partial sums over the nodes to the
    second's input (its optimal plan: three reduce-scatters across nodes, two all-to-alls, a
    permute and an all-gather; about 1,000 layouts expanded): the bound at the source at 0
    layouts, higher bounds under the cost as the search may expand more, then the cost; refused
    arguments get one line each. (On a cluster of its own: the searches' memo is the
    process's, and a path another test remembered would end the search at once.)"""
    cluster = taps.Cluster(8, 8, intra_latency=3e-6, inter_latency=6e-6)
    source = taps.Layout([128, 4096], [8, 8], [-1, 0], partial=[1])
    target = taps.Layout([128, 4096], [2, 32], [-1, 0])
    pair = ([source], [target], [2.0])
    got = [redistribution_pair_estimates(*pair, [n], cluster) for n in (0, 64, 512, None)]
    (bound,), _ = redistribution_pair_bounds(*pair, cluster)
    (cost,) = redistribution_pair_costs(*pair, cluster, planner="optimal")
    (paper,) = redistribution_pair_costs(*pair, cluster)
    assert bound < cost < paper
    estimates = [float(e[0]) for e, _ in got]
    assert [bool(x[0]) for _, x in got] == [False, False, False, True]
    assert estimates[0] == bound and estimates[-1] == cost
    assert estimates == sorted(estimates) and estimates[2] > bound
    with pytest.raises(taps.TapsError, match=r"^expansions must be a count of layouts"):
        redistribution_pair_estimates(*pair, [-1], cluster)
    with pytest.raises(taps.TapsError, match=r"^1 pairs and 2 expansions: one per pair$"):
        redistribution_pair_estimates(*pair, [1, 2], cluster)
    with pytest.raises(taps.TopologyError, match="topology model only"):
        redistribution_pair_estimates(*pair, [None], cluster, "volume")
    # 100 searches of about 10 ms each (each element size its own objective) stop at once at a
    # limit of 0, and remember no path: the pair is then priced in full as before.
    sizes = [2.0 * (1 + k * 2**-30) for k in range(100)]
    with pytest.raises(
        taps.TimeLimitError, match=r"^the time limit ran out while pricing 100 redistributions$"
    ):
        redistribution_pair_estimates(
            [source] * 100, [target] * 100, sizes, [None] * 100, cluster, time_limit=0.0
        )
    last = ([source], [target], sizes[-1:])
    (again,), _ = redistribution_pair_estimates(*last, [None], cluster)
    assert again < redistribution_pair_costs(*last, cluster)[0]  # not Algorithm 1's plan


def _unbounded(shape: tuple[int, int]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    # A _Bound's Algorithm 1 costs (none known: infinite) and cheap flags (none cheap).
    return [np.full(shape, np.inf)] * 2, [np.zeros(shape, dtype=bool) for _ in range(2)]


def test_rounds_price_a_pairs_backward_only_once_it_is_picked_again():
    # One class pair of a training edge, both directions bounded: the first round prices its
    # forward, the next its backward (the gradient's way back), then nothing is left; an edge
    # of the same layouts in the same round is priced once.
    a, b = taps.Layout([8, 8], [8], [0, -1]), taps.Layout([8, 8], [8], [-1, 0])
    c, d = taps.Layout([8, 8], [8], [-1, -1]), taps.Layout([8, 8], [2, 4], [0, 1])

    def bound() -> tables._Bound:
        parts = [np.array([[1.0]]), np.array([[2.0]])]
        exact = [np.array([[False]]), np.array([[False]])]
        return tables._Bound(
            np.array([[3.0]]), [(a, c)], [(b, d)], True, 4.0, parts, exact, *_unbounded((1, 1))
        )

    calls = []

    def price(sources, targets, sizes):
        calls.append(list(zip(sources, targets, sizes, strict=True)))
        return np.array([10.0 * len(calls)] * len(sources)), np.ones(len(sources), dtype=bool)

    first, second = bound(), bound()
    chosen = [(first, {(0, 0)}), (second, {(0, 0)})]
    assert tables._refine(chosen, price)
    assert calls == [[(a, b, 4.0)]]
    assert first.cost[0, 0] == second.cost[0, 0] == 10.0 + 2.0
    assert tables._refine(chosen, price)
    assert calls[1] == [(d, c, 4.0)]
    assert first.cost[0, 0] == 10.0 + 20.0
    assert not tables._refine(chosen, price)
    assert len(calls) == 2


def test_a_pair_whose_search_stops_short_keeps_the_higher_bound_and_is_priced_again():
    # The first pricing of a class pair's forward stops short: its bound rises to what the
    # search left (never below the bound it had), it stays inexact, and the next round prices
    # it again, in full.
    a, b = taps.Layout([8, 8], [8], [0, -1]), taps.Layout([8, 8], [8], [-1, 0])
    parts = [np.array([[5.0]]), np.array([[0.0]])]
    exact = [np.array([[False]]), np.array([[True]])]
    edge = tables._Bound(
        np.array([[5.0]]), [(a,)], [(b,)], False, 2.0, parts, exact, *_unbounded((1, 1))
    )
    answers = [([7.0], [False]), ([4.0], [False]), ([9.0], [True])]
    calls = []

    def price(sources, targets, sizes):
        calls.append(list(zip(sources, targets, strict=True)))
        cost, done = answers[len(calls) - 1]
        return np.array(cost), np.array(done)

    assert tables._refine([(edge, {(0, 0)})], price)
    assert edge.cost[0, 0] == 7.0 and not edge.exact[0][0, 0]
    assert tables._refine([(edge, {(0, 0)})], price)
    assert edge.cost[0, 0] == 7.0 and not edge.exact[0][0, 0]  # 4.0 is below what it had
    assert tables._refine([(edge, {(0, 0)})], price)
    assert edge.cost[0, 0] == 9.0 and edge.exact[0][0, 0]
    assert not tables._refine([(edge, {(0, 0)})], price)
    assert calls == [[(a, b)]] * 3


def test_a_priced_pair_settles_every_entry_of_the_same_pair():
    # Priced through one class pair of one edge, a directed pair settles every entry holding it
    # in the bounds given: the class pair of the same edge that differs only in its gradient,
    # another edge's forward, and another edge's backward (the gradient's way back: d -> c is
    # the pair c <- d); not an edge of other bytes per element. A bound priced short rises
    # only where it was lower; an exact entry stays.
    a, b = taps.Layout([8, 8], [8], [0, -1]), taps.Layout([8, 8], [8], [-1, 0])
    c, d = taps.Layout([8, 8], [8], [-1, -1]), taps.Layout([8, 8], [2, 4], [0, 1])

    def bound(src, dst, dtype, forward, backward) -> tables._Bound:
        shape = (len(src), len(dst))
        parts = [np.full(shape, forward), np.full(shape, backward)]
        exact = [np.zeros(shape, dtype=bool), np.zeros(shape, dtype=bool)]
        return tables._Bound(
            parts[0] + parts[1], src, dst, True, dtype, parts, exact, *_unbounded(shape)
        )

    edge = bound([(a, c), (a, d)], [(b, d)], 4.0, 1.0, 2.0)
    other = bound([(a, c)], [(b, c)], 4.0, 3.0, 0.5)
    back = bound([(c, a)], [(c, b)], 4.0, 0.25, 0.5)  # its backward: b -> a
    high = bound([(d, a)], [(d, b)], 4.0, 0.25, 3.0)
    wide = bound([(a, c)], [(b, d)], 2.0, 1.0, 2.0)
    places = tables._Places([edge, other, back, high, wide])
    answers = [([10.0], [True]), ([2.0], [False])]
    calls = []

    def price(sources, targets, sizes):
        calls.append(list(zip(sources, targets, sizes, strict=True)))
        cost, done = answers[len(calls) - 1]
        return np.array(cost), np.array(done)

    assert tables._refine([(edge, {(0, 0)})], price, places=places)
    assert calls == [[(a, b, 4.0)]]
    assert edge.parts[0].tolist() == [[10.0], [10.0]] and edge.exact[0].all()
    assert other.parts[0][0, 0] == 10.0 and other.exact[0][0, 0]
    assert edge.cost.tolist() == [[12.0], [12.0]] and other.cost[0, 0] == 10.5
    assert not wide.exact[0].any() and wide.parts[0][0, 0] == 1.0
    # b -> a, priced short at 2.0: back's backward rises from 0.5, high's stays at 3.0.
    back.exact[0][:] = True
    assert tables._refine([(back, {(0, 0)})], price, places=places)
    assert calls[1] == [(b, a, 4.0)]
    assert back.parts[1][0, 0] == 2.0 and not back.exact[1][0, 0] and back.cost[0, 0] == 2.25
    assert high.parts[1][0, 0] == 3.0 and not high.exact[1][0, 0]


def test_an_assignment_works_out_the_unknown_algorithm_1_costs_it_takes():
    # The cheap tables leave most of Algorithm 1's costs unknown (NaN): the assignment's upper
    # bound works out those of the directions it takes that are still bounds, distinct pairs
    # once, in one call; known ones, exact directions and other class pairs are not asked for,
    # and a second look asks nothing.
    a, b = taps.Layout([8, 8], [8], [0, -1]), taps.Layout([8, 8], [8], [-1, 0])
    c, d = taps.Layout([8, 8], [8], [-1, -1]), taps.Layout([8, 8], [2, 4], [0, 1])

    def bound(src, dst, upper) -> tables._Bound:
        shape = (len(src), len(dst))
        parts = [np.full(shape, 1.0), np.full(shape, 2.0)]
        exact = [np.zeros(shape, dtype=bool), np.zeros(shape, dtype=bool)]
        cheap = [np.zeros(shape, dtype=bool) for _ in range(2)]
        uppers = [np.array(u, dtype=float) for u in upper]
        return tables._Bound(parts[0] + parts[1], src, dst, True, 4.0, parts, exact, uppers, cheap)

    nan = np.nan
    # Row 1, column 0 taken: forward a -> b unknown, backward b -> c known (5.0).
    first = bound([(c, c), (a, c)], [(b, b)], [[[nan], [nan]], [[nan], [5.0]]])
    # The same forward pair unknown, its backward exact; row 0 untouched.
    second = bound([(d, d), (a, d)], [(b, c)], [[[nan], [nan]], [[nan], [nan]]])
    second.exact[1][1, 0] = True

    def edge(producer, consumer, bounds):
        e = taps.graph.Edge(producer, consumer, 0, producer, (8, 8), (8, 8))
        return tables.EdgeTable(e, np.array([0, 1]), np.array([0]), bounds.cost)

    edges = [edge("p", "q", first), edge("p", "r", second)]
    bounds = {id(first.cost): first, id(second.cost): second}
    calls = []

    def paper(sources, targets, sizes):
        calls.append(list(zip(sources, targets, sizes, strict=True)))
        return np.array([7.0] * len(sources))

    choice = {"p": 1, "q": 0, "r": 0}
    # first: (7 - 1) + (5 - 2); second: (7 - 1), its backward exact.
    assert tables._dearer(edges, bounds, choice, paper) == 15.0
    assert calls == [[(a, b, 4.0)]]
    assert first.upper[0][1, 0] == 7.0 and second.upper[0][1, 0] == 7.0
    assert np.isnan(first.upper[0][0, 0]) and np.isnan(second.upper[1][1, 0])
    assert tables._dearer(edges, bounds, choice, paper) == 15.0 and len(calls) == 1


def test_spare_pairs_are_the_next_direction_of_the_nearest_pairs():
    # A 3 x 3 training edge, the assignment on (1, 1): both its directions priced first, then,
    # once they are, the next direction of each pair ``nearest`` gives, in its order, at most
    # the spare.
    layouts = [taps.Layout([8, 8], [8], [0, -1]), taps.Layout([8, 8], [8], [-1, 0])]
    layouts.append(taps.Layout([8, 8], [2, 4], [0, 1]))
    parts = [np.ones((3, 3)), np.ones((3, 3))]
    exact = [np.zeros((3, 3), dtype=bool), np.zeros((3, 3), dtype=bool)]
    exact[0][0, 0] = True  # (0, 0)'s forward known: its backward is next
    rows = [(x, x) for x in layouts]
    b = tables._Bound(
        np.full((3, 3), 2.0), rows, rows, True, 2.0, parts, exact, *_unbounded((3, 3))
    )
    calls: list = []

    def price(sources, targets, sizes):
        calls.append(list(zip(sources, targets, strict=True)))
        return np.array([10.0 * len(calls)] * len(sources)), np.ones(len(sources), dtype=bool)

    def nearest():
        assert b.exact[0][1, 1] and b.exact[1][1, 1]
        return [(b, 0, 0), (b, 2, 1), (b, 0, 2), (b, 2, 2)]

    assert tables._refine([(b, {(1, 1)})], price, 3, nearest)
    assert calls[0] == [(layouts[1], layouts[1])]  # both directions: one directed pair
    assert calls[1] == [
        (layouts[0], layouts[0]),
        (layouts[2], layouts[1]),
        (layouts[0], layouts[2]),
    ]
    assert b.cost[1, 1] == 20.0 and b.cost[0, 0] == 1.0 + 20.0 and b.cost[2, 1] == 20.0 + 1.0
    assert not b.exact[0][2, 2] and b.cost[2, 2] == 2.0


def _tied_chain() -> taps.Graph:
    # relu1 reads relu0, the two tied: their edge is one operator's choice on both ends.
    g = taps.Graph(name="tied chain")
    x = g.input("x", (8, 8), requires_grad=True)
    h = g.relu("relu1", g.relu("relu0", g.linear("fc0", x, 8)))
    g.linear("fc1", h, 4)
    g.tie([["relu0"], ["relu1"]])
    return g


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(small_graphs(), st.just(_tied_chain())),
    st.sampled_from(CLUSTERS),
    st.integers(1, 40),
    st.floats(1.0, 1.5),
    st.data(),
)
def test_nearest_pairs_are_the_least_min_marginals(graph, shape, count, slack, data):
    # Against every assignment priced on the bounded tables (tied operators alike, those the
    # reductions leave to the solver at the given choice): the pairs are those still bounds
    # whose least completion is under the upper bound, least first, and none left out is less.
    cluster = taps.Cluster(*shape)  # latency and replicas' own transfers: bounds under costs
    assume(small_enough(graph, cluster, 20_000))
    made, bounds = tables._Bound.__init__, {}

    def record(self, cost, *rest):
        made(self, cost, *rest)
        bounds[id(cost)] = self

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tables._Bound, "__init__", record)
        bounded = build_tables(graph, cluster, OPTIMAL, bounded=True)
    names = list(bounded.ops)
    choice = {n: data.draw(st.integers(0, len(bounded.ops[n].candidates) - 1)) for n in names}
    rep = {n: n for n in names}
    for group in graph.tied:
        for position, first in enumerate(group[0]):
            for instance in group[1:]:
                rep[instance[position]] = first
    choice = {n: choice[rep[n]] for n in names}
    problem = bounded.problem()
    folded = Ties.of(names, graph.tied).fold([problem])[0] if graph.tied else problem
    held = {v for p in reduce([folded], list(folded.node_cost)).cores[0].pairs for v in (p.u, p.w)}
    free = [n for n in names if rep[n] == n]
    want = {k: np.full(b.cost.shape, np.inf) for k, b in bounds.items()}
    optimum = np.inf
    for picked in itertools.product(*(range(len(bounded.ops[n].candidates)) for n in free)):
        assignment = dict(zip(free, picked, strict=True))
        assignment = {n: assignment[rep[n]] for n in names}
        cost = problem.evaluate(assignment)
        optimum = min(optimum, cost)
        if any(assignment[v] != choice[v] for v in held):
            continue
        for e in bounded.edges:
            i = e.source_class[assignment[e.edge.producer]]
            j = e.target_class[assignment[e.edge.consumer]]
            want[id(e.cost)][i, j] = min(want[id(e.cost)][i, j], cost)
    upper = optimum * slack
    least = tables._least(problem, bounded.edges, choice, graph.tied)
    got = tables._nearest(least, bounds, upper, count)
    tol = 1e-9 * max(optimum, 1e-30)
    values = [want[id(b.cost)][i, j] for b, i, j in got]
    event(f"returned {min(len(got), 3)}, tied {bool(graph.tied)}")
    assert len(set((id(b), i, j) for b, i, j in got)) == len(got) <= count
    assert all(b.inexact(i, j) for b, i, j in got)
    assert all(v < upper + tol for v in values)
    assert all(x <= y + tol for x, y in itertools.pairwise(values))
    returned = {(id(b.cost), i, j) for b, i, j in got}
    left = [
        want[k][i, j]
        for k, b in bounds.items()
        for i, j in zip(*np.nonzero(~(b.exact[0] & b.exact[1])))
        if (k, i, j) not in returned and want[k][i, j] < upper - tol
    ]
    if len(got) < count:
        assert not left
    elif left:
        assert min(left) >= values[-1] - tol


def test_spare_pairs_price_both_directions_of_the_chosen_pairs():
    a, b = taps.Layout([8, 8], [8], [0, -1]), taps.Layout([8, 8], [8], [-1, 0])
    c, d = taps.Layout([8, 8], [8], [-1, -1]), taps.Layout([8, 8], [2, 4], [0, 1])
    parts = [np.array([[1.0]]), np.array([[2.0]])]
    exact = [np.array([[False]]), np.array([[False]])]
    edge = tables._Bound(
        np.array([[3.0]]), [(a, c)], [(b, d)], True, 4.0, parts, exact, *_unbounded((1, 1))
    )
    calls = []

    def price(sources, targets, sizes):
        calls.append(list(zip(sources, targets, sizes, strict=True)))
        return np.array([10.0, 20.0][: len(sources)]), np.ones(len(sources), dtype=bool)

    assert tables._refine([(edge, {(0, 0)})], price, 5)
    assert calls == [[(a, b, 4.0), (d, c, 4.0)]]
    assert edge.cost[0, 0] == 30.0
    assert not tables._refine([(edge, {(0, 0)})], price, 5)


def test_pair_costs_refuse_lists_of_other_lengths():
    layout = taps.Layout([8, 8], [8], [0, -1])
    with pytest.raises(taps.TapsError, match="one of each per pair"):
        redistribution_pair_costs([layout], [layout], [2.0, 2.0], taps.Cluster(2, 4))
    with pytest.raises(taps.LayoutError):
        redistribution_pair_costs(
            [layout], [taps.Layout([4], [8], [-1])], [2.0], taps.Cluster(2, 4), planner="optimal"
        )


def test_bounds_refuse_the_volume_model():
    layout = taps.Layout([8, 8], [8], [0, -1])
    with pytest.raises(taps.TopologyError):
        taps.redistribution_bounds([layout], [layout], taps.Cluster(2, 4), model="volume")


@pytest.mark.parametrize("label", ["AlexNet, 8 ", "AlexNet, 16 ", "Megatron-LM 1T"])
@pytest.mark.parametrize("cheap_pairs", [1, tables.CHEAP_PAIRS])
def test_paper_cases_bounded_equals_full(label, cheap_pairs, monkeypatch):
    # Cheap bounds on every call (the full ones where a pair can matter) or on large calls only.
    monkeypatch.setattr(tables, "CHEAP_PAIRS", cheap_pairs)
    (case,) = [
        t
        for t in timing_cases(False)
        if f"{t.label}, {t.nodes * DEVICES_PER_NODE} devices".startswith(label)
    ]
    graph = taps.models.by_name(case.model)
    cluster = taps.Cluster(case.nodes, DEVICES_PER_NODE, device_memory=float("inf"))
    result = taps.search(graph, cluster, OPTIMAL)
    full = build_tables(graph, cluster, OPTIMAL)
    solution = solve(full, None)
    assert result.cost == full.evaluate(solution.choice)
    assert result.plan.strategies == full.strategies(solution.choice)
    # Every pair's bound on the real layouts (ops outside the search, reshapes, partial sums)
    # lies under its cost, and it is more than nothing wherever Algorithm 1 moves something.
    bounded = build_tables(graph, cluster, OPTIMAL, bounded=True)
    for b, e in zip(bounded.edges, full.edges, strict=True):
        assert (b.cost <= e.cost).all()
        assert (b.cost[e.cost > 0] > 0).all()


@pytest.mark.parametrize("label", ["AlexNet, 8 ", "AlexNet, 16 "])
@pytest.mark.parametrize("entries", [1, 100])
def test_paper_cases_with_spare_pairs_find_the_full_tables_optimum(label, entries):
    # Rounds that price many spare pairs (every pair of the chosen pairs' rows and columns under
    # their cost, or one per 100 entries) still end on the full tables' optimum, exactly priced.
    (case,) = [
        t
        for t in timing_cases(False)
        if f"{t.label}, {t.nodes * DEVICES_PER_NODE} devices".startswith(label)
    ]
    graph = taps.models.by_name(case.model)
    cluster = taps.Cluster(case.nodes, DEVICES_PER_NODE, device_memory=float("inf"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tables, "ENTRIES_PER_SPARE_PAIR", entries)
        patch.setattr(tables, "MIN_SPARE", 1)
        result = taps.search(graph, cluster, OPTIMAL)
    full = build_tables(graph, cluster, OPTIMAL)
    solution = solve(full, None)
    assert result.cost == full.evaluate(solution.choice)
    choice = {
        name: full.ops[name].strategies.index(s) for name, s in result.plan.strategies.items()
    }
    assert full.evaluate(choice) == result.cost


def test_tightening_gives_the_full_bound_to_the_cheap_pairs_under_the_upper_bound():
    # A 3 x 3 training edge with cheap bounds on some pairs and directions: those whose
    # min-marginal is under the upper bound get their full bound (and its exactness) by one
    # call, each distinct directed pair once; the rest keep theirs.
    layouts = [taps.Layout([8, 8], [8], [0, -1]), taps.Layout([8, 8], [8], [-1, 0])]
    layouts.append(taps.Layout([8, 8], [2, 4], [0, 1]))
    rows = [(x, x) for x in layouts]
    parts = [np.ones((3, 3)), np.full((3, 3), 2.0)]
    exact = [np.zeros((3, 3), dtype=bool), np.zeros((3, 3), dtype=bool)]
    upper, cheap = _unbounded((3, 3))
    cheap[0][[0, 1, 2], [0, 1, 2]] = True  # the diagonal's forward
    cheap[1][0, 2] = cheap[1][2, 0] = True
    b = tables._Bound(np.full((3, 3), 3.0), rows, rows, True, 2.0, parts, exact, upper, cheap)
    least = np.array([[1.0, 5.0, 2.0], [5.0, 9.0, 5.0], [4.0, 5.0, 3.0]])
    calls = []

    def price(sources, targets, sizes):
        calls.append(list(zip(sources, targets, sizes, strict=True)))
        return np.array([10.0, 20.0, 30.0, 40.0][: len(sources)]), np.array([False, True, False])

    tables._tighten({id(b.cost): least}, {id(b.cost): b}, 4.0, price)
    # Under 4: (0, 0) and (2, 2) forward, (0, 2) backward; (1, 1) at 9 and (2, 0) at 4 are not.
    assert calls == [
        [
            (layouts[0], layouts[0], 2.0),
            (layouts[2], layouts[2], 2.0),
            (layouts[2], layouts[0], 2.0),
        ]
    ]
    assert b.cost[0, 0] == 10.0 + 2.0 and b.cost[2, 2] == 20.0 + 2.0 and b.cost[0, 2] == 1.0 + 30.0
    assert b.exact[0][2, 2] and not b.exact[0][0, 0] and not b.exact[1][0, 2]
    assert not b.cheap[0][0, 0] and b.cheap[0][1, 1] and b.cheap[1][2, 0]
    assert b.cost[1, 1] == 3.0 and b.cost[2, 0] == 3.0
    tables._tighten({id(b.cost): least}, {id(b.cost): b}, 4.0, price)
    assert len(calls) == 1  # nothing left under it


def test_tightening_takes_the_least_min_marginals_first_up_to_its_cap(monkeypatch):
    # The same edge, all its pairs cheap in both directions, with at most three directed class
    # pairs a round: the three of least min-marginal under the upper bound, a tie at the cut
    # broken by the order the tables are read (the forward first, then by row).
    layouts = [taps.Layout([8, 8], [8], [0, -1]), taps.Layout([8, 8], [8], [-1, 0])]
    rows = [(x, x) for x in layouts]
    parts = [np.ones((2, 2)), np.full((2, 2), 2.0)]
    exact = [np.zeros((2, 2), dtype=bool), np.zeros((2, 2), dtype=bool)]
    upper, _ = _unbounded((2, 2))
    cheap = [np.ones((2, 2), dtype=bool), np.ones((2, 2), dtype=bool)]
    b = tables._Bound(np.full((2, 2), 3.0), rows, rows, True, 2.0, parts, exact, upper, cheap)
    least = np.array([[3.0, 1.0], [2.0, 9.0]])  # (1, 1) over the upper bound
    calls = []

    def price(sources, targets, sizes):
        calls.append(list(zip(sources, targets, sizes, strict=True)))
        return np.full(len(sources), 10.0), np.zeros(len(sources), dtype=bool)

    monkeypatch.setattr(tables, "TIGHTEN_PAIRS", 3)
    tables._tighten({id(b.cost): least}, {id(b.cost): b}, 4.0, price)
    # 1 and 1 (both directions of (0, 1)), then 2 forward of (1, 0) before its backward.
    assert b.cheap[0].tolist() == [[True, False], [False, True]]
    assert b.cheap[1].tolist() == [[True, False], [True, True]]
    assert calls == [[(layouts[0], layouts[1], 2.0), (layouts[1], layouts[0], 2.0)]]
    tables._tighten({id(b.cost): least}, {id(b.cost): b}, 4.0, price)
    # Then the rest under the upper bound: (1, 0) backward, (0, 0) both ways.
    assert b.cheap[0].tolist() == [[False, False], [False, True]]
    assert b.cheap[1].tolist() == [[False, False], [False, True]]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    small_graphs(),
    st.sampled_from(CLUSTERS),
    st.sampled_from([0.0, 0.3, 0.9, 1.0]),
    st.sampled_from([0.0, 0.01, 1.0, np.inf]),
    st.sampled_from([1, tables.CHEAP_PAIRS]),
    st.sampled_from([1, tables.TIGHTEN_PAIRS]),
)
def test_lazy_rounds_on_weak_cheap_bounds_find_the_full_tables_optimum(
    graph, shape, scale, band, cheap_pairs, tighten_pairs
):
    # Cheap bounds made weaker (down to nothing) on every call or the large ones, and the band of
    # pairs given their full bounds from none to all under the upper bound, one pair a round or
    # many: still the full tables' optimum, exactly priced.
    cluster = paper_cluster(*shape)
    assume(small_enough(graph, cluster, 200_000))
    kernel = tables.redistribution_table_bounds

    def weak(*args, **kwargs):
        bound, exact, paper = kernel(*args, **kwargs)
        return np.where(exact, bound, bound * scale), exact, paper

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tables, "redistribution_table_bounds", weak)
        patch.setattr(tables, "LAZY_BAND", band)
        patch.setattr(tables, "CHEAP_PAIRS", cheap_pairs)
        patch.setattr(tables, "TIGHTEN_PAIRS", tighten_pairs)
        result = taps.search(graph, cluster, OPTIMAL)
    _is_the_full_tables_optimum(result, graph, cluster)
