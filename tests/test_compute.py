"""The roofline of an operator's compute (taps.search.compute): FLOPs against PyTorch's own
counter on real modules, bytes and the per-device share against closed forms."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import taps
from taps.search.compute import (
    Work,
    backward_work,
    compute_times,
    forward_work,
    is_contraction,
    iteration_space,
)


def _torch_flops(module: torch.nn.Module, *inputs: torch.Tensor) -> tuple[int, int]:
    """PyTorch's count of the FLOPs of ``module`` forward, then backward."""
    with FlopCounterMode(display=False) as forward:
        out = module(*inputs)
    with FlopCounterMode(display=False) as backward:
        out.sum().backward()
    return forward.get_total_flops(), backward.get_total_flops()


def _graph_flops(g: taps.Graph) -> tuple[float, float]:
    """taps' FLOPs of the contractions of ``g`` (what PyTorch's counter counts)."""
    ops = [op for op in g.ops if is_contraction(op)]
    return (
        sum(forward_work(g, op).flops for op in ops),
        sum(backward_work(g, op).flops for op in ops),
    )


class _Block(torch.nn.Module):
    """Convolutions (strided, grouped), linear layers and batched matmuls, without biases
    (PyTorch's counter leaves bias additions out)."""

    def __init__(self, groups: int = 1) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False)
        self.grouped = torch.nn.Conv2d(8, 8, 3, padding=1, groups=groups, bias=False)
        self.fc1 = torch.nn.Linear(8 * 8 * 8, 64, bias=False)
        self.fc2 = torch.nn.Linear(64, 32, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.grouped(torch.relu(self.conv(x)))
        h = self.fc1(h.flatten(1))
        scores = h.unsqueeze(2) @ h.unsqueeze(1)  # (b, 64, 64)
        return self.fc2(scores.softmax(-1) @ h.unsqueeze(2).expand(-1, -1, 64).transpose(1, 2))


def _graph(grad_input: bool, groups: int) -> taps.Graph:
    with torch.device("meta"):
        x = torch.empty(4, 3, 16, 16, requires_grad=grad_input)
        return taps.from_torch(_Block(groups), x)


@pytest.mark.parametrize("grad_input", [False, True])
def test_flops_match_pytorch_counter(grad_input: bool) -> None:
    """Forward and backward FLOPs of every contraction (strided convolutions, linear layers,
    batched matmuls) equal what torch.utils.flop_counter counts on the real module; with the
    input requiring a gradient the first convolution's input gradient is counted too."""
    torch.manual_seed(0)
    x = torch.randn(4, 3, 16, 16, requires_grad=grad_input)
    expected = _torch_flops(_Block(), x)
    assert _graph_flops(_graph(grad_input, 1)) == pytest.approx(expected, rel=1e-12)


def test_grouped_convolution() -> None:
    """A grouped convolution's forward FLOPs equal PyTorch's count, and its backward is one
    contraction of the same size per input needing a gradient (PyTorch's counter multiplies the
    weight gradient of a grouped convolution by the groups, so it is no reference there)."""
    x = torch.randn(4, 3, 16, 16)
    flat, grouped = _graph(False, 1), _graph(False, 4)
    forward = _torch_flops(_Block(4), x)[0]
    assert _graph_flops(grouped)[0] == pytest.approx(forward, rel=1e-12)
    op, plain = grouped.op("grouped"), flat.op("grouped")
    assert forward_work(grouped, op).flops * 4 == forward_work(flat, plain).flops
    assert backward_work(grouped, op).flops == 2 * forward_work(grouped, op).flops


def test_linear_closed_form() -> None:
    """A linear ``bi,io->bo`` (+ bias): 2*b*i*o FLOPs forward, a contraction of that size per
    input needing a gradient and a sum over the output for the bias; bytes each operand once."""
    b, i, o = 64, 128, 256
    g = taps.Graph()
    x = g.input("x", (b, i), requires_grad=True)
    g.linear("fc", x, o, bias=True)
    op = g.op("fc")
    assert is_contraction(op) and iteration_space(op) == b * i * o
    fwd, bwd = forward_work(g, op), backward_work(g, op)
    assert fwd == Work(2 * b * i * o + b * o, 2 * (b * i + i * o + o + b * o))
    grad_x = Work(2 * b * i * o, 2 * (b * o + i * o + b * i))
    grad_w = Work(2 * b * i * o, 2 * (b * o + b * i + i * o))
    grad_b = Work(b * o, 2 * (b * o + o))
    assert bwd == grad_x + grad_w + grad_b


def test_pointwise_embedding_and_roofline() -> None:
    """A pointwise operator does one FLOP per element and moves its operands; an embedding moves
    its output's rows; the roofline is the larger of FLOPs over peak and bytes over bandwidth."""
    g = taps.Graph()
    x = g.input("x", (32, 16), requires_grad=True)
    g.gelu("act", x)
    ids = g.input("ids", (8, 4), dtype_bytes=8)
    g.embedding("emb", ids, 1000, 16)
    act, emb = g.op("act"), g.op("emb")
    assert not is_contraction(act) and not is_contraction(emb)
    assert forward_work(g, act) == Work(32 * 16, 2 * 32 * 16 * 2)
    assert backward_work(g, act) == Work(32 * 16, 32 * 16 * 2 * 3)
    assert forward_work(g, emb) == Work(0, 2 * 8 * 4 * 16 * 2 + 8 * 4 * 8)
    assert backward_work(g, emb) == Work(0, 2 * 8 * 4 * 16 * 2)
    assert Work(10.0, 3.0).seconds(5.0, 1.0) == 3.0
    assert Work(10.0, 3.0).seconds(2.0, 1.0) == 5.0


def test_per_device_share_prices_replicas() -> None:
    """A strategy's devices each do the operator's work over the product of its split degrees:
    a replicated strategy over 4 of 16 devices pays 4 times the full split's time."""
    g = taps.Graph()
    x = g.input("x", (64, 128))
    g.linear("fc", x, 256)
    op = g.op("fc")
    peak, bandwidth = 1e12, 1e11
    whole = (
        forward_work(g, op).seconds(peak, bandwidth),
        backward_work(g, op).seconds(peak, bandwidth),
    )
    degrees = np.array([[16, 1, 1], [4, 1, 1], [2, 2, 4], [1, 1, 1]])
    fwd, bwd = compute_times(g, op, degrees, peak, bandwidth)
    shares = [16, 4, 16, 1]
    assert fwd == pytest.approx([whole[0] / s for s in shares], rel=1e-12)
    assert bwd == pytest.approx([whole[1] / s for s in shares], rel=1e-12)
    assert fwd[1] == pytest.approx(4 * fwd[0]) and math.isclose(bwd[3], whole[1])
