"""Strategies over fewer devices than the cluster has, the rest replicating the operator: the
enumeration against a plain enumerator of the definition, the layouts replayed rank by rank, the
node cost against the plain-Python reference, memory by hand, and the search with and without
them."""

from __future__ import annotations

import itertools
from math import comb, factorial, prod

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reference as ref
import sim
import taps
from taps import Pricing
from taps._core import allreduce_costs
from taps._support.limits import candidate_count
from taps.plan.candidates import candidates
from taps.reproduce.cases import paper_cluster
from taps.search.prices import all_reduce_operands, intra_collectives, memory
from taps.search.tables import build_tables
from test_reference import _cluster, operators
from test_strategies import as_tuples, brute


def plain_replicated(sizes: list[int], num_devices: int) -> list[tuple]:
    """Every strategy that splits ``sizes`` over ``num_devices / r`` devices (r = 2, 4, ...) with
    one replica dim of size r anywhere among the split dims, from the definition: every order of
    the split dims and the replica dim in the device matrix. Sorted by the documented order:
    r, then the split in the default order, then the replica dim's position, innermost first."""
    rows = []
    r = 2
    while r <= num_devices:
        for degrees in {row[0] for row in brute(sizes, num_devices // r)}:
            split = [a for a, d in enumerate(degrees) if d > 1]
            # Device dims 0..h, innermost first: a permutation of the split axes and "R".
            for order in itertools.permutations([*split, "R"]):
                dmap = [-1] * len(sizes)
                for k, item in enumerate(order):
                    if item != "R":
                        dmap[item] = k
                matrix = [r if item == "R" else degrees[item] for item in reversed(order)]
                position = order.index("R")
                below = [m if m < position else m - 1 for m in dmap]
                key = (r, degrees, tuple(-m for m in below), position)
                rows.append((key, (degrees, tuple(dmap), tuple(matrix))))
        r *= 2
    return [row for _, row in sorted(rows)]


@settings(max_examples=120, deadline=None)
@given(st.lists(st.integers(1, 24), min_size=0, max_size=3), st.integers(0, 5))
def test_enumeration_is_the_default_then_every_replicated_split(sizes, n):
    plain = taps.enumerate_strategies(sizes, 2**n)
    got = taps.enumerate_strategies(sizes, 2**n, replicas=True)
    assert got[: len(plain)] == plain, "the default list, in its order, comes first"
    want = plain_replicated(sizes, 2**n)
    assert as_tuples(got[len(plain) :]) == want
    assert candidate_count(sizes, 2**n, replicas=True) == len(got)
    for s in got:
        assert s.num_devices == 2**n
        assert prod(s.degrees) * s.replicas == 2**n
        assert taps.Strategy(s.degrees, s.device_map, s.device_matrix) == s


def test_no_partitionable_axis_gets_the_fully_replicated_strategy():
    assert taps.enumerate_strategies([], 8) == []
    (s,) = taps.enumerate_strategies([], 8, replicas=True)
    assert (s.degrees, s.device_map, s.device_matrix, s.replicas) == ([], [], [8], 8)
    assert "device_matrix=[8]" in repr(s)


@pytest.mark.parametrize(
    ("degrees", "device_map", "device_matrix"),
    [
        ([2], [0], [4]),  # the dim is not of the axis's degree
        ([2], [1], [2]),  # no such dim
        ([2, 2], [0, 0], [2, 2]),  # one dim twice
        ([2], [0], [2, 1]),  # a dim of 1
        ([2], [0], [2, 3]),  # not a power of two
        ([1], [0], [2]),  # an axis of degree 1 on a dim
    ],
)
def test_bad_device_matrices_are_strategy_errors(degrees, device_map, device_matrix):
    with pytest.raises(taps.StrategyError, match="device"):
        taps.Strategy(degrees, device_map, device_matrix)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([2, 4, 8]), min_size=1, max_size=3), st.integers(1, 4), st.data())
