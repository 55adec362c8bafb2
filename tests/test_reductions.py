"""The exact reductions (taps.solve.reductions) against brute force over every assignment, on random
problems: multigraphs with cycles and parallel edges, layout classes shared by candidates, ties."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

import taps
from graphs_gen import pair_cost
from taps.solve import reductions
from taps.solve.reductions import PairCost, Problem, reduce


@st.composite
def problems(draw) -> Problem:
    n = draw(st.integers(1, 6))
    names = [f"v{i}" for i in range(n)]
    sizes = {v: draw(st.integers(1, 4)) for v in names}
    # Small integer costs: many ties, so the choice among equals is exercised too.
    costs = st.integers(0, 5).map(float)
    node = {v: np.array(draw(st.lists(costs, min_size=k, max_size=k))) for v, k in sizes.items()}
    pairs = []
    if n > 1:
        for _ in range(draw(st.integers(0, 9))):
            u, w = draw(st.permutations(names))[:2]
            pairs.append(pair_cost(draw, u, w, sizes, costs))
    return Problem(node, pairs)


def _brute_force(problem: Problem) -> tuple[float, dict[str, int]]:
    names = list(problem.node_cost)
    best, arg = math.inf, {}
    for c in itertools.product(*(range(len(problem.node_cost[v])) for v in names)):
        choice = dict(zip(names, c))
        cost = problem.evaluate(choice)
        if cost < best:
            best, arg = cost, choice
    return best, arg


def _check(problem: Problem) -> reductions.Reduction:
    want, _ = _brute_force(problem)
    reduction = reduce([problem], list(problem.node_cost))
    core_best, core_choice = _brute_force(reduction.cores[0])
    # The core's optimum is the whole problem's, and expanding it attains it.
    assert core_best == pytest.approx(want, abs=1e-9)
    choice = reduction.expand(core_choice)
    assert sorted(choice) == sorted(problem.node_cost)
    assert problem.evaluate(choice) == pytest.approx(want, abs=1e-9)
    assert reduction.eliminated + len(reduction.cores[0].node_cost) == len(problem.node_cost)
    return reduction


@settings(max_examples=400, deadline=None)
@given(problems())
def test_reductions_keep_the_optimum(problem):
    _check(problem)


@st.composite
def narrow_problems(draw) -> Problem:
    """Wide operators (5-7 candidates, classes of their own) and narrow ones (2) joined at
    random: series through a narrow operator between two wide ones wait (the reductions'
    other order)."""
    n = draw(st.integers(2, 6))
    names = [f"v{i}" for i in range(n)]
    sizes = {v: draw(st.sampled_from([2, 2, 5, 7])) for v in names}
    costs = st.integers(0, 5).map(float)
    node = {v: np.array(draw(st.lists(costs, min_size=k, max_size=k))) for v, k in sizes.items()}
    pairs = []
    for _ in range(draw(st.integers(1, 8))):
        u, w = draw(st.permutations(names))[:2]
        flat = draw(st.lists(costs, min_size=sizes[u] * sizes[w], max_size=sizes[u] * sizes[w]))
        cost = np.array(flat).reshape(sizes[u], sizes[w])
        pairs.append(PairCost(u, w, np.arange(sizes[u]), np.arange(sizes[w]), cost))
    return Problem(node, pairs)


@settings(max_examples=300, deadline=None)
@given(narrow_problems())
def test_reductions_through_narrow_operators_keep_the_optimum(problem):
    _check(problem)


def test_narrow_operators_between_wide_ones_wait():
    """A ring of wide operators (8 candidates) joined through narrow ones (2), the narrow ones
    first in the order: eliminated first, each would join two wide ones by an 8 x 8 pair cost;
    waiting, the wide ones go first and no pair cost made is larger than 2 x 8 (ConvNeXt and
    Swin on 8 x 8: 1,649 x 1,649 and 5,624 x 1,374 pair costs avoided). The optimum is brute
    force's."""
    rng = np.random.default_rng(0)
    ring = ["n0", "w0", "n1", "w1", "n2", "w2"]
    sizes = {v: 2 if v[0] == "n" else 8 for v in ring}
    node = {v: rng.integers(0, 5, sizes[v]).astype(float) for v in ring}
    pairs = [
        PairCost(
            u,
            w,
            np.arange(sizes[u]),
            np.arange(sizes[w]),
            rng.integers(0, 9, (sizes[u], sizes[w])).astype(float),
        )
        for u, w in zip(ring, ring[1:] + ring[:1])
    ]
    problem = Problem(node, pairs)
    reduction = _check(problem)
    made = [p for k, p in reduction.pairs.items() if k >= len(pairs)]
    assert made and max(p.cost.size for p in made) <= 2 * 8


