"""Built-in models: AlexNet, the Megatron-LM transformer layers of the paper, a GPT-style layer and
an MLP. Every default is listed in docs/graph.md."""

from __future__ import annotations

from dataclasses import dataclass

from taps._core import GraphError
from taps._support.arguments import shown
from taps.graph import Graph
from taps.graph.records import checked_size


def _sizes(where: str, **values: object) -> None:
    """Every value a positive int below 2**63 (TypeError if not an int, GraphError if out of
    range), checked before anything is built."""
    for name, value in values.items():
        checked_size(where, name, value)


#: AlexNet's default batch (the paper gives none).
ALEXNET_BATCH = 128


def alexnet(
    batch: int = ALEXNET_BATCH, elementwise: bool = False, dtype_bytes: int = 2, bias: bool = False
) -> Graph:
    """torchvision's AlexNet on 224x224 images: 5 convolutions and 3 fully connected layers.

    By default ReLU and max-pooling are folded into the operator before them (a convolution's
    output has the pooled shape): every axis of their tensors that the producer can split they can
    split too, so taking the producer's layout costs them nothing, and the graph has the paper's 8
    operators and 7 edges (docs/graph.md gives the argument). ``elementwise=True`` makes them
    explicit operators; ``bias=True`` adds torchvision's biases (61,100,840 parameters in all).
    """
    _sizes("alexnet", batch=batch, dtype_bytes=dtype_bytes)
    g = Graph(name=f"alexnet(batch={batch})")
    x = g.input("images", (batch, 3, 224, 224), dtype_bytes)
    convs = [  # out channels, kernel, stride, padding, pool after
        (64, 11, 4, 2, True),
        (192, 5, 1, 2, True),
        (384, 3, 1, 1, False),
        (256, 3, 1, 1, False),
        (256, 3, 1, 1, True),
    ]
    for i, (cout, k, s, p, pooled) in enumerate(convs, start=1):
        if elementwise:
            x = g.conv2d(f"conv{i}", x, cout, k, s, p, bias)
            x = g.relu(f"relu{i}", x)
            if pooled:
                x = g.pool(f"pool{i}", x, 3, 2)
        else:
            x = g.conv2d(f"conv{i}", x, cout, k, s, p, bias, pool=(3, 2) if pooled else None)
    x = g.reshape("flatten", x, (batch, 256 * 6 * 6))
    for i, out in enumerate((4096, 4096, 1000), start=1):
        x = g.linear(f"fc{i}", x, out, bias)
        if elementwise and i < 3:
            x = g.relu(f"fc{i}.relu", x)
    return g


@dataclass(frozen=True)
class MegatronConfig:
    """One row of Narayanan et al. 2021, table 1."""

    heads: int
    hidden: int
    layers: int
    gpus: int
    global_batch: int


MEGATRON_CONFIGS: dict[str, MegatronConfig] = {
    "1.7B": MegatronConfig(24, 2304, 24, 32, 512),
    "3.6B": MegatronConfig(32, 3072, 30, 64, 512),
    "7.5B": MegatronConfig(32, 4096, 36, 128, 512),
    "18.4B": MegatronConfig(48, 6144, 40, 256, 1024),
    "39.1B": MegatronConfig(64, 8192, 48, 512, 1536),
    "76.1B": MegatronConfig(80, 10240, 60, 1024, 1792),
    "145.6B": MegatronConfig(96, 12288, 80, 1536, 2304),
    "310.1B": MegatronConfig(128, 16384, 96, 1920, 2160),
    "529.6B": MegatronConfig(128, 20480, 105, 2520, 2520),
    "1008.0B": MegatronConfig(160, 25600, 128, 3072, 3072),
}


#: Other names of Megatron configurations.
MEGATRON_ALIASES = {"1T": "1008.0B"}


