"""taps.sharding: every candidate's operand layouts agree with each other rank by rank."""

from __future__ import annotations

import pytest

import taps
from taps.sharding import Candidate, candidates, strategies


def _ops() -> list[taps.Operator]:
    g = taps.Graph()
    x = g.input("x", (8, 4, 16))
    g.einsum("e", "bsi,io->bso", x, g.parameter("w", (16, 8)), partitionable="bsio")
    img = g.input("img", (4, 8, 10, 10))
    g.conv2d("c", img, 16, kernel=3, padding=1)
    return g.ops


@pytest.mark.parametrize("devices", [1, 4, 8])
def test_operands_share_each_axis_range_on_every_rank(devices):
    """Independent of how layouts are built: on every rank, an axis that two operands share
    covers the same range in both, and a split axis is cut into its degree's equal blocks."""
    for op in _ops():
        for cand in candidates(op, devices):
            degree = dict(zip(op.partitionable, cand.strategy.degrees))
            operands = [*zip(op.inputs, cand.inputs), (op.output, cand.output)]
            for rank in range(devices):
                seen: dict[str, tuple[int, int]] = {}
                for operand, layout in operands:
                    for axis, (lo, hi) in zip(operand.dims, layout.shard_index(rank)):
                        assert hi - lo == op.axis_size(axis) // degree.get(axis, 1)
                        assert seen.setdefault(axis, (lo, hi)) == (lo, hi), (op.name, axis)


def test_candidate_layout_lookup_and_strategy_order():
    op = _ops()[0]
    found = candidates(op, 8)
    assert [c.strategy for c in found] == strategies(op, 8)
    c = found[3]
    assert c.layout(op, op.output) == c.output
    assert c.layout(op, op.inputs[1]) == c.inputs[1]
    assert Candidate.of(op, c.strategy) == c


def test_no_strategy_fits():
    g = taps.Graph()
    g.relu("r", g.input("x", (3, 5)))
    with pytest.raises(taps.StrategyError, match="no split of its partitionable axes"):
        candidates(g.op("r"), 2)
