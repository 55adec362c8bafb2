"""The training step of the cost model (docs/search.md#the-training-step): against brute force
over every assignment priced directly, closed forms (Alpa's data-parallel MLP, Megatron's
column -> row MLP), the tables against the breakdown, and the addend operands of the IR."""

from __future__ import annotations

import itertools
import json
import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import taps
from graphs_gen import CLUSTERS, small_enough, small_graphs
from taps import Cluster, Graph, GraphError, Plan, Pricing, Strategy
from taps.plan.candidates import Candidate, candidates
from taps.search.evaluate import breakdown, evaluate
from taps.search.prices import memory, partial_flows
from taps.search.tables import build_tables

STEPS = ["training", "forward"]


def _assignments(graph: Graph, cluster: Cluster):
    names = [op.name for op in graph.ops]
    lists = [[c.strategy for c in candidates(op, cluster.num_devices)] for op in graph.ops]
    for combo in itertools.product(*lists):
        yield dict(zip(names, combo))


@settings(max_examples=30)
@given(
    small_graphs(),
    st.sampled_from(CLUSTERS),
    st.sampled_from(["topology", "volume"]),
    st.sampled_from(STEPS),
    st.sampled_from(["optimal", "paper"]),
)
def test_search_equals_the_least_direct_price(graph, shape, cost_model, step, planner):
    """The search's optimum is the least cost of any assignment priced by evaluate() (plans and
    collectives, not the tables), and its cost is evaluate() of its own strategies."""
    cluster = Cluster(*shape)
    assume(small_enough(graph, cluster, 300))
    result = taps.search(
        graph, cluster, taps.Pricing(cost_model=cost_model, step=step, planner=planner)
    )
    best = min(
        evaluate(
            Plan(graph, cluster, s, Pricing(cost_model=cost_model, step=step, planner=planner))
        )
        for s in _assignments(graph, cluster)
    )
    assert result.cost == pytest.approx(best, rel=1e-9, abs=1e-15)
    direct = evaluate(
        Plan(
            graph,
            cluster,
            result.plan.strategies,
            Pricing(cost_model=cost_model, step=step, planner=planner),
        )
    )
    assert result.cost == pytest.approx(direct, rel=1e-9, abs=1e-15)


@settings(max_examples=30)
@given(small_graphs(), st.sampled_from(CLUSTERS), st.sampled_from(["topology", "volume"]))
def test_tables_equal_the_breakdown_of_every_assignment(graph, shape, cost_model):
    cluster = Cluster(*shape)
    assume(small_enough(graph, cluster, 200))
    tables = build_tables(graph, cluster, Pricing(cost_model=cost_model, zero=True))
    names = [op.name for op in graph.ops]
    for choice in itertools.product(*(range(len(tables.ops[n].candidates)) for n in names)):
        strategies = {n: tables.ops[n].strategies[i] for n, i in zip(names, choice)}
        rows = breakdown(
            Plan(graph, cluster, strategies, Pricing(cost_model=cost_model, zero=True))
        )
        want = tables.evaluate(dict(zip(names, choice)))
        assert sum(r.total for r in rows) == pytest.approx(want, rel=1e-9, abs=1e-15)


def test_forward_step_is_the_papers_model():
    """step="forward" prices what the paper does: Algorithm 1 on every edge, the partial output
    and every gradient all_reduced at the operator (the MatMul closed form)."""
    g = Graph()
    x = g.input("x", (16, 8), requires_grad=True)
    g.linear("fc", x, 4)
    cluster = Cluster(1, 8)
    for s in _assignments(g, cluster):
        d, r, c = s["fc"].degrees
        want = 2 * ((d - 1) * 8 * 4 + (r - 1) * 16 * 4 + (c - 1) * 16 * 8) / (d * r * c) * 2
        paper = Pricing(cost_model="volume", step="forward", gradient_bytes=None)
        assert evaluate(Plan(g, cluster, s, paper)) == pytest.approx(want)


def _alpa_mlp(bias: bool = True) -> Graph:
    """Alpa's data-parallel MLP test (tests/shard_parallel/test_mlp.py): batch 512, two dense
    layers of 64 -> 64 in float32 with biases."""
    g = Graph("alpa-mlp")
    x = g.input("x", (512, 64), 4)
    h = g.relu("act", g.linear("fc1", x, 64, bias=bias))
    g.linear("fc2", h, 64, bias=bias)
    return g


