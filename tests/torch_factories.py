"""Factories for ``taps import`` and ``taps search --torch`` in the tests:
``torch_factories:<name>`` returns ``(module, inputs)`` built on the meta device."""

from __future__ import annotations

import sys

import torch
from torch import nn


def mlp() -> tuple[nn.Module, torch.Tensor]:
    with torch.device("meta"):
        module = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64)).half()
        return module, torch.empty(32, 64, dtype=torch.half)


def not_a_pair() -> nn.Module:
    return nn.Linear(4, 4)


def raises() -> tuple[nn.Module, torch.Tensor]:
    raise ValueError("the config has no field 'hidden'\nsecond line")


def exits() -> tuple[nn.Module, torch.Tensor]:
    sys.exit(0)


#: Not callable: ``torch_factories:CONSTANT`` names a value.
CONSTANT = 3


# -- the models people train: small configs of real families, built on the meta device ---------

BATCH, SEQ = 2, 16


def _ids(vocab: int = 1000, seq: int = SEQ) -> torch.Tensor:
    return torch.zeros(BATCH, seq, dtype=torch.long)


def _images(size: int = 32, channels: int = 3) -> torch.Tensor:
    return torch.empty(BATCH, channels, size, size)


def _small(**extra: object) -> dict[str, object]:
    """The widths every transformers config here shares: 2 layers, 64 wide, 4 heads."""
    return {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 1000,
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "use_cache": False,
        **extra,
    }


def _vision_widths() -> dict[str, object]:
    """:func:`_small` without what a vision tower has no use for."""
    return {
        k: v
        for k, v in _small().items()
        if k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
    }


def falcon() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    from transformers import FalconConfig, FalconForCausalLM

    config = FalconConfig(**_small(), new_decoder_architecture=True, num_kv_heads=2)
    with torch.device("meta"):
        return FalconForCausalLM(config), (_ids(),)


def clip_text() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    from transformers import CLIPTextConfig, CLIPTextModel

    with torch.device("meta"):
        return CLIPTextModel(CLIPTextConfig(**_small(), max_position_embeddings=32)), (_ids(),)


def clip_vision() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    from transformers import CLIPVisionConfig, CLIPVisionModel

    config = CLIPVisionConfig(**_vision_widths(), image_size=32, patch_size=8)
    with torch.device("meta"):
        return CLIPVisionModel(config), (_images(),)


def clip() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """CLIP's text and vision towers together (the contrastive model)."""
    from transformers import CLIPConfig, CLIPModel

    text = {**_small(), "max_position_embeddings": 32}
    vision = {**_vision_widths(), "image_size": 32, "patch_size": 8}
    config = CLIPConfig(text_config=text, vision_config=vision, projection_dim=32)
    with torch.device("meta"):
        return CLIPModel(config), (_ids(), _images())


def _encoder_decoder() -> dict[str, object]:
    """:func:`_small`'s widths as encoder-decoder configs name them."""
    return {
        "vocab_size": 1000,
        "d_model": 64,
        "encoder_layers": 2,
        "decoder_layers": 2,
        "encoder_attention_heads": 4,
        "decoder_attention_heads": 4,
        "encoder_ffn_dim": 128,
        "decoder_ffn_dim": 128,
    }


def whisper() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    config = WhisperConfig(
        **_encoder_decoder(),
        num_mel_bins=16,
        max_source_positions=32,
        max_target_positions=32,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
        use_cache=False,
    )
    with torch.device("meta"):
        features = torch.empty(BATCH, 16, 64)  # two frames per encoder position
        return WhisperForConditionalGeneration(config), (features, None, _ids())


def swin() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    from transformers import SwinConfig, SwinModel

    config = SwinConfig(
        image_size=32, patch_size=2, embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=4
    )
    with torch.device("meta"):
        return SwinModel(config), (_images(),)


def roberta() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    from transformers import RobertaConfig, RobertaForMaskedLM

    with torch.device("meta"):
        return RobertaForMaskedLM(RobertaConfig(**_small())), (_ids(),)


