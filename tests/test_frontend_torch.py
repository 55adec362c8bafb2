"""The PyTorch front end against hand-built graphs, the built-in models and torch itself.

Every model is built on the meta device (nothing allocated, no download)."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import taps
from taps.errors import MissingExtraError
from taps.frontends import from_torch
from taps.frontends.torch import Conversion, convert, repeated_blocks
from taps.reproduce.cases import paper_cluster

CLUSTER = taps.Cluster(2, 8)


def meta(factory, *shapes, dtype=torch.float16, grad=False):
    """A module and inputs on the meta device."""
    with torch.device("meta"):
        module = factory().to(dtype)
        inputs = [torch.empty(s, dtype=dtype, requires_grad=grad) for s in shapes]
    return module, inputs


def num_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def convert_checked(module, *inputs, **options) -> taps.Graph:
    """from_torch, with the checks every converted graph must pass: the module's parameter
    count, and an exact JSON round trip."""
    g = from_torch(module, *inputs, **options)
    assert g.num_parameters() == num_params(module)
    assert taps.Graph.from_json(g.to_json()) == g
    return g


def same_search(g: taps.Graph, ref: taps.Graph, names: dict[str, str] | None = None) -> None:
    """Equal optimal cost, and (when ``names`` maps ref's operators to g's) equal strategies."""
    a, b = taps.search(g, CLUSTER), taps.search(ref, CLUSTER)
    assert a.cost == pytest.approx(b.cost, rel=1e-9)
    for ref_name, name in (names or {}).items():
        assert a.plan.strategies[name] == b.plan.strategies[ref_name], (name, ref_name)


# -- small modules against hand-built graphs -------------------------------------------------


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, 256)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(256, 64, bias=False)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def test_mlp_equals_the_hand_built_graph():
    module, (x,) = meta(MLP, (32, 64))
    g = convert_checked(module, x, name="mlp")
    ref = taps.Graph("mlp")
    ref.parameter("fc1.weight", (256, 64))
    ref.parameter("fc1.bias", (256,))
    ref.parameter("fc2.weight", (64, 256))
    ref.input("x", (32, 64))
    ref.add_operator(
        "fc1",
        "linear",
        [("x", ["b", "in"]), ("fc1.weight", ("out", "in"))],
        ("b", "out"),
        addends=[("fc1.bias", ("out",))],  # added after the contraction
    )
    ref.add_operator("act", "gelu", [("fc1.out", ("b", "s"))], ("b", "s"))
    ref.add_operator(
        "fc2", "linear", [("act.out", ("b", "in")), ("fc2.weight", ("out", "in"))], ("b", "out")
    )
    assert g == ref


class Block(nn.Module):
    """A pre-norm transformer layer in plain torch, as taps.models.gpt describes it: tokens as
    rows, attention over (batch, seq, heads)."""

    def __init__(self, hidden: int = 256, heads: int = 8, batch: int = 8) -> None:
        super().__init__()
        self.heads, self.batch = heads, batch
        self.ln1 = nn.LayerNorm(hidden)
        self.q = nn.Linear(hidden, hidden, bias=False)
        self.k = nn.Linear(hidden, hidden, bias=False)
        self.v = nn.Linear(hidden, hidden, bias=False)
        self.proj = nn.Linear(hidden, hidden, bias=False)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden, bias=False)
        self.fc2 = nn.Linear(4 * hidden, hidden, bias=False)

    def forward(self, x):
        (t, h), b = x.shape, self.batch
        s = t // b
        y = self.ln1(x)
        q, k, v = (
            m(y).view(b, s, self.heads, h // self.heads).transpose(1, 2)
            for m in (self.q, self.k, self.v)
        )
        ctx = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(ctx.transpose(1, 2).reshape(t, h))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def test_attention_block_matches_taps_models_gpt():
    module, (x,) = meta(Block, (8 * 64, 256), grad=True)
    g = convert_checked(module, x)
    kinds = [op.kind for op in g.ops]
    assert kinds == [
        "layernorm", "linear", "linear", "linear", "scores", "softmax", "context", "linear",
        "add", "layernorm", "linear", "gelu", "linear", "add",
    ]  # fmt: skip
    # Transposes are labels: the context is laid out (b, s, n, d) for the reshape after it.
    assert not [t for t in g.tensors.values() if t.kind == "view" and t.shape == (8, 8, 64, 32)]
    assert g.op("scores").partitionable == ("b", "s", "n")
    ref = taps.models.gpt(256, 8, 64, 8)
    names = [op.name for op in g.ops]
    assert names[:4] == ["ln1", "q", "k", "v"]
    same_search(g, ref, {r.name: n for r, n in zip(ref.ops, names)})


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, stride=2, padding=1, bias=False)
        self.fc = nn.Linear(64 * 4 * 4, 16)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.adaptive_avg_pool2d(F.relu(self.conv2(x)), 4)
        return self.fc(torch.flatten(x, 1))


def test_conv_net_matches_the_graph_api():
    module, (x,) = meta(ConvNet, (32, 3, 32, 32))
    g = convert_checked(module, x)
    ref = taps.Graph("convnet")
    h = ref.input("images", (32, 3, 32, 32))
    h = ref.pool("pool1", ref.relu("relu1", ref.conv2d("conv1", h, 32, 3, padding=1, bias=True)), 2)
    h = ref.relu("relu2", ref.conv2d("conv2", h, 64, 3, stride=2, padding=1))
    h = ref.pool("pool2", h, 2)
    ref.linear("fc", ref.reshape("flat", h, (32, 64 * 16)), 16, bias=True)
    assert [op.kind for op in g.ops] == [op.kind for op in ref.ops]
    same_search(g, ref, {"conv1": "conv1", "conv2": "conv2", "fc": "fc"})


class GroupedNet(nn.Module):
    """A ResNeXt-style grouped convolution and a MobileNet-style depthwise one."""

    def __init__(self) -> None:
        super().__init__()
        self.grouped = nn.Conv2d(64, 128, 3, padding=1, groups=8)
        self.depthwise = nn.Conv2d(128, 128, 3, padding=1, groups=128, bias=False)

    def forward(self, x):
        return self.depthwise(F.relu(self.grouped(x)))


def test_grouped_convolutions_match_the_graph_api():
    module, (x,) = meta(GroupedNet, (32, 64, 16, 16))
    g = convert_checked(module, x)
    ref = taps.Graph("grouped")
    h = ref.input("images", (32, 64, 16, 16))
    h = ref.relu("relu", ref.conv2d("grouped", h, 128, 3, padding=1, bias=True, groups=8))
    ref.conv2d("depthwise", h, 128, 3, padding=1, groups=128)
    assert g.op("grouped").partitionable == ("b", "g", "ci", "co")
    assert g.op("depthwise").partitionable == ("b", "g")  # one channel per group
    same_search(g, ref, {"grouped": "grouped", "relu": "relu", "depthwise": "depthwise"})


def test_a_split_of_the_groups_communicates_nothing():
    """Closed form: the groups are neither contracted nor missing from the weight, so splitting
    only them leaves no partial sum and no gradient to reduce; splitting only the batch
    all-reduces the weight's gradient: ``2 (n - 1) / n`` times its bytes per device (in fp32,
    ``gradient_bytes=4``)."""
    module, (x,) = meta(lambda: nn.Conv2d(64, 128, 3, groups=16, bias=False), (32, 64, 8, 8))
    g = convert_checked(module, x)
    (op,) = g.ops
    n = CLUSTER.num_devices
    by_axes = {
        tuple(op.partitionable[i] for i, d in enumerate(s.degrees) if d > 1): s
        for s in taps.strategies_for(g, op.name, CLUSTER)
    }
    volume = {
        k: taps.evaluate(
            taps.Plan(g, CLUSTER, {op.name: s}, taps.Pricing("volume", gradient_bytes=4))
        )
        for k, s in by_axes.items()
    }
    assert volume[("g",)] == 0
    assert volume[("b",)] == pytest.approx(2 * (n - 1) / n * 128 * 4 * 9 * 4)


def test_mobilenet_and_resnext_convert_and_search():
    import torchvision

    for factory, grouped in (
        (torchvision.models.mobilenet_v2, 17),
        (torchvision.models.resnext50_32x4d, 16),
    ):
        module, (x,) = meta(factory, (32, 3, 224, 224))
        g = convert_checked(module, x)
        assert sum("g" in op.partitionable for op in g.ops) == grouped
        _search_ok(g)


# -- torchvision, transformers, torchtitan -----------------------------------------------------


def test_alexnet_gives_the_strategies_and_cost_of_taps_models_alexnet():
    import torchvision

    module, (x,) = meta(torchvision.models.alexnet, (128, 3, 224, 224))
    g = convert_checked(module, x)
    ref = taps.models.alexnet(elementwise=True, bias=True)
    assert len(g.ops) == len(ref.ops) == 18  # dropout free, the 6x6 adaptive pool the identity
    same_search(g, ref, {r.name: o.name for r, o in zip(ref.ops, g.ops)})


def _fused_gpt(hidden: int, heads: int, seq: int, batch: int) -> taps.Graph:
    """taps.models.gpt with GPT-2's fused QKV projection (weight (h, 3h), biases) and its
    tokens-as-rows matmuls, built by hand with the Graph API."""
    g = taps.Graph("gpt2-block")
    tokens, hd = batch * seq, hidden // heads
    x = g.input("x", (batch, seq, hidden), requires_grad=True)
    h = g.reshape("rows", g.layernorm("ln1", x), (tokens, hidden))
    g.parameter("qkv.weight", (hidden, 3, hidden))
    g.parameter("qkv.bias", (3, hidden))
    qkv = g.add_operator(
        "qkv",
        "linear",
        [(h, ("i", "k")), ("qkv.weight", ("k", "c", "j")), ("qkv.bias", ("c", "j"))],
        ("i", "c", "j"),
    )
    qkv = g.reshape("qkv.split", qkv, (batch, seq, 3, hidden))
    heads_of = [
        g.reshape(
            f"{n}.heads",
            g.add_operator(
                n, "split", [(qkv, ("b", "s", "c", "h"))], ("b", "s", "h"), partitionable="bsh"
            ),
            (batch, seq, heads, hd),
        )
        for n in "qkv"
    ]
    scores = g.einsum("scores", "bsnd,btnd->bnst", *heads_of[:2], partitionable="bsn")
    probs = g.softmax("softmax", scores)
    ctx = g.einsum("context", "bnst,btnd->bsnd", probs, heads_of[2], partitionable="bsn")
    attn = g.linear("proj", g.reshape("context.rows", ctx, (tokens, hidden)), hidden, bias=True)
    x = g.add("residual1", g.reshape("x.rows", x, (tokens, hidden)), attn)
    h = g.gelu("gelu", g.linear("fc1", g.layernorm("ln2", x), 4 * hidden, bias=True))
    g.add("residual2", x, g.linear("fc2", h, hidden, bias=True))
    return g


def test_gpt2_block_fused_qkv_keeps_the_per_head_split():
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    hidden, heads, seq, batch = 256, 8, 64, 8
    config = GPT2Config(
        n_embd=hidden, n_head=heads, n_positions=seq, activation_function="gelu",
        use_cache=False, attn_implementation="sdpa",
    )  # fmt: skip
    module, (x,) = meta(lambda: GPT2Block(config), (batch, seq, hidden), grad=True)
    g = convert_checked(module, x)
    # The split of c_attn's output into q, k, v factors its output axis into (3, hidden): a
    # strategy can split the hidden part, which is the heads (Megatron's column split).
    c_attn = g.op("attn.c_attn")
    assert c_attn.partitionable_sizes == (batch * seq, hidden, hidden)  # the 3 stays whole
    assert [c_attn.axis_size(a) for a in c_attn.output.dims] == [batch * seq, 3, hidden]
    # Communication only, gradients in the model's dtype: the block's extra elementwise operators
    # would add their own compute, and its biases' gradients weigh double in fp32.
    # Communication only, without latency (the paper's cluster): operator granularity differs.
    comm, paper = taps.Pricing(compute=False, gradient_bytes=None), paper_cluster(2, 8)
    a = taps.search(g, paper, comm).cost
    b = taps.search(_fused_gpt(hidden, heads, seq, batch), paper, comm).cost
    assert abs(a / b - 1) < 0.005


def test_opt_layer_equals_taps_models_gpt():
    """A transformers decoder layer with separate q/k/v projections and no biases is exactly
    taps.models.gpt (the query scaling is one more free elementwise operator)."""
    from transformers import OPTConfig
    from transformers.models.opt.modeling_opt import OPTDecoderLayer

    hidden, heads, seq, batch = 256, 8, 64, 8
    config = OPTConfig(
        hidden_size=hidden, num_attention_heads=heads, ffn_dim=4 * hidden,
        activation_function="gelu", enable_bias=False, use_cache=False,
        attn_implementation="sdpa", do_layer_norm_before=True,
    )  # fmt: skip
    module, (x,) = meta(lambda: OPTDecoderLayer(config), (batch, seq, hidden), grad=True)
    g = convert_checked(module, x)
    ref = taps.models.gpt(hidden, heads, seq, batch)
    assert g.num_parameters() == ref.num_parameters()
    a, b = taps.search(g, CLUSTER).cost, taps.search(ref, CLUSTER).cost
    assert abs(a / b - 1) < 0.005


def _search_ok(g: taps.Graph) -> None:
    result = taps.search(g, CLUSTER)
    assert result.status == "optimal" and result.cost > 0


def test_resnet50_converts_and_searches():
    import torchvision

    module, (x,) = meta(torchvision.models.resnet50, (32, 3, 224, 224))
    g = convert_checked(module, x)
    assert sum(op.kind == "conv2d" for op in g.ops) == 53
    assert sum(op.kind == "batchnorm" for op in g.ops) == 53
    # layer1..layer4: every bottleneck after the first of its stage is a repeat.
    assert sorted(len(t) for t in g.tied) == [2, 2, 3, 5]
    _search_ok(g)


def test_vit_converts_and_searches():
    import torchvision

    module, (x,) = meta(lambda: torchvision.models.VisionTransformer(
        image_size=64, patch_size=16, num_layers=2, num_heads=4, hidden_dim=128, mlp_dim=256
    ), (16, 3, 64, 64))  # fmt: skip
    g = convert_checked(module, x)
    assert sum(op.kind == "scores" for op in g.ops) == 2
    # nn.MultiheadAttention's fused in_proj is factored by the select of q, k, v.
    in_proj = next(op for op in g.ops if op.name.endswith("self_attention.linear"))
    assert 3 in in_proj.axis_sizes
    _search_ok(g)


def test_bert_converts_and_searches():
    from transformers import BertConfig, BertModel

    config = BertConfig(
        num_hidden_layers=2, hidden_size=128, num_attention_heads=4, intermediate_size=512,
        vocab_size=1024,
    )  # fmt: skip
    with torch.device("meta"):
        module = BertModel(config)
        ids = torch.zeros(16, 64, dtype=torch.long)
    g = convert_checked(module, ids)
    assert "embeddings.word_embeddings.weight" in g.tensors
    assert [len(t) for t in g.tied] == [2]
    _search_ok(g)


def _hf_llama(layers: int = 2):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        num_hidden_layers=layers, hidden_size=128, num_attention_heads=8, num_key_value_heads=2,
        intermediate_size=256, vocab_size=1024, use_cache=False,
    )  # fmt: skip
    with torch.device("meta"):
        return LlamaForCausalLM(config), torch.zeros(16, 64, dtype=torch.long)


def test_transformers_llama_converts_and_searches():
    module, ids = _hf_llama()
    g = convert_checked(module, ids)
    assert {"model.layers.0.self_attn.q_proj", "lm_head"} <= {op.name for op in g.ops}
    _search_ok(g)


def _titan_llama(flavor: str = "debugmodel", layers: int | None = None):
    """torchtitan's Llama 3 from its config, with SDPA attention (flex attention needs a
    block mask built on a real device)."""
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3 import llama3_configs

    config = llama3_configs[flavor](attn_backend="flex")
    if layers is not None:
        config.layers = config.layers[:layers]
    for layer in config.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    with torch.device("meta"):
        return config.build()


def test_torchtitan_llama3_converts_and_searches():
    module = _titan_llama(layers=2)
    with torch.device("meta"):
        tokens = torch.zeros(8, 128, dtype=torch.long)
    g = convert_checked(module, tokens)
    # The fused wqkv (n_kv_heads, heads per kv + 2, head_dim) is factored by the split: the kv
    # heads are an axis of the projection.
    wqkv = g.op("layers.0.attention.qkv_linear.wqkv")
    kv_heads, r, head_dim = 16, 3, 16  # the debug model: 16 heads, 16 kv heads, dim 256
    assert [wqkv.axis_size(a) for a in wqkv.output.dims] == [8 * 128, kv_heads, r, head_dim]
    kv, piece = wqkv.output.dims[1:3]
    assert kv in wqkv.partitionable and piece not in wqkv.partitionable
    # Complex rotary embeddings: the real/imaginary pair is an axis no strategy splits.
    rope = [op for op in g.ops if op.name.startswith("layers.0.attention.rope")]
    assert rope and all("ri0" not in op.partitionable for op in rope)
    assert [len(t) for t in g.tied] == [2]
    _search_ok(g)


# -- repeated blocks ---------------------------------------------------------------------------


def test_repeated_blocks_group_identical_layers_aligned():
    module, ids = _hf_llama(layers=3)
    g = from_torch(module, ids, tie=False)
    assert g.tied == ()

    program = torch.export.export(module, (ids,))
    conversion = convert(program, name=g.name)
    groups = repeated_blocks(conversion, module)
    assert len(groups) == 1 and len(groups[0]) == 3
    first, *rest = groups[0]
    for inst, i in zip(rest, (1, 2)):
        assert inst == [n.replace("layers.0.", f"layers.{i}.", 1) for n in first]
    conversion.graph.tie(groups[0])  # the graph IR agrees they are repeats


class Widths(nn.Module):
    """Three blocks in a ModuleList: two alike, one wider."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(64, 64)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(64, w), nn.ReLU(), nn.Linear(w, 64)) for w in (128, 256, 128)
        )

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = x + block(x)
        return x


