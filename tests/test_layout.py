"""taps.Layout: validation, attributes, immutability, shard_index, equality; and the simulator's
own sanity on hand-computed examples (so the references the other tests rely on are checked)."""

import pickle
from math import prod

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim
import strategies_gen as sg
import taps

# --------------------------------------------------------------------------- simulator sanity


def test_sim_coordinates_innermost_first():
    dm = [2, 3, 4]  # d_2 = 2, d_1 = 3, d_0 = 4 (3 only to make the dims distinguishable)
    assert sim.coords(0, dm) == [0, 0, 0]
    assert sim.coords(1, dm) == [1, 0, 0]
    assert sim.coords(4, dm) == [0, 1, 0]
    assert sim.coords(13, dm) == [1, 0, 1]
    assert all(sim.rank_of(sim.coords(r, dm), dm) == r for r in range(24))


def test_sim_shards_by_hand():
    # [4, 2] split along dim 0 by the inner device dim (size 2), replicated along the outer one.
    got = sim.shards(([4, 2], [2, 2], [0, -1]))
    assert [g.tolist() for g in got] == [
        [[0, 1], [2, 3]],
        [[4, 5], [6, 7]],
        [[0, 1], [2, 3]],
        [[4, 5], [6, 7]],
    ]
    # split along dim 1 by the outer device dim
    got = sim.shards(([2, 4], [2, 2], [-1, 1]))
    assert [g.tolist() for g in got] == [
        [[0, 1], [4, 5]],
        [[0, 1], [4, 5]],
        [[2, 3], [6, 7]],
        [[2, 3], [6, 7]],
    ]


def test_sim_replay_by_hand():
    lay = ([4, 4], [2, 2], [1, 0])
    arrays = sim.shards(lay)
    # all_gather along device dim 0 on tensor dim 1: every rank gets full rows of its row block.
    out, rec = sim.replay(sim.SimOp("all_gather", 0, 1), arrays, [2, 2])
    assert [a.tolist() for a in out] == sim_expected([4, 4], [2, 2], [1, -1])
    assert rec == [4, 4, 4, 4]
    # all_to_all along device dim 0 from tensor dim 1 to tensor dim 0: columns -> rows
    cols = sim.shards(([4, 4], [4], [-1, 0]))
    assert [a.tolist() for a in cols][1] == [[1], [5], [9], [13]]
    out, rec = sim.replay(sim.SimOp("all_to_all", 0, 1, 0), cols, [4])
    assert [a.tolist() for a in out] == [
        [[0, 1, 2, 3]],
        [[4, 5, 6, 7]],
        [[8, 9, 10, 11]],
        [[12, 13, 14, 15]],
    ]
    assert rec == [3, 3, 3, 3]
    # slice is free and local
    out, rec = sim.replay(sim.SimOp("slice", 0, 1), sim.shards(([4, 4], [2, 2], [1, -1])), [2, 2])
    assert [a.tolist() for a in out] == [a.tolist() for a in arrays]
    assert rec == [0, 0, 0, 0]


def sim_expected(shape, dm, tm):
    return [a.tolist() for a in sim.shards((shape, dm, tm))]


# --------------------------------------------------------------------------- validation

BAD = [
    # (shape, device_matrix, tensor_map, message pattern)
    ([4, 4], [2, 2], [0], r"(?i)length|len|dim"),
    ([4], [2, 2], [0, 1], r"(?i)length|len|dim"),
    ([4, 4], [2, 2], [0, 0], r"(?i)twice|more than once|duplicate|repeat|already|used"),
    ([4, 4, 4], [2, 2], [1, -1, 1], r"(?i)twice|more than once|duplicate|repeat|already|used"),
    ([4, 4], [2, 2], [0, 2], r"(?i)range|out of|invalid|device dim"),
    ([4, 4], [2, 2], [-2, 0], r"(?i)range|out of|invalid|-2"),
    ([3, 4], [2, 2], [0, -1], r"(?i)divid|divisib|multiple|cannot be split"),
    ([4, 6], [4, 1], [-1, 1], r"(?i)divid|divisib|multiple|cannot be split"),
    ([4, 4], [3], [-1, -1], r"(?i)power of (two|2)|power-of-two|pow"),
    ([4, 4], [0, 2], [-1, -1], r"(?i)power of (two|2)|power-of-two|positive|pow"),
    ([4, 4], [-2, 2], [-1, 0], r"(?i)power of (two|2)|power-of-two|positive|pow"),
    ([12, 4], [6], [0, -1], r"(?i)power of (two|2)|power-of-two|pow"),
]