def deberta_v2() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    from transformers import DebertaV2Config, DebertaV2Model

    config = DebertaV2Config(
        **_small(), relative_attention=True, position_buckets=8, pos_att_type=["p2c", "c2p"]
    )
    with torch.device("meta"):
        return DebertaV2Model(config), (_ids(),)


def phi3() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    from transformers import Phi3Config, Phi3ForCausalLM

    config = Phi3Config(**_small(), num_key_value_heads=4)
    with torch.device("meta"):
        return Phi3ForCausalLM(config), (_ids(),)


def qwen2_gqa() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Grouped-query attention: 4 query heads on 2 key/value heads."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**_small(), num_key_value_heads=2)
    with torch.device("meta"):
        return Qwen2ForCausalLM(config), (_ids(),)


def bart() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """An encoder-decoder whose decoder inputs are the ids shifted right (a slice assignment:
    ``copy_``)."""
    from transformers import BartConfig, BartForConditionalGeneration

    config = BartConfig(**_encoder_decoder(), max_position_embeddings=32, use_cache=False)
    with torch.device("meta"):
        return BartForConditionalGeneration(config), (_ids(),)


def bloom() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """ALiBi attention: the bias added to the scores by ``baddbmm``."""
    from transformers import BloomConfig, BloomForCausalLM

    config = BloomConfig(hidden_size=64, n_layer=2, n_head=4, vocab_size=1000, use_cache=False)
    with torch.device("meta"):
        return BloomForCausalLM(config), (_ids(),)


def _timm(name: str, **options: object) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    import timm

    with torch.device("meta"):
        return timm.create_model(name, pretrained=False, **options), (_images(),)


def timm_vit() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return _timm("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2, num_classes=10)


def timm_convnext() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return _timm("convnext_atto", depths=(1, 1, 1, 1), dims=(16, 32, 64, 128), num_classes=10)


def timm_efficientnet() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return _timm("efficientnet_b0", num_classes=10)


def timm_mixer() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    from timm.models.mlp_mixer import MlpMixer

    with torch.device("meta"):
        module = MlpMixer(num_classes=10, img_size=32, patch_size=8, num_blocks=2, embed_dim=64)
        return module, (_images(),)


def timm_swin() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return _timm(
        "swin_tiny_patch4_window7_224",
        img_size=32,
        patch_size=2,
        window_size=4,
        depths=(2, 2),
        num_heads=(2, 4),
        embed_dim=16,
        num_classes=10,
    )


def timm_deit_drop_path() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A ViT with stochastic depth (drop path: a ``bernoulli_`` per sample)."""
    return _timm(
        "vit_tiny_patch16_224",
        img_size=32,
        patch_size=8,
        depth=2,
        num_classes=10,
        drop_path_rate=0.1,
    )


def _vision(factory: str, size: int = 32, **options: object) -> tuple[nn.Module, tuple]:
    import torchvision

    with torch.device("meta"):
        return getattr(torchvision.models, factory)(num_classes=10, **options), (_images(size),)


def tv_shufflenet() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return _vision("shufflenet_v2_x0_5")


def tv_densenet() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return _vision("DenseNet", growth_rate=8, block_config=(2, 2), num_init_features=16)


def tv_resnet() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return _vision("resnet18")


def tv_mobilenet_v3() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return _vision("mobilenet_v3_small")


def tv_efficientnet() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return _vision("efficientnet_b0")


def tv_vit() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return _vision(
        "VisionTransformer",
        image_size=32,
        patch_size=8,
        num_layers=2,
        num_heads=4,
        hidden_dim=64,
        mlp_dim=128,
    )


def _causal_lm(config_name: str, model_name: str, **extra: object) -> tuple[nn.Module, tuple]:
    """A transformers causal language model of :func:`_small`'s widths (``extra`` on top)."""
    import transformers

    config = getattr(transformers, config_name)(**_small(**extra))
    with torch.device("meta"):
        return getattr(transformers, model_name)(config), (_ids(),)


def gpt2() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """GPT-2 with its language-model head tied to the token embedding."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_layer=2,
        n_embd=64,
        n_head=4,
        vocab_size=1000,
        n_positions=64,
        use_cache=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    with torch.device("meta"):
        return GPT2LMHeadModel(config), (_ids(),)


def llama() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return _causal_lm("LlamaConfig", "LlamaForCausalLM", num_key_value_heads=2)


def mistral() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return _causal_lm("MistralConfig", "MistralForCausalLM", num_key_value_heads=2)


def gemma2() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Gemma 2: sliding-window and full layers alternating, the head tied to the embedding."""
    return _causal_lm("Gemma2Config", "Gemma2ForCausalLM", num_key_value_heads=2, head_dim=16)


def gemma3() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return _causal_lm("Gemma3TextConfig", "Gemma3ForCausalLM", num_key_value_heads=2, head_dim=16)


def gpt_neox() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """GPT-NeoX: a partial rotary embedding and parallel attention and MLP."""
    return _causal_lm("GPTNeoXConfig", "GPTNeoXForCausalLM", rotary_pct=0.25)


def opt() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    from transformers import OPTConfig, OPTForCausalLM

    config = OPTConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        ffn_dim=128,
        word_embed_proj_dim=64,
        vocab_size=1000,
        max_position_embeddings=64,
        use_cache=False,
    )
    with torch.device("meta"):
        return OPTForCausalLM(config), (_ids(),)


