"""Parameter storage sharding (FSDP / ZeRO-3, docs/search.md#parameter-storage-sharding): the
gathers and reduce_scatter priced against closed forms and the link-load judge, the memory
against a hand count, the timeline's prefetch against closed forms, and the search against brute
force over every strategy and storage choice."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import linkload
import taps
from graphs_gen import small_graphs
from taps.plan.candidates import Candidate, strategies_for
from taps.search.prices import FORWARD_GATHER, copies_of, memory
from taps.search.tables import build_tables
from taps.search.timeline import backward_timeline

ONE = taps.Cluster.hierarchy([(8, 100e9, 5e-6)], replicas="flat")
TWO = taps.Cluster.hierarchy([(4, 450e9, 5e-6), (4, 50e9, 10e-6)], replicas="flat")


def _linear(batch: int = 64, inp: int = 256, out: int = 512, dtype: int = 2) -> taps.Graph:
    g = taps.Graph(name="linear")
    x = g.input("x", (batch, inp), dtype_bytes=dtype)
    g.linear("fc", x, out)
    return g


def _data_parallel(cluster: taps.Cluster) -> taps.Strategy:
    return taps.Strategy([cluster.num_devices, 1, 1], [0, -1, -1])


def _collectives(plan: taps.Plan) -> list[tuple[str, str, float]]:
    return [(c.kind, c.reason, cost) for r in taps.breakdown(plan) for c, cost in r.collectives]


@pytest.mark.parametrize("cluster", [ONE, TWO])
def test_gathers_and_reduce_scatter_are_priced_as_the_ring_and_the_judge(cluster):
    """Data parallelism over all n devices with the weight (p elements) sharded: two all_gathers
    of the bf16 weight and a reduce_scatter of its fp32 gradient over the n devices, each priced
    as the closed form on one level and as the link-load judge on two."""
    g = _linear()
    n, p = cluster.num_devices, 256 * 512
    plan = taps.Plan(g, cluster, {"fc": _data_parallel(cluster)}, taps.Pricing(fsdp=True))
    found = _collectives(plan)
    assert [(k, r) for k, r, _ in found] == [
        ("all_gather", FORWARD_GATHER),
        ("all_gather", "backward gather"),
        ("reduce_scatter", "gradient"),
    ]
    groups = linkload.groups_along([n], [0])
    for (kind, _, cost), dtype in zip(found, (2, 2, 4)):
        # The judge's input: each device's shard to gather, the whole gradient to scatter.
        block = p * dtype / n if kind == "all_gather" else p * dtype
        assert cost == pytest.approx(linkload.seconds(cluster.levels, kind, groups, block))
        if len(cluster.levels) == 1:
            _, bandwidth, latency = cluster.levels[0]
            ring = (n - 1) * latency + (n - 1) / n * p * dtype / bandwidth
            assert cost == pytest.approx(ring, rel=1e-12)
    # The same parameter replicated: one fp32 all_reduce, the two gathers' and the scatter's bytes.
    plain = _collectives(plan.with_pricing(taps.Pricing()))
    assert [(k, r) for k, r, _ in plain] == [("all_reduce", "gradient")]
    assert plain[0][2] == pytest.approx(
        linkload.seconds(cluster.levels, "all_reduce", groups, p * 4)
    )


def test_a_gather_along_one_device_dim_is_what_the_core_prices_for_it():
    """Over one device dim the halved all_reduce is ``collective_cost``'s own all_gather and
    reduce_scatter of that dim (the group may span several dims, which the core's single-dim
    kinds cannot say)."""
    g = _linear()
    strategy = taps.Strategy([4, 4, 1], [1, 0, -1])  # batch over dim 1, in over dim 0 (4 each)
    plan = taps.Plan(g, TWO, {"fc": strategy}, taps.Pricing(fsdp=True))
    # The weight's block is 64 x 512 on every device (``in`` over one dim); its shard, a quarter
    # of it, is one block of [4, 64, 512] split over the other dim too: all_gathered along it.
    found = [(c, cost) for c, cost in taps.breakdown(plan)[0].collectives if c.parameter]
    assert len(found) == 3  # and the output's partial sums, all_reduced as before
    for c, cost in found:
        split = c.layout.tensor_map[0]
        group = ({0, 1} - {split}).pop()
        assert c.layout.tensor_map == [split, -1] and c.layout.device_matrix == [4, 4]
        if c.kind == "all_gather":
            shard = taps.Layout([4, 64, 512], [4, 4], [group, split, -1])
            want = TWO.collective_cost(shard, "all_gather", group, c.dtype_bytes)
        else:
            want = TWO.collective_cost(c.layout, "reduce_scatter", group, c.dtype_bytes)
        assert cost == pytest.approx(want, rel=1e-12), c.kind


def test_memory_is_the_hand_count():
    """bf16 weight, mixed-precision Adam: 2 + 4 + 4 + 8 bytes per element, all divided by the 8
    devices; twice the gathered weight spread over the operator's copies; the saved output."""
    g = _linear(batch=64, inp=256, out=512)
    g.layers = 4
    op = g.op("fc")
    cand = Candidate.of(op, _data_parallel(ONE))
    p, n, saved = 256 * 512, 8, 64 // 8 * 512 * 2
    assert memory(g, op, cand) == p * 18 + saved
    assert memory(g, op, cand, taps.Pricing(zero=True)) == p * (2 + 16 / n) + saved
    sharded = memory(g, op, cand, taps.Pricing(), 1.0, True, copies_of(g)["fc"])
    assert sharded == p * 18 / n + 2 * p * 2 / 4 + saved
    # The search's tables hold both, and the plan's memory is the sharded one's.
    table = build_tables(g, ONE, taps.Pricing(fsdp=True)).ops["fc"]
    i = [c.strategy for c in table.candidates].index(cand.strategy)
    j = (
        len(table.candidates)
        - 1
        - [c.strategy for c in table.candidates][::-1].index(cand.strategy)
    )
    assert not table.sharded[i] and table.sharded[j]
    assert (table.memory[i], table.memory[j]) == (memory(g, op, cand), sharded)