def test_alpa_data_parallel_mlp_closed_form():
    """On 4 devices pure data parallelism costs Alpa's expected objective, 2 * (all_reduce of
    64 * 64 * 4 B + all_reduce of 64 * 4 B) with all_reduce(V) = 2 (n-1)/n V: 49,920 B, and is the
    optimum of the training step. The paper's model prefers a column-parallel first layer
    (49,536 B: it prices the all_to_all of the activations forward only); under the training step
    that plan pays the all_to_all back as well (74,112 B)."""
    g, cluster = _alpa_mlp(), Cluster(1, 4)
    ar = lambda v: 2 * 3 / 4 * v  # noqa: E731
    dp = {"fc1": Strategy([4, 1, 1], [0, -1, -1]), "act": Strategy([4, 1], [0, -1])}
    dp["fc2"] = dp["fc1"]
    assert (
        evaluate(Plan(g, cluster, dp, Pricing(cost_model="volume")))
        == 2 * (ar(64 * 64 * 4) + ar(64 * 4))
        == 49_920
    )
    column = dict(dp, fc1=Strategy([1, 1, 4], [-1, -1, 0]), act=Strategy([1, 4], [-1, 0]))
    all_to_all = 3 / 4 * 512 * 64 / 4 * 4  # elements received per device, times 4 B
    grads_fc2 = ar(64 * 64 * 4) + ar(64 * 4)
    assert (
        evaluate(Plan(g, cluster, column, Pricing(cost_model="volume", step="forward")))
        == all_to_all + grads_fc2
    )
    assert (
        evaluate(Plan(g, cluster, column, Pricing(cost_model="volume")))
        == 2 * all_to_all + grads_fc2
        == 74_112
    )
    training = taps.search(g, cluster, taps.Pricing(cost_model="volume"))
    assert training.cost == 49_920 and training.plan.strategies == dp
    forward = taps.search(g, cluster, taps.Pricing(cost_model="volume", step="forward"))
    assert forward.cost == 49_536 < 49_920


def _megatron_mlp(consumer: bool) -> Graph:
    g = Graph("megatron-mlp")
    x = g.input("x", (32, 64), requires_grad=True)
    h = g.gelu("gelu", g.linear("fc1", x, 256, bias=True))
    y = g.linear("fc2", h, 64, bias=True)
    if consumer:
        g.relu("next", y)
    return g


MEGATRON = {
    "fc1": Strategy([1, 1, 4], [-1, -1, 0]),  # column parallel
    "gelu": Strategy([1, 4], [-1, 0]),
    "fc2": Strategy([1, 4, 1], [-1, 0, -1]),  # row parallel
    "next": Strategy([1, 4], [-1, 0]),
}


def test_megatron_column_row_mlp_needs_no_bias_gradient_all_reduce():
    """Megatron's MLP on 4 devices: the row-parallel layer's bias gradient is the same on every
    device (only the contracted axis is split), so nothing reduces it; the forward all_reduce
    of fc2's partial output is fc2's, as in Megatron; the input's gradient is all_reduced at fc1
    (the identity's backward, Megatron's f)."""
    g, cluster = _megatron_mlp(False), Cluster(1, 4)
    strategies = {k: v for k, v in MEGATRON.items() if k != "next"}
    rows = {
        r.name: r for r in breakdown(Plan(g, cluster, strategies, Pricing(cost_model="volume")))
    }
    assert [(c.tensor, c.reason) for c, _ in rows["fc2"].collectives] == [
        ("fc2.out", "forward partial sum")
    ]
    assert [(c.tensor, c.reason) for c, _ in rows["fc1"].collectives] == [("x", "gradient")]
    assert all(i.total == 0 for r in rows.values() for i in r.incoming)
    ar = 2 * 3 / 4 * 32 * 64 * 2  # one all_reduce of a (32, 64) fp16 tensor
    assert evaluate(Plan(g, cluster, strategies, Pricing(cost_model="volume"))) == 2 * ar
    # The paper's model all_reduces fc2's bias gradient over the device dim of `in`.
    forward = {
        r.name: r
        for r in breakdown(
            Plan(g, cluster, strategies, Pricing(cost_model="volume", step="forward"))
        )
    }
    assert ("fc2.bias", "gradient") in [(c.tensor, c.reason) for c, _ in forward["fc2"].collectives]


