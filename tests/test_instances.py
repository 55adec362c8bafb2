"""Repeated layers exported once (taps.frontends.torch.instances): the graph of a module whose
layers were exported as a prefix and copied equals the graph of its whole export, operator for
operator, name for name, on real models; a module the prefix cannot stand for is exported whole.
"""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
import torch
import transformers
from hypothesis import given, settings
from torch import nn

from taps.frontends.torch import from_torch
from taps.frontends.torch.instances import _period, cuts


def _small(**extra):
    return {
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 100,
        "use_cache": False,
        **extra,
    }


def _lm(config_cls, model_cls, **extra):
    with torch.device("meta"):
        return model_cls(config_cls(**_small(**extra))), (torch.zeros(2, 16, dtype=torch.long),)


def mixtral():
    return _lm(transformers.MixtralConfig, transformers.MixtralForCausalLM, num_hidden_layers=5)


def deepseek_v3():
    # At its released widths (256 experts, MLA attention): a dense first layer, then MoE.
    with torch.device("meta"):
        config = transformers.DeepseekV3Config(
            num_hidden_layers=4, first_k_dense_replace=1, vocab_size=1000, use_cache=False
        )
        return transformers.DeepseekV3ForCausalLM(config), (torch.zeros(2, 16, dtype=torch.long),)


def gemma2():
    # Sliding and full attention alternate: a period of two layers.
    return _lm(
        transformers.Gemma2Config,
        transformers.Gemma2ForCausalLM,
        num_hidden_layers=7,
        head_dim=16,
        sliding_window=8,
    )


def t5():
    # The first layer of each stack holds the relative position bias every later layer reads.
    with torch.device("meta"):
        config = transformers.T5Config(
            vocab_size=100,
            d_model=64,
            d_kv=16,
            d_ff=128,
            num_layers=4,
            num_heads=4,
            use_cache=False,
        )
        model = transformers.T5ForConditionalGeneration(config)
        ids = torch.zeros(2, 16, dtype=torch.long)
    return model, (ids, None, ids)


def gpt2():
    # The token embedding shared with the head.
    with torch.device("meta"):
        config = transformers.GPT2Config(
            n_embd=64, n_layer=4, n_head=4, vocab_size=100, use_cache=False
        )
        return transformers.GPT2LMHeadModel(config), (torch.zeros(2, 16, dtype=torch.long),)


def resnet50():
    import torchvision

    with torch.device("meta"):
        return torchvision.models.resnet50(), (torch.empty(2, 3, 32, 32),)


@pytest.mark.parametrize("factory", [mixtral, deepseek_v3, gemma2, t5, gpt2, resnet50])
def test_layers_exported_once_give_the_whole_exports_graph(factory, monkeypatch):
    module, inputs = factory()
    found = cuts(module)
    assert found and all(c.kept < len(c.keys) for c in found)
    whole = from_torch(module, *inputs, once=False)
    exported = []
    export = torch.export.export

    def counted(mod, args, kwargs=None, **options):
        exported.append(sum(len(list(c.children())) for c in mod.modules()))
        return export(mod, args, kwargs, **options)

    monkeypatch.setattr(torch.export, "export", counted)
    once = from_torch(module, *inputs)
    # One export, of fewer modules than the whole: the copies were made, not a second export.
    assert len(exported) == 1
    assert exported[0] < sum(len(list(c.children())) for c in module.modules())
    assert once == whole  # tensors, operators in order, ties
    assert once.num_parameters() == whole.num_parameters()
    # The user's module is left whole.
    assert [len(list(module.get_submodule(c.path).children())) for c in found] == [
        len(c.keys) for c in found
    ]


class Indexed(nn.Module):
    """Layers called by their index up to a count fixed at build: a prefix cannot run it."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 5
        self.layers = nn.ModuleList(nn.Linear(16, 16) for _ in range(self.count))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(self.count):
            x = self.layers[i](x).relu()
        return x


class Between(nn.Module):
    """Work of the parent after each layer (the relu): the copies would miss it. (Work after
    some layers only, the last exported one among them, would pass for work after the list: the
    layers' wiring is read from the export, the parent's loop is not.)"""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 16)) for _ in range(5)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x).relu()
        return x


@pytest.mark.parametrize("cls", [Indexed, Between])
def test_a_module_the_prefix_cannot_stand_for_is_exported_whole(cls):
    with torch.device("meta"):
        module, x = cls(), torch.empty(4, 16)
    assert cuts(module)
    assert from_torch(module, x) == from_torch(module, x, once=False)
    assert len([op for op in from_torch(module, x).ops if op.kind == "linear"]) == len(
        [m for m in module.modules() if isinstance(m, nn.Linear)]
    )


def test_layers_that_differ_in_an_attribute_are_not_copies():
    with torch.device("meta"):
        model = transformers.Gemma2ForCausalLM(
            transformers.Gemma2Config(**_small(num_hidden_layers=6, head_dim=16))
        )
    (cut,) = cuts(model)
    assert cut.period == 2  # sliding and full attention
    with torch.device("meta"):
        model = transformers.MixtralForCausalLM(
            transformers.MixtralConfig(**_small(num_hidden_layers=6))
        )
    (cut,) = cuts(model)
    assert (cut.start, cut.period, cut.kept) == (0, 1, 2)  # layer_idx apart, all alike


def _brute_period(labels):
    """Every (start, period) under which the list repeats three times or more, the fewest kept."""
    n, best = len(labels), None
    for period in range(1, n + 1):
        for start in range(n):
            if n - start < 3 * period:
                continue
            if any(labels[i] != labels[i + period] for i in range(start, n - period)):
                continue
            kept = start + 2 * period + (n - start) % period
            if kept < n and (best is None or kept < best[0]):
                best = (kept, start, period)
    return best


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 2), max_size=4),
    st.lists(st.integers(0, 2), min_size=1, max_size=3),
    st.integers(1, 6),
    st.integers(0, 3),
)
def test_the_kept_prefix_is_the_shortest_that_shows_two_periods(head, unit, times, extra):
    labels = head + unit * times + unit[:extra]
    got, want = _period(labels), _brute_period(labels)
    assert (got is None) == (want is None)
    if got is not None:
        kept, start, period = got
        assert kept == want[0]
        assert all(labels[i] == labels[i + period] for i in range(start, len(labels) - period))
        assert (len(labels) - kept) % period == 0