def test_repeated_blocks_keep_different_blocks_apart():
    module, (x,) = meta(Widths, (32, 64))
    g = convert_checked(module, x)
    assert len(g.tied) == 1
    (instances,) = g.tied
    assert [inst[0] for inst in instances] == ["blocks.0.0", "blocks.2.0"]


# -- errors -----------------------------------------------------------------------------------


class Odd(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)

    def forward(self, x):
        y = torch.special.erfcx(self.a(x))
        return torch.cummax(self.b(y), dim=1).values


def test_unsupported_operators_are_all_listed_with_their_module():
    module, (x,) = meta(Odd, (32, 16))
    with pytest.raises(taps.GraphError) as e:
        from_torch(module, x)
    text = str(e.value)
    assert "2 operator(s)" in text
    assert "aten.special_erfcx.default in the top-level module" in text
    assert "aten.cummax.default in the top-level module" in text


def test_unknown_replicate_keeps_the_operator_whole():
    module, (x,) = meta(Odd, (32, 16))
    g = convert_checked(module, x, unknown="replicate")
    kept = [op for op in g.ops if op.kind in ("special_erfcx", "cummax")]
    assert [op.kind for op in kept] == ["special_erfcx", "cummax", "cummax"]  # values, indices
    assert all(op.partitionable == () for op in kept)
    assert g.op("b").inputs[0].tensor == "special_erfcx.out"
    # Whole operators need candidates on fewer devices than the cluster's: replicate=True.
    result = taps.search(g, CLUSTER, replicate=True)
    assert all(result.plan.strategies[op.name].degrees == [] for op in kept)