def test_a_model_parallel_operator_has_nothing_to_shard():
    """A strategy splitting the weight over every device reduces no gradient: no twin."""
    g = _linear()
    table = build_tables(g, ONE, taps.Pricing(fsdp=True)).ops["fc"]
    whole = [c.strategy for c, s in zip(table.candidates, table.sharded) if s]
    assert whole and taps.Strategy([1, 2, 4], [-1, 1, 0]) not in whole
    assert taps.Strategy([1, 2, 4], [-1, 1, 0]) in [c.strategy for c in table.candidates]


# --- the timeline: prefetch ---------------------------------------------------------------------


def test_prefetched_gathers_hide_behind_the_step_before():
    """Gathers no longer than the step before are hidden but the first; longer ones expose the
    difference, each issued when the step before starts."""
    t = backward_timeline([3.0, 3.0, 3.0], [], lambda g, b: 0.0, gathers=[1.0, 2.0, 2.0])
    assert t.waits == (1.0, 0.0, 0.0) and t.exposed == 1.0 and t.end == 10.0
    t = backward_timeline([1.0, 1.0, 1.0], [], lambda g, b: 0.0, gathers=[2.0, 2.0, 2.0])
    # Gathers back to back on the stream: ready at 2, 4, 6; computes at 2-3, 4-5, 6-7.
    assert t.waits == (2.0, 1.0, 1.0) and t.end == 7.0 and t.exposed == 4.0


def test_gathers_and_reductions_run_on_their_own_streams():
    """A reduction issued before the next gather does not delay it (FSDP2's all-gather stream);
    the gathers queue behind each other."""
    from taps.search.timeline import Gradient

    # Step 0 ends at 1 and issues a 5 s reduction (1-6); step 1's gather (2 s) was issued at
    # step 0's start (0-2), step 2's at step 1's start (2-4): the computes run 0-1, 2-3, 4-5.
    t = backward_timeline(
        [1.0, 1.0, 1.0],
        [Gradient(0, "g", 1.0)],
        lambda g, b: 5.0,
        bucket_bytes=1.0,
        gathers=[0.0, 2.0, 2.0],
    )
    assert t.waits == (0.0, 1.0, 1.0) and t.compute_end == 5.0 and t.end == 6.0
    assert t.exposed == 3.0


# --- the search -----------------------------------------------------------------------------------


def _brute_force(graph, cluster, pricing, limit):
    """The least cost over every strategy and storage of every operator whose memory fits, each
    plan priced by ``taps.evaluate`` (the breakdown, not the tables), and whether it shards."""
    names = [op.name for op in graph.ops]
    copies = copies_of(graph)
    options = [strategies_for(graph, n, cluster) for n in names]
    best = (math.inf, False)
    for strategies in itertools.product(*options):
        for storage in itertools.product((False, True), repeat=len(names)):
            sharded = tuple(n for n, s in zip(names, storage) if s)
            plan = taps.Plan(
                graph, cluster, dict(zip(names, strategies)), replace(pricing, fsdp=sharded)
            )
            need = graph.layers * sum(
                memory(graph, op, plan.candidates[op.name], plan.pricing, 1.0, s, copies[op.name])
                for op, s in zip(graph.ops, storage)
            )
            if need <= limit:
                cost = taps.evaluate(plan)
                if cost < best[0] * (1 - 1e-12):
                    best = (cost, any(_reduces(plan, n) for n in sharded))
    return best


def _reduces(plan, name):
    """Whether sharding ``name`` under ``plan`` changes anything (it reduces a gradient)."""
    row = next(r for r in taps.breakdown(plan) if r.name == name)
    return any(c.kind == "reduce_scatter" for c, _ in row.collectives)


