"""Variable elimination (taps.solve.elimination) against brute force over every assignment, on
random problems denser than series-parallel ones (complete graphs, parallel pair costs, shared
classes), and the search through it against the plain ILP on graphs the reductions leave a core
of."""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import taps
from graphs_gen import inception, pair_cost, skip_ladder, small_cores, small_enough
from taps import Pricing
from taps.search.tables import build_tables
from taps.solve import elimination
from taps.solve.elimination import KERNEL_SPEEDUP, elimination_order
from taps.solve.pipeline import solve
from taps.solve.reductions import PairCost, Problem, reduce


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
        pairs.append(pair_cost(draw, u, w, sizes, costs))
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
    elimination = elimination_order(problem)
    assert elimination is not None
    choice, cost = elimination.solve()
    assert set(choice) == set(problem.node_cost)
    assert all(0 <= choice[v] < len(c) for v, c in problem.node_cost.items())
    want = _brute_force(problem)
    assert cost == pytest.approx(want, abs=1e-9)
    # The choice attains the optimum it reports.
    assert problem.evaluate(choice) == pytest.approx(want, abs=1e-9)


@pytest.mark.parametrize("seed", range(4))
def test_min_plus_steps_in_blocks_equal_brute_force(seed, monkeypatch):
    """Steps whose factors fall into two groups of operators are min-plus products, a block of
    the eliminated operator's choices at a time: with blocks of one or two choices (a tiny
    chunk) the optimum is brute force's. Six operators of 4 candidates: a ring with chords, so
    that some steps join tables over several operators and some do not."""
    monkeypatch.setattr(elimination, "_CHUNK", 7)
    rng = np.random.default_rng(seed)
    names = [f"v{i}" for i in range(6)]
    node = {v: rng.random(4) for v in names}
    joined = [(names[i], names[(i + 1) % 6]) for i in range(6)] + [("v0", "v3"), ("v1", "v4")]
    pairs = [
        PairCost(u, w, rng.integers(0, 3, 4), rng.integers(0, 4, 4), rng.random((3, 4)))
        for u, w in joined
    ]
    problem = Problem(node, pairs)
    order = elimination_order(problem)
    assert order is not None
    choice, cost = order.solve()
    want = _brute_force(problem)
    assert cost == pytest.approx(want, abs=1e-12)
    assert problem.evaluate(choice) == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("row_terms", [1, 2])
@pytest.mark.parametrize("zeros", [False, True])
def test_min_plus_step_is_numpys_sums_to_the_bit(row_terms, zeros):
    """A min-plus step, whose sides of one term go to the kernel as they are (the eliminated
    operator's costs as its shift), gives numpy's ``best + row terms`` plus ``0.0 + column
    terms``, least over the eliminated operator, to the bit: with random costs, and with every
    cost -0.0 (numpy's sum is +0.0 there, a term taken as it is would leave -0.0)."""
    rng = np.random.default_rng(row_terms)
    k, a, b = 20, 30, 6

    def cost(*shape):
        # Magnitudes apart: sums in another order round differently.
        return (
            np.full(shape, -0.0)
            if zeros
            else rng.random(shape) * 10.0 ** rng.integers(-3, 4, shape)
        )

    best = cost(k)
    rows = [cost(k, a) for _ in range(row_terms)]
    col = cost(k, b)
    terms = [([0, 1], t) for t in rows] + [([0, 2], col)]
    got = elimination._min_plus_step(
        best, terms, [k, a, b], ([1], [2]), None, elimination.Products()
    )
    x = best[:, None]
    for t in rows:
        x = x + t
    want = (x[:, :, None] + (np.zeros((k, 1, 1)) + col[:, None, :])).min(axis=0)
    assert got.shape == want.shape and got.tobytes() == want.tobytes()


def _complete(operators: int, choices: int, seed: int) -> Problem:
    """``operators`` of ``choices`` candidates each, every two joined, random costs."""
    rng = np.random.default_rng(seed)
    names = [f"v{i}" for i in range(operators)]
    node = {v: rng.random(choices) for v in names}
    pairs = [
        PairCost(u, w, np.arange(choices), np.arange(choices), rng.random((choices, choices)))
        for u, w in itertools.combinations(names, 2)
    ]
    return Problem(node, pairs)


