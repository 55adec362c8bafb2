"""The torch engine replays the training step as taps plans it: every edge's forward and backward
plans, flowing partial sums, gradient all_reduces (biases included, ZeRO's reduce_scatter and
all_gather): every collective the run issues on the fake process group is one taps predicted,
with its kind, groups and bytes, and none is left over; the numbers on gloo ranks equal the
dense module's. Real models from transformers, torchvision and timm, built from small configs on
the meta device."""

from __future__ import annotations

import collections

import pytest
import torch
from torch import nn

import taps
from taps.frontends.torch import from_torch
from taps.search.evaluate import step_layouts
from taps.verify import VerifyError, verify_torch
from taps.verify.prediction import describe_scopes, predicted_collectives
from taps.verify.result import OK
from torch_models import MODELS

pytest.importorskip("torch.distributed.tensor")


class PlainBlock(nn.Module):
    """LayerNorm, Linear, GELU, Linear, ReLU, Linear and a residual add (the issue's block)."""

    def __init__(self, hidden: int = 64) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, 4 * hidden)
        self.fc3 = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc3(torch.relu(self.fc2(nn.functional.gelu(self.fc1(self.ln(x))))))


def plain_block() -> tuple[nn.Module, torch.Tensor]:
    """A factory for ``taps verify --torch``."""
    torch.manual_seed(0)
    return PlainBlock(), torch.randn(32, 64, requires_grad=True)


def _plan(module, x, cluster, **pricing):
    return taps.search(from_torch(module, x), cluster, taps.Pricing(**pricing)).plan


def _predicted(plan):
    """taps' prediction, computed here from the plan alone (the engine's own is not read)."""
    step = step_layouts(plan)
    return predicted_collectives(
        step.layouts, step.intra, 4, describe_scopes(step.layouts), step.backward
    )


def _issued(result):
    return collections.Counter(
        (c.phase, c.kind, c.group_size, c.measured_bytes)
        for c in result.collectives
        if c.measured_bytes is not None
    )


@pytest.mark.parametrize("zero", [False, True])
def test_plain_block_issues_exactly_the_predicted_collectives(zero):
    """On 2 x 2 devices: the collectives issued are taps' prediction one for one (kind, group,
    bytes), forward and backward, none unpriced; with ZeRO every parameter's gradient is a
    reduce_scatter and an all_gather."""
    module, x = plain_block()
    plan = _plan(module, x, taps.Cluster(2, 2), zero=zero)
    result = verify_torch(module, [x], plan, numerics=None)
    assert result.ok, result.mismatches
    assert {c.status for c in result.collectives} == {OK}
    want = collections.Counter(
        (p.phase, p.kind, len(p.groups[0]), p.bytes) for p in _predicted(plan)
    )
    assert _issued(result) == want
    assert {p for p, *_ in want} == {"forward", "backward"}
    kinds = {k for _, k, *_ in want}
    if zero:
        assert {"reduce_scatter", "all_gather"} <= kinds
        grads = [c for c in result.collectives if "gradient of" in c.what]
        assert grads and {c.kind for c in grads} == {"reduce_scatter", "all_gather"}


def test_a_bias_gradient_is_reduced_where_it_is_partial():
    """Batch split over one device dim, the contraction over the other: the biases' gradients
    are partial over the batch dim and all_reduced there, as predicted."""
    module, x = plain_block()
    plan = _plan(module, x, taps.Cluster(2, 2))
    strategies = dict(plan.strategies)
    fc = plan.graph.op("fc2")
    # fc2 split 2 ways along its batch axis and 2 along its contracted axis.
    wanted = next(
        s
        for s in taps.enumerate_strategies(list(fc.partitionable_sizes), 4)
        if s.degrees[fc.partitionable.index(fc.contracted[0])] == 2
        and s.degrees[fc.partitionable.index(fc.inputs[0].dims[0])] == 2
    )
    strategies["fc2"] = wanted
    plan = taps.Plan(plan.graph, plan.cluster, strategies, plan.pricing)
    result = verify_torch(module, [x], plan, numerics=None)
    assert result.ok, result.mismatches
    bias = [c for c in result.collectives if c.what == "gradient of fc2.bias"]
    assert len(bias) == 1 and bias[0].status == OK and bias[0].group_size == 2


