"""The PyTorch front end on the models people train, and each rule for their operators against
torch itself.

Every model is a small config (2 layers, small widths) of a real family built on the meta device
by ``tests/torch_factories.py``: it converts with no operator left without a rule, its graph
searches, its graph parameters equal the module's (a tied weight, the head sharing the
embedding's, counted once in both), and the export of its plan names every parameter and buffer
of the module, which ``distribute_module`` places.

Each rule added for these models is checked on a tiny module with real CPU tensors: for every
axis the rule lets a strategy split, the operator computed on the halves of its operands and
joined (concatenated along the axis, summed where the axis is contracted) equals torch's whole
result."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import taps
import torch_factories
from taps.export import distribute_module, to_dtensor, to_jax
from taps.export.distribute import export_module
from taps.frontends import from_torch

CLUSTER = taps.Cluster(1, 4)

#: Every family of the sweep (docs/frontends.md#the-model-families): (factory of
#: tests/torch_factories.py, its parameters are tied: a weight under several keys).
MODELS = [
    # transformers: decoders
    ("gpt2", True),
    ("llama", False),
    ("mistral", False),
    ("qwen2_gqa", False),
    ("gemma2", True),
    ("gemma3", True),
    ("phi3", False),
    ("falcon", True),
    ("bloom", True),
    ("opt", True),
    ("gpt_neox", False),
    # transformers: encoders, encoder-decoders, vision and audio
    ("bert", True),
    ("roberta", True),
    ("albert", True),
    ("distilbert", True),
    ("deberta_v2", False),
    ("t5", True),
    ("bart", True),
    ("whisper", True),
    ("clip", False),
    ("clip_text", False),
    ("clip_vision", False),
    ("hf_vit", False),
    ("swin", False),
    # timm
    ("timm_vit", False),
    ("timm_deit", False),
    ("timm_deit_drop_path", False),
    ("timm_convnext", False),
    ("timm_swin", False),
    ("timm_mixer", False),
    ("timm_efficientnet", False),
    ("timm_mobilenet_v3", False),
    ("timm_resnet", False),
    # torchvision
    ("tv_resnet", False),
    ("tv_vit", False),
    ("tv_convnext", False),
    ("tv_efficientnet", False),
    ("tv_mobilenet_v3", False),
    ("tv_shufflenet", False),
    ("tv_densenet", False),
    ("tv_swin", False),
    ("tv_alexnet", False),
    ("tv_vgg", False),
    # torchtitan
    ("torchtitan_llama", False),
]


def _tied(module: nn.Module) -> bool:
    return len(list(module.parameters())) < len(
        list(module.named_parameters(remove_duplicate=False))
    )


@pytest.fixture(scope="module")
def fake_mesh():
    """A 4-rank fake process group (no communication) for the module's tests."""
    import torch.distributed as tdist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    tdist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    yield
    tdist.destroy_process_group()


@pytest.mark.parametrize(("factory", "tied"), MODELS, ids=[m for m, _ in MODELS])
def test_model_converts_searches_counts_its_parameters_and_exports(factory, tied, fake_mesh):
    """Converted, the graph holds the module's parameters once each, searches; the DTensor
    export names every parameter and buffer with a placement per mesh dim, the JAX one a spec
    entry per dim, and ``distribute_module`` places the module with it."""
    from torch.distributed.device_mesh import DeviceMesh

    module, inputs = getattr(torch_factories, factory)()
    assert _tied(module) == tied
    module.train()
    exported = export_module(module, *inputs)
    g = from_torch(module, *inputs)
    # module.parameters() yields a tied weight once; the graph must count it once too.
    assert g.num_parameters() == sum(p.numel() for p in module.parameters())
    result = taps.search(g, CLUSTER)
    assert result.status in ("optimal", "feasible")
    assert set(result.plan.strategies) == {op.name for op in g.ops}
    dt, jx = to_dtensor(result.plan, module), to_jax(result.plan)
    params, buffers = dict(module.named_parameters()), dict(module.named_buffers())
    for name in {**params, **buffers}:
        assert len(dt.tensors[name]) == len(dt.mesh.shape), name
    for name, p in params.items():
        assert len(jx.tensors[name]) == p.dim(), name
    mesh = DeviceMesh("cpu", torch.arange(4).reshape(dt.mesh.shape))
    dm = distribute_module(module, dt, *inputs, mesh=mesh, exported=exported)
    assert set(dm.parameters) == set(params) and set(buffers) <= set(dm.buffers)
    for name, t in {**dm.parameters, **dm.buffers}.items():
        assert len(t.placements) == len(dt.mesh.shape), name
    for name, t in dm.parameters.items():
        assert tuple(t.shape) == tuple(params[name].shape), name
        assert list(t.placements) == dt.placements(name), name