def bert() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """BERT with its masked-language-model head tied to the token embedding."""
    from transformers import BertConfig, BertForMaskedLM

    with torch.device("meta"):
        return BertForMaskedLM(BertConfig(**_small())), (_ids(),)


def albert() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """ALBERT: one layer's parameters shared by every layer, and a factorised embedding."""
    from transformers import AlbertConfig, AlbertForMaskedLM

    with torch.device("meta"):
        return AlbertForMaskedLM(AlbertConfig(**_small(), embedding_size=32)), (_ids(),)


def distilbert() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    from transformers import DistilBertConfig, DistilBertForMaskedLM

    config = DistilBertConfig(
        vocab_size=1000, dim=64, n_layers=2, n_heads=4, hidden_dim=128, pad_token_id=0
    )
    with torch.device("meta"):
        return DistilBertForMaskedLM(config), (_ids(),)


def t5() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """T5 (the decoder's ids given), its relative position bias made by the first layer."""
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(
        num_layers=2, d_model=64, num_heads=4, d_ff=128, vocab_size=1000, d_kv=16, use_cache=False
    )
    with torch.device("meta"):
        ids = _ids()
        return T5ForConditionalGeneration(config), (ids, None, ids[:, :8])


def hf_vit() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    from transformers import ViTConfig, ViTModel

    config = ViTConfig(**_vision_widths(), image_size=32, patch_size=8)
    with torch.device("meta"):
        return ViTModel(config, add_pooling_layer=False), (_images(),)


def torchtitan_llama() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """torchtitan's Llama 3 debug model (2 layers), SDPA attention, on the meta device."""
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3 import llama3_configs

    config = llama3_configs["debugmodel"](attn_backend="flex")
    config.layers = config.layers[:2]
    for layer in config.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    with torch.device("meta"):
        return config.build(), (_ids(),)


def timm_resnet() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return _timm("resnet18", num_classes=10)


def timm_mobilenet_v3() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return _timm("mobilenetv3_small_050", num_classes=10)


def timm_deit() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """DeiT with its distillation token and second head."""
    return _timm(
        "deit_tiny_distilled_patch16_224", img_size=32, patch_size=8, depth=2, num_classes=10
    )


def tv_convnext() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return _vision("convnext_tiny")


def tv_swin() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return _vision("swin_t")


def tv_alexnet() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return _vision("alexnet", size=64)


def tv_vgg() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    return _vision("vgg11", size=32)