@pytest.mark.parametrize(("shape", "dm", "tm", "pattern"), BAD)
def test_invalid_layouts_raise_layout_error(shape, dm, tm, pattern):
    with pytest.raises(taps.LayoutError, match=pattern) as info:
        taps.Layout(shape, dm, tm)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, taps.TapsError)


def test_error_hierarchy():
    for cls in (
        taps.LayoutError,
        taps.UnifyError,
        taps.StrategyError,
        taps.TopologyError,
        taps.GraphError,
        taps.InfeasibleError,
    ):
        assert issubclass(cls, taps.TapsError)
        assert issubclass(cls, ValueError)
    assert issubclass(taps.UnifyError, taps.LayoutError)


# --------------------------------------------------------------------------- attributes


def test_attributes_are_plain_lists():
    lay = taps.Layout([8, 6, 4], [2, 1, 4], [0, -1, 2])
    for name, want in [
        ("shape", [8, 6, 4]),
        ("device_matrix", [2, 1, 4]),
        ("tensor_map", [0, -1, 2]),
        ("shard_shape", [2, 6, 2]),
    ]:
        got = getattr(lay, name)
        assert type(got) is list, (name, type(got))
        assert all(type(x) is int for x in got), (name, got)
        assert got == want, (name, got)
    assert type(lay.num_devices) is int
    assert lay.num_devices == 8
    assert [lay.device_dim_size(k) for k in range(3)] == [4, 1, 2]


def test_size_one_device_dims_split_nothing():
    lay = taps.Layout([3, 4], [1, 4], [1, 0])
    assert lay.shard_shape == [3, 1]
    assert lay.num_devices == 4


@pytest.mark.parametrize(
    "name", ["shape", "device_matrix", "tensor_map", "shard_shape", "num_devices"]
)
def test_immutable(name):
    lay = taps.Layout([8, 4], [2, 2], [0, 1])
    with pytest.raises((AttributeError, TypeError)):
        setattr(lay, name, [1])
    assert lay == taps.Layout([8, 4], [2, 2], [0, 1])


def test_returned_lists_are_copies():
    lay = taps.Layout([8, 4], [2, 2], [0, 1])
    lay.shape.append(3)
    lay.tensor_map[0] = -1
    lay.device_matrix[0] = 64
    assert lay.shape == [8, 4]
    assert lay.tensor_map == [0, 1]
    assert lay.device_matrix == [2, 2]


def test_equality_and_hash():
    a = taps.Layout([8, 4], [2, 2], [0, 1])
    b = taps.Layout([8, 4], [2, 2], [0, 1])
    assert a == b
    # Asked twice (the second from the cached hash), and of an equal layout made by the core.
    assert hash(a) == hash(a) == hash(b) == hash(b.compacted())
    assert len({a, b}) == 1
    others = [
        taps.Layout([8, 4], [2, 2], [1, 0]),
        taps.Layout([4, 8], [2, 2], [0, 1]),
        taps.Layout([8, 4], [4, 1], [0, 1]),
        taps.Layout([8, 4], [1, 4], [0, 1]),
        taps.Layout([8, 4], [2, 2], [0, -1]),
    ]
    for o in others:
        assert a != o
        assert not a.__eq__(o)
    assert len({a, *others}) == 1 + len(others)
    assert {a: 1}[b] == 1


def test_pickle_round_trip():
    lay = taps.Layout([8, 6, 4], [2, 1, 4], [0, -1, 2])
    back = pickle.loads(pickle.dumps(lay))
    assert back == lay
    assert back.shard_shape == [2, 6, 2]
    partial = taps.Layout([8, 6], [2, 2, 4], [0, -1], partial=[2, 1])
    back = pickle.loads(pickle.dumps(partial))
    assert back == partial and back.partial == [1, 2]
    assert hash(back) == hash(partial)