@settings(max_examples=100, deadline=None)
@given(problems())
def test_without_series_reductions(problem):
    """With no work allowed for min-plus products, only leaves and parallel edges go."""
    saved, reductions.MAX_SERIES_WORK = reductions.MAX_SERIES_WORK, -1
    try:
        reduction = _check(problem)
    finally:
        reductions.MAX_SERIES_WORK = saved
    # Only leaves go: every operator left has zero or at least two neighbours.
    core = reduction.cores[0]
    for v in core.node_cost:
        near = {p.other(v) for p in core.pairs if v in (p.u, p.w)}
        assert len(near) != 1


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 7), st.data())
def test_trees_reduce_to_one_operator(n, data):
    """A random tree (each operator joined to an earlier one) leaves a single operator."""
    node = {f"v{i}": np.arange(3, dtype=float)[::-1] + i for i in range(n)}
    pairs = []
    for i in range(1, n):
        j = data.draw(st.integers(0, i - 1))
        cost = np.array(data.draw(st.lists(st.floats(0, 9), min_size=9, max_size=9))).reshape(3, 3)
        pairs.append(PairCost(f"v{j}", f"v{i}", np.arange(3), np.arange(3), cost))
    reduction = _check(Problem(node, pairs))
    assert len(reduction.cores[0].node_cost) == 1 and not reduction.cores[0].pairs


def _lex_brute_force(first: Problem, second: Problem) -> tuple[tuple[float, float], dict]:
    names = list(first.node_cost)
    best: tuple[float, float] = (math.inf, math.inf)
    arg: dict[str, int] = {}
    for c in itertools.product(*(range(len(first.node_cost[v])) for v in names)):
        choice = dict(zip(names, c))
        key = (first.evaluate(choice), second.evaluate(choice))
        if key < best:
            best, arg = key, choice
    return best, arg


def _recosted(problem: Problem, costs: st.SearchStrategy, data: st.DataObject) -> Problem:
    """The same operators, candidates and classes with other costs."""

    def draw(shape: tuple[int, ...]) -> np.ndarray:
        n = math.prod(shape)
        return np.array(data.draw(st.lists(costs, min_size=n, max_size=n))).reshape(shape)

    return Problem(
        {v: draw(c.shape) for v, c in problem.node_cost.items()},
        [PairCost(p.u, p.w, p.u_class, p.w_class, draw(p.cost.shape)) for p in problem.pairs],
    )


@settings(max_examples=300, deadline=None)
@given(problems(), st.data())
def test_lexicographic_reductions_keep_the_optimum(problem, data):
    """Two objectives: the least second cost among the optima of the first (integer costs, so
    the first has exact ties), the second possibly negative (a maximised cost, negated)."""
    second = _recosted(problem, st.integers(-5, 5).map(float), data)
    want, _ = _lex_brute_force(problem, second)
    reduction = reduce([problem, second], list(problem.node_cost))
    core_want, core_choice = _lex_brute_force(*reduction.cores)
    assert core_want == pytest.approx(want, abs=1e-9)
    choice = reduction.expand(core_choice)
    assert (problem.evaluate(choice), second.evaluate(choice)) == pytest.approx(want, abs=1e-9)
    if not reduction.cores[0].pairs:
        isolated = reduction.expand(reduction.isolated_choice())
        got = (problem.evaluate(isolated), second.evaluate(isolated))
        assert got == pytest.approx(want, abs=1e-9)


