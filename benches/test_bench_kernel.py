"""The Rust cost kernels against plain Python on the same inputs (issue 5: at least 100 times
faster). Both sides get their inputs prepared outside the timings and only the cost functions are
timed; the Rust side runs on every core, as the search calls it. Prints each ratio; the thread
scaling of the Rust kernel is in the criterion bench (``cargo bench --bench core -- cost_kernel``).

Run: ``.venv/bin/python -m pytest benches/test_bench_kernel.py -q -s --benchmark-enable``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import taps
from taps._core import allreduce_costs
from taps.graph import Operator
from taps.plan.candidates import Candidate, strategies
from taps.reproduce.cases import paper_cluster
from taps.search.prices import all_reduce_operands, intra_collectives

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import reference as ref

#: A Megatron-sized linear layer (b, s, h) x (h, o), fp16.
LINEAR = (64, 2048, 4096, 4096)
CLUSTER = (4, 8, 60e9, 6e9)
#: 512 nodes of 8 devices, for a GPT-3-sized transformer layer: 2882 strategies over 14 operators.
GPT_CLUSTER = (512, 8, 60e9, 6e9)
#: Sources the Python reference plans against every target (it is hundreds of times slower).
PYTHON_ROWS = 6


def _best_seconds(fn: Callable[[], object], rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _output_classes() -> list[taps.Layout]:
    """The distinct output distributions (b, s, o) of every strategy of the linear layer on 32
    devices: what the search hands the kernel for one edge."""
    b, s, _, o = LINEAR
    strategies = taps.enumerate_strategies(list(LINEAR), 32)
    layouts = [st.tensor_layout([0, 1, 3], [b, s, o]).normalized() for st in strategies]
    return list(dict.fromkeys(layouts))


def _triple(layout: taps.Layout) -> ref.Triple:
    return layout.shape, layout.device_matrix, layout.tensor_map


def test_redistribution_costs_vs_reference(benchmark):
    layouts = _output_classes()
    # The reference prices as the paper does: replicas share a transfer, no latency.
    cluster = paper_cluster(*CLUSTER)
    pairs = len(layouts) ** 2
    rust = benchmark(taps.redistribution_costs, layouts, layouts, cluster)
    rust_rate = pairs / _best_seconds(
        lambda: taps.redistribution_costs(layouts, layouts, cluster), 5
    )
    triples = [_triple(x) for x in layouts]
    python: list[np.ndarray] = []
    seconds = _best_seconds(
        lambda: python.append(ref.redistribution_costs(triples[:PYTHON_ROWS], triples, CLUSTER)),
        2,
    )
    python_rate = PYTHON_ROWS * len(layouts) / seconds
    np.testing.assert_allclose(rust[:PYTHON_ROWS], python[-1], rtol=1e-12)
    ratio = rust_rate / python_rate
    benchmark.extra_info.update(pairs=pairs, rust_pairs_per_s=rust_rate, ratio=ratio)
    print(
        f"\nredistribution_costs, {len(layouts)} x {len(layouts)} layout classes: Rust "
        f"{rust_rate:,.0f} pairs/s, Python reference {python_rate:,.0f} pairs/s, {ratio:.0f}x"
    )
    assert ratio > 1


@dataclass
class _Node:
    """One operator's input to the node-cost kernel, built once outside the timings: the arrays
    the search hands the Rust kernel and the same rows as lists for the Python reference."""

    op: Operator
    strategies: list[taps.Strategy]
    degrees: np.ndarray
    device_maps: np.ndarray
    tensors: list[tuple[list[int], list[int], float]]
    degree_lists: list[list[int]]
    map_lists: list[list[int]]


def _nodes(graph: taps.Graph, cluster: taps.Cluster) -> list[_Node]:
    out = []
    for op in graph.ops:
        found = strategies(op, cluster.num_devices)
        degrees = [list(st.degrees) for st in found]
        maps = [list(st.device_map) for st in found]
        out.append(
            _Node(
                op,
                found,
                np.array(degrees, dtype=np.int64),
                np.array(maps, dtype=np.int64),
                all_reduce_operands(graph, op),
                degrees,
                maps,
            )
        )
    return out


def _linear_graph() -> taps.Graph:
    graph = taps.Graph(name="linear")
    b, s, h, o = LINEAR
    graph.linear("fc", graph.input("x", (b, s, h), requires_grad=True), o)
    return graph


@pytest.mark.parametrize(
    ("graph", "params"),
    [
        (_linear_graph(), CLUSTER),
        (taps.models.gpt(hidden=12288, heads=96, seq=2048, batch=16), GPT_CLUSTER),
    ],
    ids=["linear-32dev", "gpt-4096dev"],
)
def test_allreduce_costs_vs_reference(benchmark, graph, params):
    cluster = paper_cluster(*params)
    nodes = _nodes(graph, cluster)
    count = sum(len(n.strategies) for n in nodes)

    def rust() -> list[np.ndarray]:
        return [allreduce_costs(n.degrees, n.device_maps, n.tensors, cluster) for n in nodes]

    def reference() -> list[np.ndarray]:
        return [ref.allreduce_costs(n.degree_lists, n.map_lists, n.tensors, params) for n in nodes]

    got = benchmark(rust)
    for n, costs, want in zip(nodes, got, reference()):
        # Exactly the node costs of the per-strategy loop over taps collectives it replaced.
        loop = [
            sum(c.cost(cluster) for c in intra_collectives(graph, n.op, Candidate.of(n.op, st)))
            for st in n.strategies
        ]
        assert np.array_equal(costs, loop)
        np.testing.assert_allclose(costs, want, rtol=1e-12)
    rust_rate = count / _best_seconds(rust, 200)
    python_rate = count / _best_seconds(reference, 3)
    ratio = rust_rate / python_rate
    benchmark.extra_info.update(strategies=count, rust_strategies_per_s=rust_rate, ratio=ratio)
    print(
        f"\nallreduce_costs, {count} strategies of {len(nodes)} operators on "
        f"{cluster.num_devices} devices: Rust {rust_rate:,.0f} strategies/s, Python reference "
        f"{python_rate:,.0f} strategies/s, {ratio:.0f}x"
    )
    assert ratio > 1