def test_partial_sums_flow_to_a_single_consumer_as_a_reduce_scatter():
    """fc2's partial output flows to its one consumer: to a consumer split along the same devices
    the edge is a reduce_scatter, half the all_reduce the paper's model prices at fc2."""
    g, cluster = _megatron_mlp(True), Cluster(1, 4)
    assert partial_flows(g) == {"fc1", "fc2"} and partial_flows(g, "forward") == set()
    rows = {
        r.name: r
        for r in breakdown(
            Plan(g, cluster, MEGATRON, Pricing(cost_model="volume", planner="optimal"))
        )
    }
    assert [c.tensor for c, _ in rows["fc2"].collectives] == []
    (edge,) = rows["next"].incoming
    assert [op.kind for op in edge.redistribution.all_ops] == ["reduce_scatter"]
    assert edge.cost == 3 / 4 * 32 * 64 * 2
    assert edge.backward is not None and edge.backward_cost == 3 * 32 * 64 / 4 * 2  # all_gather
    forward = {
        r.name: r
        for r in breakdown(Plan(g, cluster, MEGATRON, Pricing(cost_model="volume", step="forward")))
    }
    assert [c.tensor for c, _ in forward["fc2"].collectives] == ["fc2.out", "fc2.bias"]
    # The bias's gradient is reduced in fp32 (4 bytes), the partial sums in the graph's fp16.
    assert forward["fc2"].intra_cost == 2 * 3 / 4 * 32 * 64 * 2 + 2 * 3 / 4 * 64 * 4


def test_an_output_read_twice_is_all_reduced_once_at_its_operator():
    g = Graph()
    x = g.input("x", (8, 16))
    y = g.linear("fc", x, 8)
    g.relu("a", y)
    g.relu("b", y)
    assert partial_flows(g) == set()
    s = {"fc": Strategy([1, 4, 1], [-1, 0, -1]), "a": Strategy([4, 1], [0, -1])}
    s["b"] = s["a"]
    rows = {r.name: r for r in breakdown(Plan(g, Cluster(1, 4), s, Pricing(cost_model="volume")))}
    assert [(c.tensor, c.reason) for c, _ in rows["fc"].collectives] == [
        ("fc.out", "forward partial sum")
    ]
    for name in ("a", "b"):
        (edge,) = rows[name].incoming
        assert [op.kind for op in edge.redistribution.all_ops] == ["slice"]


def test_backward_edge_takes_the_gradient_to_the_producers_layout():
    """A data-parallel producer feeding a consumer that splits the features: forward a
    slice-free all_to_all, backward the gradient (split like the consumer's input, partial over
    nothing: an elementwise consumer) goes back by one all_to_all too."""
    g = Graph()
    x = g.input("x", (16, 8), requires_grad=True)
    g.relu("b", g.relu("a", x))
    s = {"a": Strategy([4, 1], [0, -1]), "b": Strategy([1, 4], [-1, 0])}
    (row,) = [
        r
        for r in breakdown(Plan(g, Cluster(1, 4), s, Pricing(cost_model="volume")))
        if r.name == "b"
    ]
    (edge,) = row.incoming
    assert edge.backward is not None
    assert [op.kind for op in edge.redistribution.all_ops] == ["all_to_all"]
    assert [op.kind for op in edge.backward.all_ops] == ["all_to_all"]
    assert edge.cost == edge.backward_cost == 3 / 4 * 16 * 8 / 4 * 2


def test_zero_divides_optimizer_state_by_the_data_parallel_group():
    """ZeRO: a parameter replicated over g devices keeps its fp16 weight whole and 1/g of the
    other bytes per parameter (gradient, master weight, moments); the cost is the all_reduce's."""
    g = _alpa_mlp()
    op = g.op("fc1")
    cand = Candidate.of(op, Strategy([4, 1, 1], [0, -1, -1]))
    params = 64 * 64 + 64
    out = 512 * 64 / 4 * 4
    assert memory(g, op, cand) == params * 16 + out
    assert memory(g, op, cand, Pricing(zero=True)) == params * (4 + 12 / 4) + out
    cluster = Cluster(1, 4)
    s = {"fc1": cand.strategy, "act": Strategy([4, 1], [0, -1]), "fc2": cand.strategy}
    assert evaluate(Plan(g, cluster, s, Pricing(zero=True))) == evaluate(Plan(g, cluster, s))
    rows = breakdown(Plan(g, cluster, s, Pricing(zero=True)))
    assert all(c.zero for r in rows for c, _ in r.collectives)