def megatron_config(name: str) -> tuple[str, MegatronConfig]:
    """The key and configuration of a Megatron-LM name (``"1.7B"`` ... ``"1008.0B"``, or an alias
    such as ``"1T"``)."""
    if not isinstance(name, str):
        raise TypeError(f"megatron: name must be a str, got {type(name).__name__}")
    key = MEGATRON_ALIASES.get(name.upper(), name)
    if key not in MEGATRON_CONFIGS:
        raise GraphError(
            f"unknown Megatron configuration {name!r}: expected one of "
            f"{', '.join([*MEGATRON_CONFIGS, *MEGATRON_ALIASES])}"
        )
    return key, MEGATRON_CONFIGS[key]


def megatron(name: str, batch: int | None = None, seq: int = 2048) -> Graph:
    """One transformer layer of a Megatron-LM configuration (``"1.7B"`` ... ``"1008.0B"``, or
    ``"1T"``); ``batch`` defaults to the configuration's global batch, and the graph's ``layers``
    is the configuration's layer count."""
    key, c = megatron_config(name)
    if batch is not None:
        _sizes("megatron", batch=batch)
    return gpt(
        c.hidden,
        c.heads,
        seq,
        c.global_batch if batch is None else batch,
        layers=c.layers,
        name=f"megatron-{key}",
    )


def gpt(
    hidden: int,
    heads: int,
    seq: int,
    batch: int,
    layers: int = 1,
    ffn_multiplier: int = 4,
    name: str | None = None,
    dtype_bytes: int = 2,
    blocks: int = 1,
    tie: bool = False,
    fused_attention: bool = True,
) -> Graph:
    """One pre-norm transformer layer on ``batch * seq`` tokens: layernorm, q/k/v projections,
    attention scores, softmax, context, output projection, residual add, layernorm, two-layer MLP
    with GeLU, residual add.

    ``blocks > 1`` stacks that many layers in the graph, their names prefixed ``h0.``, ``h1.``,
    ...; ``tie=True`` declares them repeats (:meth:`Graph.tie`), so a search gives them one set of
    strategies. ``layers`` still multiplies the memory of the whole graph.

    As in the 2-D MatMuls of Megatron-LM and MindSpore, the projections and the MLP see the tokens
    as one axis (splitting it is data parallelism); attention sees batch, sequence and heads, and
    splits any of them but the head dim, the key sequence it normalises over and contracts.

    ``fused_attention`` (the default) is attention as engines run it (flash or memory-efficient):
    the backward keeps the softmax's logsumexp per row, not the scores or the probabilities
    (:attr:`taps.graph.Operator.saved`); ``False`` keeps both, as the unfused einsums do.
    """
    _sizes(
        "gpt",
        hidden=hidden,
        heads=heads,
        seq=seq,
        batch=batch,
        layers=layers,
        ffn_multiplier=ffn_multiplier,
        dtype_bytes=dtype_bytes,
        blocks=blocks,
    )
    # The largest tensors: the scores (batch, heads, seq, seq) and the MLP's hidden activation.
    _sizes("gpt", **{"batch * heads * seq * seq": batch * heads * seq * seq})
    _sizes(
        "gpt", **{"batch * seq * ffn_multiplier * hidden": batch * seq * ffn_multiplier * hidden}
    )
    if hidden % heads:
        raise GraphError(f"hidden size {hidden} is not a multiple of {heads} heads")
    hd = hidden // heads
    tokens = batch * seq
    g = Graph(
        name=name or f"gpt(h={hidden}, heads={heads}, seq={seq}, batch={batch})", layers=layers
    )
    # The previous layer's output: its gradient flows back.
    x = g.input("x", (tokens, hidden), dtype_bytes, requires_grad=True)
    instances = []
    for i in range(blocks):
        p = f"h{i}." if blocks > 1 else ""
        first = len(g.ops)
        h = g.layernorm(f"{p}ln1", x)
        q, k, v = (
            g.reshape(f"{p}{n}.heads", g.linear(f"{p}{n}", h, hidden), (batch, seq, heads, hd))
            for n in ("q", "k", "v")
        )
        # Fused attention (flash, memory-efficient) keeps neither the scores nor the
        # probabilities for the backward, only the logsumexp per row; the paper's model kept both.
        scores = g.einsum(
            f"{p}scores",
            "bsnd,btnd->bnst",
            q,
            k,
            partitionable="bsn",
            saved="none" if fused_attention else "output",
        )
        probs = g.softmax(f"{p}softmax", scores, saved="rows" if fused_attention else "output")
        ctx = g.einsum(f"{p}context", "bnst,btnd->bsnd", probs, v, partitionable="bsn")
        flat = g.reshape(f"{p}context.flat", ctx, (tokens, hidden))
        x = g.add(f"{p}residual1", x, g.linear(f"{p}proj", flat, hidden))
        h = g.layernorm(f"{p}ln2", x)
        h = g.gelu(f"{p}gelu", g.linear(f"{p}fc1", h, ffn_multiplier * hidden))
        x = g.add(f"{p}residual2", x, g.linear(f"{p}fc2", h, hidden))
        instances.append([op.name for op in g.ops[first:]])
    if tie and blocks > 1:
        g.tie(instances)
    return g