def test_bad_arguments_are_one_line_errors():
    module, (x,) = meta(MLP, (32, 64))
    with pytest.raises(taps.GraphError, match="unknown= must be"):
        from_torch(module, x, unknown="skip")
    with pytest.raises(taps.GraphError, match=r"needs a torch\.nn\.Module"):
        from_torch(lambda x: x, x)
    with pytest.raises(taps.GraphError, match=r"torch\.export failed on MLP"):
        from_torch(module, torch.empty(32, 7, device="meta"))


def test_missing_torch_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(MissingExtraError, match=r"pip install 'taps\[torch\]'"):
        from_torch(object())


def test_saved_export_archive_converts(tmp_path):
    from taps.frontends.torch import load

    module = MLP()
    x = torch.randn(32, 64)
    path = tmp_path / "mlp.pt2"
    torch.export.save(torch.export.export(module, (x,)), str(path))
    assert load(str(path)) == from_torch(module, x, name="mlp")
    with pytest.raises(taps.GraphError, match="cannot load"):
        load(str(tmp_path / "missing.pt2"))


def test_conversion_maps_operators_to_modules():
    module, (x,) = meta(MLP, (32, 64))
    program = torch.export.export(module, (x,))
    conversion = convert(program)
    assert isinstance(conversion, Conversion)
    assert conversion.module_of == {"fc1": "fc1", "act": "act", "fc2": "fc2"}


def test_blocks_tie_only_when_the_graph_would_tie_them():
    """The first block reads a tensor with no gradient, the others one with: the first is not
    a repeat of the others (Graph.tie would refuse it), the others are tied."""

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.a(x))

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x * 2
            for block in self.blocks:
                x = block(x)
            return x

    with torch.device("meta"):
        model, x = Model(), torch.zeros(8, 16)
    graph = from_torch(model, x)
    assert [len(group) for group in graph.tied] == [2]
    assert graph.tied[0][0][0].startswith("blocks.1.")
