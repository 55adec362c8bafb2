"""The torch engine replays the training step as taps plans it: every edge's forward and backward
plans, flowing partial sums, gradient all_reduces (biases included, ZeRO's reduce_scatter and
all_gather): every collective the run issues on the fake process group is one taps predicted,
with its kind, groups and bytes, and none is left over; the numbers on gloo ranks equal the
dense module's. Real models from transformers, torchvision and timm, built from small configs on
the meta device."""

from __future__ import annotations

import collections
import math

import numpy as np
import pytest
import torch
from torch import nn

import taps
from taps.errors import VerifyError
from taps.export.distribute import export_module
from taps.frontends.torch import from_torch
from taps.search.evaluate import step_layouts
from taps.verify import verify_torch
from taps.verify.prediction import describe_scopes, predicted_collectives
from taps.verify.result import OK, TOLERANCE, relative_error, step_errors
from taps.verify.torch.engine import integer_sizes
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


#: Per model, the collectives its training step issued on 16 devices (2 x 8, the fake process
#: group) under taps' plan, every one predicted (recorded in docs/verify.md).
@pytest.mark.parametrize("name", sorted(MODELS))
def test_real_models_on_16_devices(name):
    """Token ids into embeddings (GPT-2, Llama, BERT), a fused q, k, v projection split by heads
    (GPT-2, both ViTs), a tied embedding and head (GPT-2), BatchNorm's running statistics
    (ResNet), a token-mixing MLP over transposes (MLP-Mixer): every collective issued on the fake
    process group at 16 devices is one taps predicted, forward and backward, and every predicted
    one is issued."""
    module, x = MODELS[name]()
    plan = _plan(module, x, taps.Cluster(2, 8))
    result = verify_torch(module, [x], plan, numerics=None)
    assert result.ok, result.mismatches
    assert {c.status for c in result.collectives} <= {OK, "shared"}
    assert {c.phase for c in result.collectives} == {"forward", "backward"}
    assert sum(c.status == OK for c in result.collectives) >= 10
    issued = _issued(result)
    want = collections.Counter(
        (p.phase, p.kind, len(p.groups[0]), p.bytes) for p in _predicted(plan)
    )
    # A prediction computed once for a twin edge ("shared") is issued once.
    shared = collections.Counter(
        (c.phase, c.kind, c.group_size, c.predicted_bytes)
        for c in result.collectives
        if c.status == "shared"
    )
    assert issued == want - shared


def test_a_fused_projection_is_split_inside_one_dim_of_the_modules_tensor():
    """GPT-2's plan splits the fused q, k, v projection's output along its heads, a factor
    inside one dim of the module's tensor (no DTensor placement): the replay carries its blocks
    and the split operators take q, k and v from them."""
    from taps.export.distribute import block_shape

    module, x = MODELS["gpt2"]()
    plan = _plan(module, x, taps.Cluster(2, 2))
    fused = [op.name for op in plan.graph.ops if op.name.endswith("c_attn") and op.kind == "linear"]
    step = step_layouts(plan)
    inner = [
        n
        for n in fused
        if (lay := step.layouts.outputs[n]).tensor_map[2] >= 0
        and block_shape(lay.shape, lay.shard_shape, [lay.shape[0], 3 * lay.shape[2]])
    ]
    assert inner, "the plan does not split the fused projection by heads"
    result = verify_torch(module, [x], plan, numerics=None)
    assert result.ok, result.mismatches


def _grid(block, view):
    """``block`` (a rank's elements, by flattened index, in its own row-major order) as a
    sub-grid of ``view``: per dim of ``view`` the sorted indices it uses; ``None`` when its
    elements are not every combination of those, in row-major order."""
    coords = torch.unravel_index(block.reshape(-1), view)
    sets = [torch.unique(c) for c in coords]
    if math.prod(len(t) for t in sets) != block.numel():
        return None
    grid = torch.arange(math.prod(view)).reshape(view)[torch.meshgrid(*sets, indexing="ij")]
    return [len(t) for t in sets] if torch.equal(grid.reshape(-1), block.reshape(-1)) else None


