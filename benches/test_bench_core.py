"""pytest-benchmark of the batch cost API (layout pairs per second).

Run: ``.venv/bin/python -m pytest benches -q --benchmark-enable --benchmark-only``.
"""

from __future__ import annotations

import pytest

import taps


def _linear_outputs(devices: int) -> list[taps.Layout]:
    """Output layouts of every strategy of a linear layer (b, s, h) x (h, o)."""
    strategies = taps.enumerate_strategies([64, 2048, 4096, 4096], devices)
    return [s.tensor_layout([0, 1, 3], [64, 2048, 4096]) for s in strategies]


@pytest.mark.parametrize("devices", [8, 32])
def test_redistribution_costs(benchmark, devices):
    layouts = _linear_outputs(devices)
    cluster = taps.Cluster(devices // 8 or 1, min(devices, 8))
    benchmark.extra_info["pairs"] = len(layouts) ** 2
    costs = benchmark(taps.redistribution_costs, layouts, layouts, cluster)
    assert costs.shape == (len(layouts), len(layouts))


def test_plan_redistribution_one_pair(benchmark):
    layouts = _linear_outputs(32)
    plan = benchmark(taps.plan_redistribution, layouts[0], layouts[-1])
    assert plan.volume > 0