def test_budget_refuses_wide_tables():
    """Five operators of 30 candidates, all joined: the first step of any order builds a table
    over four of them (30^4 entries) from 30 choices of the fifth, four tables each."""
    problem = _complete(5, 30, seed=0)
    assert elimination_order(problem, max_table=30**4 - 1) is None
    # The first step's four pair costs each join one other operator: one min-plus product, its
    # entries counted at the kernel's rate.
    assert elimination_order(problem, max_work=30**5 / KERNEL_SPEEDUP - 1) is None
    elimination = elimination_order(problem)
    assert elimination is not None and elimination.largest == 30**4


def test_equal_work_goes_to_the_smaller_table():
    """``a`` (2 choices) joined to ``b`` (8): eliminating either is 16 entries of work, ``a``
    leaving a table over ``b``'s 8 choices, ``b`` one over ``a``'s 2. ``b`` goes first, though
    ``a`` comes first in the problem: the rotary core of DeepSeek-V3's MLA (its ``sub`` and
    ``add``, 1,303 candidates each) took 4.8 s so, 8.2 s in the problem's order, which built a
    table of 1,303 x 139 x 139 where 139^3 would do."""
    rng = np.random.default_rng(1)
    node = {"a": rng.random(2), "b": rng.random(8)}
    problem = Problem(node, [PairCost("a", "b", np.arange(2), np.arange(8), rng.random((2, 8)))])
    elimination = elimination_order(problem)
    assert elimination is not None
    assert elimination.order[0] == "b"
    assert elimination.largest == 2
    solved = elimination.solve()
    assert solved is not None
    assert solved[1] == pytest.approx(_brute_force(problem), abs=1e-12)


def test_a_core_beyond_the_numpy_budget_is_eliminated_when_scip_would_be_slower(monkeypatch):
    """The pipeline eliminates a core whose estimated work is past ``MAX_WORK`` when it stays
    within ``WORK_PER_FLOW`` per flow of the ILP (SCIP would take longer): the same optimum as
    brute force, and no ILP built."""
    problem = _complete(4, 6, seed=2)
    estimate = elimination_order(problem)
    assert estimate is not None
    # The numpy budget as it capped the pipeline's (raising=False: the pipeline no longer reads
    # it, which is what this test checks).
    monkeypatch.setattr("taps.solve.pipeline.MAX_WORK", estimate.work / 2, raising=False)

    def no_ilp(*args, **kwargs):
        raise AssertionError("the ILP was built")

    monkeypatch.setattr("taps.solve.pipeline.solve_ilp", no_ilp)
    solution = solve(_Instance(problem))
    assert problem.evaluate(solution.choice) == pytest.approx(_brute_force(problem), abs=1e-12)


@dataclass
class _Instance:
    """A problem as :func:`taps.solve.pipeline.solve` takes it: one layer, no memory, no ties."""

    of: Problem
    layers: int = 1
    tied: tuple = ()

    def problem(self) -> Problem:
        return self.of

    @property
    def memory_per_op(self) -> dict[str, np.ndarray]:
        return {v: np.zeros(len(c)) for v, c in self.of.node_cost.items()}


def _game_work(problem: Problem, order: Sequence[str]) -> float:
    """The work of an elimination order as the elimination game counts it: eliminating an
    operator joins its neighbours, and costs its candidates times theirs."""
    sizes = {v: len(c) for v, c in problem.node_cost.items()}
    joined: dict[str, set[str]] = {v: set() for v in sizes}
    for p in problem.pairs:
        if p.u != p.w:
            joined[p.u].add(p.w)
            joined[p.w].add(p.u)
    work = 0.0
    for v in order:
        near = joined.pop(v)
        work += sizes[v] * math.prod(sizes[u] for u in near)
        for u in near:
            joined[u] |= near - {u}
            joined[u].discard(v)
    return work


@st.composite
def graphs(draw) -> Problem:
    """Up to 7 operators of 1-6 candidates, random pairs (costs irrelevant to the order)."""
    n = draw(st.integers(1, 7))
    names = [f"v{i}" for i in range(n)]
    node = {v: np.zeros(draw(st.integers(1, 6))) for v in names}
    every = list(itertools.combinations(names, 2))
    joined = draw(st.lists(st.sampled_from(every), unique=True)) if every else []
    pairs = [
        PairCost(
            u,
            w,
            np.arange(len(node[u])),
            np.arange(len(node[w])),
            np.zeros((len(node[u]), len(node[w]))),
        )
        for u, w in joined
    ]
    return Problem(node, pairs)


