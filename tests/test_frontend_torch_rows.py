"""The PyTorch front end's rows view and pieces of splits on DeepSeek-V3's MLA attention
(transformers' own, a small config on the meta device): the latent ``(batch, 1, seq, rank)``
expanded by ``kv_b_proj`` is rows, and a piece of a split reads the pieces' dim whole, which
leaves the search's optimum as it was with that dim partitionable."""

from __future__ import annotations

import pytest
import torch
import transformers

import taps
from taps.frontends.torch import from_torch
from taps.reproduce.cases import paper_cluster

BATCH, SEQ, HEADS, RANK, NOPE, ROPE, V = 2, 6, 4, 16, 8, 8, 8


def _deepseek_v3(layers: int = 1) -> tuple[taps.Graph, torch.nn.Module]:
    config = transformers.DeepseekV3Config(
        num_hidden_layers=layers, use_cache=False, first_k_dense_replace=0, vocab_size=128,
        hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_attention_heads=HEADS, num_key_value_heads=HEADS, kv_lora_rank=RANK, q_lora_rank=24,
        qk_rope_head_dim=ROPE, qk_nope_head_dim=NOPE, v_head_dim=V,
        n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
    )  # fmt: skip
    with torch.device("meta"):
        model = transformers.DeepseekV3ForCausalLM(config)
        ids = torch.zeros(BATCH, SEQ, dtype=torch.long)
    return from_torch(model, ids), model


def _selectors(op: taps.Operator) -> list[str]:
    """The axes a split's input has and its output lacks (which piece is read; not the narrowed
    dim of a piece of unequal size, which is in both)."""
    dims = op.inputs[0].dims
    return [a for a in dims if a not in op.output.dims] if len(dims) > len(op.output.dims) else []


def test_deepseek_v3_latent_expands_as_rows():
    g, model = _deepseek_v3()
    assert g.num_parameters() == sum(p.numel() for p in model.parameters())
    attn = "model.layers.0.self_attn"
    kv_b = g.op(f"{attn}.kv_b_proj")
    # (batch, 1, seq, rank) seen as (batch * seq) rows of the layer norm's output, as every other
    # projection of the layer sees them: one rows axis, not batch and seq apart.
    assert kv_b.kind == "linear"
    assert kv_b.partitionable_sizes == (BATCH * SEQ, RANK, HEADS, NOPE)
    assert [kv_b.axis_size(a) for a in kv_b.output.dims] == [BATCH * SEQ, HEADS, 2, NOPE]
    latent = g.root(kv_b.inputs[0].tensor)
    assert latent.shape == (BATCH * SEQ, RANK)
    (norm,) = [op for op in g.ops if op.output.tensor == latent.name]
    assert norm.name.startswith(f"{attn}.kv_a_layernorm.")
    assert g.op(f"{attn}.q_b_proj").partitionable_sizes[0] == BATCH * SEQ
    # The split of its output into keys and values reads the pieces' dim whole.
    pieces = [op for op in g.ops if op.kind == "split" and _selectors(op)]
    assert len(pieces) == 4  # q into (nope, rope), kv into (keys, values): two pieces each
    for op in pieces:
        assert not set(_selectors(op)) & set(op.partitionable), op.name


def _with_selectors(g: taps.Graph) -> taps.Graph:
    """``g`` as the front end converted it before: the pieces' dim of a split partitionable."""
    data = g.to_dict()
    for op in data["ops"]:
        if op["kind"] == "split":
            op["partitionable"] += _selectors(g.op(op["name"]))
    return taps.Graph.from_dict(data)


def _gpt2_block() -> taps.Graph:
    """GPT-2's block: its fused QKV projection split into three pieces."""
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    config = transformers.GPT2Config(n_embd=64, n_head=4, n_positions=16, use_cache=False)
    with torch.device("meta"):
        x = torch.empty(BATCH, 16, 64)
        return from_torch(GPT2Block(config), x)


def _phi3_mlp() -> taps.Graph:
    """Phi-3's MLP: its fused gate and up projection chunked in two, on rows."""
    from transformers.models.phi3.modeling_phi3 import Phi3MLP

    config = transformers.Phi3Config(hidden_size=64, intermediate_size=96)
    with torch.device("meta"):
        x = torch.empty(BATCH, 16, 64)
        return from_torch(Phi3MLP(config), x)


@pytest.mark.parametrize(
    ("model", "pieces", "devices"),
    [
        ("deepseek_v3", 4, (1, 4)),
        ("deepseek_v3", 4, (2, 4)),
        ("gpt2", 3, (2, 4)),
        ("phi3", 2, (2, 4)),
    ],
)
def test_the_pieces_dim_whole_keeps_the_optimum(model, pieces, devices):
    """Searched with the pieces' dim partitionable (the old conversion: a superset of the
    strategies), the optimum costs the same."""
    g = {"deepseek_v3": lambda: _deepseek_v3()[0], "gpt2": _gpt2_block, "phi3": _phi3_mlp}[model]()
    old = _with_selectors(g)
    widened = [op for op in old.ops if op.partitionable != g.op(op.name).partitionable]
    assert len(widened) == pieces
    cluster = paper_cluster(*devices)
    new_result, old_result = taps.search(g, cluster), taps.search(old, cluster)
    assert new_result.status == old_result.status == "optimal"
    assert new_result.cost == pytest.approx(old_result.cost, rel=1e-9)
