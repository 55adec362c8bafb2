"""Hypothesis generators of small graphs and clusters on which brute force is affordable."""

from __future__ import annotations

import math

from hypothesis import strategies as st

import taps
from taps.sharding import candidates

CLUSTERS = [(1, 1), (1, 2), (2, 1), (1, 4), (2, 2), (4, 1), (1, 8), (2, 4), (4, 2), (2, 8), (4, 4)]


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