def test_training_search_differs_from_the_paper_on_a_gpt_layer():
    """A smoke check on a real model: both steps search, and the training step's optimum priced
    by evaluate() equals its cost."""
    g = taps.models.gpt(hidden=256, heads=4, seq=128, batch=4)
    cluster = Cluster(1, 4)
    r = taps.search(g, cluster, taps.Pricing(planner="optimal"))
    assert r.plan.pricing.step == "training" and r.plan.pricing.planner == "optimal"
    assert taps.search(g, cluster).plan.pricing.planner == "paper"
    assert r.cost == pytest.approx(
        evaluate(Plan(g, cluster, r.plan.strategies, Pricing(planner="optimal"))), rel=1e-9
    )
    f = taps.search(g, cluster, taps.Pricing(step="forward"))
    assert f.plan.pricing.planner == "paper"
    assert evaluate(Plan(g, cluster, f.plan.strategies, Pricing(planner="optimal"))) >= r.cost * (
        1 - 1e-9
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"step": "backward"}, "unknown step 'backward'"),
        ({"planner": "fast"}, "unknown planner 'fast'"),
    ],
)
def test_bad_step_or_planner_is_one_clear_error(kwargs, message):
    g = _alpa_mlp()
    with pytest.raises(taps.TapsError, match=message):
        taps.search(g, Cluster(1, 2), taps.Pricing(**kwargs))


# -- addends in the IR -----------------------------------------------------------------------


def test_linear_bias_is_an_addend_in_the_signature_and_json():
    g = _alpa_mlp()
    op = g.op("fc1")
    assert [o.addend for o in op.inputs] == [False, False, True]
    assert op.gradient_axes(op.inputs[2]) == ("b",)
    assert op.gradient_axes(op.inputs[1]) == ("b",)
    assert op.gradient_axes(op.inputs[0]) == ("out",)
    plain = Graph("alpa-mlp")
    x = plain.input("x", (512, 64), 4)
    plain.add_operator(
        "fc1",
        "linear",
        [(x, ("b", "in")), (plain.parameter("w", (64, 64), 4), ("in", "out"))],
        ("b", "out"),
        addends=[(plain.parameter("bias", (64,), 4), ("out",))],
    )
    factor = Graph("alpa-mlp")
    x = factor.input("x", (512, 64), 4)
    factor.add_operator(
        "fc1",
        "linear",
        [
            (x, ("b", "in")),
            (factor.parameter("w", (64, 64), 4), ("in", "out")),
            (factor.parameter("bias", (64,), 4), ("out",)),
        ],
        ("b", "out"),
    )
    assert plain.signature("fc1") != factor.signature("fc1")
    assert plain.signature("fc1") == g.signature("fc1")
    text = g.to_json()
    assert '"addend": true' in text
    back = Graph.from_json(text)
    assert back == g and back.signature("fc1") == g.signature("fc1")


def test_addend_errors_name_the_problem():
    g = Graph()
    x = g.input("x", (4, 8))
    w = g.parameter("w", (8, 4))
    with pytest.raises(GraphError, match=r"addend 2 \('b'\) has axes \['i'\]"):
        g.add_operator(
            "fc", "linear", [(x, "bi"), (w, "io")], "bo", addends=[(g.parameter("b", (8,)), "i")]
        )
    doc = _alpa_mlp().to_dict()
    inputs = doc["ops"][0]["inputs"]
    inputs.insert(0, inputs.pop())  # the addend first
    with pytest.raises(GraphError, match=r"inputs\[1\]: an input after an addend"):
        Graph.from_json(json.dumps(doc))
    inputs[0]["addend"] = "yes"
    with pytest.raises(GraphError, match=r"inputs\[0\].addend: expected bool"):
        Graph.from_json(json.dumps(doc))


def test_conv_bias_is_an_addend():
    g = Graph()
    x = g.input("x", (4, 3, 8, 8))
    g.conv2d("conv", x, 8, 3, bias=True)
    assert [o.addend for o in g.op("conv").inputs] == [False, False, True]
    assert math.prod(g.tensors["conv.bias"].shape) == 8


@pytest.mark.parametrize(
    ("flags", "kwargs"),
    [
        ([], {}),
        (["--step", "forward"], {"step": "forward"}),
        (
            ["--step", "training", "--planner", "paper", "--zero"],
            {"planner": "paper", "zero": True},
        ),
    ],
)
def test_cli_step_and_planner(tmp_path, capsys, flags, kwargs):
    from taps.cli import main

    path, out = tmp_path / "g.json", tmp_path / "r.json"
    graph = _megatron_mlp(True)
    path.write_text(graph.to_json())
    argv = ["search", str(path), "--nodes", "1", "--devices-per-node", "4", "--json", str(out)]
    assert main([*argv, "--cost-model", "volume", *flags]) == 0
    capsys.readouterr()
    want = taps.search(graph, Cluster(1, 4), taps.Pricing("volume", **kwargs)).cost
    assert json.loads(out.read_text())["volume"]["cost"] == pytest.approx(want)
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--step", "backward"])
    assert exit_.value.code == 2
    assert "--step: invalid choice: 'backward'" in capsys.readouterr().err


