"""The step time in the search: compute in the node costs, gradients reduced in fp32 and
overlapped with the backward, the step reported per operator and in total, saved with the plan."""

from __future__ import annotations

import itertools
import json
import math

import pytest

import taps
from taps import Pricing
from taps.errors import ArgumentError, PlanFileError, TopologyError
from taps.plan.candidates import strategies_for
from taps.search.compute import backward_work, forward_work
from taps.search.tables import build_tables
from taps.search.timeline import Gradient, backward_timeline

COMM_ONLY = Pricing(compute=False)


def _mlp(batch: int = 256, hidden: int = 1024, layers: int = 3) -> taps.Graph:
    g = taps.Graph("mlp")
    h = g.input("x", (batch, hidden))
    for k in range(layers):
        h = g.linear(f"fc{k}", h, hidden, bias=True)
        h = g.relu(f"act{k}", h)
    return g


def _cluster(nodes: int = 2) -> taps.Cluster:
    """The paper's cluster of V100s, every setting explicit (no latency: a bucket's cost is then
    its gradients' summed)."""
    return taps.Cluster(
        nodes, 8, 60e9, 6e9, intra_latency=0.0, inter_latency=0.0, replicas="shared", device="v100"
    )


def test_pricing_counts_compute_under_topology_only() -> None:
    assert Pricing().counts_compute and Pricing(compute=None).counts_compute
    assert not Pricing(cost_model="volume").counts_compute
    assert not COMM_ONLY.counts_compute
    assert Pricing().gradient_bytes == 4
    with pytest.raises(TopologyError, match="volume model prices bytes"):
        Pricing(cost_model="volume", compute=True)
    with pytest.raises(ArgumentError, match="gradient_bytes"):
        Pricing(gradient_bytes=0)


def test_node_cost_is_compute_plus_overlapped_reductions() -> None:
    """Each candidate's node cost: its forward, the longer of its backward and its parameters'
    gradient reductions, and its other collectives, from the roofline's work (divided by the
    product of the split degrees) and the collectives priced one by one."""
    g, cluster = _mlp(), _cluster()
    peak, bandwidth = cluster.device.peak_flops, cluster.device.memory_bandwidth
    timed, comm = build_tables(g, cluster, Pricing()), build_tables(g, cluster, COMM_ONLY)
    op = g.op("fc1")
    fwd = forward_work(g, op).seconds(peak, bandwidth)
    bwd = backward_work(g, op).seconds(peak, bandwidth)
    rest = {o.name: strategies_for(g, o.name, cluster)[0] for o in g.ops}
    for i, cand in enumerate(timed.ops["fc1"].candidates):
        share = math.prod(cand.strategy.degrees)
        plan = taps.Plan(g, cluster, rest | {"fc1": cand.strategy})
        (row,) = [r for r in taps.breakdown(plan) if r.name == "fc1"]
        grads = row.gradient_cost
        expected = fwd / share + max(bwd / share, grads) + row.intra_cost - grads
        assert timed.ops["fc1"].node_cost[i] == pytest.approx(expected, rel=1e-9, abs=1e-15)
        assert comm.ops["fc1"].node_cost[i] == pytest.approx(row.intra_cost, rel=1e-9, abs=1e-15)


def test_gradients_reduced_in_their_dtype() -> None:
    """A parameter's gradient reduction moves 4 bytes an element by default, the parameter's
    own 2 with ``gradient_bytes=None``; an activation's partial sums keep their dtype."""
    g, cluster = _mlp(), _cluster()
    data_parallel = {o.name: strategies_for(g, o.name, cluster)[0] for o in g.ops}
    volume = Pricing(cost_model="volume")
    rows = {
        b: taps.breakdown(
            taps.Plan(g, cluster, data_parallel, Pricing(cost_model="volume", gradient_bytes=b))
        )
        for b in (None, 4)
    }
    for fp16, fp32 in zip(rows[None], rows[4]):
        for (c16, cost16), (c32, cost32) in zip(fp16.collectives, fp32.collectives):
            assert c16.parameter == c32.parameter
            assert cost32 == pytest.approx(cost16 * (2 if c16.parameter else 1))
            assert c32.dtype_bytes == (4 if c32.parameter else 2)
    assert volume.gradient_bytes == 4