def test_transformer_layer_reduces_completely():
    """The residual connections of a transformer layer are series-parallel: nothing is left for
    SCIP, and the optimum is that of the full ILP."""
    graph = taps.models.gpt(hidden=256, heads=4, seq=64, batch=4)
    cluster = taps.Cluster(2, 4)
    full = taps.search(graph, cluster, options=taps.IlpOptions(reduce=False))
    reduced = taps.search(graph, cluster)
    assert reduced.ilp.operators == 0 and reduced.ilp.eliminated == len(graph.ops)
    assert reduced.cost == pytest.approx(full.cost, rel=1e-9)
    assert reduced.status == "optimal" and reduced.gap == 0


@settings(max_examples=400, deadline=None)
@given(problems(), st.floats(-3.0, 3.0))
def test_min_marginals_against_brute_force(problem, shift):
    # Fractional costs too: the pass back subtracts what was folded in.
    problem = Problem(
        {v: c + shift * np.arange(len(c)) for v, c in problem.node_cost.items()}, problem.pairs
    )
    names = list(problem.node_cost)
    nodes = reductions.min_marginals(problem, names)
    passed = reductions.pair_min_marginals(problem, names)
    if nodes is None:  # the reductions leave pair costs: nothing to compare
        assert passed is None and reduce([problem], names).cores[0].pairs
        return
    want = {v: np.full(len(c), math.inf) for v, c in problem.node_cost.items()}
    want_pairs = [np.full(p.cost.shape, math.inf) for p in problem.pairs]
    for c in itertools.product(*(range(len(problem.node_cost[v])) for v in names)):
        choice = dict(zip(names, c))
        cost = problem.evaluate(choice)
        for v, i in choice.items():
            want[v][i] = min(want[v][i], cost)
        for k, p in enumerate(problem.pairs):
            i, j = p.u_class[choice[p.u]], p.w_class[choice[p.w]]
            want_pairs[k][i, j] = min(want_pairs[k][i, j], cost)
    for v in names:
        np.testing.assert_allclose(nodes[v], want[v], rtol=0, atol=1e-9)
    # The pairs' pass gives the same nodes' min-marginals, to the bit, and each pair's.
    assert passed is not None and passed[0].keys() == nodes.keys()
    for v, m in nodes.items():
        np.testing.assert_array_equal(passed[0][v], m)
    assert len(passed[1]) == len(want_pairs)
    for got, expected in zip(passed[1], want_pairs, strict=True):
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-9)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 12), st.integers(1, 6), st.integers(1, 3), st.data())
def test_compact_merges_exactly_the_equal_rows(rows, cols, values, data):
    # Few distinct values: many equal rows; -0.0 and 0.0 are equal.
    cells = st.sampled_from([0.0, -0.0, 1.5, np.inf][: values + 1])
    matrix = np.array(data.draw(st.lists(cells, min_size=rows * cols, max_size=rows * cols)))
    matrix = matrix.reshape(rows, cols)
    classes = np.array(data.draw(st.lists(st.integers(0, rows - 1), min_size=1, max_size=8)))
    merged, distinct = reductions._compact(classes, matrix, 0)
    np.testing.assert_array_equal(distinct[merged], matrix[classes])
    # As many classes as np.unique finds distinct rows, none of them equal.
    assert len(distinct) == len(np.unique(matrix, axis=0))
    assert len(np.unique(distinct, axis=0)) == len(distinct)
    # The columns of the transposed matrix alike.
    merged_t, distinct_t = reductions._compact(classes, matrix.T, 1)
    np.testing.assert_array_equal(merged_t, merged)
    np.testing.assert_array_equal(distinct_t, distinct.T)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 12), st.integers(1, 5), st.sampled_from([(), (1,), (3,)]), st.data())