@pytest.mark.parametrize("name", ["llama", "bert", "resnet", "mixer"])
def test_real_models_on_16_devices(name):
    """Token ids into embeddings (Llama, BERT), BatchNorm's running statistics (ResNet), a
    token-mixing MLP over transposes (MLP-Mixer): every collective issued on the fake process
    group at 16 devices is one taps predicted, forward and backward."""
    module, x = MODELS[name]()
    plan = _plan(module, x, taps.Cluster(2, 8))
    result = verify_torch(module, [x], plan, numerics=None)
    assert result.ok, result.mismatches
    assert {c.status for c in result.collectives} <= {OK, "shared"}
    assert {c.phase for c in result.collectives} == {"forward", "backward"}
    assert sum(c.status == OK for c in result.collectives) >= 10


@pytest.mark.parametrize("name", ["gpt2", "vit", "timm_vit"])
def test_a_fused_projection_split_inside_is_one_line(name):
    """A fused q, k, v projection split along its heads (a factor inside one dim of the module's
    tensor) has no DTensor form: the torch replay refuses it in one line naming the node."""
    module, x = MODELS[name]()
    plan = _plan(module, x, taps.Cluster(2, 2))
    with pytest.raises(VerifyError, match=r"at node .*no DTensor form") as info:
        verify_torch(module, [x], plan, numerics=None)
    assert "\n" not in str(info.value)


def test_plain_block_numbers_on_4_gloo_ranks():
    """The whole training step on 4 gloo processes: the output and every gradient (biases, the
    input read twice) equal the dense block's."""
    module, x = plain_block()
    plan = _plan(module, x, taps.Cluster(2, 2))
    result = verify_torch(module, [x], plan, numerics=4)
    assert result.ok, result.mismatches
    names = {f"grad {k}" for k, _ in module.named_parameters()} | {"grad x", "output 0"}
    assert set(result.errors) == names
    assert 0 < result.max_error <= result.tolerance


def test_zero_numbers_on_4_gloo_ranks():
    module, x = plain_block()
    plan = _plan(module, x, taps.Cluster(1, 4), zero=True)
    result = verify_torch(module, [x], plan, numerics=4)
    assert result.ok, result.mismatches


def test_llama_numbers_on_4_gloo_ranks():
    """Token ids, embeddings, RMSNorm's mean over a split hidden dim, rotary tables: the output
    and every parameter's gradient equal the dense Llama's."""
    module, ids = MODELS["llama"]()
    plan = _plan(module, ids, taps.Cluster(1, 4))
    result = verify_torch(module, [ids], plan, numerics=4)
    assert result.ok, result.mismatches
    names = {f"grad {k}" for k, _ in module.named_parameters()} | {"output 0"}
    assert set(result.errors) == names


def test_a_broken_backward_plan_is_reported(monkeypatch):
    """The engine's backward is taps' plan: with the backward plans left out, their predicted
    collectives are missing."""
    from taps.export import distribute

    real = distribute.Replay.of.__func__

    def without_backward(cls, step, mesh):
        replay = real(cls, step, mesh)
        return distribute.Replay(
            replay.layouts,
            replay.redistributions,
            dict.fromkeys(replay.backward),
            replay.partial,
            replay.flowing,
            replay.gradients,
            replay.used,
            replay.steps,
        )

    monkeypatch.setattr(distribute.Replay, "of", classmethod(without_backward))
    module, x = plain_block()
    result = verify_torch(module, [x], _plan(module, x, taps.Cluster(2, 2)), numerics=None)
    assert not result.ok
    assert any(c.status == "missing" and c.phase == "backward" for c in result.collectives)