# The searched plan under Algorithm 1 moves nothing between operators: no case there.
@pytest.mark.parametrize(
    ("megatron", "planner"),
    [(True, "paper"), (True, "optimal"), (False, "optimal")],
    ids=["megatron-paper", "megatron-optimal", "searched-optimal"],
)
def test_training_step_edges_run_on_xla_as_priced(megatron, planner):
    """Every edge of a training-step plan, forward (from the partial sums where they flow) and
    backward (the gradient with its partial dims back to the producer's layout), run on XLA by
    taps' own steps: each block is right and the bytes XLA moves are what taps prices."""
    pytest.importorskip("jax")
    from taps.verify import verify_redistributions

    if megatron:
        g, cluster, strategies = _megatron_mlp(True), Cluster(1, 4), MEGATRON
    else:
        g = taps.models.mlp(batch=64, sizes=(32, 64, 32), dtype_bytes=4)
        cluster = Cluster(2, 4)
        strategies = taps.search(
            g, cluster, taps.Pricing(cost_model="volume", planner=planner)
        ).plan.strategies
    rows = breakdown(Plan(g, cluster, strategies, Pricing(cost_model="volume", planner=planner)))
    plans = [
        (plan, cost)
        for row in rows
        for i in row.incoming
        for plan, cost in ((i.redistribution, i.cost), (i.backward, i.backward_cost))
        if plan is not None
    ]
    pairs = [(plan.source, plan.target) for plan, _ in plans]
    assert any(layout.partial for pair in pairs for layout in pair)
    results = verify_redistributions(pairs, cluster.devices_per_node, planner=planner)
    assert all(r.ok for r in results), [r.mismatches for r in results if not r.ok]
    # The replay runs float32: taps' bytes at the graph's element size, scaled to 4 bytes.
    dtype = g.tensors["x"].dtype_bytes
    measured = [sum(c.measured_bytes or 0 for c in r.collectives) for r in results]
    assert measured == pytest.approx([cost * 4 / dtype for _, cost in plans])
    assert sum(measured) > 0


@pytest.mark.parametrize("cost_model", ["topology", "volume"])
def test_partial_sums_flow_through_a_view(cost_model):
    """A contraction's partial output read through a reshape: the tables price every assignment
    as the plans do, and the search finds the least of them."""
    g = Graph()
    x = g.input("x", (8, 16), requires_grad=True)
    y = g.linear("fc", x, 32)
    g.relu("r", g.reshape("v", y, (8, 4, 8)))
    cluster = Cluster(2, 4)
    assert partial_flows(g) == {"fc"}
    tables = build_tables(g, cluster, Pricing(cost_model=cost_model))
    names = [op.name for op in g.ops]
    prices = []
    for choice in itertools.product(*(range(len(tables.ops[n].candidates)) for n in names)):
        s = {n: tables.ops[n].strategies[i] for n, i in zip(names, choice)}
        prices.append(evaluate(Plan(g, cluster, s, Pricing(cost_model=cost_model))))
        assert tables.evaluate(dict(zip(names, choice))) == pytest.approx(prices[-1], rel=1e-9)
    assert taps.search(g, cluster, taps.Pricing(cost_model=cost_model)).cost == pytest.approx(
        min(prices), rel=1e-9
    )


def test_bias_gradient_all_reduce_is_what_xla_runs():
    """The replay on XLA (jax.vjp of the sharded program) all_reduces a bias gradient over the
    batch split only: the training step prices exactly those bytes, the paper's model more."""
    pytest.importorskip("jax")
    from taps.verify import verify

    g = Graph("bias")
    g.linear("fc1", g.input("x", (32, 16)), 32, bias=True)
    cluster, s = Cluster(1, 8), {"fc1": Strategy([2, 2, 2], [2, 1, 0])}
    r = verify(Plan(g, cluster, s))
    (xla,) = [c.measured_bytes for c in r.collectives if c.what == "gradient of fc1.bias"]
    # The replay runs float32, as taps reduces parameters' gradients by default.
    priced = {
        step: sum(
            cost
            for row in breakdown(Plan(g, cluster, s, Pricing(cost_model="volume", step=step)))
            for c, cost in row.collectives
            if c.tensor == "fc1.bias"
        )
        for step in STEPS
    }
    assert xla == priced["training"] == 64
    assert priced["forward"] == 96