def test_step_time_adds_up_and_hides_only_with_compute() -> None:
    """The step is compute plus exposed communication, per operator and in total; without
    compute nothing is hidden; with it the exposed time lies between what is not a gradient
    reduction and all of the communication."""
    g, cluster = _mlp(), _cluster()
    for pricing in (Pricing(), COMM_ONLY):
        result = taps.search(g, cluster, pricing)
        step, rows = result.step, result.breakdown
        assert step.step_time == pytest.approx(step.compute + step.exposed)
        assert step.exposed == pytest.approx(sum(r.exposed for r in rows))
        assert step.compute == pytest.approx(sum(r.compute for r in rows))
        assert taps.step_time(result.plan) == step
        if not pricing.counts_compute:
            assert step.compute == 0 and step.exposed == pytest.approx(step.communication)
        else:
            fixed = sum(r.communication - r.gradient_cost for r in rows)
            assert fixed - 1e-15 <= step.exposed <= step.communication + 1e-15
            assert step.compute > 0


def test_exposed_time_is_the_timeline_of_the_plan() -> None:
    """On data parallelism (every gradient reduced over all devices, nothing else communicated)
    the exposed time is the timeline's, worked out here from the operators' backward times and
    the gradients' bytes."""
    # A bucket per layer's weight (64 MiB in fp32), each reduction shorter than a layer's backward.
    g, cluster = _mlp(batch=65536, hidden=4096, layers=4), _cluster(1)
    n = cluster.num_devices
    batch = {
        o.name: next(s for s in strategies_for(g, o.name, cluster) if s.degrees[0] == n)
        for o in g.ops
    }
    plan = taps.Plan(g, cluster, batch)
    rows = taps.breakdown(plan)
    assert all(r.incoming_cost == 0 for r in rows)
    durations = [r.backward_compute for r in reversed(rows)]
    grads = [
        Gradient(k, "all", math.prod(c.layout.shard_shape) * 4.0)
        for k, r in enumerate(reversed(rows))
        for c, _ in r.collectives
    ]
    # Priced as one all_reduce of the bucket's bytes over every device.
    per_byte = sum(c for r in rows for _, c in r.collectives) / sum(x.bytes for x in grads)
    timeline = backward_timeline(durations, grads, lambda _, size: size * per_byte)
    step = taps.step_time(plan)
    assert step.exposed == pytest.approx(timeline.exposed, rel=1e-9)
    assert len(timeline.buckets) > 1 and 0 < step.exposed < step.communication / 2


def test_search_with_compute_equals_brute_force() -> None:
    """The step-time objective's optimum over every assignment, by enumeration."""
    g, cluster = _mlp(batch=64, hidden=256, layers=2), _cluster(1)
    tables = build_tables(g, cluster, Pricing())
    names = list(tables.ops)
    best = min(
        tables.evaluate(dict(zip(names, c)))
        for c in itertools.product(*(range(len(tables.ops[n].candidates)) for n in names))
    )
    result = taps.search(g, cluster, Pricing())
    assert result.cost == pytest.approx(best, rel=1e-9)
    assert taps.evaluate(result.plan) == pytest.approx(result.cost, rel=1e-9)


@pytest.mark.parametrize("preset", ["dgx-v100", "dgx-h100"])
def test_replicate_no_longer_replicates_everything(preset: str) -> None:
    """With compute counted, ``replicate=True`` splits the work: no operator is copied whole to
    every device, where communication alone copies every one (nothing to communicate)."""
    g, cluster = taps.models.by_name("mlp"), taps.Cluster.preset(preset, 2)

    def whole(pricing: Pricing) -> int:
        plan = taps.search(g, cluster, pricing, replicate=True).plan
        return sum(math.prod(s.degrees) == 1 for s in plan.strategies.values())

    assert whole(COMM_ONLY) == len(g.ops)
    assert whole(Pricing()) == 0


def test_saved_plan_keeps_the_pricing_and_refuses_version_1() -> None:
    g, cluster = _mlp(), _cluster()
    plan = taps.search(g, cluster, Pricing(compute=False, gradient_bytes=None)).plan
    again = taps.Plan.from_json(plan.to_json())
    assert again == plan and again.pricing.gradient_bytes is None
    assert not again.pricing.counts_compute
    doc = json.loads(plan.to_json())
    doc["version"] = 1
    with pytest.raises(PlanFileError, match="version 1: this taps reads version 3"):
        taps.Plan.from_dict(doc)


def test_json_reports_the_step(tmp_path) -> None:
    """``taps search --json`` writes the step time, compute and exposed communication, in total
    and per operator."""
    from taps.cli import main

    out = tmp_path / "r.json"
    main(["search", "mlp", "--cluster", "dgx-h100", "--nodes", "2", "--json", str(out)])
    data = json.loads(out.read_text())["topology"]
    assert data["compute"] is True and data["gradient_bytes"] == 4
    assert data["step_time"] == pytest.approx(data["compute_time"] + data["exposed"])
    ops = data["operators"]
    assert sum(o["exposed"] for o in ops) == pytest.approx(data["exposed"])
    assert sum(o["forward_compute"] + o["backward_compute"] for o in ops) == pytest.approx(
        data["compute_time"]
    )
