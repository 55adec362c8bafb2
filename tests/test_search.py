"""The search against brute force, and the cost model against the paper's closed forms."""

from __future__ import annotations

import itertools
import pickle
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import taps
from graphs_gen import CLUSTERS, small_enough, small_graphs
from taps import Pricing
from taps.plan.candidates import candidates
from taps.reproduce.cases import paper_cluster
from taps.search.prices import intra_collectives, memory
from taps.search.tables import build_tables
from taps.solve.pipeline import solve


def _brute_force(tables) -> float:
    """The least cost over every assignment: one array axis per operator, every cost added along
    its axes."""
    names = list(tables.ops)
    axis = {n: k for k, n in enumerate(names)}
    total = np.zeros([len(tables.ops[n].strategies) for n in names])

    def along(values: np.ndarray, axes: list[int]) -> np.ndarray:
        shape = [1] * len(names)
        for a, size in zip(axes, values.shape):
            shape[a] = size
        return values.reshape(shape)

    for n, t in tables.ops.items():
        total = total + along(t.node_cost, [axis[n]])
    for e in tables.edges:
        u, w = axis[e.edge.producer], axis[e.edge.consumer]
        pair = e.cost[np.ix_(e.source_class, e.target_class)]
        total = total + (along(pair, [u, w]) if u < w else along(pair.T, [w, u]))
    return float(total.min())


OPTIONS = [
    taps.IlpOptions(),
    taps.IlpOptions(reduce=False),
    taps.IlpOptions(prune=False, warm_start=False),
    taps.IlpOptions(formulation="pairwise", prune=False, presolve=True, reduce=False),
]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    small_graphs(),
    st.sampled_from(CLUSTERS),
    st.sampled_from(["topology", "volume"]),
    st.sampled_from(OPTIONS),
)
def test_search_equals_brute_force(graph, shape, cost_model, options):
    cluster = paper_cluster(*shape)
    assume(small_enough(graph, cluster, 200_000))
    result = taps.search(graph, cluster, taps.Pricing(cost_model=cost_model), options=options)
    tables = build_tables(graph, cluster, Pricing(cost_model=cost_model))
    assert result.status == "optimal" and result.gap == 0
    assert result.cost == pytest.approx(_brute_force(tables), rel=1e-9, abs=1e-18)
    # The cost is what the independent evaluation of the chosen strategies gives.
    assert taps.evaluate(
        taps.Plan(graph, cluster, result.plan.strategies, taps.Pricing(cost_model=cost_model))
    ) == pytest.approx(result.cost, rel=1e-9, abs=1e-18)


@settings(max_examples=40, deadline=None)
@given(small_graphs(), st.sampled_from(CLUSTERS), st.data())
def test_tables_agree_with_direct_evaluation(graph, shape, data):
    """The search's tables (batch kernel, layout classes) price any assignment exactly as the
    direct path does (plan_redistribution per edge, collectives per op)."""
    cluster = paper_cluster(*shape)
    assume(small_enough(graph, cluster))
    for cost_model in ("topology", "volume"):
        tables = build_tables(graph, cluster, Pricing(cost_model=cost_model))
        choice = {
            name: data.draw(st.integers(0, len(t.strategies) - 1)) for name, t in tables.ops.items()
        }
        strategies = {name: tables.ops[name].strategies[i] for name, i in choice.items()}
        assert tables.evaluate(choice) == pytest.approx(
            taps.evaluate(
                taps.Plan(graph, cluster, strategies, taps.Pricing(cost_model=cost_model))
            ),
            rel=1e-9,
            abs=1e-18,
        )


@settings(max_examples=25, deadline=None)
@given(small_graphs(), st.sampled_from([s for s in CLUSTERS if s[0] > 1]))
def test_topology_search_never_worse_under_topology(graph, shape):
    cluster = paper_cluster(*shape)
    assume(small_enough(graph, cluster))
    c = taps.compare(graph, cluster)
    assert c.topology.cost <= c.volume_under_topology * (1 + 1e-9)
    assert c.saving >= -1e-7