def test_group_min_is_each_class_least(members, count, width, data):
    # Rows of one number (scattered into the classes) and of several (sorted by class), as a
    # plain loop over the classes takes them; a class without members is inf.
    size = members * math.prod(width)
    cells = st.sampled_from([0.0, 1.5, -2.0, 7.0, np.inf])
    values = np.array(data.draw(st.lists(cells, min_size=size, max_size=size)))
    values = values.reshape(members, *width)
    classes = np.array(
        data.draw(st.lists(st.integers(0, count - 1), min_size=members, max_size=members)),
        dtype=np.int64,
    )
    want = np.full((count, *width), np.inf)
    for c in range(count):
        for row in values[classes == c]:
            want[c] = np.minimum(want[c], row)
    np.testing.assert_array_equal(reductions._group_min(values, classes, count), want)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 12), st.integers(1, 6), st.integers(1, 4), st.data())
def test_first_equal_is_the_first_row_of_equal_numbers(rows, cols, values, data):
    # The core's pass against comparing every earlier row, in every layout it reads in place
    # (C, Fortran, a transposed view) or copies (a strided view): -0.0 equals 0.0, a row with a
    # NaN equals no other.
    cells = st.sampled_from([1.5, 0.0, -0.0, np.inf, np.nan][: values + 1])
    matrix = np.array(data.draw(st.lists(cells, min_size=rows * cols, max_size=rows * cols)))
    matrix = matrix.reshape(rows, cols)
    want = [
        next((f for f in range(r) if np.array_equal(matrix[f], matrix[r])), r) for r in range(rows)
    ]
    wide = np.repeat(matrix, 2, axis=1)
    for layout in (matrix, np.asfortranarray(matrix), matrix.T.copy().T, wide[:, ::2]):
        assert taps._core.first_equal(layout).tolist() == want


@st.composite
def repeated_problems(draw) -> Problem:
    """A stack of copies of one random block whose copies share their arrays (as a model's
    layers share their cost tables), each joined to the next by one pair cost (also shared),
    some node costs of the copies changed so that equal and unequal inputs mix."""
    block = draw(problems())
    copies = draw(st.integers(2, 3))
    names = list(block.node_cost)
    node: dict[str, np.ndarray] = {}
    pairs: list[PairCost] = []
    link = pair_cost(draw, "a", "b", {"a": len(block.node_cost[names[-1]]), "b": 1}, st.just(0.0))
    link_cost = draw(
        st.lists(st.integers(0, 5).map(float), min_size=link.cost.size, max_size=link.cost.size)
    )
    for c in range(copies):
        for v in names:
            node[f"{v}.{c}"] = block.node_cost[v]
        for p in block.pairs:
            pairs.append(PairCost(f"{p.u}.{c}", f"{p.w}.{c}", p.u_class, p.w_class, p.cost))
    # One node of a copy differs: the same pair arrays with other node costs.
    changed = f"{names[0]}.{draw(st.integers(0, copies - 1))}"
    node[changed] = node[changed] + draw(st.integers(0, 3))
    # The copies joined: the last operator of one to the first of the next, a chain of equal
    # pair costs (first's candidates all one class: any cost per candidate of the last).
    cost = np.array(link_cost).reshape(link.cost.shape)
    first = np.zeros(len(block.node_cost[names[0]]), dtype=np.int64)
    for c in range(copies - 1):
        pairs.append(PairCost(f"{names[-1]}.{c}", f"{names[0]}.{c + 1}", link.u_class, first, cost))
    return Problem(node, pairs)


