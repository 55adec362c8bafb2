"""taps.enumerate_strategies against the paper's count formula, a brute-force enumeration and the
paper's MatMul table (with the errata of docs/conventions.md)."""

import itertools
from math import comb, factorial, prod

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim
import taps
from taps._core import strategy_arrays, tensor_layouts


def formula(p, n):
    if n == 0:
        return 1
    return sum(factorial(i) * comb(p, i) * comb(n - 1, i - 1) for i in range(1, min(p, n) + 1))


def brute(sizes, num_devices):
    """Every (degrees, device_map, device_matrix), in the documented order."""
    n = num_devices.bit_length() - 1
    assert 2**n == num_devices
    p = len(sizes)
    out = []
    for exps in itertools.product(range(n + 1), repeat=p):
        if sum(exps) != n:
            continue
        degrees = tuple(2**e for e in exps)
        if any(s % d for s, d in zip(sizes, degrees, strict=True)):
            continue
        split = [a for a in range(p) if degrees[a] > 1]
        for perm in itertools.permutations(range(len(split))):
            dmap = [-1] * p
            for a, k in zip(split, perm, strict=True):
                dmap[a] = k
            dm = [0] * len(split)
            for a in split:
                dm[len(split) - 1 - dmap[a]] = degrees[a]
            out.append((degrees, tuple(dmap), tuple(dm)))
    # degrees ascending lexicographically, then device maps descending lexicographically
    out.sort(key=lambda t: (t[0], tuple(-m for m in t[1])))
    return out


def as_tuples(strategies, with_matrix=True):
    out = []
    for s in strategies:
        row = (tuple(s.degrees), tuple(s.device_map))
        if with_matrix:
            row += (tuple(s.device_matrix),)
        out.append(row)
    return out


def test_brute_force_matches_formula():
    for p in range(1, 5):
        for n in range(0, 7):
            assert len(brute([2**n] * p, 2**n)) == formula(p, n), (p, n)


@pytest.mark.parametrize("p", [1, 2, 3, 4])
@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 5, 6])
def test_count_formula(p, n):
    got = taps.enumerate_strategies([2**n * 3] * p, 2**n)
    assert len(got) == formula(p, n)


def test_single_device():
    got = taps.enumerate_strategies([5, 7, 3], 1)
    assert len(got) == 1
    assert list(got[0].degrees) == [1, 1, 1]
    assert list(got[0].device_map) == [-1, -1, -1]
    assert prod(got[0].device_matrix) == 1
    lay = got[0].tensor_layout([0, 2], [5, 3])
    assert lay.num_devices == 1
    assert lay.shard_shape == [5, 3]


@settings(max_examples=150)
@given(
    st.lists(st.integers(1, 48), min_size=1, max_size=4),
    st.integers(0, 6),
)
def test_matches_brute_force(sizes, n):
    got = taps.enumerate_strategies(sizes, 2**n)
    want = brute(sizes, 2**n)
    if n == 0:
        assert as_tuples(got, with_matrix=False) == [w[:2] for w in want]
    else:
        assert as_tuples(got) == want
    for s in got:
        assert type(s.degrees) is list and type(s.device_map) is list
        assert all(type(x) is int for x in [*s.degrees, *s.device_map, *s.device_matrix])
        assert prod(s.degrees) == 2**n


MATMUL = [
    # degrees (b, in, out), device map, device matrix, X shape, W shape, Y shape
    ((1, 1, 4), (-1, -1, 0), (4,), ("b", "in"), ("in", "out/4"), ("b", "out/4")),
    ((1, 2, 2), (-1, 1, 0), (2, 2), ("b", "in/2"), ("in/2", "out/2"), ("b", "out/2")),
    ((1, 2, 2), (-1, 0, 1), (2, 2), ("b", "in/2"), ("in/2", "out/2"), ("b", "out/2")),
    ((1, 4, 1), (-1, 0, -1), (4,), ("b", "in/4"), ("in/4", "out"), ("b", "out")),
    ((2, 1, 2), (1, -1, 0), (2, 2), ("b/2", "in"), ("in", "out/2"), ("b/2", "out/2")),
    ((2, 1, 2), (0, -1, 1), (2, 2), ("b/2", "in"), ("in", "out/2"), ("b/2", "out/2")),
    ((2, 2, 1), (1, 0, -1), (2, 2), ("b/2", "in/2"), ("in/2", "out"), ("b/2", "out")),
    ((2, 2, 1), (0, 1, -1), (2, 2), ("b/2", "in/2"), ("in/2", "out"), ("b/2", "out")),
    ((4, 1, 1), (0, -1, -1), (4,), ("b/4", "in"), ("in", "out"), ("b/4", "out")),
]


def _eval(expr, sizes):
    name, _, div = expr.partition("/")
    return sizes[name] // int(div or 1)