@settings(max_examples=25, deadline=None)
@given(small_graphs(), st.sampled_from([1, 2, 4, 8]))
def test_one_node_both_searches_cost_the_same(graph, devices):
    """On one node every link is an intra-node link: time is bytes over one bandwidth, so both
    searches minimise the same thing."""
    cluster = paper_cluster(1, devices)
    assume(small_enough(graph, cluster))
    c = taps.compare(graph, cluster, Pricing(compute=False))
    assert c.topology.cost == pytest.approx(c.volume_under_topology, rel=1e-9, abs=1e-18)


def test_matmul_volume_is_the_papers_formula():
    b, i, o = 64, 32, 16
    g = taps.Graph(name="matmul")
    x = g.input("x", (b, i), requires_grad=True)
    w = g.parameter("w", (i, o))
    g.einsum("mm", "bi,io->bo", x, w)
    op = g.op("mm")
    cluster = paper_cluster(1, 8)
    for cand in candidates(op, 8):
        d, r, c = cand.strategy.degrees
        want = 2 * ((d - 1) * i * o + (r - 1) * b * o + (c - 1) * b * i) / (d * r * c)
        got = sum(col.cost(cluster, "volume") for col in intra_collectives(g, op, cand))
        assert got == pytest.approx(want * 2), cand.strategy  # fp16: two bytes per element


def test_memory_limit():
    g = taps.models.mlp(batch=64, sizes=(64, 256, 64))
    cluster = paper_cluster(1, 4)
    tables = build_tables(g, cluster)
    need = g.layers * sum(float(t.memory.min()) for t in tables.ops.values())
    with pytest.raises(taps.InfeasibleError, match=re.escape(f"smallest needs {need:,.0f} bytes")):
        taps.search(g, cluster, memory_limit=need * 0.999)
    result = taps.search(g, cluster, memory_limit=need)
    assert result.memory_per_device <= need * (1 + 1e-9)
    free = taps.search(g, cluster)
    assert result.cost >= free.cost * (1 - 1e-9)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    small_graphs(),
    st.sampled_from(CLUSTERS),
    st.floats(0, 1),
    st.sampled_from(OPTIONS[:3]),
    st.sampled_from([None, 10**8]),
)
def test_memory_limited_search_equals_brute_force(graph, shape, position, options, per_parameter):
    """A limit between the least and the most memory: the optimum over the assignments that fit
    (with reductions, the unconstrained optimum is only taken when it fits). Memory in the
    billions of bytes, as for real models, must not upset SCIP's numerics."""
    cluster = paper_cluster(*shape)
    assume(small_enough(graph, cluster))
    tables = build_tables(graph, cluster, Pricing(parameter_bytes=per_parameter))
    names = list(tables.ops)

    def mem(choice):
        return graph.layers * sum(float(tables.ops[n].memory[i]) for n, i in choice.items())

    every = [
        dict(zip(names, c))
        for c in itertools.product(*(range(len(tables.ops[n].strategies)) for n in names))
    ]
    lo, hi = min(map(mem, every)), max(map(mem, every))
    limit = lo + position * (hi - lo)
    result = taps.search(
        graph,
        cluster,
        taps.Pricing(parameter_bytes=per_parameter),
        memory_limit=limit,
        options=options,
    )
    # SCIP holds the limit to 1e-9 of it: the optimum lies between those of the strict limit and
    # of the limit with that tolerance (they differ only when memories differ by less).
    tolerance = 1e-9
    strict = min(tables.evaluate(c) for c in every if mem(c) <= limit)
    loose = min(tables.evaluate(c) for c in every if mem(c) <= limit * (1 + tolerance))
    assert result.memory_per_device <= limit * (1 + tolerance)
    assert loose * (1 - 1e-9) - 1e-18 <= result.cost <= strict * (1 + 1e-9) + 1e-18


def test_memory_counts_parameter_shards_and_saved_output():
    g = taps.Graph(name="m")
    x = g.input("x", (8, 16))
    g.linear("fc", x, 32)
    op = g.op("fc")
    for cand in candidates(op, 4):
        deg = dict(zip(op.partitionable, cand.strategy.degrees))
        in_axis, out_axis = op.partitionable[-2], op.partitionable[-1]
        weight = 16 * 32 / (deg[in_axis] * deg[out_axis])
        out = 8 * 32 / (deg[op.partitionable[0]] * deg[out_axis])
        # bf16 mixed-precision Adam: weight 2, fp32 gradient, master copy and moments 16
        assert memory(g, op, cand) == pytest.approx(weight * 18 + out * 2)


