"""``taps.verify`` (the exact XLA replay of the training step) on the models people train: one
small config of each family (decoder, encoder, encoder-decoder, vision, audio, convnet) from
transformers, timm and torchvision, built on the meta device by ``tests/torch_factories.py`` and
converted by the PyTorch front end (``tests/torch_models.py`` for GPT-2, Llama and BERT).
Embeddings, index and gather reads, slices, concatenations, broadcasts, masks, cumulative sums
and 1-d convolutions replay (docs/verify.md): every collective the compiled program
issues is one taps predicted, and the sharded outputs and gradients equal the unsharded run."""

from __future__ import annotations

import pytest

import taps
import torch_factories
import torch_models
from taps.frontends import from_torch
from taps.verify.result import OK

#: One per family: what it covers.
FAMILIES = {
    "qwen2_gqa": "decoder: token embedding, grouped-query attention, rotary slices and cat",
    "deberta_v2": "encoder: disentangled attention, relative positions by gather, repeat",
    "falcon": "decoder: multi-query attention through expand, fused qkv",
    "clip_text": "text encoder: the pooled token picked by argmax and index",
    "clip": "text and vision towers, the contrastive logits scaled by exp(logit_scale)",
    "roberta": "encoder: position ids from a padding mask by cumsum, token types by gather",
    "bart": "encoder-decoder: tied embeddings, shifted decoder inputs",
    "t5": "encoder-decoder: relative position bias made once, masked by every layer (XLA "
    "computes the layers' equal masked biases, and their redistributions, once: shared)",
    "whisper": "audio: conv1d front, positions read by index",
    "swin": "vision: relative-position table read by index, window rolls and slices",
    "tv_resnet": "convnet: BatchNorm, pooling",
    "tv_vit": "vision transformer: class token through expand and cat",
    "phi3": "decoder: fused qkv and gate-up projections split",
    "bloom": "decoder: ALiBi bias added by baddbmm",
    "gpt2": "decoder: Conv1D projections, the head tied to the token embedding",
    "llama": "decoder: RMS norm, rotary embedding, SwiGLU",
    "bert": "encoder: token-type and position embeddings",
}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_family_verifies_on_xla(name: str) -> None:
    factory = getattr(torch_factories, name, None) or torch_models.MODELS[name]
    module, inputs = factory()
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    plan = taps.search(from_torch(module, *inputs), taps.Cluster(1, 4)).plan
    result = taps.verify(plan)
    assert result.ok, result.mismatches
    assert result.collectives and {c.status for c in result.collectives} <= {OK, "shared"}