def test_block_shape_against_the_elements_each_rank_holds():
    """A rank's block seen through a reshape, as a torch node computes on it: every rank's
    elements, reshaped to :func:`block_shape`, are a sub-grid of the reshaped tensor (one set of
    indices per dim, in order), so that operators reading several such blocks pair the right
    elements; ``None`` exactly when some rank's are not."""
    from taps.export.distribute import block_shape

    cases = [
        ([32, 3, 64], [2, 2], [1, -1, 0], [32, 192]),  # a fused q, k, v split by heads
        ([32, 4, 64], [2, 2], [1, 0, -1], [32, 256]),
        ([32, 64], [4], [0, -1], [2, 16, 64]),  # rows split across batch and sequence
        ([32, 64], [2, 2], [0, 1], [4, 8, 8, 8]),
        ([6, 4], [2], [0, -1], [4, 6]),
        ([8, 6], [2], [-1, 0], [4, 12]),
        ([12], [4], [0], [2, 6]),
    ]
    for shape, matrix, tmap, view in cases:
        layout = taps.Layout(shape, matrix, tmap)
        got = block_shape(shape, layout.shard_shape, view)
        index = torch.arange(math.prod(shape)).reshape(shape)
        grids = []
        for rank in range(layout.num_devices):
            b = index
            for d, (lo, hi) in enumerate(layout.shard_index(rank)):
                b = b.narrow(d, lo, hi - lo)
            grids.append(_grid(b, view))
        want = grids[0] if all(g is not None and g == grids[0] for g in grids) else None
        # None where the shapes' factors do not nest (6 x 4 as 4 x 6), even if a block exists.
        assert got == want or (got is None and math.prod(shape[1:]) % math.prod(view[1:])), (
            shape,
            tmap,
            view,
        )
        assert got is not None or want is None or view == [4, 6], (shape, tmap, view)


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