def test_search_is_deterministic():
    g = taps.models.mlp(batch=64, sizes=(64, 256, 256, 64))
    cluster = paper_cluster(2, 4)
    a, b = taps.search(g, cluster), taps.search(g, cluster)
    assert a.plan.strategies == b.plan.strategies and a.cost == b.cost


@pytest.mark.parametrize("planner", ["paper", "optimal"])
def test_result_pickles(planner):
    g = taps.models.mlp(batch=64, sizes=(64, 256, 64))
    r = taps.search(g, paper_cluster(2, 4), Pricing(planner=planner))
    assert any(i.redistribution.all_ops for row in r.breakdown for i in row.incoming)
    back = pickle.loads(pickle.dumps(r))
    assert back == r and back.step == r.step


def test_result_reports_sizes():
    g = taps.models.mlp(batch=64, sizes=(64, 256, 64))
    cluster = paper_cluster(2, 4)
    r = taps.search(g, cluster, options=taps.IlpOptions(prune=False, reduce=False))
    tables = build_tables(g, cluster)
    assert r.num_aux_edges == sum(
        len(tables.ops[e.producer].strategies) * len(tables.ops[e.consumer].strategies)
        for e in g.edges
    )
    assert r.ilp.binaries == sum(len(t.strategies) for t in tables.ops.values())
    assert (r.ilp.operators, r.ilp.eliminated) == (len(g.ops), 0)
    # A chain reduces completely: SCIP is not needed.
    reduced = taps.search(g, cluster)
    assert (reduced.ilp.operators, reduced.ilp.eliminated) == (0, len(g.ops))
    assert reduced.ilp.variables == reduced.ilp.constraints == 0
    assert reduced.cost == pytest.approx(r.cost, rel=1e-12)
    assert [row.name for row in r.breakdown] == [op.name for op in g.ops]
    assert sum(row.total for row in r.breakdown) == pytest.approx(r.cost)
    assert np.isfinite(r.solve_time) and r.solve_time >= 0


def test_strategies_for_is_the_candidate_list():
    g = taps.models.mlp(batch=64, sizes=(64, 256, 64))
    cluster = paper_cluster(2, 4)
    r = taps.search(g, cluster)
    for op in g.ops:
        assert r.plan.strategies[op.name] in taps.strategies_for(g, op.name, cluster)


def test_op_too_small_for_the_cluster_is_replicated():
    """(2, 2) cannot be split 8 ways: the op splits over fewer devices, the rest replicating."""
    g = taps.Graph(name="tiny")
    g.relu("r", g.input("x", (2, 2)))
    result = taps.search(g, paper_cluster(1, 8))
    assert result.plan.strategies["r"].replicas > 1


def test_wrong_cost_model_and_missing_strategy():
    g = taps.models.mlp(batch=64, sizes=(64, 256, 64))
    cluster = paper_cluster(1, 2)
    with pytest.raises(taps.TapsError, match="cost model"):
        taps.search(g, cluster, taps.Pricing(cost_model="bytes"))
    with pytest.raises(taps.TapsError, match="no strategy"):
        taps.evaluate(taps.Plan(g, cluster, {}))