# -- each rule against torch: shards joined equal the whole -----------------------------------


class Fn(nn.Module):
    """A module calling ``fn`` on its inputs (named ``args_0``, ``args_1``, ... by export)."""

    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def split_soundly(fn, *inputs: torch.Tensor, kind: str, combine=torch.add) -> taps.Operator:
    """The one ``kind`` operator of ``fn`` converted (its operands must be ``fn``'s inputs);
    every partitionable axis that an input carries is checked: ``fn`` on the two halves of each
    input along it (inputs without it whole), joined, equals ``fn`` on the whole. Halves are
    joined by concatenation along an output axis, else by ``combine`` (partial results).
    Returns the operator."""
    g = from_torch(Fn(fn), *inputs, rows=False)
    (o,) = [o for o in g.ops if o.kind == kind]
    names = {f"args_{i}": i for i in range(len(inputs))}
    full = fn(*inputs)
    out_shape = g.tensor(o.output.tensor).shape
    sizes = dict(zip(o.axes, o.axis_sizes))
    checked = 0
    for axis in o.partitionable:
        where = {
            names[x.tensor]: x.dims.index(axis)
            for x in o.inputs
            if axis in x.dims and x.tensor in names
        }
        if not where:  # an output-only axis: each device computes its slice of the output
            continue
        assert sizes[axis] % 2 == 0, axis
        halves = []
        for k in range(2):
            args = [t.chunk(2, where[i])[k] if i in where else t for i, t in enumerate(inputs)]
            half_shape = [s // 2 if d == axis else s for d, s in zip(o.output.dims, out_shape)]
            halves.append(fn(*args).reshape(half_shape))
        if axis in o.output.dims:
            joined = torch.cat(halves, o.output.dims.index(axis))
        else:  # contracted: partial results combine
            joined = combine(halves[0], halves[1])
        torch.testing.assert_close(joined, full.reshape(out_shape), msg=f"split of {axis}")
        checked += 1
    assert checked, "no split was checked"
    return o


def _whole(o: taps.Operator, tensor: str, dims: list[int]) -> bool:
    """Whether ``dims`` of ``tensor``'s operand of ``o`` are all whole."""
    (x,) = [x for x in o.inputs if x.tensor == tensor]
    return all(x.dims[d] not in o.partitionable for d in dims)


X = torch.randn(4, 6, 8)
IDS = torch.tensor([[0, 3, 5, 1], [2, 2, 0, 4]])


def test_index_splits_all_but_the_indexed_dims():
    o = split_soundly(lambda x, i: x[:, i], X, IDS, kind="index")  # (4, 2, 4, 8)
    assert _whole(o, "args_0", [1]) and len(o.partitionable) == 4
    o = split_soundly(lambda x, i, j: x[i, j], X, IDS % 4, IDS, kind="index")  # (2, 4, 8)
    assert _whole(o, "args_0", [0, 1])
    split_soundly(lambda x, i, j: x[i, :, j], X, IDS % 4, IDS, kind="index")  # apart: (2, 4, 6)
    split_soundly(lambda x, i: x.index_select(2, i), X, IDS[0], kind="index")


def test_gather_splits_the_index_dims():
    idx = torch.randint(0, 6, (4, 2, 8))
    o = split_soundly(lambda x, i: torch.gather(x, 1, i), X, idx, kind="gather")
    assert _whole(o, "args_0", [1]) and not _whole(o, "args_0", [0])
    # An index shorter than x in another dim reads its prefix: that dim is whole in x.
    o = split_soundly(lambda x, i: torch.gather(x, 2, i), X, idx[:, :, :4], kind="gather")
    assert _whole(o, "args_0", [1, 2])


def test_writes_split_all_but_the_written_dim():
    idx = torch.randint(0, 6, (4, 2, 8))
    src = torch.randn(4, 2, 8)
    for kind, fn in [
        ("scatter", lambda x, i, s: x.scatter(1, i, s)),
        ("scatter_add", lambda x, i, s: x.scatter_add(1, i, s)),
    ]:
        o = split_soundly(fn, X, idx, src, kind=kind)
        assert _whole(o, "args_0", [1]) and not _whole(o, "args_0", [0, 2])
    rows = torch.tensor([0, 2, 2])
    o = split_soundly(
        lambda x, i, s: x.index_add(1, i, s), X, rows, torch.randn(4, 3, 8), kind="index_add"
    )
    assert _whole(o, "args_0", [1])
    for accumulate in (False, True):
        o = split_soundly(
            lambda x, i, v, a=accumulate: x.index_put((i,), v, accumulate=a),
            X,
            torch.tensor([1, 3]),
            torch.randn(2, 6, 8),
            kind="index_put",
        )
        assert _whole(o, "args_0", [0]) and not _whole(o, "args_0", [1, 2])


def test_scans_sorts_and_arg_reductions_keep_their_dim_whole():
    for kind, fn in [
        ("cumsum", lambda x: torch.cumsum(x, 1)),
        ("sort", lambda x: torch.sort(x, 1).values),
        ("sort", lambda x: torch.sort(x, dim=1, stable=True).values),
        ("argsort", lambda x: torch.argsort(x, 1)),
        ("topk", lambda x: torch.topk(x, 3, dim=1).values),
        ("argmax", lambda x: torch.argmax(x, 1)),
        ("argmin", lambda x: torch.argmin(x, -1, keepdim=True)),
        ("max", lambda x: torch.max(x, 1).values),
    ]:
        o = split_soundly(fn, X, kind=kind, combine=torch.maximum)
        dim = 2 if kind == "argmin" else 1
        assert _whole(o, "args_0", [dim]) == (kind != "max"), kind  # max: partial maxima


def test_baddbmm_and_copy():
    bias, a, c = torch.randn(4, 6, 8), torch.randn(4, 6, 2), torch.randn(4, 2, 8)
    # Split along k, each half adds the bias: the partial results hold it twice.
    o = split_soundly(torch.baddbmm, bias, a, c, kind="matmul", combine=lambda p, q: p + q - bias)
    assert set(o.partitionable) == {"b", "i", "j", "k"}
    split_soundly(lambda y: y.new_zeros(y.shape).copy_(y), X, kind="copy")


def test_argmax_of_everything_is_whole():
    g = from_torch(Fn(lambda x: torch.argmax(x)), X)
    (o,) = g.ops
    assert o.partitionable == ()


def test_convolutions_of_one_and_three_spatial_dims():
    w1, w3 = torch.randn(4, 6, 3), torch.randn(4, 6, 3, 3, 3)
    o = split_soundly(
        lambda x, w: F.conv1d(x, w, padding=1), torch.randn(2, 6, 10), w1, kind="conv1d"
    )
    assert set(o.partitionable) == {"b", "ci", "co"}
    split_soundly(lambda x, w: F.conv3d(x, w), torch.randn(2, 6, 4, 4, 4), w3, kind="conv3d")
    # Unbatched, and through the generic aten.convolution.
    split_soundly(lambda x, w: F.conv1d(x, w), torch.randn(6, 10), w1, kind="conv1d")


def test_grouped_and_depthwise_conv1d_split_the_groups():
    x = torch.randn(2, 8, 10)
    g = from_torch(Fn(lambda x, w: F.conv1d(x, w, groups=4)), x, torch.randn(8, 2, 3))
    (o,) = g.ops
    assert o.kind == "conv1d" and "g" in o.partitionable
    depthwise = from_torch(Fn(lambda x, w: F.conv1d(x, w, groups=8)), x, torch.randn(8, 1, 3))
    assert dict(zip(depthwise.ops[0].axes, depthwise.ops[0].axis_sizes))["g"] == 8


def test_pooling_of_one_dim():
    split_soundly(lambda x: F.adaptive_avg_pool1d(x, 1), X, kind="pool")
    split_soundly(lambda x: F.max_pool1d(x, 2), X, kind="pool")


def test_pad_roll_repeat():
    o = split_soundly(lambda x: F.pad(x, (1, 2)), X, kind="pad")
    assert _whole(o, "args_0", [2])
    o = split_soundly(lambda x: torch.roll(x, (1, -2), (0, 2)), X, kind="roll")
    assert _whole(o, "args_0", [0, 2]) and not _whole(o, "args_0", [1])
    o = split_soundly(lambda x: x.repeat(3, 1, 2, 1), X, kind="repeat")
    assert not _whole(o, "args_0", [0, 1, 2])
    for fn in (
        lambda x: x.repeat_interleave(2, dim=1),
        lambda x: torch.repeat_interleave(x, 3, dim=2),
        lambda x: x.repeat_interleave(2),
    ):
        o = split_soundly(fn, X, kind="repeat")
        assert not _whole(o, "args_0", [0, 1, 2])


def test_grouped_query_attention_with_repeat_interleave_splits_by_kv_heads():
    q, k = torch.randn(2, 8, 6, 4), torch.randn(2, 2, 6, 4)
    g = from_torch(
        Fn(
            lambda q, k, v: F.scaled_dot_product_attention(
                q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1)
            )
        ),
        q,
        k,
        k.clone(),
    )
    repeats = [o for o in g.ops if o.kind == "repeat"]
    assert len(repeats) == 2
    assert all(
        dict(zip(o.axes, o.axis_sizes))["s"] == 2 and "s" in o.partitionable for o in repeats
    )