#: What each model's numbers exercise.
_NUMBERS = {
    "gpt2": "a fused q, k, v projection split by heads, addmm's bias after the partial sums, a "
    "vocabulary-split embedding, the head tied to the embedding (its gradient the sum of its "
    "uses')",
    "llama": "token ids, RMSNorm's mean over a split hidden dim, rotary tables",
    "bert": "token-type and position embeddings; the key bias's gradient, zero in exact math",
    # BatchNorm over a split batch keeps statistics per device (data parallelism without
    # SyncBatchNorm): in training mode the output differs from the dense module's by design. In
    # eval mode it normalises by the running statistics, the same on every device.
    "resnet": "every convolution, the residuals, BatchNorm's weight and bias (eval mode)",
    "vit": "torch's multi-head attention, a class token through expand",
    "timm_vit": "q, k and v unbound from a permuted fused projection",
    "mixer": "a token-mixing MLP over transposes, its output bias's gradient zero in exact math",
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_real_models_numbers_on_4_gloo_ranks(name):
    """The whole training step on 4 gloo processes under taps' plan for 1 x 4: the output and
    every parameter's gradient equal the dense model's (``_NUMBERS``: what each exercises)."""
    assert set(_NUMBERS) == set(MODELS)
    module, x = MODELS[name]()
    if name == "resnet":
        module.eval()
    plan = _plan(module, x, taps.Cluster(1, 4))
    result = verify_torch(module, [x], plan, numerics=4)
    assert result.ok, result.mismatches
    names = {f"grad {k}" for k, _ in module.named_parameters()} | {"output 0"}
    assert set(result.errors) == names
    assert 0 < result.max_error <= result.tolerance


def test_step_errors_compare_a_zero_gradient_at_the_steps_scale():
    """A gradient that exact math makes zero is rounding noise on both sides: within the
    tolerance at the step's gradient scale (noise over noise is not); a small gradient wrong by
    1 % still fails, and an output keeps its own scale."""
    rng = np.random.default_rng(0)
    big = rng.normal(size=(64, 64)) * 30
    noise = rng.normal(size=64) * 1e-6
    errors = step_errors({"grad w": big, "grad b": -noise}, {"grad w": big, "grad b": noise})
    assert errors["grad b"] <= TOLERANCE["float32"] < 1.0 <= relative_error(-noise, noise)
    small = rng.normal(size=64) * 1e-3 * np.abs(big).max()
    got = {"grad w": big, "grad s": small * 1.01, "output 0": small * 1.01}
    errors = step_errors(got, {"grad w": big, "grad s": small, "output 0": small})
    assert errors["grad s"] > TOLERANCE["float32"]
    assert errors["output 0"] == pytest.approx(0.01)


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


@pytest.mark.parametrize(
    ("failing", "how", "said"),
    [
        (-1, "", ""),
        (2, "raise", r"VerifyError: .*: rank 2 of 4 was asked to fail"),
        (2, "kill", r"rank 2 of 4 was killed by SIGKILL \(rank 2: last words\)"),
        (2, "late", ""),
        (2, "abort once", ""),
        (2, "abort", r"rank 2 of 4 was killed by SIGABRT"),
    ],
)
def test_gloo_ranks_fork_from_one_prepared_process(tmp_path, failing, how, said):
    """The shared state is made once, in the process every rank is forked from; a rank that
    fails is one line naming its error, the cause (not the ranks that lost it as a peer); a rank
    killed once every rank's work is done (others ended cleanly) is no failure; a run a rank's
    SIGABRT stopped is made once more, and a second abort is reported."""
    import os
    import pickle

    from taps.verify.torch.ranks import run_ranks

    with open(tmp_path / "payload.pkl", "wb") as f:
        pickle.dump((str(tmp_path), failing, how), f)
    if said:
        with pytest.raises(VerifyError, match=rf"^a gloo rank failed: {said}$"):
            run_ranks("rank_probe", str(tmp_path), 4)
        return
    run_ranks("rank_probe", str(tmp_path), 4)
    assert (tmp_path / "prepared").read_text() == "once\n" * (2 if how == "abort once" else 1)
    ran = [(tmp_path / f"ran{r}").read_text().split() for r in range(4)]
    assert len({pid for pid, _, _ in ran}) == 4
    assert {(parent, prepared) for _, parent, prepared in ran} == {(ran[0][1], ran[0][1])}
    assert str(os.getpid()) not in {pid for pid, _, _ in ran}


#: Families the replay verifies beside ``MODELS`` (``tests/torch_factories.py``, several inputs,
#: a model output whose fields are the program's outputs), and what each exercises.
FAMILIES = {
    "falcon": "constants the module makes (torch.tensor: lift_fresh_copy), multi-query "
    "attention through broadcast_to",
    "deberta_v2": "views of permutes as operators, repeat, a gather's index cut as its output, "
    "a dropout of a parameter (the relative embeddings) reaching its gradient",
    "roberta": "dropout's masks drawn whole from the step's seed, attention's dropout over its "
    "weights, integer position ids moved along edges (cumsum)",
    "phi3": "a fused q, k, v and gate-up projection sliced, a rotary pass-through of size 0",
    "bart": "position ids read by an embedding (its ids its output's leading dims), dropout, "
    "the decoder's ids shifted right in place (copy_ into a slice of new_zeros)",
    "bloom": "ALiBi added by baddbmm, views of the fused projection",
    "swin": "a relative-position table read by index, window views of permutes, rolls, "
    "stochastic depth",
    "whisper": "a None input (no mask), conv1d, positions read by index, a frozen position "
    "table (no gradient)",
    "timm_convnext": "depthwise convolutions with their groups split over devices (each rank "
    "convolves its own groups), channels-last LayerNorm",
    "tv_alexnet": "max pooling, adaptive average pooling flattened into a classifier with dropout",
    "tv_vgg": "a deeper stack of convolutions and poolings into the same classifier",
    "tv_convnext": "depthwise convolutions, permutes to channels-last LayerNorm, a layer scale "
    "parameter, stochastic depth",
    "tv_swin": "torchvision's shifted windows: pad, roll, a relative-position bias read by "
    "index, an attention mask built per window, stochastic depth",
}


def _family(name):
    import torch_factories

    module, inputs = getattr(torch_factories, name)()
    return module, list(inputs)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_families_on_16_devices(name):
    """Every collective the training step issues on the fake process group at 16 devices is
    one taps predicted, and every predicted one is issued (``FAMILIES``: what each exercises)."""
    module, inputs = _family(name)
    plan = taps.search(from_torch(module, *inputs), taps.Cluster(2, 8)).plan
    result = verify_torch(module, inputs, plan, numerics=None)
    assert result.ok, result.mismatches
    assert {c.status for c in result.collectives} <= {OK, "shared"}
    assert sum(c.status == OK for c in result.collectives) >= 10
    shared = collections.Counter(
        (c.phase, c.kind, c.group_size, c.predicted_bytes)
        for c in result.collectives
        if c.status == "shared"
    )
    # Integer tensors (position ids) move at their own width, floating ones at 4 bytes.
    exported = export_module(module, *inputs)
    step = step_layouts(plan)
    predicted = predicted_collectives(
        step.layouts,
        step.intra,
        4,
        describe_scopes(step.layouts),
        step.backward,
        integer_sizes(exported.program, exported.conversion),
    )
    want = collections.Counter((p.phase, p.kind, len(p.groups[0]), p.bytes) for p in predicted)
    assert _issued(result) == want - shared


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_families_numbers_on_4_gloo_ranks(name):
    """The training step on 4 gloo processes under taps' plan for 1 x 4: the outputs and every
    parameter's gradient equal the dense model's, dropout's masks the same in both (drawn
    whole from the step's seed)."""
    module, inputs = _family(name)
    plan = taps.search(from_torch(module, *inputs), taps.Cluster(1, 4)).plan
    result = verify_torch(module, inputs, plan, numerics=4)
    assert result.ok, result.mismatches
    grads = {f"grad {k}" for k, p in module.named_parameters() if p.requires_grad}
    assert grads <= set(result.errors)
    frozen = {f"grad {k}" for k, p in module.named_parameters() if not p.requires_grad}
    assert not frozen & set(result.errors)
    assert 0 < result.max_error <= result.tolerance


def test_a_fine_tune_with_frozen_embeddings_trains_and_reduces_only_the_rest():
    """BERT with its embeddings frozen (the word table is tied to the masked-LM head, so the
    head's weight is frozen too): the graph keeps them as parameters without a gradient, the
    plan reduces no gradient of theirs, the engine issues exactly the predicted collectives on
    16 devices, and on 4 gloo ranks the trained parameters' gradients equal the dense model's
    while the frozen ones have none."""
    import torch_factories

    module, inputs = torch_factories.bert()
    module.bert.embeddings.requires_grad_(False)
    frozen = {k for k, p in module.named_parameters() if not p.requires_grad}
    assert len(frozen) == 5  # word, position and token-type tables, the LayerNorm's two
    g = from_torch(module, *inputs)
    params = {n: t for n, t in g.tensors.items() if t.kind == "parameter"}
    assert {n for n, t in params.items() if not t.requires_grad} == frozen
    assert g.num_parameters() == sum(p.numel() for p in module.parameters())
    plan = taps.search(g, taps.Cluster(2, 8)).plan

    def reduced(plan: taps.Plan) -> set[str]:
        rows = taps.breakdown(plan)
        return {c.tensor for row in rows for c, _ in row.collectives if c.reason == "gradient"}

    # The same strategies on the module trained whole reduce the frozen gradients too.
    trained = taps.Plan(
        from_torch(torch_factories.bert()[0], *inputs), plan.cluster, plan.strategies
    )
    assert reduced(plan) and not reduced(plan) & frozen
    assert reduced(trained) - reduced(plan) <= frozen and reduced(trained) & frozen
    result = verify_torch(module, list(inputs), plan, numerics=None)
    assert result.ok, result.mismatches
    assert {c.status for c in result.collectives} <= {OK, "shared"}
    result = verify_torch(module, list(inputs), plan, numerics=4)
    assert result.ok, result.mismatches
    grads = {k for k in result.errors if k.startswith("grad ")}
    assert grads == {f"grad {k}" for k, p in module.named_parameters() if p.requires_grad}
    assert 0 < result.max_error <= result.tolerance


def test_batchnorm_in_training_mode_keeps_statistics_per_device():
    """A ResNet in training mode whose plan splits its BatchNorms' batch: each gloo rank
    normalises its own samples, as data parallelism without SyncBatchNorm does and as taps
    prices it; the reference runs each such BatchNorm of the dense module on each device's
    block of the batch apart. 16 images of 64 x 64: at the default 4 of 32 x 32, layer4's
    BatchNorm normalises 2 samples of 1 x 1 per device, whose gradient float32 gets to 2e-3 of
    float64's on the dense module alone (5.6e-6 here)."""
    from taps.verify.torch.numerics import batch_parts

    module, x = MODELS["resnet"]()
    module.train()
    x = torch.randn(16, 3, 64, 64, device=x.device)
    plan = _plan(module, x, taps.Cluster(1, 4))
    parts = batch_parts(module, plan)
    assert parts and set(parts.values()) <= {2, 4}
    result = verify_torch(module, [x], plan, numerics=4)
    assert result.ok, result.mismatches
    assert 0 < result.max_error <= result.tolerance
    assert {k for k in result.errors if k.startswith("grad ")} == {
        f"grad {k}" for k, _ in module.named_parameters()
    }


def test_a_batchnorm_keeps_two_values_per_channel_on_a_device():
    """4 images of 32 x 32: layer4's maps are 1 x 1, so a batch split 4 ways would leave each
    device one value per channel, which torch cannot train (its variance divides by n - 1; the
    replay failed so). The rule views the batch as pairs and splits only their count: every
    candidate keeps at least 2 values per channel, and the plan runs on the fake process
    group, every collective predicted."""
    from taps.plan.candidates import candidates

    module, (x,) = _family("tv_resnet")
    module.train()
    g = from_torch(module, x)
    op = g.op("layer4.1.bn1")
    b, r = (op.axis_size(a) for a in ("b", "r"))
    assert (b, r) == (x.shape[0] // 2, 2) and "r" not in op.partitionable
    for cand in candidates(op, 4):
        block = cand.output.shard_shape
        assert math.prod(block[:2]) * math.prod(block[3:]) >= 2
    plan = taps.search(g, taps.Cluster(1, 4)).plan
    result = verify_torch(module, [x], plan, numerics=None)
    assert result.ok, result.mismatches


def test_the_per_device_reference_is_not_the_whole_batch():
    """The reference changes what a split BatchNorm computes (a test that it is in use): on the
    same values, two blocks normalised apart differ from the whole batch normalised at once,
    and each block equals a BatchNorm of that block alone."""
    from taps.verify.torch.numerics import statistics_per_part

    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).train()
    x = torch.randn(8, 3, 6, 6) + torch.arange(8.0).view(8, 1, 1, 1)
    whole = net(x)
    with statistics_per_part(net, {"1": 2}):
        apart = net(x)
    assert not torch.allclose(whole, apart, atol=1e-3)
    for k, block in enumerate(x.chunk(2)):
        torch.testing.assert_close(apart[4 * k : 4 * k + 4], net(block))
    assert "forward" not in vars(net[1])  # the module is left as it was


def test_the_dense_run_draws_the_steps_values_in_program_order():
    """The k-th draw of the module's own code under ``drawing`` is the program's k-th drawing
    node's value (``drawn``), computed here by hand: a dropout keeps where ``u >= p`` and
    scales by ``1 / (1 - p)``, ``rand`` is ``u``; a dropout that drops nothing draws nothing."""
    from taps.export.distribute import packet_name
    from taps.export.draws import drawing, draws

    class Noisy(nn.Module):
        def forward(self, x):
            y = nn.functional.dropout(x, 0.0, True)  # no draw
            y = nn.functional.dropout(y, 0.25, True)
            return y + torch.rand(y.shape), nn.functional.dropout(x, 0.5, True)

    x = torch.randn(4, 6)
    program = torch.export.export(Noisy(), (x,))
    drawing_nodes = [
        n.name
        for n in program.graph.nodes
        if n.op == "call_function" and draws(packet_name(n.target), n.args, n.kwargs)
    ]
    assert drawing_nodes == ["dropout_1", "rand", "dropout_2"]
    with drawing(3):
        got = Noisy()(x)

    def u(k):
        gen = torch.Generator().manual_seed(3 * 7919 + k)
        return torch.rand((4, 6), generator=gen, dtype=torch.float64).float()

    first = x * (u(0) >= 0.25) / 0.75
    assert torch.allclose(got[0], first + u(1))
    assert torch.allclose(got[1], x * (u(2) >= 0.5) / 0.5)


@pytest.mark.parametrize("mask", ["none", "bool", "float", "causal", "gqa"])
def test_attention_written_out_is_torchs_kernel(mask):
    """``attention`` (what both runs compute where attention drops something) with nothing
    dropped equals torch's own ``scaled_dot_product_attention``, and its keep mask scales the
    weights: dropping every weight of a row gives zeros there."""
    from taps.export.draws import attention

    gen = torch.Generator().manual_seed(0)
    heads = 2 if mask == "gqa" else 4
    q = torch.randn(2, 4, 5, 8, generator=gen)
    k, v = (torch.randn(2, heads, 7, 8, generator=gen) for _ in range(2))
    options = {"scale": 0.3}
    if mask == "bool":
        options["attn_mask"] = torch.rand(5, 7, generator=gen) > 0.3
        options["attn_mask"][:, 0] = True  # no row masked whole
    elif mask == "float":
        options["attn_mask"] = torch.randn(2, 1, 5, 7, generator=gen)
    elif mask == "causal":
        options["is_causal"] = True
    elif mask == "gqa":
        options["enable_gqa"] = True
    want = nn.functional.scaled_dot_product_attention(q, k, v, **options)
    keep = torch.ones(2, 4, 5, 7)
    assert torch.allclose(attention(q, k, v, keep, **options), want, atol=1e-5)
    keep[:, :, 2] = 0
    dropped = attention(q, k, v, keep, **options)
    assert torch.equal(dropped[:, :, 2], torch.zeros_like(dropped[:, :, 2]))
    assert torch.allclose(dropped[:, :, 3], want[:, :, 3], atol=1e-5)


def test_the_dense_run_draws_attentions_mask_over_its_weights():
    """Under ``drawing``, attention with ``dropout_p`` is a draw of the weights' shape (its
    query's leading dims and the key's length), kept where ``u >= p`` and scaled by
    ``1 / (1 - p)``, computed here by hand; without ``dropout_p`` it is torch's kernel."""
    from taps.export.draws import drawing

    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, 4, 8, generator=gen) for _ in range(3))
    k, v = k[:, :, :3], v[:, :, :3]
    with drawing(5):
        got = nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=0.25)
        plain = nn.functional.scaled_dot_product_attention(q, k, v)
    u = torch.rand(
        (2, 3, 4, 3), generator=torch.Generator().manual_seed(5 * 7919), dtype=torch.float64
    )
    weights = (q @ k.transpose(-2, -1) / 8**0.5).softmax(-1)
    want = (weights * ((u >= 0.25) / 0.75).float()) @ v
    assert torch.allclose(got, want, atol=1e-6)
    assert torch.allclose(plain, weights @ v, atol=1e-6)