@settings(max_examples=150, deadline=None)
@given(repeated_problems())
def test_repeated_blocks_sharing_their_arrays_keep_the_optimum(problem):
    # Eliminations whose inputs are the same arrays and equal node costs are made once and
    # shared (reductions.reduce's memo): the core and the expanded choice stay exact.
    if math.prod(len(c) for c in problem.node_cost.values()) > 5000:
        return
    _check(problem)


@settings(max_examples=300, deadline=None)
@given(st.one_of(problems(), repeated_problems()), st.integers(1, 2), st.data())
def test_reductions_taken_again_are_those_found_afresh(problem, count, data):
    """reduce_again on the same form with other costs (one or two objectives) gives what reduce
    gives, to the last digit, where every step is a leaf or a fixed operator; None otherwise."""
    order = list(problem.node_cost)
    like = reduce([problem] * count, order)
    floats = st.integers(0, 5).map(float) | st.floats(0, 9)
    costs = [_recosted(problem, floats, data) for _ in range(count)]
    again = reductions.reduce_again(costs, order, like)
    fresh = reduce(costs, order)
    if any(isinstance(s, (reductions._Merge, reductions._Series)) for s in like.steps):
        assert again is None
        event("a merge or a series: reduced afresh")
        return
    assert again is not None
    event("taken again")
    assert [(type(s), s.v) for s in again.steps] == [(type(s), s.v) for s in fresh.steps]
    for got, want in zip(again.cores, fresh.cores, strict=True):
        assert list(got.node_cost) == list(want.node_cost)
        for v, c in want.node_cost.items():
            assert np.array_equal(got.node_cost[v], c)
        assert len(got.pairs) == len(want.pairs)
        for p, q in zip(got.pairs, want.pairs, strict=True):
            assert (p.u, p.w) == (q.u, q.w) and np.array_equal(p.cost, q.cost)
    if count == 1:
        # Any choice of the core's operators expands alike (drawn: the core of a repeated
        # problem can be too large to search for its optimum).
        core = fresh.cores[0].node_cost
        core_choice = {v: data.draw(st.integers(0, len(c) - 1)) for v, c in core.items()}
        assert again.expand(core_choice) == fresh.expand(core_choice)
    # The next round takes again the round before's steps, which carry which of their classes
    # are in order (their leaves then fold and choose without gathering by them): the same.
    later = [_recosted(problem, floats, data) for _ in range(count)]
    twice = reductions.reduce_again(later, order, again)
    assert twice is not None
    fresh = reduce(later, order)
    _same_reduction(twice, fresh)
    leaves = [s for s in twice.steps if isinstance(s, reductions._Leaf)]
    if any(s.ordered is not None and any(s.ordered) for s in leaves):
        event("a leaf's classes in order")
    if count == 1:
        core = fresh.cores[0].node_cost
        core_choice = {v: data.draw(st.integers(0, len(c) - 1)) for v, c in core.items()}
        assert twice.expand(core_choice) == fresh.expand(core_choice)
    # Another form (another order, another class of a candidate) is reduced afresh.
    if len(order) > 1:
        assert reductions.reduce_again(costs, order[::-1], like) is None
    if problem.pairs:
        p = problem.pairs[0]
        pairs = [replace(p, u_class=np.zeros_like(p.u_class)), *problem.pairs[1:]]
        other = Problem(dict(problem.node_cost), pairs)
        taken = reductions.reduce_again([other] * count, order, like)
        assert (taken is None) == bool(p.u_class.any())


