"""Experts kept apart, an ``nn.ModuleList`` of expert MLPs run by a Python loop (docs/moe.md,
"Per-expert modules"; the layers in tests/moe_modulelist.py: no installed transformers or
torchtitan model writes its experts so any more): recognised as one block with an expert axis,
the experts' weights one stacked parameter each (counted once), the operators computing what the
module computes, expert parallelism searched, each expert's weight placed on its expert group, and
the plan replayed on the torch fake process group (the all_to_alls as predicted) and on gloo
(outputs and every expert's gradient as the dense run's)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import taps
from moe_models import assert_experts_held
from moe_modulelist import CapacityLoopMoE, DenseLoopMoE, Layer, Model, PickLoopMoE
from taps.export import layouts_of, to_dtensor
from taps.export.distribute import export_module
from taps.export.experts import expert_placements, stacked_parameters
from taps.frontends.torch.moe import expert_keys
from taps.graph import MOE_COMBINE, MOE_DISPATCH, MOE_EXPERT, MOE_ROUTE
from taps.plan.experts import expert_splits
from taps.verify import verify_torch
from taps.verify.torch.moe import addend, addends, blocks_of, compute, dense_run
from taps.verify.xla.operators import balanced_routing

M, H, E, K = 32, 48, 4, 2
BATCH, SEQ = 4, 8
KINDS = {"dense": DenseLoopMoE, "capacity": CapacityLoopMoE}
#: Per kind, the experts' linears in order of use.
LINEARS = {"dense": ("w1", "w3", "w2"), "capacity": ("fc1", "fc2")}


def _model(kind: str, layers: int = 1, meta: bool = True) -> tuple[Model, torch.Tensor]:
    if meta:
        with torch.device("meta"):
            return Model(KINDS[kind], layers), torch.zeros(BATCH, SEQ, dtype=torch.long)
    torch.manual_seed(0)
    model = Model(KINDS[kind], layers)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return model, torch.randint(0, 100, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_per_expert_modules_convert_with_an_expert_axis(kind: str) -> None:
    model, ids = _model(kind, layers=2)
    graph = taps.from_torch(model, ids)
    assert graph.num_parameters() == sum(p.numel() for p in model.parameters())
    for layer in (0, 1):
        prefix = f"layers.{layer}.mlp"
        ops = [op for op in graph.ops if op.name.startswith(prefix + ".")]
        kinds = [op.kind for op in ops]
        assert kinds.count(MOE_ROUTE) == kinds.count(MOE_DISPATCH) == kinds.count(MOE_COMBINE) == 1
        experts = [op for op in ops if op.kind == MOE_EXPERT]
        assert [op.name for op in experts] == [f"{prefix}.experts.*.{w}" for w in LINEARS[kind]]
        for op, w in zip(experts, LINEARS[kind]):
            name = f"{prefix}.experts.*.{w}.weight"
            weight = model.get_submodule(f"{prefix}.experts.0.{w}").weight
            assert op.inputs[1].tensor == name
            assert graph.tensors[name].shape == (E, *weight.shape)
            assert op.inputs[1].dims[0] == "e" and "e" in op.partitionable
            assert expert_keys(name, E) == [f"{prefix}.experts.{i}.{w}.weight" for i in range(E)]
            biases = [o.tensor for o in op.inputs if o.addend]
            assert biases == ([f"{prefix}.experts.*.{w}.bias"] if kind == "capacity" else [])
    # No expert's own weight is a graph tensor: each is in its stack.
    assert not [t for t in graph.tensors if ".experts.0." in t]


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_operators_compute_what_the_module_computes(kind: str) -> None:
    """The block's operators, from dispatch to combine, on the module's own routing (its top-k
    weights as the combine weights, room for every token) and on its experts' weights stacked as
    the graph holds them, equal the block's output."""
    model, ids = _model(kind, meta=False)
    layer = model.layers[0]
    exported = export_module(model, ids)
    (block,) = blocks_of(exported)
    graph = exported.conversion.graph
    x = layer.norm(model.embed(ids)).detach()
    moe = layer.mlp
    with torch.no_grad():
        want = moe(x)
        if kind == "dense":
            weights, chosen = moe.routing(x)
            combine = torch.zeros(BATCH, SEQ, E, SEQ)
            for g in range(BATCH):
                for s in range(SEQ):
                    for j in range(K):
                        combine[g, s, int(chosen[g, s, j]), s] = weights[g, s, j]
        else:
            combine = moe.combine(x)
    params = stacked_parameters(dict(model.named_parameters()), graph)
    made: dict[str, torch.Tensor] = {}
    tokens = graph.root(next(op for op in block.ops if op.kind == MOE_DISPATCH).inputs[1].tensor)
    with torch.no_grad():
        for op in block.ops:
            if op.kind == MOE_ROUTE:
                made[op.output.tensor] = combine
                continue
            xs = []
            for o in op.inputs:
                root = graph.root(o.tensor)
                if root.name in made:
                    xs.append(made[root.name])
                elif root.kind == "parameter":
                    xs.append(params[root.name])
                else:
                    assert root.name == tokens.name
                    xs.append(x)
            made[op.output.tensor] = compute(op, xs)
            for slot in addends(op):
                made[op.output.tensor] = made[op.output.tensor] + addend(op, slot, xs[slot])
    got = made[block.ops[-1].output.tensor]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert float(want.abs().max()) > 1e-2  # not a replay of zeros


