"""The Rust cost kernels against plain Python on the same inputs (issue 5: at least 100 times
faster). Prints each ratio; the thread scaling of the Rust kernel is in the criterion bench
(``cargo bench --bench core -- cost_kernel``).

Run: ``.venv/bin/python -m pytest benches/test_bench_kernel.py -q -s --benchmark-enable``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import taps
from taps._core import allreduce_costs
from taps.costs import _reduced_tensors, candidates, intra_collectives

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import reference as ref

#: A Megatron-sized linear layer (b, s, h) x (h, o), fp16.
LINEAR = (64, 2048, 4096, 4096)
CLUSTER = (4, 8, 60e9, 6e9)
#: Sources the Python reference plans against every target (it is ~100 times slower).
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
    cluster = taps.Cluster(*CLUSTER)
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


def test_allreduce_costs_vs_python_loop(benchmark):
    graph = taps.Graph(name="linear")
    b, s, h, o = LINEAR
    graph.linear("fc", graph.input("x", (b, s, h), requires_grad=True), o)
    op = graph.op("fc")
    cluster = taps.Cluster(*CLUSTER)
    cands = candidates(op, cluster.num_devices)

    def kernel() -> np.ndarray:
        return allreduce_costs(
            np.array([st.degrees for st in cands], dtype=np.int64),
            np.array([st.device_map for st in cands], dtype=np.int64),
            _reduced_tensors(graph, op),
            cluster,
        )

    def loop() -> list[float]:
        """The node costs as build_tables computed them before the kernel."""
        return [sum(c.cost(cluster) for c in intra_collectives(graph, op, st)) for st in cands]

    def reference() -> np.ndarray:
        return ref.allreduce_costs(
            [st.degrees for st in cands],
            [st.device_map for st in cands],
            _reduced_tensors(graph, op),
            CLUSTER,
        )

    got = benchmark(kernel)
    assert np.array_equal(got, loop())
    np.testing.assert_allclose(got, reference(), rtol=1e-12)
    rust = _best_seconds(kernel, 20)
    loop_ratio = _best_seconds(loop, 5) / rust
    ref_ratio = _best_seconds(reference, 5) / rust
    benchmark.extra_info.update(strategies=len(cands), loop_ratio=loop_ratio, ref_ratio=ref_ratio)
    print(
        f"\nallreduce_costs, {len(cands)} strategies: {len(cands) / rust:,.0f} strategies/s, "
        f"{loop_ratio:.0f}x the per-strategy loop over taps collectives, "
        f"{ref_ratio:.0f}x the Python reference"
    )
    assert loop_ratio > 1
