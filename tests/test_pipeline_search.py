"""The stage search (taps.search.pipeline) against brute force: the dynamic programme over cuts
against every cut, and the whole search against every pipeline (copies, groups, microbatches)
and every cut of a small graph; the API, the saved plan and where ranks work."""

from __future__ import annotations

import itertools
import json
import math
import pickle

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import taps
from taps.errors import ArgumentError
from taps.plan.stages import (
    Pipeline,
    batch_of,
    locate,
    microbatched,
    stage_graph,
    sub_cluster,
)
from taps.search.pipeline import (
    Memory,
    _Candidate,
    _replica_reduction,
    _stage_numbers,
    _step,
    _Units,
    best_cuts,
    cut_points,
    send_seconds,
    units_of,
)
from taps.search.schedules import in_flight, step_time


def _all_cuts(n: int, k: int):
    for inner in itertools.combinations(range(1, n), k - 1):
        yield (0, *inner, n)


@settings(max_examples=150, deadline=None)
@given(st.data(), st.integers(1, 7), st.integers(1, 8))
def test_the_programme_finds_the_best_cuts_of_random_chains(data, n, m):
    """1F1B's closed form over random units, sends and memory, against every cut."""
    k = data.draw(st.integers(1, n))
    f = np.array(data.draw(st.lists(st.floats(0.1, 5), min_size=n, max_size=n)))
    b = np.array(data.draw(st.lists(st.floats(0.1, 5), min_size=n, max_size=n)))
    mem = np.array(data.draw(st.lists(st.floats(0, 3), min_size=n, max_size=n)))
    send = np.array(data.draw(st.lists(st.floats(0, 1), min_size=n - 1, max_size=n - 1)))
    limit = data.draw(st.floats(1, 12))
    pf, pb, pm = (np.concatenate([[0.0], np.cumsum(x)]) for x in (f, b, mem))
    ab = np.arange(n + 1)
    valid = ab[None, :] > ab[:, None]
    times = np.where(valid, (pf + pb)[None, :] - (pf + pb)[:, None], np.inf)
    flights = np.arange(k, 0, -1, dtype=float)  # stage s holds k - s microbatches
    held = Memory(np.zeros_like(times), pm[None, :] - pm[:, None], flights, 0.0, limit)

    def fits(s, a, b):
        return flights[s] * (pm[b] - pm[a]) <= limit

    def step(bounds):
        fs = [pf[e] - pf[s] for s, e in itertools.pairwise(bounds)]
        bs = [pb[e] - pb[s] for s, e in itertools.pairwise(bounds)]
        cs = [float(send[e - 1]) for e in bounds[1:-1]] + [0.0]
        return step_time("1f1b", fs, bs, cs, m)

    total = float(pf[-1] + pb[-1])
    found = best_cuts(times, send, held, step, lambda t: total + (m - 1) * t)
    brute = [step(c) for c in _all_cuts(n, k) if all(fits(s, c[s], c[s + 1]) for s in range(k))]
    if not brute:
        assert found is None
    else:
        assert found is not None and math.isclose(found.step, min(brute), rel_tol=1e-9)


def _plain_programmes(times, send, held, bound):
    """The programmes over cuts in plain numpy (as the search ran them before they moved to
    Rust): the least bottleneck, and the cuts of least total time under ``bound``."""
    n, stages = times.shape[0] - 1, len(held.flights)
    fits = held.parameters[None] + held.flights[:, None, None] * held.activations[None]
    fits = fits + held.buffer <= held.limit
    edge = np.concatenate([2 * send, [0.0]])
    paid = np.where(fits, (times + edge[np.arange(n + 1) - 1][None, :])[None], np.inf)
    paid[-1] = np.where(fits[-1], times, np.inf)
    bottleneck = np.full(n + 1, np.inf)
    bottleneck[0] = 0.0
    for k in range(stages):
        bottleneck = np.min(
            np.maximum(bottleneck[:, None], np.where(fits[k], times, np.inf)), axis=0
        )
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    back = np.zeros((stages, n + 1), dtype=np.int64)
    allowed = np.where((times > bound)[None], np.inf, paid)
    for k in range(stages):
        c = best[:, None] + allowed[k]
        back[k] = np.argmin(c, axis=0)
        best = c[back[k], np.arange(n + 1)]
    if not np.isfinite(best[n]):
        return bottleneck[n], None
    bounds = [n]
    for k in range(stages - 1, -1, -1):
        bounds.append(int(back[k][bounds[-1]]))
    return bottleneck[n], list(reversed(bounds))


