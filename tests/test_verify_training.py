"""The training step on XLA as taps prices it: forward and backward run by taps' own plans (JAX's
autodiff only differentiates local blocks), every compiled collective one of taps' predictions and
every prediction compiled (kind, groups, bytes), and every device's block of every output and
gradient equal to the unsharded run."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import taps
from taps.cli import main
from taps.verify import verify
from taps.verify.prediction import predicted_collectives
from taps.verify.result import OK, SHARED
from taps.verify.xla.devices import jax_with_devices
from taps.verify.xla.program import GraphProgram
from taps.verify.xla.training import block_error

jax_with_devices(64)  # one JAX per test session: every module asks for the most any needs

TWO_NODES = taps.Cluster(2, 8)


def _check(r, graph, cluster, strategies, **pricing):
    """Every row matched (or computed once for an edge alike), nothing unpriced or unexpected,
    every block right, and XLA's bytes add up to what the search minimises."""
    assert r.ok, r.mismatches
    assert {c.status for c in r.collectives} <= {OK, SHARED}
    assert r.max_error < 1e-5
    assert all(c.predicted_bytes == c.measured_bytes for c in r.collectives if c.status == OK)
    moved = sum(c.predicted_bytes or 0 for c in r.collectives)
    # The replay runs float32: taps' bytes at the graph's element size, scaled to 4 bytes.
    dtype = next(iter(graph.tensors.values())).dtype_bytes
    want = (
        # Every element, gradients too, at the graph's size: the replay reduces gradients in
        # float32 like everything else.
        taps.evaluate(
            taps.Plan(
                graph, cluster, strategies, taps.Pricing("volume", gradient_bytes=None, **pricing)
            )
        )
        * 4
        / dtype
    )
    assert moved == pytest.approx(want)
    assert moved > 0


def _alexnet_like(batch: int = 16) -> taps.Graph:
    """AlexNet's kinds of layer, small: convolutions (a pooled one, a grouped one), a pooling, a
    flatten and fully connected layers, all with biases."""
    g = taps.Graph("alexnet-like")
    x = g.input("images", (batch, 3, 32, 32), 4)
    x = g.conv2d("conv1", x, 32, 5, 2, 2, True, pool=(3, 2))
    x = g.conv2d("conv2", x, 64, 3, 1, 1, True)
    x = g.pool("pool2", x, 2)
    x = g.conv2d("conv3", x, 64, 3, 1, 1, True, groups=2)
    x = g.reshape("flatten", x, (batch, 64 * x.shape[2] * x.shape[3]))
    x = g.relu("relu", g.linear("fc1", x, 128, True))
    g.linear("fc2", x, 16, True)
    return g


def _residual(batch: int = 16) -> taps.Graph:
    """A tensor read twice (the residual: its producer all_reduces, its gradients add up), an
    input that needs a gradient, biases, a layernorm."""
    g = taps.Graph("residual")
    x = g.input("x", (batch, 16), 4, requires_grad=True)
    h = g.gelu("act", g.linear("fc1", x, 32, True))
    s = g.add("res", g.linear("fc2", h, 16, True), x)
    g.linear("head", g.layernorm("ln", s), 8)
    return g


@pytest.mark.parametrize(
    ("graph", "zero"),
    [
        (taps.models.mlp(batch=64, sizes=(32, 64, 64, 32)), False),
        (taps.models.gpt(hidden=64, heads=4, seq=16, batch=8), False),
        (_alexnet_like(), False),
        (taps.models.mlp(batch=64, sizes=(32, 64, 64, 32)), True),
    ],
    ids=["mlp", "gpt-layer", "alexnet-like", "mlp-zero"],
)
def test_searched_training_plans_run_as_priced(graph, zero):
    """taps' training-step plan on 2 x 8 devices, replayed whole."""
    found = taps.search(graph, TWO_NODES, taps.Pricing(zero=zero))
    r = verify(found.plan)
    _check(r, graph, TWO_NODES, found.plan.strategies, zero=zero)
    kinds = Counter((c.phase, c.kind) for c in r.collectives)
    assert kinds[("backward", "all_reduce")] + kinds[("backward", "reduce_scatter")] > 0
    if zero:
        # Every parameter gradient is a reduce_scatter and an all_gather over the same group.
        grads = [c for c in r.collectives if c.what.startswith("gradient of")]
        assert grads and {c.kind for c in grads} == {"reduce_scatter", "all_gather"}


