"""Models as a user builds them, not as the family tests do: on the CPU with weights, and with a
library's defaults (transformers' ``use_cache`` on, which returns an inference cache)."""

from __future__ import annotations

import pytest
import torch
import transformers

import taps
from taps.frontends.torch import from_torch
from taps.verify import verify_torch
from taps.verify.torch.values import materialize


def _gpt2() -> tuple[torch.nn.Module, torch.Tensor]:
    """GPT-2 on the CPU with transformers' defaults: ``use_cache`` on, the head tied to the
    token embedding."""
    config = transformers.GPT2Config(
        n_layer=2,
        n_embd=64,
        n_head=4,
        vocab_size=256,
        n_positions=32,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config), torch.randint(0, 256, (4, 16))


def test_a_model_that_returns_its_cache_converts_and_is_left_as_it_was():
    module, ids = _gpt2()
    assert module.config.use_cache is True
    with torch.no_grad():  # as the user calls it: the cache is in the output
        assert module(ids).past_key_values is not None
    g = from_torch(module, ids)
    assert module.config.use_cache is True
    assert g.num_parameters() == sum(p.numel() for p in module.parameters())


def test_a_copy_moved_to_the_meta_device_keeps_its_tied_weights():
    """Moving a module across devices gives each key a parameter of its own: the engine's copy
    ties them again, and keeps no cache."""
    module, _ = _gpt2()
    assert module.lm_head.weight is module.transformer.wte.weight
    moved = materialize(module, torch.float32, "meta", 0)
    assert moved.lm_head.weight is moved.transformer.wte.weight
    assert moved.lm_head.weight.is_meta
    assert moved.config.use_cache is False and module.config.use_cache is True


def test_gpt2_with_its_defaults_verifies_on_the_fake_process_group_and_gloo():
    """The tied head's gradient is one all_reduce on the shared weight, issued as predicted;
    the numbers on 4 gloo ranks equal the dense model's."""
    module, ids = _gpt2()
    plan = taps.search(from_torch(module, ids), taps.Cluster(2, 4)).plan
    result = verify_torch(module, [ids], plan, numerics=None)
    assert result.ok, result.mismatches
    plan = taps.search(from_torch(module, ids), taps.Cluster(1, 4)).plan
    result = verify_torch(module, [ids], plan, numerics=4)
    assert result.ok, result.mismatches
    grads = {f"grad {k}" for k, _ in module.named_parameters()}
    assert grads <= set(result.errors)
    assert 0 < result.max_error <= result.tolerance


@pytest.mark.parametrize("name", ["efficientnet_b0", "mobilenet_v3_small"])
def test_torchvision_convnets_with_their_defaults_verify_on_gloo(name):
    """torchvision's EfficientNet (stochastic depth, and its classifier's in-place dropout) and
    MobileNetV3 (hardswish, squeeze-excitation) in training mode: every draw of the dense run
    is the replay's (``dropout_`` too), and the engine's values are scaled by each convolution's
    fan-in, so that float32 separates a right plan from a wrong one (at 8 x 64 x 64, BatchNorm's
    statistics are over enough values to be well conditioned)."""
    import torchvision

    with torch.device("meta"):
        module = getattr(torchvision.models, name)(num_classes=10)
        images = torch.empty(8, 3, 64, 64)
    module.train()
    plan = taps.search(from_torch(module, images), taps.Cluster(1, 4)).plan
    result = verify_torch(module, [images], plan, numerics=4)
    assert result.ok, (result.max_error, result.mismatches)
    assert result.max_error < 1e-4
