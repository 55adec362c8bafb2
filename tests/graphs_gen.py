"""Hypothesis generators of small graphs and clusters on which brute force is affordable."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st

import taps
from taps.plan.candidates import candidates
from taps.solve.reductions import PairCost

CLUSTERS = [(1, 1), (1, 2), (2, 1), (1, 4), (2, 2), (4, 1), (1, 8), (2, 4), (4, 2), (2, 8), (4, 4)]


def pair_cost(draw, u: str, w: str, sizes: dict[str, int], costs) -> PairCost:
    """A pair cost between operators ``u`` and ``w`` (``sizes`` candidates each): random layout
    classes shared by candidates, and a matrix of ``costs`` over the classes."""
    classes = {}
    for v in (u, w):
        k = draw(st.integers(1, sizes[v]))
        classes[v] = np.array(
            draw(st.lists(st.integers(0, k - 1), min_size=sizes[v], max_size=sizes[v]))
        )
    shape = (int(classes[u].max()) + 1, int(classes[w].max()) + 1)
    flat = draw(st.lists(costs, min_size=math.prod(shape), max_size=math.prod(shape)))
    return PairCost(u, w, classes[u], classes[w], np.array(flat).reshape(shape))


@st.composite
def small_graphs(draw) -> taps.Graph:
    """Chains, branches and joins of linear, elementwise and reshape ops on small tensors."""
    g = taps.Graph(name="random")
    b = draw(st.sampled_from([4, 8, 16]))
    h = draw(st.sampled_from([4, 8, 12]))
    x = g.input("x", (b, h), requires_grad=draw(st.booleans()))
    live = [x]
    for k in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["linear", "relu", "add", "reshape_linear"]))
        src = draw(st.sampled_from(live))
        if kind == "linear":
            out = g.linear(f"fc{k}", src, draw(st.sampled_from([4, 8])), bias=draw(st.booleans()))
        elif kind == "relu":
            out = g.relu(f"relu{k}", src)
        elif kind == "add":
            same = [t for t in live if t.shape == src.shape]
            out = g.add(f"add{k}", src, draw(st.sampled_from(same)))
        else:
            flat = g.reshape(f"view{k}", src, (math.prod(src.shape),))
            out = g.einsum(f"scale{k}", "n,n->n", flat, g.parameter(f"w{k}", flat.shape))
        live.append(out)
    return g


def small_enough(graph, cluster, limit: int = 3000) -> bool:
    """Brute force is affordable."""
    sizes = [len(candidates(op, cluster.num_devices)) for op in graph.ops]
    return math.prod(sizes) <= limit


def skip_ladder(blocks: int, reach: int = 3, batch: int = 64, hidden: int = 64) -> taps.Graph:
    """Residual connections across several blocks: block ``k`` is a two-layer MLP whose output is
    added to the outputs of the ``reach`` blocks before it (one elementwise operator reads them
    all). With ``reach >= 3`` the skips overlap so that no series-parallel reduction removes them:
    the operators keep a core of treewidth ``reach``. Four operators per block."""
    g = taps.Graph(name=f"skip ladder ({blocks} blocks, reach {reach})")
    outs = [g.input("x", (batch, hidden), requires_grad=True)]
    for k in range(blocks):
        h = g.relu(f"b{k}.act", g.linear(f"b{k}.fc1", outs[-1], 2 * hidden))
        y = g.linear(f"b{k}.fc2", h, hidden)
        earlier = outs[-reach:]
        spec = ",".join(["ij"] * (len(earlier) + 1)) + "->ij"
        outs.append(g.einsum(f"b{k}.sum", spec, y, *earlier))
    return g


def _pointwise(g: taps.Graph, name: str, *xs: taps.Tensor) -> taps.Tensor:
    """An elementwise operator on images that, like the convolutions, keeps the spatial axes
    whole (batch and channels split)."""
    spec = ",".join(["bchw"] * len(xs)) + "->bchw"
    return g.einsum(name, spec, *xs, partitionable="bc")


def inception(
    blocks: int, batch: int = 32, channels: int = 64, size: int = 16, stem: bool = True
) -> taps.Graph:
    """An Inception-style CNN: every block runs four branches on its input (a 1x1 convolution;
    a shared 1x1 reduction followed by a 3x3 convolution, and by two 3x3 convolutions the second
    of which also reads the first branch's 3x3 output; pooling then a 1x1 convolution), sums them
    with the block's input (a residual connection), and the next block reads the sum. The branch
    that reads another makes each block non-series-parallel. Twelve operators per block (plus a
    stem convolution). The pooling is 1x1 (this builder pools without padding), its cost alike."""
    g = taps.Graph(name=f"inception ({blocks} blocks)")
    x = g.input("image", (batch, 3 if stem else channels, size, size))
    if stem:
        x = g.conv2d("stem", x, channels, 3, padding=1)
    half = channels // 2
    for k in range(blocks):
        p = f"i{k}."
        one = g.conv2d(f"{p}1x1", x, channels, 1)
        reduce = _pointwise(g, f"{p}reduce.act", g.conv2d(f"{p}reduce", x, half, 1))
        three = g.conv2d(f"{p}3x3", reduce, channels, 3, padding=1)
        mid = _pointwise(g, f"{p}5x5a.act", g.conv2d(f"{p}5x5a", reduce, half, 3, padding=1))
        five = _pointwise(
            g, f"{p}5x5.mix", g.conv2d(f"{p}5x5b", mid, channels, 3, padding=1), three
        )
        pooled = g.conv2d(f"{p}pool.proj", g.pool(f"{p}pool", x, 1), channels, 1)
        total = _pointwise(g, f"{p}sum", one, three, five, pooled, x)
        x = _pointwise(g, f"{p}out", total)
    return g


@st.composite
def small_cores(draw) -> taps.Graph:
    """Small skip ladders whose skips span 3 or 4 blocks, which the series-parallel reductions
    cannot take apart (on 2 devices; brute force is affordable there)."""
    return skip_ladder(
        4, draw(st.integers(3, 4)), draw(st.sampled_from([2, 4, 8])), draw(st.sampled_from([2, 4]))
    )