@settings(max_examples=20, deadline=None)
@given(small_graphs(), st.sampled_from([s for s in CLUSTERS if s[0] > 1]))
def test_tie_break_is_lexicographic(graph, shape):
    """Among volume-optimal assignments, the best and worst topology costs bracket every one of
    them: checked against brute force over all assignments."""

    cluster = paper_cluster(*shape)
    assume(small_enough(graph, cluster))
    vol, topo = (
        build_tables(graph, cluster, Pricing(cost_model="volume")),
        build_tables(graph, cluster, Pricing(cost_model="topology")),
    )
    names = list(vol.ops)
    every = [
        dict(zip(names, c))
        for c in itertools.product(*(range(len(vol.ops[n].strategies)) for n in names))
    ]
    best_volume = min(vol.evaluate(c) for c in every)
    ties = [topo.evaluate(c) for c in every if vol.evaluate(c) <= best_volume * (1 + 1e-12)]
    lo, hi = solve(vol, tie_break=(topo, "min")), solve(vol, tie_break=(topo, "max"))
    # Without pruning and reductions (SCIP solving the whole graph twice) the answers are the same.
    plain = taps.IlpOptions(prune=False, reduce=False)
    plain_lo = solve(vol, options=plain, tie_break=(topo, "min"))
    plain_hi = solve(vol, options=plain, tie_break=(topo, "max"))
    for sol in (lo, hi, plain_lo, plain_hi):
        assert vol.evaluate(sol.choice) == pytest.approx(best_volume, rel=1e-9, abs=1e-9)
    for sol in (lo, plain_lo):
        assert topo.evaluate(sol.choice) == pytest.approx(min(ties), rel=1e-9, abs=1e-18)
    for sol in (hi, plain_hi):
        assert topo.evaluate(sol.choice) == pytest.approx(max(ties), rel=1e-9, abs=1e-18)


def test_time_limit_returns_the_best_assignment_found():
    g = taps.models.alexnet()
    cluster = paper_cluster(8, 8)
    pricing = taps.Pricing(step="forward")
    tables = build_tables(g, cluster, pricing)
    # Without reductions (AlexNet is a chain, which they solve): the pruning stops where it is
    # and the ILP build is cut short, leaving SCIP's first assignment.
    sol = solve(tables, time_limit=1e-9, options=taps.IlpOptions(reduce=False))
    assert sol.status == "timelimit" and sol.gap > 0
    cost = tables.evaluate(sol.choice)
    assert cost == pytest.approx(
        taps.evaluate(taps.Plan(g, cluster, tables.strategies(sol.choice), pricing)), rel=1e-9
    )
    assert cost >= taps.search(g, cluster, pricing).cost * (1 - 1e-9)


def _profile(tables, name: str, i: int) -> np.ndarray:
    """Candidate ``i``'s node cost and its costs towards every neighbour candidate."""
    parts = [tables.ops[name].node_cost[i : i + 1]]
    for e in tables.edges:
        if e.edge.producer == name:
            parts.append(e.cost[e.source_class[i]])
        if e.edge.consumer == name:
            parts.append(e.cost[:, e.target_class[i]])
    return np.concatenate(parts)


def test_pruning_removes_only_dominated_candidates():
    from taps.solve.prune import dominance_survivors

    # The paper's model: AlexNet on 64 devices takes a tenth of a second to price with
    # Algorithm 1 (the optimal planner's training step: about 2 s).
    g, cluster = taps.models.alexnet(), paper_cluster(8, 8)
    tables = build_tables(g, cluster, Pricing(step="forward"))
    keep = dominance_survivors([tables.problem()])
    removed = sum(len(t.strategies) - len(keep[n]) for n, t in tables.ops.items())
    assert removed > 0
    for name, t in tables.ops.items():
        for j in sorted(set(range(len(t.strategies))) - set(keep[name].tolist())):
            worst = _profile(tables, name, j)
            assert any(np.all(_profile(tables, name, i) <= worst) for i in keep[name])
    pruned = taps.search(
        g, cluster, taps.Pricing(step="forward"), options=taps.IlpOptions(reduce=False)
    )
    full = taps.search(
        g, cluster, taps.Pricing(step="forward"), options=taps.IlpOptions(prune=False, reduce=False)
    )
    assert pruned.ilp.binaries < full.ilp.binaries
    assert pruned.cost == pytest.approx(full.cost, rel=1e-12)


def _k4_graph(b: int, h: int) -> taps.Graph:
    """Four operators all joined to each other: no reduction applies, SCIP solves the core."""
    g = taps.Graph(name="k4")
    a = g.relu("a", g.input("x", (b, h), requires_grad=True))
    bb = g.linear("b", a, h)
    c = g.add("c", a, bb)
    g.einsum("d", "ij,ij,ij->ij", a, bb, c)
    return g