@settings(max_examples=200, deadline=None)
@given(st.data(), st.integers(1, 9))
def test_the_rust_programmes_equal_the_plain_ones_on_random_chains(data, n):
    """Rust's least_bottleneck and least_cuts against the plain numpy programmes, to the bit:
    integer times and sends make many ties, which both break alike (the first start)."""
    k = data.draw(st.integers(1, n))
    ints = st.integers(0, 4).map(float)
    units = np.array(data.draw(st.lists(st.integers(1, 4), min_size=n, max_size=n)), float)
    params = np.array(data.draw(st.lists(ints, min_size=n, max_size=n)))
    acts = np.array(data.draw(st.lists(ints, min_size=n, max_size=n)))
    send = np.array(data.draw(st.lists(ints, min_size=n - 1, max_size=n - 1))) / 2
    pt, pp, pa = (np.concatenate([[0.0], np.cumsum(x)]) for x in (units, params, acts))
    ab = np.arange(n + 1)
    times = np.where(ab[None, :] > ab[:, None], pt[None, :] - pt[:, None], np.inf)
    flights = np.array(data.draw(st.lists(st.integers(1, 4), min_size=k, max_size=k)), float)
    held = Memory(
        pp[None, :] - pp[:, None],
        pa[None, :] - pa[:, None],
        flights,
        data.draw(ints),
        data.draw(st.floats(0, 40)),
    )
    bound = float(data.draw(st.integers(1, 4 * n)))
    least, plain = _plain_programmes(times, send, held, bound)
    edge = np.concatenate([[0.0], 2 * send, [0.0]])
    args = (times, edge, held.parameters, held.activations, flights, held.buffer, held.limit)
    assert taps._core.least_bottleneck(*args) == least
    assert taps._core.least_cuts(*args, bound) == plain


def _small():
    return taps.models.gpt(hidden=64, heads=4, seq=16, batch=8, blocks=4, tie=True)