def test_replicas_hold_equal_blocks_and_one_replica_tiles_the_tensor(sizes, n, data):
    """Replayed with the simulator (independent of taps): ranks that differ only in the replica
    dims hold the same elements; the ranks of one replica hold disjoint blocks that cover the
    tensor."""
    found = taps.enumerate_strategies(sizes, 2**n, replicas=True)
    s = data.draw(st.sampled_from([s for s in found if s.replicas > 1]))
    lay = s.tensor_layout(list(range(len(sizes))), sizes)
    assert lay.device_matrix == s.device_matrix
    held = sim.element_sets(sim.shards(lay))
    dm = s.device_matrix
    spare = [k for k in range(len(dm)) if k not in s.device_map]
    by_replica: dict[tuple[int, ...], list[frozenset[int]]] = {}
    for rank in range(2**n):
        c = sim.coords(rank, dm)
        base = list(c)
        for k in spare:
            base[k] = 0
        assert held[rank] == held[sim.rank_of(base, dm)]
        by_replica.setdefault(tuple(c[k] for k in spare), []).append(held[rank])
        assert lay.shard_index(rank) == [tuple(x) for x in sim.shard_slices(lay, rank)]
    assert len(by_replica) == s.replicas
    for blocks in by_replica.values():
        assert sum(len(b) for b in blocks) == prod(sizes)
        assert frozenset().union(*blocks) == frozenset(range(prod(sizes)))


def test_replicated_producer_to_split_consumer_is_free_and_replays():
    """From a replicated layout every device already holds what a split one needs: slices only."""
    whole = taps.Strategy([1, 1], [-1, -1], [8]).tensor_layout([0, 1], [16, 32])
    split = taps.Strategy([2, 4], [1, 0]).tensor_layout([0, 1], [16, 32])
    plan = taps.plan_redistribution(whole, split)
    assert plan.volume == 0
    sim.replay_plan(plan, whole, split)
    back = taps.plan_redistribution(split, whole)
    assert back.volume > 0
    sim.replay_plan(back, split, whole)


def _ops() -> tuple[list[taps.Operator], taps.Graph]:
    g = taps.Graph()
    x = g.input("x", (8, 4, 16), requires_grad=True)
    g.einsum("e", "bsi,io->bso", x, g.parameter("w", (16, 8)), partitionable="bsio")
    return [g.op("e")], g