def test_partial_sums():
    a = taps.Layout([8, 6], [2, 4], [0, -1], partial=[1])
    assert a.partial == [1]
    assert a != taps.Layout([8, 6], [2, 4], [0, -1])
    assert taps.Layout([8, 6], [2, 4], [0, -1]).partial == []
    assert "partial=[1]" in repr(a)
    assert a.shard_shape == [2, 6]  # an addend of the same block
    for bad in ([0], [2], [1, 1], [-1]):
        with pytest.raises(taps.LayoutError):
            taps.Layout([8, 6], [2, 4], [0, -1], partial=bad)
    # Adjacent partial dims are one partial dim in the canonical form.
    b = taps.Layout([8, 6], [2, 2, 2], [-1, -1], partial=[0, 1])
    assert b.normalized() == taps.Layout([48], [2, 4], [-1], partial=[0])


def test_shard_index_out_of_range_is_an_error():
    lay = taps.Layout([8, 4], [2, 2], [0, 1])
    for bad in (4, 100):
        with pytest.raises((ValueError, IndexError)):
            lay.shard_index(bad)


@settings(max_examples=150)
@given(sg.layouts())
def test_layout_matches_first_principles(t):
    shape, dm, tm = t
    lay = sg.to_layout(t)
    assert lay.shape == shape
    assert lay.device_matrix == dm
    assert lay.tensor_map == tm
    assert lay.shard_shape == sim.shard_shape(t)
    n = int(np.prod(dm))
    assert lay.num_devices == n
    for k in range(len(dm)):
        assert lay.device_dim_size(k) == dm[len(dm) - 1 - k]
    full = np.arange(int(np.prod(shape))).reshape(shape)
    expect = sim.shards(t)
    for r in range(n):
        idx = [tuple(int(v) for v in p) for p in lay.shard_index(r)]
        assert idx == sim.shard_slices(t, r), (r, idx)
        got = full[tuple(slice(a, b) for a, b in idx)]
        assert np.array_equal(got, expect[r])
    # round trip through the attributes
    assert taps.Layout(lay.shape, lay.device_matrix, lay.tensor_map) == lay
    assert hash(taps.Layout(lay.shape, lay.device_matrix, lay.tensor_map)) == hash(lay)


@settings(max_examples=60)
@given(sg.layouts(), st.data())
def test_breaking_divisibility_is_rejected(t, data):
    shape, dm, tm = t
    split = [i for i, m in enumerate(tm) if m >= 0 and dm[len(dm) - 1 - m] > 1]
    if not split:
        return
    i = data.draw(st.sampled_from(split))
    bad = list(shape)
    bad[i] += 1  # d_{m_i} >= 2 divides shape[i], so it cannot divide shape[i] + 1
    with pytest.raises(taps.LayoutError):
        taps.Layout(bad, dm, tm)


# --------------------------------------------------------------------------- normalized()


@st.composite
def equivalent_rewrites(draw, t):
    """A layout of the same shape holding the same elements on every rank as ``t``, made by
    rewriting only what cannot matter: splitting/merging device dims no tensor dim uses, inserting
    size-1 device dims, and unsplitting tensor dims split along a size-1 device dim."""
    shape, dm, tm = t
    h = len(dm)
    # entries outermost first: [size, tensor dim using it or None]
    entries = [[dm[p], None] for p in range(h)]
    for i, m in enumerate(tm):
        if m >= 0:
            entries[h - 1 - m][1] = i
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["split", "merge", "insert", "unsplit"]))
        if kind == "split":
            cands = [p for p, (s, u) in enumerate(entries) if u is None and s > 1]
            if cands:
                p = draw(st.sampled_from(cands))
                e = entries[p][0].bit_length() - 1
                b = draw(st.integers(0, e))
                entries[p : p + 1] = [[2**b, None], [2 ** (e - b), None]]
        elif kind == "merge":
            cands = [
                p
                for p in range(len(entries) - 1)
                if entries[p][1] is None and entries[p + 1][1] is None
            ]
            if cands and len(entries) > 1:
                p = draw(st.sampled_from(cands))
                entries[p : p + 2] = [[entries[p][0] * entries[p + 1][0], None]]
        elif kind == "insert":
            entries.insert(draw(st.integers(0, len(entries))), [1, None])
        else:
            cands = [p for p, (s, u) in enumerate(entries) if u is not None and s == 1]
            if cands:
                entries[draw(st.sampled_from(cands))][1] = None
    h2 = len(entries)
    new_tm = [-1] * len(shape)
    for p, (_, u) in enumerate(entries):
        if u is not None:
            new_tm[u] = h2 - 1 - p
    return list(shape), [s for s, _ in entries], new_tm