@settings(max_examples=200, deadline=None)
@given(graphs())
def test_exact_order_is_the_least_work_of_every_order(problem):
    """The dynamic programme over sets against every permutation, each counted by the
    elimination game (a second count, by fill-in edges rather than parts of the graph)."""
    order = elimination._exact_order(problem, math.inf)
    assert order is not None and sorted(order) == sorted(problem.node_cost)
    least = min(_game_work(problem, p) for p in itertools.permutations(problem.node_cost))
    assert _game_work(problem, order) == least
    # Under a table limit: the least work of the orders that keep within it.
    limit = min(
        max(
            math.prod(len(problem.node_cost[u]) for u in near)
            for near in _neighbourhoods(problem, p)
        )
        for p in itertools.permutations(problem.node_cost)
    )
    order = elimination._exact_order(problem, limit)
    assert order is not None
    assert (
        max(
            math.prod(len(problem.node_cost[u]) for u in near)
            for near in _neighbourhoods(problem, order)
        )
        <= limit
    )
    if limit > 1:
        assert elimination._exact_order(problem, limit - 1) is None


def _neighbourhoods(problem: Problem, order: Sequence[str]) -> list[set[str]]:
    """The neighbours of each operator when the elimination game eliminates it."""
    joined: dict[str, set[str]] = {v: set() for v in problem.node_cost}
    for p in problem.pairs:
        joined[p.u].add(p.w)
        joined[p.w].add(p.u)
    out = []
    for v in order:
        near = joined.pop(v)
        out.append(set(near))
        for u in near:
            joined[u] |= near - {u}
            joined[u].discard(v)
    return out


def test_exact_order_beats_the_greedy_on_a_cycle_of_wide_operators():
    """DeBERTa-v2's attention core on 8 x 8 in shape: narrow operators (9-11 candidates) joined
    to a cycle of wide ones (220-492), where the greedy order's first cheap steps join the wide
    ones into large tables. The order searched over sets fits the budget, the greedy's does not,
    and elimination along it equals the greedy order's optimum (both exact)."""
    rng = np.random.default_rng(1)
    sizes = {"e": 11, "l": 11, "q": 92, "k": 92, "v": 92, "o": 11, "t": 220, "t2": 220}
    sizes |= {"m": 492, "m2": 492, "m3": 492, "m4": 492, "a2": 9, "a3": 9}
    edges = [("e", "q"), ("q", "t"), ("e", "k"), ("k", "t2"), ("e", "v"), ("t", "m")]
    edges += [("t", "m2"), ("t2", "m3"), ("m", "a3"), ("a2", "a3"), ("e", "o"), ("l", "q")]
    edges += [("l", "k"), ("l", "v"), ("v", "m4"), ("t2", "m"), ("a2", "m2"), ("a2", "m3")]
    edges += [("m4", "a3"), ("m3", "m2"), ("o", "m4"), ("l", "o")]
    # Few distinct costs per row, as layout classes give: tables compact.
    node = {v: rng.integers(0, 4, n).astype(float) for v, n in sizes.items()}
    pairs = [
        PairCost(
            u,
            w,
            np.arange(sizes[u]),
            np.arange(sizes[w]),
            rng.integers(0, 3, (sizes[u], 1)) + rng.integers(0, 3, (1, sizes[w])).astype(float),
        )
        for u, w in edges
    ]
    problem = Problem(node, pairs)
    assert elimination._greedy(problem).work > elimination.MAX_WORK
    chosen = elimination_order(problem)
    assert chosen is not None and chosen.work <= elimination.MAX_WORK
    solved = chosen.solve()
    assert solved is not None
    assert problem.evaluate(solved[0]) == solved[1]
    greedy = elimination._greedy(problem).solve()
    assert greedy is not None and solved[1] == greedy[1]