@pytest.mark.parametrize("limit", [1e30, 2.5e6])
def test_the_search_against_every_pipeline_and_cut(limit):
    """Every copies x groups x microbatches x cut of a four-block model on 4 devices, each stage
    priced by the same unit costs: the search's best 1F1B step is the least."""
    graph, cluster = _small(), taps.Cluster(1, 4)
    pricing = taps.Pricing()
    result = taps.search(
        graph, cluster, pricing, pipeline=Pipeline(schedule="1f1b"), memory_limit=limit
    )
    work = _Units(graph, cluster, pricing, limit)
    n = len(work.units)
    assert n == 4
    best = math.inf
    for replicas, groups in itertools.product((1, 2, 4), (1, 2, 4)):
        if replicas * groups > 4:
            continue
        for m in [d for d in range(1, 9) if (8 // replicas) % d == 0]:
            c = _Candidate(replicas, groups, 1, m, "1f1b")
            parts, size = replicas * m, 4 // (replicas * groups)
            for share in sorted({1, math.ceil(n / groups)}):
                costs = [work.cost(u, size, parts, share) for u in range(n)]
                if None not in costs:
                    found = _brute(work, cluster, pricing, c, size, parts, costs, limit)
                    best = min(best, found)
                    if found < math.inf:
                        break
    assert math.isclose(result.by_schedule["1f1b"], best, rel_tol=1e-9)
    assert result.plan.pipeline.schedule == "1f1b"
    if limit < 1e30:
        assert all(s.memory <= limit * 1.05 for s in result.plan.stages)


def _brute(work, cluster, pricing, c, size, parts, costs, limit):
    n = len(costs)
    best = math.inf
    buffer = max(x.buffer for x in costs)
    for bounds in _all_cuts(n, c.stages):
        f, b, g, p, a = _stage_numbers(costs, bounds)
        if any(
            p[k] + in_flight("1f1b", k, c.groups, 1, c.microbatches) * a[k] + buffer > limit
            for k in range(c.stages)
        ):
            continue
        sends = [
            send_seconds(cluster, size, work.crossing[e - 1] / parts) for e in bounds[1:-1]
        ] + [0.0]
        elements = [
            sum(x.parameters for x in costs[s:e]) / 18 for s, e in itertools.pairwise(bounds)
        ]
        reductions = [
            g[k] + _replica_reduction(cluster, pricing, c.replicas, elements[k])
            for k in range(c.stages)
        ]
        best = min(best, _step(cluster, pricing, c, f, b, sends, reductions))
    return best


def test_cuts_fall_at_tied_layers_or_single_tensors():
    graph = _small()
    assert [u[0] for u in units_of(graph)] == [f"h{i}.ln1" for i in range(4)]
    mlp = taps.models.mlp(batch=8, sizes=(16, 32, 16, 8))
    # Every boundary between the linears is crossed by one tensor.
    ops = [op.name for op in mlp.ops]
    assert all(i in cut_points(mlp) for i in range(1, len(ops)))
    # Inside a transformer block, a cut between q and k leaves two tensors crossing.
    untied = taps.models.gpt(hidden=64, heads=4, seq=16, batch=8, blocks=2)
    names = [op.name for op in untied.ops]
    cuts = cut_points(untied)
    assert names.index("h1.ln1") in cuts and names.index("h0.k") not in cuts


def test_pipelined_search_api_and_saved_plan(tmp_path):
    graph, cluster = _small(), taps.Cluster(1, 4)
    result = taps.search(graph, cluster, pipeline=True)
    assert pickle.loads(pickle.dumps(result)) == result
    plan = result.plan
    assert plan.stages and plan.pipeline.resolved
    assert [n for s in plan.stages for n in s.operators] == [op.name for op in graph.ops]
    assert result.step_time > 0 and result.cost == result.step_time
    path = tmp_path / "plan.json"
    plan.save(path)
    again = taps.Plan.load(path)
    assert again == plan and again.stages == plan.stages
    assert json.loads(path.read_text())["pipeline"]["schedule"] == plan.pipeline.schedule
    for stage, sub in zip(plan.stages, plan.stage_plans):
        assert sub.cluster == stage.cluster and list(sub.strategies) == list(stage.operators)
        taps.evaluate(sub)
    with pytest.raises(taps.StrategyError, match="pipelined plan"):
        taps.evaluate(plan)
    # Not pipelined: today's search, no stages.
    flat = taps.search(graph, cluster)
    assert flat.plan.stages == () and flat.plan.pipeline is None


def test_fixed_fields_are_kept():
    graph, cluster = _small(), taps.Cluster(2, 4)
    spec = Pipeline(stages=2, microbatches=4, schedule="gpipe", replicas=2)
    plan = taps.search(graph, cluster, pipeline=spec).plan
    p = plan.pipeline
    assert (p.stages, p.microbatches, p.schedule, p.replicas, p.chunks) == (2, 4, "gpipe", 2, 1)
    assert [s.devices for s in plan.stages] == [2, 2]
    assert [s.in_flight for s in plan.stages] == [4, 4]


def test_locate_maps_every_rank_once():
    graph, cluster = _small(), taps.Cluster(2, 4)
    spec = Pipeline(stages=2, schedule="interleaved-1f1b", replicas=2, microbatches=2)
    plan = taps.search(graph, cluster, pipeline=spec).plan
    places = [locate(plan.stages, plan.pipeline, r) for r in range(8)]
    assert [(p.replica, p.group, p.rank) for p in places] == [
        (r, g, i) for r in range(2) for g in range(2) for i in range(2)
    ]
    assert places[0].stages == (0, 2) and places[2].stages == (1, 3)
    with pytest.raises(ArgumentError, match=r"rank must be in 0\.\.7"):
        locate(plan.stages, plan.pipeline, 8)


def test_stage_graph_and_microbatch():
    graph = _small()
    ops = [op.name for op in graph.ops]
    sub = stage_graph(graph, ops[14:42])
    assert [t.name for t in sub.tensors.values() if t.kind == "input"] == ["h0.residual2.out"]
    assert sub.tensors["h0.residual2.out"].requires_grad and len(sub.tied[0]) == 2
    half = microbatched(sub, 2)
    assert half.tensors["h1.q.heads"].shape == (4, 16, 4, 16)
    assert half.tensors["h0.residual2.out"].shape == (64, 64)
    with pytest.raises(
        taps.GraphError, match=r"splitting into 8 at most.*does not split into 3 microbatches"
    ):
        microbatched(sub, 3)


def test_send_is_priced_by_the_links():
    cluster = taps.Cluster.preset("dgx-h100", 4)
    (_, intra, latency), (_, inter, inter_latency) = cluster.levels
    assert math.isclose(send_seconds(cluster, 2, 4e6), latency + 2e6 / intra)
    # Groups of two nodes: the eight devices of a node send at once out of it.
    assert math.isclose(send_seconds(cluster, 16, 16e6), inter_latency + 8 * 1e6 / inter)
    assert sub_cluster(cluster, 2, 8).num_devices == 16


@pytest.mark.parametrize(
    "spec, match",
    [
        (dict(stages=3), "power of two"),
        (dict(schedule="zigzag"), "schedule must be one of"),
        (dict(microbatches=0), "must be positive"),
        (dict(chunks=2, schedule="1f1b"), "needs the interleaved-1f1b"),
    ],
)
def test_bad_pipelines_are_refused(spec, match):
    with pytest.raises(ArgumentError, match=match):
        Pipeline(**spec)


def test_too_many_stages_is_one_line():
    with pytest.raises(ArgumentError, match="cuts into 4 unit"):
        taps.search(_small(), taps.Cluster(2, 4), pipeline=Pipeline(stages=8))


def test_a_pipeline_the_batch_does_not_allow_is_one_line():
    spec = Pipeline(replicas=8, stages=1, microbatches=3)
    with pytest.raises(ArgumentError, match="no pipeline of Pipeline"):
        taps.search(_small(), taps.Cluster(2, 4), pipeline=spec)


def test_checkpointed_stages_keep_what_leaves_each_layer():
    """On one device per stage (nothing split): a stage of two layers holds per microbatch in
    flight each layer's saved outputs, or, every layer checkpointed, each layer's output (its
    tokens x hidden in bf16) and one layer's saved outputs once more while it recomputes."""
    graph, cluster = _small(), taps.Cluster(1, 2)

    def stages(checkpoint):
        spec = Pipeline(stages=2, replicas=1, microbatches=2, schedule="1f1b")
        pricing = taps.Pricing(checkpoint=checkpoint)
        return taps.search(graph, cluster, pricing, pipeline=spec).plan.stages

    first, last = stages(0)
    assert len(first.operators) == len(last.operators) == 28  # two layers each
    assert (first.in_flight, last.in_flight) == (2, 1)
    saved = first.memory - last.memory  # two layers' saved outputs of one microbatch
    parameters = last.memory - saved
    leaving = (8 // 2) * 16 * 64 * 2  # a microbatch's tokens x hidden, bf16
    checkpointed = stages(1)[0]
    assert math.isclose(checkpointed.memory, parameters + 2 * 2 * leaving + saved / 2)
    with pytest.raises(ArgumentError, match="checkpoint 1 or 0"):
        taps.search(graph, cluster, taps.Pricing(checkpoint=2), pipeline=True)


def test_microbatches_split_only_the_inputs_that_carry_the_batch():
    """transformers' GPT-2 (built from its config on the meta device) adds a table of positions
    (its position ids, of leading dim 1 where they meet the tokens) to the token embeddings: on
    a microbatch the graph is the graph of the model exported at that batch, the positions
    whole; and a pipelined search of it runs on microbatches."""
    from torch_models import gpt2

    module, _ = gpt2()

    def graph(batch: int) -> taps.Graph:
        return taps.from_torch(module, torch.zeros(batch, 16, dtype=torch.long, device="meta"))

    whole, half = graph(8), graph(4)
    inputs = [n for n, t in whole.tensors.items() if t.kind == "input"]
    assert len(inputs) == 2  # the token ids and the positions
    assert batch_of(whole) == 8
    split = microbatched(whole, 2)
    for key in ("tensors", "ops"):
        assert {x["name"]: x for x in split.to_dict()[key]} == {
            x["name"]: x for x in half.to_dict()[key]
        }
    assert sorted(split.tensors[n].shape[0] for n in inputs) == sorted(
        half.tensors[n].shape[0] for n in inputs
    )
    spec = Pipeline(stages=2, microbatches=2, schedule="1f1b", replicas=1)
    result = taps.search(whole, taps.Cluster(1, 2), pipeline=spec)
    first = result.plan.stage_plans[0].graph
    assert first.tensors[inputs[0]].shape[0] == 4


def test_one_stage_across_nodes():
    """A single stage on every device of a multi-node cluster (what fits when nothing within a
    node does) hands nothing to another group: no send is priced, and it is no error."""
    graph, cluster = _small(), taps.Cluster(2, 2)
    plan = taps.search(graph, cluster, pipeline=Pipeline(stages=1, replicas=1)).plan
    assert [s.devices for s in plan.stages] == [4]
    assert [s.send for s in plan.stages] == [0.0]
