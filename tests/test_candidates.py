"""taps.plan.candidates: every candidate's operand layouts agree with each other rank by rank;
the partial layouts :func:`taps._core.layout_classes` builds from rows of device dims against
:func:`taps.plan.candidates.with_partial` one by one."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import taps
from taps._core import layout_classes, tensor_layouts
from taps.plan.candidates import Candidate, candidates, strategies, with_partial


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


@pytest.mark.parametrize("replicas", [False, True])
def test_candidates_made_at_once_are_the_dataclass_init(replicas):
    """``Candidate.many`` (which sets the fields itself) makes what ``Candidate.of``'s init
    does: every field, defaults included, and a gradients' memo of its own per candidate."""
    for op in _ops():
        found = candidates(op, 8, replicas)
        assert [vars(c) for c in found] == [vars(Candidate.of(op, c.strategy)) for c in found]
        assert all(c.op is op for c in found)
        assert len({id(c._gradients) for c in found}) == len(found)


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


def _plain_classes(forward, backward):
    """Classes written plainly: every layout compacted, the pairs numbered as first met."""
    index: dict = {}
    cls = [
        index.setdefault((a.compacted(), *(b.compacted() for b in rest)), len(index))
        for a, *rest in zip(forward, *([backward] if backward is not None else []))
    ]
    return cls, list(index)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.integers(1, 16), min_size=1, max_size=4),
    st.integers(0, 4),
    st.booleans(),
    st.data(),
)
def test_layout_classes_build_partial_layouts_as_with_partial(sizes, n, replicas, data):
    """``layout_classes`` given rows of partial dims (in either direction, -1 padded anywhere)
    against :func:`with_partial` of each candidate's layout one by one, compacted and numbered
    plainly; an empty row leaves the layout as it is."""
    found = taps.enumerate_strategies(sizes, 2**n, replicas)
    axes = data.draw(st.lists(st.integers(-1, len(sizes) - 1), min_size=1, max_size=4, unique=True))
    shape = [sizes[a] if a >= 0 else data.draw(st.integers(1, 9)) for a in axes]
    layouts = tensor_layouts(found, axes, shape)
    width = data.draw(st.integers(0, 3))
    rows, built = [], []
    for x in layouts:
        free = [k for k in range(len(x.device_matrix)) if k not in x.tensor_map]
        dims = (
            data.draw(st.lists(st.sampled_from(free), unique=True, max_size=width)) if free else []
        )
        row = dims + [-1] * (width - len(dims))
        rows.append(data.draw(st.permutations(row)))
        built.append(with_partial(x, dims) if dims else x)
    rows_array = np.array(rows, dtype=np.int64).reshape(len(layouts), width)
    forward_first = data.draw(st.booleans())
    if forward_first:
        got = layout_classes(layouts, layouts, rows_array, None)
        want = _plain_classes(built, layouts)
    else:
        got = layout_classes(layouts, layouts, None, rows_array)
        want = _plain_classes(layouts, built)
    cls, ahead, back = got
    assert (cls.tolist(), list(zip(ahead, back))) == want
    cls, ahead, back = layout_classes(layouts, None, rows_array)
    assert back is None
    assert (cls.tolist(), [(x,) for x in ahead]) == _plain_classes(built, None)


def test_layout_classes_refuse_rows_that_do_not_fit():
    """Rows for another count of candidates, partial sums on a dim the map splits, and
    gradients' rows with no gradients are refused."""
    layouts = tensor_layouts(taps.enumerate_strategies([8, 4], 4), [0, 1], [8, 4])
    none = np.full((len(layouts), 1), -1)
    assert layout_classes(layouts, None, none)[0].tolist() == layout_classes(layouts)[0].tolist()
    with pytest.raises(taps.TapsError):
        layout_classes(layouts, None, none[1:])
    with pytest.raises(taps.TapsError):
        layout_classes(layouts, None, None, none)
    split = np.array([[x.tensor_map[0] if x.tensor_map[0] >= 0 else -1] for x in layouts])
    assert (split >= 0).any()
    with pytest.raises(taps.LayoutError):
        layout_classes(layouts, layouts, None, split)
