"""Real mixture-of-experts models on the torch engine (``taps verify --engine torch``,
python/taps/verify/torch/moe.py): transformers' Mixtral, Qwen2-MoE and GPT-OSS (experts with
biases) from tiny configs, their
blocks' routed part (top-k, sort, histogram, grouped matmuls) replayed as taps' GShard operators
on each rank's blocks with a fixed balanced routing. On the fake process group at the plan's
world size every collective DTensor dispatches, the dispatch's and combine's all_to_alls
included, is taps' prediction (kind, group, bytes); on gloo ranks (no all_to_all there: DTensor
gathers and cuts) the outputs and every gradient, the router's included, equal the dense run's."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import transformers

import taps
from taps.export.distribute import export_module
from taps.plan.experts import expert_splits
from taps.verify import verify_torch
from taps.verify.torch.moe import dense_run
from taps.verify.torch.numerics import numerics_plan
from taps.verify.xla.operators import balanced_routing

M, H, E, K = 32, 48, 4, 2
BATCH, SEQ = 4, 8

FAMILIES = {
    "mixtral": (
        transformers.MixtralConfig,
        transformers.MixtralForCausalLM,
        {"intermediate_size": H, "num_local_experts": E},
    ),
    "qwen2_moe": (
        transformers.Qwen2MoeConfig,
        transformers.Qwen2MoeForCausalLM,
        {
            "intermediate_size": H,
            "moe_intermediate_size": 24,
            "shared_expert_intermediate_size": 40,
            "num_experts": E,
        },
    ),
    # Experts' biases (stacked, (e, out)), its weights stored (e, in, out).
    "gpt_oss": (
        transformers.GptOssConfig,
        transformers.GptOssForCausalLM,
        {"intermediate_size": H, "num_local_experts": E, "head_dim": 8},
    ),
}


def _model(family: str) -> tuple[torch.nn.Module, torch.Tensor]:
    config_cls, model_cls, extra = FAMILIES[family]
    config = config_cls(
        hidden_size=M,
        num_experts_per_tok=K,
        num_attention_heads=4,
        num_key_value_heads=4,
        num_hidden_layers=1,
        vocab_size=100,
        use_cache=False,
        **extra,
    )
    with torch.device("meta"):
        return model_cls(config), torch.zeros(BATCH, SEQ, dtype=torch.long)


def _expert_all_to_alls(rows: list, phase: str) -> list:
    """The all_to_alls on the edges into the experts and into the combine."""
    return [
        r
        for r in rows
        if r.kind == "all_to_all"
        and r.phase == phase
        and ("moe_dispatch ->" in r.what or "moe_combine" in r.what.partition("->")[2])
    ]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_expert_all_to_alls_dtensor_dispatches_are_taps_prediction(family: str) -> None:
    model, ids = _model(family)
    plan = taps.search(taps.from_torch(model, ids), taps.Cluster(2, 4)).plan
    (split,) = expert_splits(plan)
    assert split.expert > 1  # the search splits the experts
    result = verify_torch(model, [ids], plan, numerics=None)
    assert result.ok, result.mismatches
    assert all(r.status in ("ok", "shared") for r in result.collectives)
    forward = _expert_all_to_alls(result.collectives, "forward")
    backward = _expert_all_to_alls(result.collectives, "backward")
    # Tokens to their experts and back, forward; their gradients the mirror way, backward.
    assert any("moe_dispatch ->" in r.what for r in forward)
    assert any("moe_combine" in r.what for r in forward)
    assert sorted((r.group_size, r.measured_bytes) for r in forward) == sorted(
        (r.group_size, r.measured_bytes) for r in backward
    )
    # Each moves part of a device's block of the dispatched tokens egcm (4-byte elements): at
    # most all of it but its own share, at least that of the whole tensor split over all.
    whole = E * BATCH * math.ceil(K * SEQ / E) * M * 4
    for r in forward + backward:
        assert r.status == "ok" and r.measured_bytes == r.predicted_bytes
        share = (r.group_size - 1) / r.group_size
        assert whole / 8 * share <= r.measured_bytes <= whole * share


def test_mixtral_on_gloo_equals_the_dense_run() -> None:
    """Four gloo ranks under taps' plan for them (the experts split): the output and every
    gradient equal the dense run's, the router's too (it learns through the combine's
    weights only)."""
    model, ids = _model("mixtral")
    plan = taps.search(taps.from_torch(model, ids), taps.Cluster(1, 4)).plan
    assert numerics_plan(plan, 4) is plan
    (split,) = expert_splits(plan)
    assert split.expert > 1
    result = verify_torch(model, [ids], plan, numerics=4)
    assert result.ok, (result.mismatches, result.errors)
    wanted = {"output 0", "grad model.layers.0.mlp.gate.weight"} | {
        f"grad {n}" for n, p in model.named_parameters() if p.dim() == 3
    }
    assert wanted <= set(result.errors)
    assert max(result.errors.values()) < 1e-5


class _Layer(torch.nn.Module):
    """A block alone (its module path ``mlp``, as in the models)."""

    def __init__(self, block: torch.nn.Module) -> None:
        super().__init__()
        self.mlp = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.mlp(x)
        return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("implementation", ["grouped_mm", "batched_mm"])
def test_the_dense_reference_is_the_block_at_the_balanced_routing(implementation: str) -> None:
    """The reference the gloo numbers are held to, against a plain token loop over Mixtral's
    own weights: token ``t``'s choice ``j`` goes to expert ``(t k + j) mod e`` (the replay's
    balanced routing, every group alike), weighted by its router probability; SwiGLU experts
    from the fused gate-up weight (gate first) and down."""
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    config = transformers.MixtralConfig(
        hidden_size=M,
        intermediate_size=H,
        num_local_experts=E,
        num_experts_per_tok=K,
        experts_implementation=implementation,
    )
    torch.manual_seed(0)
    layer = _Layer(MixtralSparseMoeBlock(config))
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.3)
    x = torch.randn(BATCH, SEQ, M)
    (got,) = dense_run(export_module(layer, x), layer, [x])
    block = layer.mlp
    probs = torch.softmax(x @ block.gate.weight.T, dim=-1)
    c = math.ceil(K * SEQ / E)
    route = balanced_routing(SEQ, E, c)
    want = torch.zeros_like(x)
    for t in range(SEQ):
        for e in np.flatnonzero(route[t].sum(-1)):
            gate, up = (x[:, t] @ block.experts.gate_up_proj[e].T).chunk(2, dim=-1)
            y = (torch.nn.functional.silu(gate) * up) @ block.experts.down_proj[e].T
            want[:, t] += probs[:, t, e, None] * y
    assert [(t * K + j) % E for t in range(2) for j in range(K)] == [
        int(e) for t in range(2) for e in np.flatnonzero(route[t].sum(-1))
    ]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # Not the module's own routing (top-k of its scores, renormalised).
    assert float((got - layer(x)).detach().abs().max()) > 1e-3


def test_the_dense_reference_adds_the_experts_biases() -> None:
    """GPT-OSS's block (its experts' weights stored ``(e, in, out)``, with biases): the
    reference at the balanced routing against a token loop over its weights and biases, the
    router's logits weighting each choice (the routing tensor reads them), gate first in the
    fused projection as the GShard form takes it."""
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

    config = transformers.GptOssConfig(
        hidden_size=M,
        intermediate_size=H,
        num_local_experts=E,
        num_experts_per_tok=K,
        experts_implementation="grouped_mm",
    )
    torch.manual_seed(0)
    layer = _Layer(GptOssMLP(config))
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.3)
    x = torch.randn(BATCH, SEQ, M)
    (got,) = dense_run(export_module(layer, x), layer, [x])
    router, experts = layer.mlp.router, layer.mlp.experts
    logits = x @ router.weight.T + router.bias
    route = balanced_routing(SEQ, E, math.ceil(K * SEQ / E))
    want = torch.zeros_like(x)
    for t in range(SEQ):
        for e in np.flatnonzero(route[t].sum(-1)):
            h = x[:, t] @ experts.gate_up_proj[e] + experts.gate_up_proj_bias[e]
            gate, up = h.chunk(2, dim=-1)
            y = (torch.nn.functional.silu(gate) * up) @ experts.down_proj[e]
            want[:, t] += logits[:, t, e, None] * (y + experts.down_proj_bias[e])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    # The biases count: without them the loop is another number.
    assert float(experts.down_proj_bias.abs().max()) > 0.1
