"""taps.plan.candidates: every candidate's operand layouts agree with each other rank by rank."""

from __future__ import annotations

import pytest

import taps
from taps.plan.candidates import Candidate, candidates, strategies


def _ops() -> list[taps.Operator]:
    g = taps.Graph()
    x = g.input("x", (8, 4, 16))
    g.einsum("e", "bsi,io->bso", x, g.parameter("w", (16, 8)), partitionable="bsio")
    img = g.input("img", (4, 8, 10, 10))
    g.conv2d("c", img, 16, kernel=3, padding=1)
    return g.ops


@pytest.mark.parametrize("replicas", [False, True])
@pytest.mark.parametrize("devices", [1, 4, 8])
def test_operands_share_each_axis_range_on_every_rank(devices, replicas):
    """Independent of how layouts are built: on every rank, an axis that two operands share
    covers the same range in both, and a split axis is cut into its degree's equal blocks (with
    replicas too: a replicated strategy's operands agree within each replica)."""
    for op in _ops():
        for cand in candidates(op, devices, replicas):
            degree = dict(zip(op.partitionable, cand.strategy.degrees))
            operands = [*zip(op.inputs, cand.inputs), (op.output, cand.output)]
            for rank in range(devices):
                seen: dict[str, tuple[int, int]] = {}
                for operand, layout in operands:
                    for axis, (lo, hi) in zip(operand.dims, layout.shard_index(rank)):
                        assert hi - lo == op.axis_size(axis) // degree.get(axis, 1)
                        assert seen.setdefault(axis, (lo, hi)) == (lo, hi), (op.name, axis)


def test_candidates_in_strategy_order_and_their_layouts_worked_out_once():
    op = _ops()[0]
    found = candidates(op, 8)
    assert [c.strategy for c in found] == strategies(op, 8)
    c = found[3]
    assert Candidate.of(op, c.strategy) == c
    assert c.partial_output is c.partial_output
    assert c.gradient(1) is c.gradient(1)
    assert c.partial_output.tensor_map == c.output.tensor_map
    assert c.gradient(1).tensor_map == c.inputs[1].tensor_map


def test_an_op_with_no_split_over_every_device_gets_the_replicated_ones():
    """(3, 5) cannot be split in two: the candidates split over one device and replicate over
    two; without partitionable axes, the one fully replicated strategy."""
    g = taps.Graph()
    g.relu("r", g.input("x", (3, 5)))
    found = strategies(g.op("r"), 2)
    assert found == taps.enumerate_strategies([3, 5], 2, replicas=True)
    assert [(s.degrees, s.device_matrix) for s in found] == [([1, 1], [2])]
    g.einsum("s", "ab->", "r.out", partitionable="")
    assert [s.device_matrix for s in strategies(g.op("s"), 8)] == [[8]]
