"""Tied search (taps.solve.ties) against brute force over the assignments that repeat one block."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import taps
from taps import Pricing
from taps.search.tables import build_tables
from taps.solve.pipeline import smallest_memory, solve


def _tied_mlp(blocks: int, width: int = 32, batch: int = 8) -> taps.Graph:
    g = taps.Graph("tied-mlp")
    x = g.input("x", (batch, width), requires_grad=True)
    instances = []
    for i in range(blocks):
        h = g.relu(f"b{i}.act", g.linear(f"b{i}.up", x, 2 * width))
        x = g.add(f"b{i}.res", g.linear(f"b{i}.down", h, width), x)
        instances.append([f"b{i}.up", f"b{i}.act", f"b{i}.down", f"b{i}.res"])
    g.tie(instances)
    return g


def _brute_force_tied(tables, memory_limit=None):
    """The least cost over every assignment that gives each block position one candidate."""
    graph = tables.graph
    block = graph.tied[0]
    positions = range(len(block[0]))
    sizes = [len(tables.ops[block[0][p]].candidates) for p in positions]
    best = None
    for combo in itertools.product(*(range(n) for n in sizes)):
        choice = {inst[p]: combo[p] for inst in block for p in positions}
        if memory_limit is not None:
            need = graph.layers * sum(float(tables.ops[v].memory[i]) for v, i in choice.items())
            if need > memory_limit:
                continue
        cost = tables.evaluate(choice)
        best = cost if best is None else min(best, cost)
    return best


@settings(max_examples=12, deadline=None)
@given(
    blocks=st.integers(2, 4),
    nodes=st.sampled_from([1, 2]),
    per_node=st.sampled_from([2, 4]),
    model=st.sampled_from(["topology", "volume"]),
)
def test_tied_optimum_is_the_best_repeated_assignment(blocks, nodes, per_node, model):
    g = _tied_mlp(blocks)
    cluster = taps.Cluster(nodes, per_node)
    tables = build_tables(g, cluster, Pricing(cost_model=model))
    tied = solve(tables)
    # The expanded choice repeats the block, and the cost is what the full graph says.
    for inst in g.tied[0][1:]:
        assert [tied.choice[v] for v in inst] == [tied.choice[v] for v in g.tied[0][0]]
    assert tables.evaluate(tied.choice) == pytest.approx(_brute_force_tied(tables), rel=1e-9)
    untied = solve(tables, tie=False)
    assert tables.evaluate(untied.choice) <= tables.evaluate(tied.choice) * (1 + 1e-9)


@settings(max_examples=10, deadline=None)
@given(blocks=st.integers(2, 3), position=st.floats(0.0, 0.99))
def test_tied_search_under_a_binding_memory_limit(blocks, position):
    # The priced fast path against brute force and against the ILP without the price.
    g = _tied_mlp(blocks, width=64, batch=64)
    cluster = taps.Cluster(1, 4)
    tables = build_tables(g, cluster)
    free = taps.search(g, cluster)
    least = smallest_memory(tables)
    assert least < free.memory_per_device  # so the limit below binds
    limit = least + position * (free.memory_per_device - least)
    best = _brute_force_tied(tables, limit)
    r = taps.search(g, cluster, memory_limit=limit)
    assert r.memory_per_device <= limit * (1 + 1e-9)
    assert r.cost == pytest.approx(best, rel=1e-9)
    plain = taps.search(g, cluster, memory_limit=limit, options=taps.IlpOptions(price=False))
    assert plain.cost == pytest.approx(best, rel=1e-9)


def test_search_reports_the_full_graph():
    g = taps.models.gpt(256, 4, 32, 4, blocks=3, tie=True)
    cluster = taps.Cluster(2, 4)
    r = taps.search(g, cluster)
    assert set(r.plan.strategies) == {op.name for op in g.ops}
    assert r.cost == pytest.approx(
        taps.evaluate(taps.Plan(g, cluster, r.plan.strategies)), rel=1e-9
    )
    untied = taps.search(g, cluster, tie=False)
    assert untied.cost <= r.cost * (1 + 1e-9)
