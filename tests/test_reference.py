"""The Rust cost kernels against the plain-Python reference (tests/reference.py), entry by entry,
and the reference itself against the paper's worked examples and the brute-force ct of oracle.py."""

from __future__ import annotations

import itertools
from math import prod

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import oracle
import reference as ref
import strategies_gen as sg
import taps
from taps._core import allreduce_costs
from taps.reproduce.cases import paper_cluster

MODELS = ("topology", "volume")


def _cluster(n: int, data) -> tuple[taps.Cluster, tuple[int, int, float, float]]:
    per_node = data.draw(st.sampled_from([2**e for e in range(n.bit_length())]))
    intra, inter = data.draw(st.sampled_from([(60e9, 6e9), (100e9, 12.5e9)]))
    # The reference prices the paper's model: shared replicas, no latency.
    return paper_cluster(n // per_node, per_node, intra, inter), (
        n // per_node,
        per_node,
        intra,
        inter,
    )


def _assert_matrices_equal(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    for (i, j), w in np.ndenumerate(want):
        assert got[i, j] == pytest.approx(w, rel=1e-12, abs=1e-300), (i, j)


@settings(max_examples=150)
@given(st.integers(0, 6), st.data())
def test_cost_matrix_equals_reference(log2, data):
    sources, targets = data.draw(sg.layout_sets(log2, max_count=4))
    cluster, params = _cluster(2**log2, data)
    dtype_bytes = data.draw(st.sampled_from([1, 2, 4]))
    srcs, tgts = [sg.to_layout(t) for t in sources], [sg.to_layout(t) for t in targets]
    for model in MODELS:
        got = taps.redistribution_costs(srcs, tgts, cluster, dtype_bytes, model)
        want = ref.redistribution_costs(sources, targets, params, dtype_bytes, model)
        _assert_matrices_equal(got, want)


@settings(max_examples=300)
@given(st.one_of(sg.layout_pairs(), sg.dense_pairs()), st.data())
def test_plans_equal_reference(pair, data):
    """Reshapes (including the fallback), dense maps: same ops, volume and cost."""
    a, b = pair
    la, lb = sg.to_layout(a), sg.to_layout(b)
    plan, want = taps.plan_redistribution(la, lb), ref.plan(a, b)
    assert plan.volume == want.volume
    steps = [(o.kind, o.device_dim, o.tensor_dim, o.to_tensor_dim) for o in plan.all_ops]
    assert steps == [(o.kind, o.device_dim, o.tensor_dim, o.to_tensor_dim) for o in want.all_ops]
    cluster, params = _cluster(la.num_devices, data)
    for model in MODELS:
        got = taps.redistribution_costs([la], [lb], cluster, 2, model)[0, 0]
        assert got == pytest.approx(ref.plan_cost(want, params, 2, model), rel=1e-12, abs=1e-300)


@settings(max_examples=300)
@given(sg.layout_pairs())
def test_unify_equals_reference(pair):
    a, b = pair
    try:
        ua, ub = taps.unify(sg.to_layout(a), sg.to_layout(b))
    except taps.UnifyError:
        with pytest.raises(ref.UnifyError):
            ref.unify(a, b)
        return
    want = ref.unify(a, b)
    assert [ref.triple((u.shape, u.device_matrix, u.tensor_map)) for u in (ua, ub)] == list(want)


def test_repeated_layouts_share_their_entries():
    """The kernel plans each distinct pair once; the matrix still has every entry."""
    a = ([8, 8], [2, 2], [1, 0])
    b = ([8, 8], [4], [-1, 0])
    c = ([64], [2, 2], [-1])
    sources, targets = [a, b, a, c, b], [b, a, c, b, a]
    cluster = paper_cluster(2, 2)
    for model in MODELS:
        got = taps.redistribution_costs(
            [sg.to_layout(t) for t in sources],
            [sg.to_layout(t) for t in targets],
            cluster,
            2,
            model,
        )
        want = ref.redistribution_costs(sources, targets, (2, 2, 60e9, 6e9), 2, model)
        _assert_matrices_equal(got, want)
        assert np.count_nonzero(want) > 0


@st.composite
def operators(draw):
    """Axis sizes of an operator and tensors over subsets of its axes (-1: a whole dim)."""
    p = draw(st.integers(0, 4))
    sizes = [draw(st.sampled_from([1, 2, 4, 6, 8, 16, 64])) for _ in range(p)]
    tensors = []
    for _ in range(draw(st.integers(0, 4))):
        axes = draw(st.permutations(range(p)))[: draw(st.integers(0, p))]
        axes = [*axes, *([-1] * draw(st.integers(0, 1)))]
        shape = [sizes[a] if a >= 0 else 3 for a in axes]
        tensors.append((axes, shape, float(draw(st.sampled_from([1, 2, 4])))))
    return sizes, tensors


@settings(max_examples=150)
@given(operators(), st.integers(0, 5), st.data())
def test_allreduce_costs_equal_reference(op, log2, data):
    sizes, tensors = op
    strategies = taps.enumerate_strategies(sizes, 2**log2)
    cluster, params = _cluster(2**log2, data)
    degrees = np.array([s.degrees for s in strategies], dtype=np.int64).reshape(
        len(strategies), len(sizes)
    )
    maps = np.array([s.device_map for s in strategies], dtype=np.int64).reshape(degrees.shape)
    for model in MODELS:
        got = allreduce_costs(degrees, maps, tensors, cluster, model)
        assert got.shape == (len(strategies),)
        want = ref.allreduce_costs(degrees.tolist(), maps.tolist(), tensors, params, model)
        for s, w in enumerate(want):
            assert got[s] == pytest.approx(w, rel=1e-12, abs=1e-300), strategies[s]
            layouts = [strategies[s].tensor_layout(a, sh) for a, sh, _ in tensors]
            direct = sum(
                cluster.collective_cost(lay, "all_reduce", None, t[2], model)
                for lay, t in zip(layouts, tensors)
            )
            assert got[s] == direct


def test_allreduce_costs_bad_input_raises_taps_errors():
    cluster = paper_cluster(1, 4)
    deg = np.array([[2, 2]], dtype=np.int64)
    dmap = np.array([[1, 0]], dtype=np.int64)
    x = ([0, 1], [8, 8], 2.0)
    cases = [
        ((deg, dmap[:, :1], [x], cluster), taps.StrategyError),
        ((np.array([[3, 2]], dtype=np.int64), dmap, [x], cluster), taps.StrategyError),
        ((np.array([[-2, 2]], dtype=np.int64), dmap, [x], cluster), taps.StrategyError),
        ((deg, np.array([[0, 0]], dtype=np.int64), [x], cluster), taps.StrategyError),
        ((deg, dmap, [x], paper_cluster(2, 4)), taps.TopologyError),
        ((deg, dmap, [([0, 2], [8, 8], 2.0)], cluster), taps.LayoutError),
        ((deg, dmap, [([0, 1], [3, 8], 2.0)], cluster), taps.LayoutError),
        ((deg, dmap, [([0, 1], [8, -8], 2.0)], cluster), taps.LayoutError),
        ((deg, dmap, [([0, 1], [8, 8], 0.0)], cluster), taps.TopologyError),
        ((deg, dmap, [x], cluster, "bogus"), taps.TopologyError),
        ((deg.astype(np.int32), dmap, [x], cluster), TypeError),
    ]
    for args, err in cases:
        with pytest.raises(err):
            allreduce_costs(*args)


# --- the reference on the paper's examples --------------------------------------------------


def test_reference_paper_unification():
    s0, s1 = 16, 32
    ua, ub = ref.unify(([s0, s1], [2, 8], [1, 0]), ([s0, s1], [8, 2], [1, 0]))
    shape, dm = [2, s0 // 2, 4, s1 // 4], [2, 4, 2]
    assert ua == (shape, dm, [2, -1, 1, 0])
    assert ub == (shape, dm, [2, 1, 0, -1])


def test_reference_paper_redistribution():
    d3, d2, d1, d0 = 2, 4, 2, 8
    shape = [16] * 5
    plan = ref.plan(
        (shape, [d3, d2, d1, d0], [-1, 1, 2, -1, 3]), (shape, [d3, d2, d1, d0], [1, -1, -1, 0, 3])
    )
    steps = [(o.kind, o.device_dim, o.tensor_dim, o.to_tensor_dim) for o in plan.all_ops]
    assert steps == [("slice", 0, 3, None), ("all_to_all", 1, 1, 0), ("all_gather", 2, 2, None)]
    assert plan.volume * d0 * d1 * d1 * d2 * d3 == (d1 * d2 - 1) * prod(shape)


def test_reference_misaligned_reshape():
    a, b = ([6, 16], [16], [-1, 0]), ([96], [16], [0])
    with pytest.raises(ref.UnifyError):
        ref.unify(a, b)
    plan = ref.plan(a, b)
    assert plan.prelude or plan.epilogue
    assert 0 < plan.volume <= 15 * 6


def test_reference_paper_ct():
    """MatMul (d, r, c) = (8, 2, 2) on 32 devices, 8 per node: dW's all_reduce has ct 4, 0, 2."""
    for dm, tm, want in (([8, 2, 2], [1, 0], 4), ([2, 2, 8], [2, 1], 0), ([2, 8, 2], [2, 0], 2)):
        layout = ([64, 64], dm, tm)
        group = [k for k in range(3) if k not in tm]
        assert ref.ct(layout, group, 8) == want


def test_reference_paper_bandwidth():
    """Two 8-device nodes: the 8 groups (0, 8), (1, 9), ... share the inter-node link."""
    layout = ([16, 16], [2, 8], [1, 0])
    plan = ref.plan(layout, ([16, 16], [2, 8], [-1, 0]))
    assert ref.plan_cost(plan, (2, 8, 60e9, 12.5e9)) == pytest.approx(16 * 2 / (12.5e9 / 8))


def test_reference_matmul_volume():
    """docs/conventions.md#intra-operator-communication:
    2((d-1)*in*out + (r-1)*b*out + (c-1)*b*in) / (d*r*c) elements."""
    b, i, o = 64, 32, 16
    tensors = [([0, 2], [b, o], 1.0), ([0, 1], [b, i], 1.0), ([1, 2], [i, o], 1.0)]
    for deg in itertools.product([1, 2, 4, 8], repeat=3):
        if prod(deg) != 8:
            continue
        split = [a for a in range(3) if deg[a] > 1]
        dmap = [-1] * 3
        for k, a in enumerate(split):
            dmap[a] = k
        d, r, c = deg
        want = 2 * ((d - 1) * i * o + (r - 1) * b * o + (c - 1) * b * i) / (d * r * c)
        got = ref.allreduce_costs([list(deg)], [dmap], tensors, (1, 8), "volume")[0]
        assert got == pytest.approx(want, rel=1e-12)


@settings(max_examples=200)
@given(sg.layouts(max_log2_devices=5), st.data())
def test_reference_ct_equals_brute_force(layout, data):
    _, dm, tm = layout
    n = prod(dm)
    per_node = data.draw(st.sampled_from([2**e for e in range(n.bit_length())]))
    unused = [k for k in range(len(dm)) if k not in tm]
    assert ref.ct(layout, unused, per_node) == oracle.inter_node_groups(
        layout, "all_reduce", per_node
    )
    for k in range(len(dm)):
        want = oracle.inter_node_groups(layout, "all_gather", per_node, k)
        assert ref.ct(layout, [k], per_node) == want