@settings(max_examples=200)
@given(sg.layouts(), st.data())
def test_normalized_equal_for_equivalent_rewrites(t, data):
    u = data.draw(equivalent_rewrites(t))
    assert sim.element_sets(sim.shards(u)) == sim.element_sets(sim.shards(t))  # sanity
    a, b = sg.to_layout(t), sg.to_layout(u)
    assert a.normalized() == b.normalized(), (t, u)


@settings(max_examples=200)
@given(sg.layouts())
def test_normalized_preserves_elements(t):
    a = sg.to_layout(t)
    n = a.normalized()
    assert n.num_devices == a.num_devices
    assert prod(n.shape) == prod(a.shape)
    if a.num_devices > 1:
        assert 1 not in n.device_matrix, n
    assert sim.element_sets(sim.shards(n)) == sim.element_sets(sim.shards(a))
    assert n.normalized() == n


def test_normalized_merges_one_dim_written_two_ways():
    """[32] split 16 ways and [4, 8] split 4 and 4 ways are the same blocks (issue 12)."""
    a = taps.Layout([64, 32, 16], [16], [-1, 0, -1])
    b = taps.Layout([64, 4, 8, 16], [4, 4], [-1, 1, 0, -1])
    assert sim.element_sets(sim.shards(a)) == sim.element_sets(sim.shards(b))
    assert a.normalized() == b.normalized() == taps.Layout([64, 16, 32], [16], [-1, 0, -1])


@settings(max_examples=300)
@given(sg.layout_pairs())
def test_normalized_equal_iff_same_elements_across_reshapes(pair):
    """Any two shapes of one element count, read row-major: equal canonical forms iff every rank
    holds the same flat elements."""
    ta, tb = pair
    same = sim.element_sets(sim.shards(ta)) == sim.element_sets(sim.shards(tb))
    a, b = sg.to_layout(ta), sg.to_layout(tb)
    assert (a.normalized() == b.normalized()) == same, (ta, tb)


@settings(max_examples=300)
@given(sg.layout_pairs(reshape=False))
def test_normalized_equal_iff_same_elements(pair):
    ta, tb = pair
    same = sim.element_sets(sim.shards(ta)) == sim.element_sets(sim.shards(tb))
    a, b = sg.to_layout(ta), sg.to_layout(tb)
    assert (a.normalized() == b.normalized()) == same, (ta, tb)


# --------------------------------------------------------------------------- compacted()


@settings(max_examples=200)
@given(sg.layouts(), st.data())
def test_compacted_equal_for_equivalent_rewrites_and_keeps_the_dims(t, data):
    """Rewrites of the device matrix alone give one compacted form, which holds the same elements
    on every rank, keeps the tensor's dims (but size-1 ones) and is its own compacted form."""
    u = data.draw(equivalent_rewrites(t))
    a, b = sg.to_layout(t), sg.to_layout(u)
    c = a.compacted()
    assert c == b.compacted(), (t, u)
    assert c.shape == [s for s in a.shape if s > 1]
    assert sim.element_sets(sim.shards(c)) == sim.element_sets(sim.shards(a))
    assert c.compacted() == c


@settings(max_examples=200)
@given(sg.layout_pairs(log2=3), st.sampled_from([(1, 8), (2, 4), (8, 1)]))
def test_algorithm_1_costs_the_same_from_and_to_compacted_forms(pair, shape):
    """What the search relies on when it prices one layout of each compacted form: Algorithm 1's
    plan between the compacted forms costs what the plan between the layouts does."""
    a, b = (sg.to_layout(t) for t in pair)
    cluster = taps.Cluster(*shape)
    for model in ("topology", "volume"):
        want = taps.plan_redistribution(a, b).cost(cluster, model=model)
        got = taps.plan_redistribution(a.compacted(), b.compacted()).cost(cluster, model=model)
        assert got == pytest.approx(want, rel=1e-12, abs=0), (pair, model)


def test_compacted_keeps_what_normalized_merges():
    a = taps.Layout([64, 4, 8, 16], [4, 4], [-1, 1, 0, -1])
    assert a.compacted() == taps.Layout([64, 4, 8, 16], [4, 4], [-1, 1, 0, -1])
    assert a.normalized() == taps.Layout([64, 16, 32], [16], [-1, 0, -1])
    p = taps.Layout([8], [2, 2, 2], [-1], partial=[0, 1])
    assert p.compacted().partial == [0, 1]  # Algorithm 1 all-reduces them one at a time
    assert p.normalized().partial == [0]