@pytest.mark.parametrize("devices", [2, 8, 16])
def test_node_costs_equal_the_reference_with_replicas(devices):
    (op,), g = _ops()
    shape = (max(1, devices // 4), min(4, devices), 60e9, 6e9)
    cluster = paper_cluster(*shape)
    cands = candidates(op, devices, replicas=True)
    tensors = all_reduce_operands(g, op)
    degrees = [c.strategy.degrees for c in cands]
    maps = [c.strategy.device_map for c in cands]
    matrices = [c.strategy.device_matrix for c in cands]
    params = ref.cluster_params(shape)
    for model in ("topology", "volume"):
        got = allreduce_costs(
            np.array(degrees, dtype=np.int64),
            np.array(maps, dtype=np.int64),
            tensors,
            cluster,
            model,
            matrices,
        )
        want = ref.allreduce_costs(degrees, maps, tensors, params, model, matrices)
        np.testing.assert_allclose(got, want, rtol=1e-12)
        # The breakdown's collectives price the same thing, one by one.
        for c, cost in zip(cands, got, strict=True):
            direct = sum(col.cost(cluster, model) for col in intra_collectives(g, op, c))
            assert cost == pytest.approx(direct, rel=1e-12, abs=1e-300)


@settings(max_examples=100, deadline=None)
@given(operators(), st.integers(0, 4), st.data())
def test_kernel_equals_reference_on_any_operator_with_replicas(op, log2, data):
    sizes, tensors = op
    found = taps.enumerate_strategies(sizes, 2**log2, replicas=True)
    cluster, params = _cluster(2**log2, data)
    degrees = [s.degrees for s in found]
    maps = [s.device_map for s in found]
    matrices = [s.device_matrix for s in found]
    shape = (len(found), len(sizes))
    for model in ("topology", "volume"):
        got = allreduce_costs(
            np.array(degrees, dtype=np.int64).reshape(shape),
            np.array(maps, dtype=np.int64).reshape(shape),
            tensors,
            cluster,
            model,
            matrices,
        )
        want = ref.allreduce_costs(degrees, maps, tensors, params, model, matrices)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-300)


def test_replicated_matmul_volumes_by_hand():
    """Y = X W with (b, i, o) split (d, r, c) on 8/R devices and R replicas: each replica reduces on
    its own, so the paper's volumes hold with the split degrees: the forward all_reduce of Y moves
    2(r-1)/r of a Y shard, that of dW 2(d-1)/d of a W shard (the replicas compute the same dW)."""
    b, i, o = 64, 32, 16
    g = taps.Graph()
    g.einsum("mm", "bi,io->bo", g.input("x", (b, i)), g.parameter("w", (i, o)))
    op = g.op("mm")
    cluster = paper_cluster(1, 8)
    seen = 0
    for cand in candidates(op, 8, replicas=True):
        d, r, c = cand.strategy.degrees
        rep = cand.strategy.replicas
        want_y = 2 * (r - 1) / r * (b * o) / (d * c)
        want_w = 2 * (d - 1) / d * (i * o) / (r * c)
        got = sum(col.cost(cluster, "volume") for col in intra_collectives(g, op, cand))
        assert got == pytest.approx(2 * (want_y + want_w)), cand.strategy
        seen += rep > 1
    assert seen > 0


def test_memory_counts_a_replica_as_a_whole_copy_of_its_blocks():
    (op,), g = _ops()
    for cand in candidates(op, 8, replicas=True):
        deg = dict(zip(op.partitionable, cand.strategy.degrees, strict=True))
        w_shard = 16 * 8 / (deg["i"] * deg["o"])
        y_shard = 8 * 4 * 8 / (deg["b"] * deg["s"] * deg["o"])
        assert memory(g, op, cand) == w_shard * 18 + y_shard * 2  # bf16 mixed-precision Adam


def _with_scalar_loss() -> taps.Graph:
    g = taps.Graph()
    x = g.input("x", (16, 32), requires_grad=True)
    y = g.linear("fc", x, 64)
    g.einsum("loss", "bo->", y, partitionable="")
    return g


def test_search_over_an_op_with_no_partitionable_axis():
    g = _with_scalar_loss()
    cluster = paper_cluster(2, 4)
    (only,) = candidates(g.op("loss"), 8)
    assert only.strategy.device_matrix == [8]
    result = taps.search(g, cluster)
    assert result.plan.strategies["loss"] == only.strategy
    tables = build_tables(g, cluster)
    assert result.cost == pytest.approx(
        taps.evaluate(taps.Plan(g, cluster, result.plan.strategies))
    )
    assert result.cost == pytest.approx(
        min(tables.evaluate({"fc": k, "loss": 0}) for k in range(len(tables.ops["fc"].candidates)))
    )


def test_default_candidates_are_todays_and_the_option_adds_the_rest():
    g = taps.models.mlp(batch=32, sizes=(64, 128, 64))
    for op in g.ops:
        default = candidates(op, 8)
        assert [c.strategy for c in default] == taps.enumerate_strategies(
            list(op.partitionable_sizes), 8
        )
        full = candidates(op, 8, replicas=True)
        assert full[: len(default)] == default and len(full) > len(default)


def megatron_mlp() -> taps.Graph:
    g = taps.Graph(name="megatron-mlp")
    x = g.input("x", (8, 16, 64))
    h = g.einsum("fc1", "bsh,hf->bsf", x, g.parameter("w1", (64, 256)))
    a = g.gelu("gelu", h)
    g.einsum("fc2", "bsf,fh->bsh", a, g.parameter("w2", (256, 64)))
    return g


@pytest.mark.parametrize("shape", [(1, 4), (2, 4)])
@pytest.mark.parametrize("cost_model", ["topology", "volume"])
def test_megatron_mlp_with_replicas_is_no_worse(shape, cost_model):
    g = megatron_mlp()
    cluster = paper_cluster(*shape)
    plain = taps.search(g, cluster, taps.Pricing(cost_model=cost_model))
    wide = taps.search(g, cluster, taps.Pricing(cost_model=cost_model), replicate=True)
    assert wide.cost <= plain.cost * (1 + 1e-9)
    assert wide.cost == pytest.approx(
        taps.evaluate(
            taps.Plan(g, cluster, wide.plan.strategies, taps.Pricing(cost_model=cost_model))
        )
    )
    # Megatron's plan (column-parallel fc1, row-parallel fc2) with the GELU replicated is in the
    # space and priced like any other assignment.
    n = cluster.num_devices
    megatron = {
        "fc1": taps.Strategy([1, 1, 1, n], [-1, -1, -1, 0]),
        "gelu": taps.Strategy([1, 1, 1], [-1, -1, -1], [n]),
        "fc2": taps.Strategy([1, 1, n, 1], [-1, -1, 0, -1]),
    }
    tables = build_tables(g, cluster, Pricing(cost_model=cost_model), replicas=True)
    choice = {k: tables.ops[k].strategies.index(s) for k, s in megatron.items()}
    assert tables.evaluate(choice) == pytest.approx(
        taps.evaluate(taps.Plan(g, cluster, megatron, taps.Pricing(cost_model=cost_model)))
    )
    assert wide.cost <= tables.evaluate(choice) * (1 + 1e-9)


@pytest.mark.parametrize("p", [0, 1, 2, 3])
@pytest.mark.parametrize("n", [0, 1, 2, 3, 5])
def test_count_is_the_documented_formula(p, n):
    def default(m):
        if m == 0:
            return 1
        return sum(factorial(i) * comb(p, i) * comb(m - 1, i - 1) for i in range(1, min(p, m) + 1))

    extra = (n > 0) + sum(
        (i + 1) * factorial(i) * comb(p, i) * comb(m - 1, i - 1)
        for m in range(1, n)
        for i in range(1, min(p, m) + 1)
    )
    want = default(n) + extra
    assert len(taps.enumerate_strategies([2**n * 3] * p, 2**n, replicas=True)) == want


def test_kernel_rejects_device_matrices_that_do_not_fit_the_rows():
    cluster = paper_cluster(1, 4)
    deg = np.array([[2]], dtype=np.int64)
    dmap = np.array([[0]], dtype=np.int64)
    with pytest.raises(taps.StrategyError, match="2 device matrices for 1 strategies"):
        allreduce_costs(deg, dmap, [], cluster, "topology", [[2, 2], [2, 2]])
    with pytest.raises(taps.StrategyError, match="device map"):
        allreduce_costs(deg, dmap, [], cluster, "topology", [[4]])
    # Split along dim 0, dim 1 a replica dim: nothing to reduce inside a replica.
    split = allreduce_costs(deg, dmap, [([0], [8], 2.0)], cluster, "volume", [[2, 2]])
    assert split[0] == 0.0
    # A tensor without the split axis is partial over dim 0 only: 2 (2-1)/2 of its 8 elements.
    whole = allreduce_costs(deg, dmap, [([-1], [8], 2.0)], cluster, "volume", [[2, 2]])
    assert whole[0] == pytest.approx(2 * (2 - 1) / 2 * 8 * 2.0)


def test_without_a_memory_limit_full_replication_is_free_and_a_limit_trades_it():
    """Copies cost no communication: unbounded, the communication-only search copies every
    operator to every device; under the memory of the default plan, the wider search stays
    within it and is no worse. (Counting compute, copies cost their duplicated work:
    tests/test_steptime.py.)"""
    g = megatron_mlp()
    cluster = paper_cluster(2, 4)
    comm = taps.Pricing(compute=False)
    free = taps.search(g, cluster, comm, replicate=True)
    assert free.cost == 0.0
    assert all(s.replicas == 8 for s in free.plan.strategies.values())
    plain = taps.search(g, cluster, comm)
    bounded = taps.search(g, cluster, comm, memory_limit=plain.memory_per_device, replicate=True)
    assert bounded.memory_per_device <= plain.memory_per_device
    assert bounded.cost <= plain.cost * (1 + 1e-9)
    assert free.memory_per_device > plain.memory_per_device