@st.composite
def chains(draw) -> Problem:
    """A chain of operators (reduced by leaves alone), each pair's classes of either end its
    candidates in order or drawn (a class per candidate, some shared)."""
    sizes = draw(st.lists(st.integers(1, 5), min_size=2, max_size=6))
    costs = st.integers(0, 5).map(float)
    names = [f"v{i}" for i in range(len(sizes))]

    def classes(n: int) -> np.ndarray:
        if draw(st.booleans()):
            return np.arange(n)
        drawn = draw(st.lists(st.integers(0, n - 1), min_size=n, max_size=n))
        return np.unique(drawn, return_inverse=True)[1].reshape(-1)

    node = {
        v: np.array(draw(st.lists(costs, min_size=n, max_size=n))) for v, n in zip(names, sizes)
    }
    pairs = []
    for (u, m), (w, n) in itertools.pairwise(zip(names, sizes)):
        u_class, w_class = classes(m), classes(n)
        shape = (int(u_class.max()) + 1, int(w_class.max()) + 1)
        cost = np.array(draw(st.lists(costs, min_size=math.prod(shape), max_size=math.prod(shape))))
        pairs.append(PairCost(u, w, u_class, w_class, cost.reshape(shape)))
    return Problem(node, pairs)


@settings(max_examples=200, deadline=None)
@given(chains(), st.data())
def test_leaves_taken_again_round_after_round_are_those_found_afresh(problem, data):
    """Leaves taken again round after round (the optimal search's rounds on a chain), each
    round's steps carrying which of their classes are in order, reduce and choose as afresh."""
    order = list(problem.node_cost)
    like = reduce([problem], order)
    for _ in range(3):
        costs = _recosted(problem, st.integers(0, 5).map(float) | st.floats(0, 9), data)
        again = reductions.reduce_again([costs], order, like)
        assert again is not None
        fresh = reduce([costs], order)
        _same_reduction(again, fresh)
        core = fresh.cores[0].node_cost
        core_choice = {v: data.draw(st.integers(0, len(c) - 1)) for v, c in core.items()}
        assert again.expand(core_choice) == fresh.expand(core_choice)
        like = again


def _same_reduction(got: reductions.Reduction, want: reductions.Reduction) -> None:
    assert [(type(s), getattr(s, "v", None)) for s in got.steps] == [
        (type(s), getattr(s, "v", None)) for s in want.steps
    ]
    for a, b in zip(got.cores, want.cores, strict=True):
        assert list(a.node_cost) == list(b.node_cost)
        assert all(np.array_equal(a.node_cost[v], c) for v, c in b.node_cost.items())
        assert [(p.u, p.w) for p in a.pairs] == [(q.u, q.w) for q in b.pairs]
        assert all(np.array_equal(p.cost, q.cost) for p, q in zip(a.pairs, b.pairs, strict=True))


@settings(max_examples=300, deadline=None)
@given(st.one_of(problems(), repeated_problems()), st.data())
def test_products_kept_across_rounds_reduce_as_afresh(problem, data):
    """A reduction given the last round's products (the optimal search's rounds: some pair
    costs changed, the others equal) is the fresh reduction of the new costs, step for step and
    to the last digit, and its core's optimum expands to the new problem's optimum."""
    # Every product hashed, so that the small problems drawn here do take the memo.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reductions, "MEMO_RATIO", 0)
        _reduce_in_rounds(problem, data)


def _reduce_in_rounds(problem: Problem, data: st.DataObject) -> None:
    order = list(problem.node_cost)
    products = reductions.Products()
    reduce([problem], order, products=products)
    fresh_costs = _recosted(problem, st.integers(0, 5).map(float), data)
    kept = data.draw(
        st.lists(st.booleans(), min_size=len(problem.pairs), max_size=len(problem.pairs))
    )
    pairs = [
        p if keep else q for p, q, keep in zip(problem.pairs, fresh_costs.pairs, kept, strict=True)
    ]
    changed = Problem(dict(problem.node_cost), pairs)
    products.next_round()
    again = reduce([changed], order, products=products)
    fresh = reduce([changed], order)
    _same_reduction(again, fresh)
    if math.prod(len(c) for c in changed.node_cost.values()) <= 5000:
        want, _ = _brute_force(changed)
        _, core_choice = _brute_force(again.cores[0])
        assert changed.evaluate(again.expand(core_choice)) == pytest.approx(want, abs=1e-9)


