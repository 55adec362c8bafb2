"""A parameter used in several places is one parameter: the graph IR's share operator against
hand-built graphs and closed forms, and real transformers models with tied weights (built from
their configs on the meta device) whose graph holds exactly the module's parameters."""

from __future__ import annotations

import pytest

import taps
import torch_factories
from taps import Cluster, Graph, GraphError, Plan, Pricing, Strategy
from taps.frontends import from_torch
from taps.search.evaluate import breakdown, evaluate


def _tied() -> Graph:
    """``x -> x w -> (x w) w``: one weight read by two operators, the second through a view."""
    g = Graph("tied")
    x = g.input("x", (512, 64), 4)
    w = g.parameter("w", (64, 64), 4)
    y = g.einsum("use1", "bi,io->bo", x, w)
    wt = g.reshape("w.flat", w, (64, 64))
    g.einsum("use2", "bi,io->bo", y, wt)
    return g


def test_share_makes_one_reader_of_the_parameter():
    g = _tied()
    assert g.share_parameters() == ["w.share"]
    assert [op.name for op in g.ops] == ["w.share", "use1", "use2"]
    share = g.op("w.share")
    assert share.kind == taps.graph.SHARE and share.inputs[0].tensor == "w"
    readers = [o.tensor for op in g.ops for o in op.inputs if g.root(o.tensor).name == "w"]
    assert readers == ["w"]  # the share operator alone reads it
    assert g.op("use1").inputs[1].tensor == "w.share.out"
    assert g.root("w.flat").name == "w.share.out"  # the view now views the shared weight
    assert g.num_parameters() == 64 * 64
    assert [(e.producer, e.consumer) for e in g.edges] == [
        ("w.share", "use1"),
        ("use1", "use2"),
        ("w.share", "use2"),
    ]
    assert Graph.from_json(g.to_json()) == g
    assert g.share_parameters() == []  # nothing left to share


def test_share_refuses_clashes_and_ties_and_leaves_the_graph():
    g = _tied()
    g.input("w.share.out", (1,))
    before = g.to_json()
    with pytest.raises(GraphError, match=r"w\.share\.out"):
        g.share_parameters()
    assert g.to_json() == before
    g = taps.models.mlp(batch=8, sizes=(4, 4, 4, 4))
    g.tie([["fc2"], ["fc3"]])
    with pytest.raises(GraphError, match="before declaring ties"):
        g.share_parameters()


def test_tied_weight_is_held_once_and_its_gradient_comes_back_on_the_edges():
    """Data parallel uses of a weight sharded over 4 devices (FSDP): memory holds one shard of
    it, at the share operator, and each use pays, in volume, the all_gather of the weight
    forward and the reduce_scatter of its gradient back (2 (n-1)/n |W| together, an
    all_reduce's volume); nothing else communicates."""
    g = _tied()
    g.share_parameters()
    dp = Strategy([4, 1, 1], [0, -1, -1])
    chosen = {"use1": dp, "use2": dp, "w.share": Strategy([4, 1], [0, -1])}
    plan = Plan(g, Cluster(1, 4), chosen, Pricing(cost_model="volume", planner="optimal"))
    weight = 64 * 64 * 4
    assert evaluate(plan) == pytest.approx(2 * (2 * 3 / 4 * weight))
    costs = {c.name: c for c in breakdown(plan)}
    assert not any(c.collectives for c in costs.values())
    from taps.search.prices import memory

    mem = {name: memory(g, g.op(name), c) for name, c in plan.candidates.items()}
    assert mem["w.share"] == 64 * 64 / 4 * 16  # one shard, weight, gradient and optimizer state
    assert mem["use1"] == mem["use2"] == 512 / 4 * 64 * 4  # the outputs only


def test_a_replicated_shared_weight_is_reduced_by_its_uses_only():
    """The weight whole on every device (data parallelism): each use's gradient comes back on
    its edge as one all_reduce, already summed, so the share operator reduces nothing more."""
    g = _tied()
    g.share_parameters()
    dp = Strategy([4, 1, 1], [0, -1, -1])
    whole = {"use1": dp, "use2": dp, "w.share": Strategy([1, 1], [-1, -1], [4])}
    plan = Plan(g, Cluster(1, 4), whole, Pricing(cost_model="volume", planner="optimal"))
    costs = {c.name: c for c in breakdown(plan)}
    assert costs["w.share"].total == 0
    assert evaluate(plan) == pytest.approx(2 * (2 * 3 / 4 * 64 * 64 * 4))


#: The tied families of tests/torch_factories.py: the token embedding read again by the head.
TIED = ["gpt2", "bert", "t5", "gemma2", "gemma3"]


@pytest.mark.parametrize("family", TIED)
def test_tied_models_have_the_modules_parameters(family):
    module, inputs = getattr(torch_factories, family)()
    g = from_torch(module, *inputs)
    named = dict(module.named_parameters())  # one key per tensor, its first
    assert g.num_parameters() == sum(p.numel() for p in named.values())
    params = {n for n, t in g.tensors.items() if t.kind == "parameter"}
    assert params == set(named)
    shared = [op for op in g.ops if op.kind == taps.graph.SHARE]
    assert len(shared) == 1  # the input embedding, read again by the output head
    readers = [op.name for op in g.ops for o in op.inputs if o.tensor == shared[0].output.tensor]
    assert len(readers) >= 2
    assert Graph.from_json(g.to_json()) == g