def test_expand_elementwise_and_masks():
    split_soundly(lambda x: x.expand(3, *x.shape) * 1.0, X, kind="expand")
    mask = torch.rand(4, 6, 8) > 0.5
    split_soundly(lambda x, m: x.masked_fill(m, -1.0), X, mask, kind="masked_fill")
    split_soundly(lambda x, m, y: torch.where(m, x, y), X, mask, X.flip(0), kind="where")
    split_soundly(lambda x: x.clamp(-0.5, 0.5), X, kind="clamp")
    for kind, fn in [("triu", lambda x: torch.triu(x)), ("tril", lambda x: torch.tril(x, -1))]:
        o = split_soundly(fn, X, kind=kind)
        assert _whole(o, "args_0", [1, 2])  # which elements stay depends on row and column


def test_creation_and_random_operators_are_constants():
    fns = [
        lambda x: x + x.new_zeros(x.shape),
        lambda x: x * torch.ones_like(x),
        lambda x: x + torch.full_like(x, 2.0),
        lambda x: x + x.new_empty(4, 1, 1).bernoulli_(0.9).div_(0.9),  # stochastic depth
        lambda x: x + torch.zeros_like(x).fill_(1.0),
        lambda x: x + torch.arange(8.0),
        lambda x: x + x.new_ones(8) + x.new_full((8,), 2.0),
    ]
    for fn in fns:
        g = from_torch(Fn(fn), X)
        assert {o.kind for o in g.ops} <= {"add", "mul"}, [o.kind for o in g.ops]
        assert all(len(o.inputs) == 1 for o in g.ops)  # x alone: the constants are no operand
    # Drawn with probabilities from the graph: an elementwise operator.
    g = from_torch(Fn(lambda p: torch.bernoulli(p)), torch.rand(4, 6))
    assert [o.kind for o in g.ops] == ["bernoulli"]


def test_a_slice_of_size_zero_is_no_operator():
    """Phi-3's rotary embedding: the slice past the rotary dims is empty and joins nothing."""

    def rotary(x):
        rot, rest = x[..., :8], x[..., 8:]
        return torch.cat([rot * 2.0, rest], dim=-1)

    g = from_torch(Fn(rotary), X, rows=False)
    assert [o.kind for o in g.ops] == ["mul", "cat"]
    assert all(s > 0 for o in g.ops for s in o.axis_sizes)
    assert [x.tensor for x in g.op("cat").inputs] == ["mul.out"]


def test_an_operator_without_a_rule_is_named_with_its_module():
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            return torch.cummax(self.fc(x), dim=1).values

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = Block()

        def forward(self, x):
            return self.inner(x)

    with pytest.raises(taps.GraphError, match=r"aten\.cummax\.default in inner$"):
        from_torch(Net(), X)