@settings(max_examples=15, deadline=None)
@given(st.sampled_from([8, 16]), st.sampled_from([8, 16]), st.sampled_from(CLUSTERS))
def test_irreducible_core_goes_to_scip(b, h, shape):
    graph, cluster = _k4_graph(b, h), paper_cluster(*shape)
    assume(small_enough(graph, cluster, 200_000))
    for cost_model in ("topology", "volume"):
        # Variable elimination would decide the core before SCIP (tests/test_elimination.py).
        options = taps.IlpOptions(eliminate=False)
        result = taps.search(graph, cluster, taps.Pricing(cost_model=cost_model), options=options)
        tables = build_tables(graph, cluster, Pricing(cost_model=cost_model))
        assert result.cost == pytest.approx(_brute_force(tables), rel=1e-9, abs=1e-18)
        if cluster.num_devices > 1:
            assert (result.ilp.operators, result.ilp.eliminated) == (4, 0)
            assert result.ilp.continuous > 0


def test_binding_memory_limit_in_bytes_of_a_real_model():
    """48 layers of a GPT block with a limit that binds: the memory row holds billions of bytes.
    Every option set (different pruning and branching) must find the same optimum; with the row
    in bytes SCIP once returned a 0.25% worse assignment as optimal without pruning."""
    g = taps.models.gpt(hidden=1024, heads=16, seq=2048, batch=8, layers=48)
    cluster = paper_cluster(2, 8)
    free = taps.search(g, cluster, taps.Pricing(step="forward"))
    limit = free.memory_per_device * 0.8
    costs = []
    for options in (OPTIONS[0], taps.IlpOptions(prune=False), taps.IlpOptions(presolve=True)):
        r = taps.search(
            g, cluster, taps.Pricing(step="forward"), memory_limit=limit, options=options
        )
        assert r.status == "optimal" and r.memory_per_device <= limit
        costs.append(r.cost)
    assert costs[0] > free.cost
    assert costs == pytest.approx([costs[0]] * len(costs), rel=1e-9)


def test_a_view_of_a_parameter_counts_as_parameter_memory():
    """A fused weight read through a view (the front ends' factored QKV projections) holds
    optimizer state like the parameter it views."""
    direct, viewed = taps.Graph(), taps.Graph()
    for g in (direct, viewed):
        x = g.input("x", (8, 16))
        w = g.parameter("w", (16, 32))
        if g is viewed:
            w = g.reshape("w.view", w, (16, 32))
        g.einsum("mm", "bi,io->bo", x, w)
    cluster = paper_cluster(1, 4)
    a, b = build_tables(direct, cluster), build_tables(viewed, cluster)
    assert np.array_equal(a.ops["mm"].memory, b.ops["mm"].memory)
    assert direct.signature("mm") == viewed.signature("mm")


def test_sets_inside_priced_sets_are_read_from_their_matrix(monkeypatch):
    """The tables' memo of ``redistribution_costs``: sets of layouts inside sets priced before
    (in any order) are read from that matrix, not priced again, and equal the kernel's own
    matrix of them."""
    from taps._core import redistribution_costs
    from taps.search import tables

    op = taps.models.alexnet().ops[1]
    layouts = list(dict.fromkeys(c.inputs[0] for c in candidates(op, 8)))
    assert len(layouts) >= 6
    cluster = taps.Cluster(1, 8)
    pricing = Pricing()
    how = (cluster, 2.0, pricing.cost_model, pricing.planner, None)
    calls = []

    def counted(*args, **kwargs):
        calls.append(args[:2])
        return redistribution_costs(*args, **kwargs)

    monkeypatch.setattr(tables, "redistribution_costs", counted)
    priced = tables._Priced()
    whole = tables._gathered([(priced(layouts, layouts[::-1], *how), False)])
    inside = [layouts[4], layouts[1], layouts[2]]
    part = tables._gathered([(priced(inside, layouts[:3], *how), False)])
    assert len(calls) == 1
    want = redistribution_costs(inside, layouts[:3], cluster, 2.0, *how[2:4])
    assert np.array_equal(part, want)
    assert np.array_equal(
        whole[::-1][:, ::-1], redistribution_costs(layouts[::-1], layouts, *how[:4])
    )
    # Another element size is priced.
    priced(inside, layouts[:3], cluster, 4.0, *how[2:])
    assert len(calls) == 2
