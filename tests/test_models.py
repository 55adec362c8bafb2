"""The built-in models against numbers computed by hand or published."""

from __future__ import annotations

import math

import pytest

import taps
from taps.costs import candidates


def test_alexnet_has_the_papers_eight_operators_and_torchvision_shapes():
    g = taps.models.alexnet(batch=32)
    assert [op.name for op in g.ops] == [
        "conv1",
        "conv2",
        "conv3",
        "conv4",
        "conv5",
        "fc1",
        "fc2",
        "fc3",
    ]
    assert len(g.edges) == 7
    shapes = {op.name: g.tensors[op.output.tensor].shape for op in g.ops}
    assert shapes["conv1"] == (32, 64, 27, 27)  # 55x55 conv, then the 3/2 max-pool
    assert shapes["conv5"] == (32, 256, 6, 6)
    assert g.edges[4].consumer_shape == (32, 9216)  # conv5 -> fc1 through the flatten
    assert shapes["fc3"] == (32, 1000)
    # torchvision's AlexNet has 61,100,840 parameters, 10,344 of them biases (not modelled).
    assert g.num_parameters() == 61_100_840 - 10_344


def test_alexnet_elementwise_is_the_same_network_with_explicit_ops():
    g = taps.models.alexnet(batch=32, elementwise=True)
    names = [op.name for op in g.ops]
    assert names.count("relu1") == 1 and "pool5" in names and len(names) == 8 + 7 + 3
    assert g.num_parameters() == taps.models.alexnet(batch=32).num_parameters()


def _formula(p: int, devices: int) -> int:
    n = devices.bit_length() - 1
    if n == 0:
        return 1
    return sum(
        math.factorial(i) * math.comb(p, i) * math.comb(n - 1, i - 1)
        for i in range(1, min(p, n) + 1)
    )


def test_alexnet_aux_edges_match_the_papers_counts():
    """The paper: more than 3e3 / 1e4 / 5e4 auxiliary edges on 8 / 16 / 64 devices. It counts
    every strategy of the formula; taps drops the ones whose degrees do not divide (conv1 has 3
    input channels), so its count is a little lower on 8 devices."""
    g = taps.models.alexnet()
    for devices, bound in ((8, 3e3), (16, 1e4), (64, 5e4)):
        paper = sum(_formula(3, devices) ** 2 for _ in g.edges)
        assert paper > bound, (devices, paper)
        counts = {op.name: len(candidates(op, devices)) for op in g.ops}
        ours = sum(counts[e.producer] * counts[e.consumer] for e in g.edges)
        assert ours <= paper and ours > 0.85 * paper


@pytest.mark.parametrize("name", list(taps.models.MEGATRON_CONFIGS))
def test_megatron_layers_follow_the_table(name):
    c = taps.models.MEGATRON_CONFIGS[name]
    g = taps.models.megatron(name, batch=8, seq=128)
    h = c.hidden
    assert g.layers == c.layers
    assert g.tensors["x"].shape == (8, 128, h)
    # q, k, v, proj (h^2 each) and the 4h MLP (8 h^2), plus two layernorms (4 h).
    assert g.num_parameters() == 12 * h * h + 4 * h
    assert g.tensors["q.heads"].shape == (8, 128, c.heads, h // c.heads)


def test_megatron_defaults_and_aliases():
    g = taps.models.megatron("1T", seq=64)
    assert g.tensors["x"].shape == (3072, 64, 25600)
    assert g == taps.models.megatron("1008.0B", seq=64)
    with pytest.raises(taps.GraphError, match="unknown Megatron configuration"):
        taps.models.megatron("2B")


def test_gpt_validates_heads_and_mlp_validates_sizes():
    with pytest.raises(taps.GraphError, match="multiple"):
        taps.models.gpt(hidden=100, heads=3, seq=8, batch=2)
    with pytest.raises(taps.GraphError, match="two sizes"):
        taps.models.mlp(sizes=(8,))
    g = taps.models.mlp(batch=16, sizes=(8, 32, 8), activation="relu")
    assert [op.kind for op in g.ops] == ["linear", "relu", "linear"]
