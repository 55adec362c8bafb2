"""Small real models for the torch engine's tests and benches: each factory builds a model from
its library's config on the meta device and returns ``(module, inputs)`` (token ids as integer
tensors, images as floating ones), as ``taps verify --torch`` takes them. Nothing is downloaded.
"""

from __future__ import annotations

import torch
from torch import nn

VOCAB = 128


def _ids(batch: int = 2, seq: int = 16) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(0))


class _Hidden(nn.Module):
    """A transformers model returning its last hidden state (a tensor, not a model output)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids, use_cache=False).last_hidden_state


class _Logits(nn.Module):
    """A transformers language model returning its logits (its head tied to the embedding)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids, use_cache=False).logits


def gpt2() -> tuple[nn.Module, torch.Tensor]:
    """GPT-2 with its language-model head, whose weight is the token embedding's (tied)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=VOCAB, n_positions=16, n_embd=64, n_layer=2, n_head=4,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    with torch.device("meta"):
        return _Logits(GPT2LMHeadModel(config)), _ids()


def llama(layers: int = 2) -> tuple[nn.Module, torch.Tensor]:
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=16,
    )  # fmt: skip
    with torch.device("meta"):
        return _Hidden(LlamaModel(config)), _ids()


def bert() -> tuple[nn.Module, torch.Tensor]:
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=16, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    with torch.device("meta"):
        return _Hidden(BertModel(config, add_pooling_layer=False)), _ids()


def _image(batch: int = 4) -> torch.Tensor:
    return torch.empty(batch, 3, 32, 32, device="meta")


def resnet() -> tuple[nn.Module, torch.Tensor]:
    from torchvision.models import resnet18

    with torch.device("meta"):
        return resnet18(num_classes=16), _image()


def vit() -> tuple[nn.Module, torch.Tensor]:
    from torchvision.models import VisionTransformer

    with torch.device("meta"):
        module = VisionTransformer(
            image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128,
            num_classes=16,
        )  # fmt: skip
        return module, _image()


def timm_vit() -> tuple[nn.Module, torch.Tensor]:
    from timm.models.vision_transformer import VisionTransformer

    with torch.device("meta"):
        module = VisionTransformer(
            img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=16
        )
        return module, _image()


def mixer() -> tuple[nn.Module, torch.Tensor]:
    from timm.models.mlp_mixer import MlpMixer

    with torch.device("meta"):
        module = MlpMixer(img_size=32, patch_size=8, embed_dim=64, num_blocks=2, num_classes=16)
        return module, _image()


#: Every factory, by name.
MODELS = {
    "gpt2": gpt2, "llama": llama, "bert": bert, "resnet": resnet, "vit": vit,
    "timm_vit": timm_vit, "mixer": mixer,
}  # fmt: skip