def test_matmul_table():
    sizes = {"b": 8, "in": 16, "out": 32}
    got = taps.enumerate_strategies([sizes["b"], sizes["in"], sizes["out"]], 4)
    assert as_tuples(got) == [row[:3] for row in MATMUL]
    for s, (_, _, _, xs, ws, ys) in zip(got, MATMUL, strict=True):
        x = s.tensor_layout([0, 1], [sizes["b"], sizes["in"]])
        w = s.tensor_layout([1, 2], [sizes["in"], sizes["out"]])
        y = s.tensor_layout([0, 2], [sizes["b"], sizes["out"]])
        assert x.shard_shape == [_eval(e, sizes) for e in xs]
        assert w.shard_shape == [_eval(e, sizes) for e in ws]
        assert y.shard_shape == [_eval(e, sizes) for e in ys]
        for lay, axes in ((x, [0, 1]), (w, [1, 2]), (y, [0, 2])):
            assert lay.device_matrix == list(s.device_matrix)
            assert lay.tensor_map == [s.device_map[a] for a in axes]
            assert lay.num_devices == 4


def test_indivisible_sizes_are_dropped():
    # b = 2 cannot take degree 4; in = 3 cannot be split at all
    got = taps.enumerate_strategies([2, 3, 8], 4)
    want = [row[:3] for row in MATMUL if row[0][0] <= 2 and row[0][1] == 1]
    assert as_tuples(got) == want


@settings(max_examples=60)
@given(st.lists(st.integers(1, 16), min_size=1, max_size=4), st.integers(1, 5), st.data())
def test_tensor_layout_shards(sizes, n, data):
    got = taps.enumerate_strategies(sizes, 2**n)
    if not got:
        return
    s = data.draw(st.sampled_from(got))
    axes = data.draw(st.permutations(range(len(sizes))))
    axes = axes[: data.draw(st.integers(1, len(sizes)))]
    shape = [sizes[a] for a in axes]
    lay = s.tensor_layout(list(axes), shape)
    assert lay.shape == shape
    assert lay.device_matrix == list(s.device_matrix)
    assert lay.tensor_map == [s.device_map[a] for a in axes]
    assert lay.shard_shape == [sizes[a] // s.degrees[a] for a in axes]
    # the device matrix is the split degrees, ordered by device dim, outermost first
    dm = s.device_matrix
    for a, k in enumerate(s.device_map):
        if k >= 0:
            assert sim.dev_size(dm, k) == s.degrees[a]


@settings(max_examples=60)
@given(
    st.lists(st.integers(1, 16), min_size=1, max_size=4),
    st.integers(0, 5),
    st.booleans(),
    st.data(),
)
def test_tensor_layouts_match_one_by_one(sizes, n, replicas, data):
    """The batch call against Strategy.tensor_layout per strategy, whole dims (-1) included."""
    found = taps.enumerate_strategies(sizes, 2**n, replicas)
    axes = data.draw(st.lists(st.integers(-1, len(sizes) - 1), min_size=1, max_size=5, unique=True))
    shape = [sizes[a] if a >= 0 else data.draw(st.integers(1, 9)) for a in axes]
    assert tensor_layouts(found, axes, shape) == [s.tensor_layout(axes, shape) for s in found]


@settings(max_examples=60)
@given(st.lists(st.integers(1, 16), max_size=4), st.integers(0, 5), st.booleans())
def test_strategy_arrays_are_each_strategys_lists(sizes, n, replicas):
    """The batch call's rows against each strategy's ``degrees`` and ``device_map``."""
    found = taps.enumerate_strategies(sizes, 2**n, replicas)
    degrees, maps = strategy_arrays(found)
    assert degrees.dtype == maps.dtype == np.int64
    assert degrees.shape == maps.shape == (len(found), len(sizes) if found else 0)
    assert degrees.tolist() == [s.degrees for s in found]
    assert maps.tolist() == [s.device_map for s in found]


def test_strategy_arrays_refuse_mixed_axis_counts():
    mixed = taps.enumerate_strategies([8, 4], 4)[:1] + taps.enumerate_strategies([8], 4)
    with pytest.raises(taps.StrategyError):
        strategy_arrays(mixed)
    assert [a.shape for a in strategy_arrays([])] == [(0, 0), (0, 0)]


def test_tensor_layouts_bad_input():
    found = taps.enumerate_strategies([8, 4], 4)
    with pytest.raises(taps.LayoutError):
        tensor_layouts(found, [0, 1], [8, 0])
    assert tensor_layouts([], [0], [8]) == []


def test_deterministic_and_frozen():
    a = taps.enumerate_strategies([8, 16, 32, 4], 16)
    b = taps.enumerate_strategies([8, 16, 32, 4], 16)
    assert as_tuples(a) == as_tuples(b)
    with pytest.raises((AttributeError, TypeError)):
        a[0].degrees = [1, 1, 1, 16]
    a[0].degrees.append(99)
    assert list(a[0].degrees) == list(b[0].degrees)


@pytest.mark.parametrize("num_devices", [3, 6, 12, 0, -4])
def test_non_power_of_two_devices(num_devices):
    with pytest.raises(taps.StrategyError) as info:
        taps.enumerate_strategies([8, 8], num_devices)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("sizes", [[8, 0], [-2, 4], [0]])
def test_bad_axis_sizes(sizes):
    with pytest.raises(taps.StrategyError):
        taps.enumerate_strategies(sizes, 4)


def test_strategy_pickle_and_equality():
    import pickle

    got = taps.enumerate_strategies([8, 16, 32], 4)
    back = pickle.loads(pickle.dumps(got))
    assert back == got
    assert as_tuples(back) == as_tuples(got)
    assert len(set(got)) == len(got)