@st.composite
def parameter_chains(draw) -> taps.Graph:
    """Chains of one to three matmuls with weights, each splitting every axis or only the batch
    (its weight then fits only by sharding its storage), and elementwise operators between; or
    one of :func:`graphs_gen.small_graphs`."""
    if draw(st.booleans()):
        return draw(small_graphs())
    g = taps.Graph(name="chain")
    dtype = draw(st.sampled_from([2, 4]))
    x = g.input("x", (draw(st.sampled_from([4, 8])), draw(st.sampled_from([4, 8]))), dtype)
    for k in range(draw(st.integers(1, 3))):
        out = draw(st.sampled_from([4, 8, 16]))
        w = g.parameter(f"w{k}", (x.shape[1], out), dtype)
        only = "b" if draw(st.booleans()) else None
        x = g.einsum(f"mm{k}", "bi,io->bo", x, w, partitionable=only)
        if draw(st.booleans()):
            x = g.relu(f"relu{k}", x)
    return g


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(
    graph=parameter_chains(),
    fraction=st.one_of(st.floats(0.0, 0.3), st.floats(0.0, 1.0)),
    devices=st.sampled_from([(1, 2), (2, 2), (1, 4)]),
    default=st.booleans(),
)
def test_the_search_shards_exactly_where_memory_binds(graph, fraction, devices, default):
    """A sharded operator's gathers are priced whole, so sharding is never cheaper: under the
    default pricing (compute counted, latency, bf16 or fp32 weights with fp32 gradients) its two
    gathers and reduce_scatter cost more than the all_reduce, its reduce_scatter hidden as that
    would be; communication only with fp32 weights they communicate 1.5 times the all_reduce.
    Under a limit between the least and the most memory the search's cost is brute force's, and
    it shards an operator only when the plan without sharding does not fit or costs more."""
    cluster = taps.Cluster(*devices)
    names = [op.name for op in graph.ops]
    sizes = [len(strategies_for(graph, n, cluster)) for n in names]
    if math.prod(sizes) * 2 ** len(names) > 600:
        return
    pricing = (
        taps.Pricing(fsdp=True)
        if default
        else taps.Pricing(compute=False, parameter_bytes=4, gradient_bytes=4, fsdp=True)
    )
    tables = build_tables(graph, cluster, pricing)
    low = graph.layers * sum(float(t.memory.min()) for t in tables.ops.values())
    high = graph.layers * sum(float(t.memory.max()) for t in tables.ops.values())
    limit = low + fraction * (high - low)
    want, shards = _brute_force(graph, cluster, pricing, limit)
    got = taps.search(graph, cluster, pricing, memory_limit=limit)
    assert got.cost == pytest.approx(want, rel=1e-9, abs=1e-15)
    assert got.memory_per_device <= limit * (1 + 1e-12)
    plain = replace(pricing, fsdp=False)
    unsharded, _ = _brute_force_plain(graph, cluster, plain, limit)
    if unsharded <= want * (1 + 1e-9):
        # Sharding buys nothing: no operator whose storage matters is sharded.
        assert not any(_reduces(got.plan, n) for n in (got.plan.pricing.fsdp or ()))
    else:
        assert shards and any(_reduces(got.plan, n) for n in (got.plan.pricing.fsdp or ()))


def _brute_force_plain(graph, cluster, pricing, limit):
    names = [op.name for op in graph.ops]
    best = (math.inf, False)
    for strategies in itertools.product(*(strategies_for(graph, n, cluster) for n in names)):
        plan = taps.Plan(graph, cluster, dict(zip(names, strategies)), pricing)
        need = graph.layers * sum(
            memory(graph, op, plan.candidates[op.name], pricing) for op in graph.ops
        )
        if need <= limit:
            best = min(best, (taps.evaluate(plan), False))
    return best


def test_the_plan_records_the_choice_and_reads_it_back(tmp_path):
    g = taps.models.mlp()
    cluster = taps.Cluster(2, 4)
    plain = taps.search(g, cluster)
    got = taps.search(
        g, cluster, taps.Pricing(fsdp=True), memory_limit=0.97 * plain.memory_per_device
    )
    assert got.plan.pricing.fsdp and got.memory_per_device < plain.memory_per_device
    assert taps.evaluate(got.plan) == pytest.approx(got.cost, rel=1e-12)
    path = tmp_path / "plan.json"
    got.plan.save(path)
    assert taps.Plan.load(path) == got.plan
    with pytest.raises(taps.GraphError, match="fsdp names operators"):
        taps.Plan(g, cluster, dict(got.plan.strategies), taps.Pricing(fsdp=("nope",)))
    with pytest.raises(TypeError, match="fsdp"):
        taps.Pricing(fsdp="fc1")
    assert taps.Pricing(fsdp=["b", "a"]).fsdp == ("a", "b") and taps.Pricing(fsdp=()).fsdp is False