@settings(max_examples=200, deadline=None)
@given(graphs())
def test_beam_order_as_wide_as_every_set_is_the_least_work(problem):
    """A beam that keeps every set of eliminated operators is the dynamic programme over sets:
    its order has the least work of every permutation (the elimination game's count); a beam of
    one is still an order of every operator."""
    n = len(problem.node_cost)
    order = elimination._beam_order(problem, math.inf, width=2**n)
    assert order is not None and sorted(order) == sorted(problem.node_cost)
    least = min(_game_work(problem, p) for p in itertools.permutations(problem.node_cost))
    assert _game_work(problem, order) == least
    narrow = elimination._beam_order(problem, math.inf, width=1)
    assert narrow is not None and sorted(narrow) == sorted(problem.node_cost)


def _shared_weights_core(wide: int, seed: int) -> Problem:
    """ALBERT's core on 8 x 8 in shape, its wide operators (92 candidates there) of ``wide``
    candidates: two layers of one attention and MLP block whose linear operators share their
    weights (a pair cost between the two copies of each), the second layer's output joined
    back to the first's input."""
    rng = np.random.default_rng(seed)
    block = [("e", "q"), ("e", "k"), ("e", "v"), ("q", "s"), ("k", "s"), ("v", "c"), ("s", "c")]
    block += [("c", "d"), ("e", "a"), ("d", "a"), ("a", "n"), ("n", "f"), ("f", "o")]
    block += [("o", "r"), ("n", "r"), ("r", "m")]
    narrow = {"s": 6, "c": 6, "a": 5, "n": 5, "r": 5, "m": 5}
    sizes = {"e": wide} | {v: narrow.get(v, wide) for u, v in block}
    sizes |= {f"{v}2": n for v, n in sizes.items() if v != "e"}
    edges = block + [("m", f"{v}2") for u, v in block if u == "e"]
    edges += [(f"{u}2", f"{v}2") for u, v in block if u != "e"]
    edges += [(v, f"{v}2") for v in "qkvdfo"] + [("r2", "e")]
    node = {v: rng.integers(0, 4, n).astype(float) for v, n in sizes.items()}
    pairs = [
        PairCost(
            u,
            w,
            np.arange(sizes[u]),
            np.arange(sizes[w]),
            rng.integers(0, 5, (sizes[u], sizes[w])).astype(float),
        )
        for u, w in edges
    ]
    return Problem(node, pairs)


def test_beam_order_beats_the_greedy_on_layers_sharing_weights():
    """ALBERT's core: the greedy order's cheap first steps join the two layers' wide operators
    into large tables; the beam's order is estimated several times less work (ALBERT on 8 x 8:
    5.6e8 against 1.5e8), and elimination along it has the greedy order's optimum."""
    problem = _shared_weights_core(92, 0)
    greedy = elimination._greedy(problem)
    chosen = elimination_order(problem, max_work=math.inf)
    assert chosen is not None and chosen.work * 3 < greedy.work
    small = _shared_weights_core(12, 1)
    order = elimination._beam_order(small, math.inf)
    assert order is not None
    solved = elimination._estimated(small, order).solve()
    greedy_solved = elimination._greedy(small).solve()
    assert solved is not None and greedy_solved is not None
    assert solved[1] == greedy_solved[1] == small.evaluate(solved[0])


def test_deadline_stops_the_elimination():
    problem = Problem(
        {"a": np.array([1.0, 0.0]), "b": np.array([0.0, 1.0])},
        [PairCost("a", "b", np.arange(2), np.arange(2), np.eye(2))],
    )
    elimination = elimination_order(problem)
    assert elimination is not None
    assert elimination.solve(deadline=time.perf_counter() - 1) is None
    assert elimination.solve() == ({"a": 1, "b": 0}, 0.0)


def _every_assignment(tables) -> tuple[np.ndarray, np.ndarray]:
    """The cost and the memory of every assignment: arrays with one axis per operator, each
    cost added along its axes (numpy broadcasting, no search involved)."""
    names = list(tables.ops)
    axis = {n: k for k, n in enumerate(names)}

    def along(values: np.ndarray, axes: list[int]) -> np.ndarray:
        shape = [1] * len(names)
        for a, size in zip(axes, values.shape):
            shape[a] = size
        return values.reshape(shape)

    cost = np.zeros([len(tables.ops[n].strategies) for n in names])
    memory = np.zeros_like(cost)
    for n, t in tables.ops.items():
        cost = cost + along(t.node_cost, [axis[n]])
        memory = memory + along(t.memory * tables.graph.layers, [axis[n]])
    for e in tables.edges:
        u, w = axis[e.edge.producer], axis[e.edge.consumer]
        pair = e.cost[np.ix_(e.source_class, e.target_class)]
        cost = cost + (along(pair, [u, w]) if u < w else along(pair.T, [w, u]))
    return cost, memory