def test_a_split_after_a_channel_shuffle_moves_its_blocks_in_its_edge():
    """torchvision's ShuffleNetV2: each block splits the channel shuffle's output in two (a
    ``chunk`` whose pieces the next block reads), and the plan moves the shuffled tensor to the
    split's layout by an all_to_all. The replay runs that edge when it cuts a piece: the
    collective is issued in the edge's scope, as predicted (it was issued outside every scope,
    leaving the prediction missing)."""
    module, inputs = _family("tv_shufflenet")
    plan = taps.search(from_torch(module, *inputs), taps.Cluster(1, 4)).plan
    result = verify_torch(module, inputs, plan, numerics=None)
    assert result.ok, result.mismatches
    split = [c for c in result.collectives if "transpose -> " in c.what and ".split" in c.what]
    assert split and {c.status for c in split} == {OK}


def test_an_in_place_dropout_draws_the_steps_mask():
    """``Dropout(inplace=True)`` (torchvision's MobileNetV3 and EfficientNet heads) exports as
    ``aten.dropout_``: the replay draws its mask from the step's seed as for ``dropout``, so the
    gloo ranks' numbers equal the dense run's (torch drew its own mask there, 0.5 off)."""
    torch.manual_seed(0)
    module = nn.Sequential(
        nn.Linear(32, 64), nn.Hardswish(), nn.Dropout(0.5, inplace=True), nn.Linear(64, 16)
    )
    x = torch.randn(8, 32)
    program = export_module(module, x).program
    assert "dropout_" in {
        getattr(n.target, "__name__", "").split(".")[0] for n in program.graph.nodes
    }
    plan = _plan(module, x, taps.Cluster(1, 4))
    result = verify_torch(module, [x], plan, numerics=4)
    assert result.ok, result.mismatches
    assert 0 < result.max_error <= result.tolerance