def test_optimal_plans_by_the_cluster_run_as_priced():
    """On DGX H100 nodes the optimal planner takes [96, 32, 96] from a split of its first two dims
    over [16, 2] devices to another over [8, 4] (55,296 elements per device, forward and backward,
    whether it minimises seconds or elements: the exact planner slices a free device dim; it was
    110,592 and 73,728 under the budgeted one): the replay runs the plans the search priced (its
    cost model), forward and backward, and XLA moves their bytes."""
    cluster = taps.Cluster.preset("dgx-h100", 4)
    g = taps.Graph("swap")
    g.relu("b", g.relu("a", g.input("x", (96, 32, 96), 2, requires_grad=True)))
    strategies = {
        "a": taps.Strategy([16, 2, 1], [1, 0, -1]),
        "b": taps.Strategy([8, 4, 1], [0, 1, -1]),
    }
    r = verify(taps.Plan(g, cluster, strategies, taps.Pricing(planner="optimal")))
    assert r.ok, r.mismatches
    assert {c.status for c in r.collectives} <= {OK, SHARED}
    assert r.max_error < 1e-5

    def moved(cost_model):
        rows = taps.breakdown(
            taps.Plan(
                g, cluster, strategies, taps.Pricing(cost_model=cost_model, planner="optimal")
            )
        )
        plans = [
            p for row in rows for i in row.incoming for p in (i.redistribution, i.backward) if p
        ]
        intra = [c for row in rows for c, _ in row.collectives]
        return sum(p.cost(cluster, 2, "volume") for p in plans) + sum(
            c.cost(cluster, "volume") for c in intra
        )

    assert (moved("topology"), moved("volume")) == (55_296, 55_296)
    measured = sum(c.measured_bytes or 0 for c in r.collectives if c.status == OK)
    assert measured == pytest.approx(moved("topology") * 4 / 2)  # fp16 graph, float32 replay


def test_partial_sums_flow_and_edges_pay_their_backward():
    """Megatron's column -> row MLP on 4 devices: the row layer's partial sums flow to the next
    operator, whose edge all_reduces them (the operator does not); the gradient of the row
    layer's input goes back by the edge's backward plan."""
    g = taps.Graph("megatron")
    x = g.input("x", (16, 32), 4)
    h = g.relu("act", g.linear("fc1", x, 64))
    g.relu("out", g.linear("fc2", h, 32))
    s = {
        "fc1": taps.Strategy([1, 1, 4], [-1, -1, 0]),
        "act": taps.Strategy([1, 4], [-1, 0]),
        "fc2": taps.Strategy([1, 4, 1], [-1, 0, -1]),
        "out": taps.Strategy([1, 4], [-1, 0]),
    }
    cluster = taps.Cluster(1, 4)
    r = verify(taps.Plan(g, cluster, s))
    _check(r, g, cluster, s)
    edge = [
        c for c in r.collectives if c.what.startswith("edge fc2 -> out") and c.phase == "forward"
    ]
    assert [(c.phase, c.kind) for c in edge] == [("forward", "all_reduce")]
    assert not [c for c in r.collectives if c.what.startswith("forward partial sum")]


@pytest.mark.parametrize(
    "graph", [_residual(), taps.models.gpt(hidden=32, heads=2, seq=8, batch=4)], ids=["res", "gpt"]
)
@settings(max_examples=3, deadline=None)
@given(data=st.data())
def test_random_strategies_run_as_priced(graph, data):
    """Not only the search's choice: any assignment (replicated operators included) runs as the
    training step prices it, with or without ZeRO."""
    g = graph
    cluster = taps.Cluster(2, 4)
    strategies = {
        op.name: data.draw(st.sampled_from(taps.strategies_for(g, op.name, cluster, True)))
        for op in g.ops
    }
    zero = data.draw(st.booleans())
    r = verify(taps.Plan(g, cluster, strategies, taps.Pricing(zero=zero)))
    _check(r, g, cluster, strategies, zero=zero)