#: The layer of :func:`gpt` the command line builds as ``gpt``: GPT-3 175B's shape (Brown et al.
#: 2020: 96 layers of hidden size 12288, 96 heads, sequences of 2048), at batch 16.
GPT3_HIDDEN, GPT3_HEADS, GPT3_SEQ, GPT3_LAYERS = 12288, 96, 2048, 96
GPT_BATCH = 16

#: The MLP's default batch.
MLP_BATCH = 1024


def mlp(
    batch: int = MLP_BATCH,
    sizes: tuple[int, ...] = (1024, 4096, 4096, 1024),
    activation: str = "gelu",
    dtype_bytes: int = 2,
) -> Graph:
    """A chain of linear layers ``sizes[0] -> sizes[1] -> ...`` with an activation between."""
    if activation not in ("gelu", "relu"):
        raise GraphError(f"activation must be 'gelu' or 'relu', got {activation!r}")
    if not isinstance(sizes, (list, tuple)):
        raise TypeError(f"mlp: sizes must be a tuple of ints, got {type(sizes).__name__}")
    if len(sizes) < 2:
        raise GraphError(f"an MLP needs at least two sizes, got {shown(sizes)}")
    _sizes("mlp", batch=batch, dtype_bytes=dtype_bytes)
    _sizes("mlp", **{f"sizes[{i}]": n for i, n in enumerate(sizes)})
    g = Graph(name=f"mlp(batch={batch}, sizes={list(sizes)})")
    x = g.input("x", (batch, sizes[0]), dtype_bytes)
    for i, out in enumerate(sizes[1:], start=1):
        x = g.linear(f"fc{i}", x, out)
        if i < len(sizes) - 1:
            x = getattr(g, activation)(f"act{i}", x)
    return g


def names() -> list[str]:
    """The built-in models by the names the command line takes."""
    return ["alexnet", "gpt", "mlp"] + [f"megatron-{name}" for name in MEGATRON_CONFIGS]


def default_batch(name: str) -> int:
    """The batch :func:`by_name` builds ``name`` with when none is given."""
    key = name.lower()
    if key == "alexnet":
        return ALEXNET_BATCH
    if key == "mlp":
        return MLP_BATCH
    if key == "gpt":
        return GPT_BATCH
    if key.startswith("megatron-"):
        return megatron_config(name[len("megatron-") :])[1].global_batch
    raise GraphError(f"unknown model {name!r}: expected one of {', '.join(names())}")


def by_name(name: str, batch: int | None = None) -> Graph:
    """A built-in model by its command-line name (:func:`names`, ``megatron-1T`` too), at its
    default batch unless ``batch`` is given."""
    key = name.lower()
    if key.startswith("megatron-"):
        return megatron(name[len("megatron-") :], batch=batch)
    if key == "gpt":
        size = GPT_BATCH if batch is None else batch
        return gpt(GPT3_HIDDEN, GPT3_HEADS, GPT3_SEQ, size, layers=GPT3_LAYERS)
    if key in ("alexnet", "mlp"):
        build = alexnet if key == "alexnet" else mlp
        return build(batch=default_batch(key) if batch is None else batch)
    raise GraphError(f"unknown model {name!r}: expected one of {', '.join(names())}")