def _core_pairs(tables) -> int:
    """Pair costs the series-parallel reductions leave (for elimination or SCIP)."""
    problem = tables.problem()
    return len(reduce([problem], list(problem.node_cost)).cores[0].pairs)


#: The smallest graphs whose skips the reductions cannot take apart (16 operators, 1.7 million
#: assignments on 2 devices).
TINY = [
    (skip_ladder(4, reach=3, batch=2, hidden=2), (1, 2)),
    (skip_ladder(4, reach=4, batch=4, hidden=2), (2, 1)),
]


@pytest.mark.parametrize(("graph", "shape"), TINY, ids=lambda x: getattr(x, "name", str(x)))
@pytest.mark.parametrize("cost_model", ["topology", "volume"])
def test_search_through_elimination_equals_brute_force(graph, shape, cost_model):
    """Graphs whose skips do not reduce: the reductions leave a core, elimination decides it (no
    SCIP), and the result is the least cost over every assignment."""
    cluster = taps.Cluster(*shape)
    tables = build_tables(graph, cluster, Pricing(cost_model=cost_model))
    assert _core_pairs(tables) > 0
    result = taps.search(graph, cluster, taps.Pricing(cost_model=cost_model))
    assert (result.ilp.operators, result.ilp.eliminated) == (0, len(graph.ops))
    cost, _ = _every_assignment(tables)
    assert result.status == "optimal" and result.gap == 0
    assert result.cost == pytest.approx(float(cost.min()), rel=1e-9, abs=1e-18)
    assert taps.evaluate(
        taps.Plan(graph, cluster, result.plan.strategies, taps.Pricing(cost_model=cost_model))
    ) == pytest.approx(result.cost, rel=1e-9, abs=1e-18)


@pytest.mark.parametrize(("graph", "shape"), TINY, ids=lambda x: getattr(x, "name", str(x)))
@pytest.mark.parametrize("position", [0.0, 0.3, 0.7])
def test_binding_limit_on_a_core_equals_brute_force(graph, shape, position):
    """Under a memory limit that binds, the core goes to the price and SCIP: still the optimum
    over the assignments that fit."""
    cluster = taps.Cluster(*shape)
    tables = build_tables(graph, cluster)
    cost, memory = _every_assignment(tables)
    lo, hi = float(memory.min()), float(memory.max())
    limit = lo + position * (hi - lo)
    result = taps.search(graph, cluster, memory_limit=limit)
    want = float(cost[memory <= limit * (1 + 1e-9)].min())
    assert result.memory_per_device <= limit * (1 + 1e-9)
    assert result.cost == pytest.approx(want, rel=1e-9, abs=1e-18)


MEDIUM = [
    (skip_ladder(6, reach=4, batch=64, hidden=64), (4, 4)),
    (inception(2, batch=16, channels=32, size=8), (2, 8)),
]


@pytest.mark.parametrize(("graph", "shape"), MEDIUM, ids=lambda x: getattr(x, "name", str(x)))
def test_elimination_equals_the_plain_ilp(graph, shape):
    """Too large for brute force: elimination against SCIP on the whole graph, no reductions."""
    cluster = taps.Cluster(*shape)
    assert _core_pairs(build_tables(graph, cluster)) > 0
    mine = taps.search(graph, cluster)
    assert mine.ilp.operators == 0
    plain = taps.search(graph, cluster, options=taps.IlpOptions(reduce=False))
    assert plain.status == "optimal" and plain.ilp.operators == len(graph.ops)
    assert mine.cost == pytest.approx(plain.cost, rel=1e-9)