def test_a_swapped_backward_plan_is_caught(monkeypatch):
    """The check can fail: predicting each edge's backward plan as another edge's (a rotation)
    leaves compiled collectives unmatched."""

    def rotated(self):
        back = self.backward[1:] + self.backward[:1]
        return predicted_collectives(
            self.layouts, self.intra, self.dtype.itemsize, self.describe, back
        )

    monkeypatch.setattr(GraphProgram, "predicted", rotated)
    g = taps.models.mlp(batch=64, sizes=(32, 64, 64, 32))
    r = verify(taps.search(g, TWO_NODES).plan)
    assert not r.ok
    assert any(line.split(":")[0] in ("differs", "missing", "unexpected") for line in r.mismatches)
    assert any("backward" in line for line in r.mismatches)


def test_zero_predicted_as_an_all_reduce_is_caught(monkeypatch):
    """A ZeRO gradient predicted as the all_reduce it is priced as: XLA runs a reduce_scatter and
    an all_gather instead, so the prediction is missing and both are unexpected."""
    real = GraphProgram.predicted

    def plain(self):
        self.intra = {
            k: [dataclasses.replace(c, zero=False) for c in v] for k, v in self.intra.items()
        }
        return real(self)

    monkeypatch.setattr(GraphProgram, "predicted", plain)
    g = taps.models.mlp(batch=64, sizes=(32, 64, 32))
    r = verify(taps.search(g, TWO_NODES, taps.Pricing(zero=True)).plan)
    statuses = Counter(line.split(":")[0] for line in r.mismatches)
    assert statuses["missing"] > 0 and statuses["unexpected"] == 2 * statuses["missing"]


def test_block_error_adds_partial_sums_and_checks_every_copy():
    """Against numpy by hand: eight ranks as [2, 4], partial sums over the four of each row (each
    pair of rows then holds the two halves of dim 0); a wrong copy on one rank shows."""
    layout = taps.Layout([4, 2], [2, 4], [1, -1], partial=[0])
    want = np.arange(8.0).reshape(4, 2)
    blocks = np.zeros((8, 2, 2))
    for r in range(8):
        lo, hi = layout.shard_index(r)[0]
        blocks[r] = want[lo:hi] / 4
    assert block_error(blocks, layout, want) == pytest.approx(0.0, abs=1e-12)
    blocks[5, 0, 0] += 0.7
    assert block_error(blocks, layout, want) == pytest.approx(0.1)
    whole = taps.Layout([4, 2], [2, 4], [1, -1])
    copies = np.stack([want[slice(*whole.shard_index(r)[0])] for r in range(8)])
    copies[6] *= 2
    assert block_error(copies, whole, want) > 0.5