def test_products_take_the_last_round_only_for_equal_operands(monkeypatch):
    monkeypatch.setattr(reductions, "MEMO_RATIO", 0)
    rng = np.random.default_rng(0)
    x, y = rng.random((3, 4)), rng.random((4, 5))
    products = reductions.Products()
    first = products(x, y)
    assert np.array_equal(first, reductions.min_plus_one(x, y))
    products.next_round()
    # Equal values in other arrays: the last round's product; changed values: computed anew.
    assert products(x.copy(), y.copy()) is first
    z = y.copy()
    z[1, 2] -= 1.0
    assert np.array_equal(products(x, z), reductions.min_plus_one(x, z))
    # A product the round just ended did not ask for is forgotten.
    products.next_round()
    products.next_round()
    assert products(x, y) is not first


def _same_marginals(got, want) -> None:
    assert (got is None) == (want is None)
    if got is None:
        return
    assert got[0].keys() == want[0].keys()
    for v, m in want[0].items():
        np.testing.assert_array_equal(got[0][v], m)
    assert len(got[1]) == len(want[1])
    for a, b in zip(got[1], want[1], strict=True):
        np.testing.assert_array_equal(a, b)


@settings(max_examples=300, deadline=None)
@given(st.one_of(problems(), repeated_problems()), st.data())
def test_pair_min_marginals_sharing_eliminations_and_products_are_the_fresh_ones(problem, data):
    """The optimal search's spare pairs (tables._nearest), two rounds: the pair min-marginals of
    the problem with some operators fixed, its reductions taking the eliminations of the whole
    problem's (the same arrays elsewhere) and the products kept from the round before (some pair
    costs changed in place since), are those computed afresh, to the bit."""
    order = list(problem.node_cost)
    products = reductions.Products()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reductions, "MEMO_RATIO", 0)  # every product kept
        for _ in range(2):
            memo: reductions.Memo = {}
            whole = reduce([problem], order, products=products, memo=memo)
            one = {
                v: data.draw(st.integers(0, len(c) - 1))
                for v, c in problem.node_cost.items()
                if data.draw(st.booleans())
            }
            fixed = problem.fixed(one)
            got = reductions.pair_min_marginals(fixed, order, products, memo)
            products.next_round()
            _same_marginals(got, reductions.pair_min_marginals(fixed, order))
            assert whole.cores  # alive until here: its arrays keep their addresses
            # The next round: some pair costs priced anew, in place.
            for p in problem.pairs:
                if data.draw(st.booleans()):
                    p.cost[...] = np.array(
                        data.draw(
                            st.lists(
                                st.integers(0, 5).map(float),
                                min_size=p.cost.size,
                                max_size=p.cost.size,
                            )
                        )
                    ).reshape(p.cost.shape)


def test_eliminations_shared_with_the_whole_problem_see_the_fixed_operators():
    """``d`` a leaf of ``v`` in the whole problem, fixed in the other: ``v``'s series between the
    same arrays then has other node costs, so it is not the whole problem's (a memo keyed by the
    arrays alone would take it)."""
    rng = np.random.default_rng(1)
    names = ["d", "v", "a", "b"]
    node = {v: rng.integers(0, 5, 3).astype(float) for v in names}

    def pair(u: str, w: str) -> PairCost:
        return PairCost(u, w, np.arange(3), np.arange(3), rng.integers(0, 5, (3, 3)).astype(float))

    problem = Problem(node, [pair("d", "v"), pair("a", "v"), pair("v", "b"), pair("a", "b")])
    memo: reductions.Memo = {}
    whole = reduce([problem], names, memo=memo)
    assert [type(s).__name__ for s in whole.steps][:2] == ["_Leaf", "_Series"]
    fixed = problem.fixed({"d": 2})
    got = reductions.pair_min_marginals(fixed, names, None, memo)
    _same_marginals(got, reductions.pair_min_marginals(fixed, names))
