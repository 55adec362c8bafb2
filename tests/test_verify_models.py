"""``taps.verify`` (the exact XLA replay of the training step) on the models people train: one
small config of each family (decoder, encoder, encoder-decoder, vision, audio, convnet) from
transformers, timm and torchvision, built on the meta device by ``tests/torch_factories.py`` and
converted by the PyTorch front end. Embeddings, index and gather reads, slices, concatenations,
broadcasts and 1-d convolutions replay (docs/verify.md): every collective the compiled program
issues is one taps predicted, and the sharded outputs and gradients equal the unsharded run."""

from __future__ import annotations

import pytest

import taps
import torch_factories
from taps.frontends import from_torch
from taps.verify.result import OK

#: One per family: (factory, what it covers).
FAMILIES = {
    "qwen2_gqa": "decoder: token embedding, grouped-query attention, rotary slices and cat",
    "deberta_v2": "encoder: disentangled attention, relative positions by gather, repeat",
    "falcon": "decoder: multi-query attention through expand, fused qkv",
    "clip_text": "text encoder: the pooled token picked by argmax and index",
    "bart": "encoder-decoder: tied embeddings, shifted decoder inputs",
    "whisper": "audio: conv1d front, positions read by index",
    "swin": "vision: relative-position table read by index, window rolls and slices",
    "tv_resnet": "convnet: BatchNorm, pooling",
}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_family_verifies_on_xla(name: str) -> None:
    module, inputs = getattr(torch_factories, name)()
    plan = taps.search(from_torch(module, *inputs), taps.Cluster(1, 4)).plan
    result = taps.verify(plan)
    assert result.ok, result.mismatches
    assert result.collectives and {c.status for c in result.collectives} <= {OK, "shared"}