def test_cli_verifies_the_training_step(tmp_path):
    path = tmp_path / "mlp.json"
    path.write_text(taps.models.mlp(batch=64, sizes=(32, 64, 32)).to_json())
    argv = ["verify", str(path), "--nodes", "2", "--devices-per-node", "4", "--zero"]
    out = tmp_path / "v.json"
    assert main([*argv, "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["collectives"]
    assert {r["status"] for r in rows} == {"ok"}
    assert {r["kind"] for r in rows} >= {"reduce_scatter", "all_gather"}
    # The torch engine runs the same training step, ZeRO included.
    torch_argv = ["verify", "--torch", "test_verify_torch_training:plain_block"]
    torch_argv += ["--engine", "torch", "--nodes", "2", "--devices-per-node", "2", "--zero"]
    assert main([*torch_argv, "--gloo", "0", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["collectives"]
    assert {r["status"] for r in rows} == {"ok"}
    assert {r["kind"] for r in rows} >= {"reduce_scatter", "all_gather"}


def test_zero_pads_a_gradient_the_group_does_not_divide():
    """A finding, kept as a test: taps prices ZeRO's reduce_scatter and all_gather as halves of
    the all_reduce, as if every gradient split evenly over its group. A 4-element bias
    data-parallel over 8 devices cannot: the replay pads it to 8 elements (as ZeRO
    implementations do), and XLA moves twice taps' bytes for it; the weight's gradient, which
    divides, is exact."""
    g = taps.Graph("tiny-bias")
    g.linear("fc", g.input("x", (64, 16), 4), 4, bias=True)
    s = {"fc": taps.Strategy([8, 1, 1], [0, -1, -1])}
    r = verify(taps.Plan(g, taps.Cluster(1, 8), s, taps.Pricing(zero=True)))
    rows = {
        (c.what, c.kind): (c.status, c.predicted_bytes, c.measured_bytes) for c in r.collectives
    }
    assert rows == {
        ("gradient of fc.weight", "reduce_scatter"): (OK, 224, 224),
        ("gradient of fc.weight", "all_gather"): (OK, 224, 224),
        ("gradient of fc.bias", "reduce_scatter"): ("differs", 14, 28),
        ("gradient of fc.bias", "all_gather"): ("differs", 14, 28),
    }
    assert r.max_error < 1e-5


def test_an_adds_gradient_goes_back_once_where_its_edges_run_alike():
    """An add hands its output's gradient to both operands: where both edges run the same
    backward steps on it, XLA computes them once and taps prices them per edge (``shared``)."""
    g = taps.Graph("sum")
    x = g.input("x", (16, 32), 4)
    g.add("sum", g.linear("a", x, 32), g.linear("b", x, 32))
    batch = taps.Strategy([4, 1, 1], [0, -1, -1])
    s = {"a": batch, "b": batch, "sum": taps.Strategy([1, 4], [-1, 0])}
    cluster = taps.Cluster(1, 4)
    r = verify(taps.Plan(g, cluster, s))
    _check(r, g, cluster, s)
    shared = [(c.phase, c.kind) for c in r.collectives if c.status == SHARED]
    assert shared == [("backward", "all_to_all")]


def test_zero_in_the_paper_model_is_one_clear_error():
    """Unknown steps and planners are the Pricing's to refuse; ZeRO outside the training step
    is the replay's."""
    g = taps.models.mlp(batch=16, sizes=(8, 8))
    plan = taps.search(g, taps.Cluster(1, 4)).plan
    with pytest.raises(taps.VerifyError, match=r"ZeRO .* training step only"):
        verify(plan.with_pricing(taps.Pricing(step="forward", zero=True)))


@pytest.mark.parametrize("zero", [False, True])
def test_a_frozen_weight_has_no_gradient_on_xla(zero):
    """A frozen weight read by a data-parallel linear: XLA compiles the other weights' gradient
    reductions and none of its own, as taps priced it (the same plan with it trained has one
    more)."""

    def graph(frozen: bool) -> taps.Graph:
        g = taps.Graph(name="m")
        w = g.parameter("w", (32, 64), requires_grad=not frozen)
        g.einsum("fc", "bi,io->bo", g.input("x", (16, 32)), w)
        g.relu("r", "fc.out")
        g.linear("fc2", "r.out", 32)
        return g

    data = taps.Strategy([16, 1, 1], [0, -1, -1])
    strategies = {"fc": data, "r": taps.Strategy([16, 1], [0, -1]), "fc2": data}
    whats = {}
    for frozen in (False, True):
        plan = taps.Plan(graph(frozen), TWO_NODES, strategies, taps.Pricing(zero=zero))
        r = verify(plan)
        _check(r, plan.graph, TWO_NODES, strategies, zero=zero)
        whats[frozen] = {c.what for c in r.collectives if c.what.startswith("gradient of")}
    assert whats[False] == whats[True] | {"gradient of w"}
    assert "gradient of w" not in whats[True]