def test_the_dense_reference_is_a_token_loop_over_the_modules_experts() -> None:
    """The gloo runs' reference (taps' operators on whole tensors at the balanced routing,
    the experts' weights stacked) against each token run through the module's own expert
    modules: token ``t``'s choice ``j`` to expert ``(t k + j) mod e``, weighted by its router
    probability."""
    torch.manual_seed(0)
    layer = Layer(DenseLoopMoE(M, H, E, K), M)
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.3)
    x = torch.randn(BATCH, SEQ, M)
    (got,) = dense_run(export_module(layer, x), layer, [x])
    moe = layer.mlp
    h = layer.norm(x)
    probs = torch.softmax(moe.gate(h), dim=-1)
    route = balanced_routing(SEQ, E, math.ceil(K * SEQ / E))
    want = x.clone()
    for t in range(SEQ):
        for e in np.flatnonzero(route[t].sum(-1)):
            want[:, t] += probs[:, t, e, None] * moe.experts[int(e)](h[:, t])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layers", [2, 4])
def test_layers_of_per_expert_modules_are_exported_once_as_whole(layers: int) -> None:
    """Four layers are exported as a prefix and copied; the experts' list (its children side
    by side, not a chain of layers) is never cut: the graph is the whole export's."""
    model, ids = _model("dense", layers=layers)
    once = taps.from_torch(model, ids).to_dict()
    whole = taps.from_torch(model, ids, once=False).to_dict()
    # The same operators; the same tensors (views may be listed in another order).
    assert once["ops"] == whole["ops"]
    assert sorted(once["tensors"], key=str) == sorted(whole["tensors"], key=str)
    assert once.keys() == whole.keys()
    assert all(once[k] == whole[k] for k in once if k != "tensors")
    assert len([op for op in once["ops"] if op["kind"] == MOE_DISPATCH]) == layers


def test_a_loop_picking_each_experts_tokens_is_refused() -> None:
    """Picking each expert's tokens (``torch.where``) gives shapes that depend on the data:
    refused in one line naming the node and what to write instead."""
    with torch.device("meta"):
        layer = Layer(PickLoopMoE(M, H, E, K), M)
        x = torch.zeros(BATCH, SEQ, M)
    with pytest.raises(taps.GraphError, match=r"node \S+ in .*depends on the data"):
        taps.from_torch(layer, x)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_expert_all_to_alls_dtensor_dispatches_are_taps_prediction(kind: str) -> None:
    model, ids = _model(kind)
    plan = taps.search(taps.from_torch(model, ids), taps.Cluster(2, 4)).plan
    (split,) = expert_splits(plan)
    assert split.expert > 1
    result = verify_torch(model, [ids], plan, numerics=None)
    assert result.ok, result.mismatches
    assert all(r.status in ("ok", "shared") for r in result.collectives)
    experts = [
        r
        for r in result.collectives
        if r.kind == "all_to_all"
        and ("moe_dispatch ->" in r.what or "moe_combine" in r.what.partition("->")[2])
    ]
    assert {r.phase for r in experts} == {"forward", "backward"}
    assert all(r.measured_bytes == r.predicted_bytes for r in experts)
    # The experts' weights' gradients reduced over their data-parallel copies, by stack.
    reduced = {r.what for r in result.collectives if r.what.startswith("gradient of")}
    stacked = {f"gradient of layers.0.mlp.experts.*.{w}.weight" for w in LINEARS[kind]}
    assert stacked <= reduced or split.data == 1


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_each_experts_weight_is_placed_on_its_expert_group(kind: str) -> None:
    """The searched plan's placements of a stacked weight give each of the module's experts its
    ranks: on every rank of the fake process group, the experts it holds are its block of the
    stacked weight (taps' layout), each placed as DTensor places the stacked weight."""
    model, ids = _model(kind, meta=False)
    plan = taps.search(taps.from_torch(model, ids), taps.Cluster(2, 4)).plan
    dt = to_dtensor(plan, model)
    layouts = layouts_of(plan)
    stacked = stacked_parameters(dict(model.named_parameters()), plan.graph)
    for w in LINEARS[kind]:
        name = f"layers.0.mlp.experts.*.{w}.weight"
        layout = layouts.tensors[name]
        assert "Shard(0)" in dt.tensors[name]
        where = expert_placements(dt, name, E)
        for e in where:
            assert sorted(e.ranks) == [
                r
                for r in range(8)
                if layout.shard_index(r)[0][0] <= e.expert < layout.shard_index(r)[0][1]
            ]
        own = [e.get_submodule(w).weight.detach() for e in model.layers[0].mlp.experts]
        assert_experts_held(dt, name, layout, stacked[name].detach(), own)


def test_on_gloo_every_experts_gradient_is_the_dense_runs() -> None:
    """Four gloo ranks under taps' plan for them (the experts split): the output and the
    gradient of every weight, each stack of the experts' included (the experts' own gradients
    stacked as the graph holds them), equal the dense run's."""
    model, ids = _model("dense", meta=False)
    plan = taps.search(taps.from_torch(model, ids), taps.Cluster(1, 4)).plan
    (split,) = expert_splits(plan)
    assert split.expert > 1
    result = verify_torch(model, [ids], plan, numerics=4)
    assert result.ok, (result.mismatches, result.errors)
    wanted = {"output 0", "grad layers.0.mlp.gate.weight"} | {
        f"grad layers.0.mlp.experts.*.{w}.weight" for w in LINEARS["dense"]
    }
    assert wanted <= set(result.errors)
    assert max(result.errors.values()) < 1e-5