def test_time_limit_on_a_core_returns_an_assignment_and_its_gap():
    """A limit that passes before the elimination: the solve returns the first assignment, with
    no bound (gap inf)."""
    graph, cluster = MEDIUM[1][0], taps.Cluster(*MEDIUM[1][1])
    optimum = taps.search(graph, cluster).cost
    tables = build_tables(graph, cluster)
    r = solve(tables, cluster.device_memory, 1e-9)
    assert r.status == "timelimit" and r.gap == math.inf
    cost = tables.evaluate(r.choice)
    assert cost == pytest.approx(
        taps.evaluate(taps.Plan(graph, cluster, tables.strategies(r.choice))), rel=1e-9
    )
    assert cost >= optimum * (1 - 1e-9)


@settings(max_examples=20, deadline=None)
@given(small_cores(), st.sampled_from([(1, 2), (2, 1)]), st.sampled_from(["topology", "volume"]))
def test_random_cores_equal_brute_force(graph, shape, cost_model):
    cluster = taps.Cluster(*shape)
    assume(small_enough(graph, cluster, 2_000_000))
    tables = build_tables(graph, cluster, Pricing(cost_model=cost_model))
    assume(_core_pairs(tables) > 0)
    result = taps.search(graph, cluster, taps.Pricing(cost_model=cost_model))
    assert result.ilp.operators == 0  # elimination decided the core, not SCIP
    cost, _ = _every_assignment(tables)
    assert result.cost == pytest.approx(float(cost.min()), rel=1e-9, abs=1e-18)


def _sorted_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The plain numbering of :func:`elimination._unique_rows`: numpy's ``unique`` of the rows
    as bytes, every row sorted."""
    rows = np.ascontiguousarray(rows)
    keys = rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).reshape(-1)
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    return first, inverse.reshape(-1)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 12),
    st.integers(1, 5),
    st.sampled_from([np.float64, np.int64, np.int32]),
    st.data(),
)
def test_unique_rows_numbers_rows_as_sorting_their_bytes(rows, cols, dtype, data) -> None:
    # A few distinct values (signed zeros, NaN, infinities, classes past 255) make many equal rows
    # and rows that differ only in bits; the hashed grouping must number them as the sort does.
    values = [0.0, -0.0, 1.0, -2.5, np.inf, -np.inf, np.nan, 300.0]
    if dtype is not np.float64:
        values = [0, 1, 255, 256, 300, -1]
    table = np.array(
        data.draw(st.lists(st.sampled_from(values), min_size=rows * cols, max_size=rows * cols)),
        dtype=dtype,
    ).reshape(rows, cols)
    want = _sorted_rows(table)
    for got in (elimination._unique_rows(table), elimination._unique_rows(table.T.copy().T)):
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


def test_unique_rows_survives_hash_collisions(monkeypatch) -> None:
    # Every row one hash: the check sees the collision and the rows are sorted the plain way.
    table = np.random.default_rng(0).integers(0, 3, size=(40, 3)).astype(np.float64)
    monkeypatch.setattr(elimination, "row_hashes", lambda bits: np.zeros(len(bits), np.uint64))
    got = elimination._unique_rows(table)
    want = _sorted_rows(table)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4), st.integers(1, 30), st.data())
def test_joint_in_place_groups_as_the_plain_joint_in_the_largest_tables_order(
    tables, candidates, data
) -> None:
    # An eliminated operator's joint classes: the same groups of candidates as _joint's (the
    # distinct class combinations), numbered ascending by the largest table's class, then the
    # others'; a table with a combination per class is then read in its own order.
    classes = [
        np.array(data.draw(st.lists(st.integers(0, 5), min_size=candidates, max_size=candidates)))
        for _ in range(tables)
    ]
    sizes = data.draw(st.lists(st.integers(1, 100), min_size=tables, max_size=tables))
    inverse, rows = elimination._joint_in_place(classes, sizes)
    plain_inverse, plain_rows = elimination._joint(classes)
    stacked = np.stack(classes)
    np.testing.assert_array_equal(rows[:, inverse], stacked)
    # The same partition of the candidates, and every combination once.
    for i, j in itertools.combinations(range(candidates), 2):
        assert (inverse[i] == inverse[j]) == (plain_inverse[i] == plain_inverse[j])
    assert rows.shape == plain_rows.shape
    largest = sizes.index(max(sizes))
    keys = [largest, *(k for k in range(tables) if k != largest)]
    combos = [tuple(int(rows[k, c]) for k in keys) for c in range(rows.shape[1])]
    assert combos == sorted(set(combos))
