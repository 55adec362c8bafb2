"""taps.redistribution_costs: the batch matrix agrees entry by entry with the single plans, and
bad input raises a taps error (never a Rust panic)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import strategies_gen as sg
import taps
from taps.reproduce.cases import paper_cluster


def _not_a_panic(exc):
    names = {cls.__name__ for cls in type(exc).__mro__}
    assert "PanicException" not in names, repr(exc)


@settings(max_examples=80)
@given(st.integers(0, 6), st.data())
def test_matrix_matches_single_plans(log2, data):
    sources, targets = data.draw(sg.layout_sets(log2))
    srcs = [sg.to_layout(t) for t in sources]
    tgts = [sg.to_layout(t) for t in targets]
    n = 2**log2
    L = data.draw(st.sampled_from([2**e for e in range(log2 + 1)]))
    cl = paper_cluster(n // L, L)
    dtype_bytes = data.draw(st.sampled_from([1, 2, 4]))
    for model in ("topology", "volume"):
        got = taps.redistribution_costs(srcs, tgts, cl, dtype_bytes, model)
        assert isinstance(got, np.ndarray)
        assert got.dtype == np.float64
        assert got.shape == (len(srcs), len(tgts))
        for i, a in enumerate(srcs):
            for j, b in enumerate(tgts):
                want = taps.plan_redistribution(a, b).cost(cl, dtype_bytes, model)
                assert got[i, j] == pytest.approx(want, rel=1e-12, abs=1e-300), (i, j, model)
        kw = taps.redistribution_costs(srcs, tgts, cl, dtype_bytes=dtype_bytes, model=model)
        assert np.array_equal(kw, got)


def test_defaults_and_known_values():
    a = taps.Layout([8, 8], [4], [0, -1])
    b = taps.Layout([8, 8], [4], [-1, 0])
    c = taps.Layout([8, 8], [4], [-1, -1])
    cl = paper_cluster(2, 2)
    got = taps.redistribution_costs([a, c], [a, b, c], cl, model="volume")
    # a->a: 0; a->b: all_to_all 3/4*16; a->c: gather 3*16; c->a, c->b: slices; c->c: 0
    want = np.array([[0, 12, 48], [0, 0, 0]], dtype=np.float64) * 2
    assert np.array_equal(got, want)
    topo = taps.redistribution_costs([a, c], [a, b, c], cl)
    for i, s in enumerate([a, c]):
        for j, t in enumerate([a, b, c]):
            assert topo[i, j] == pytest.approx(taps.plan_redistribution(s, t).cost(cl), rel=1e-12)


def test_empty_inputs():
    a = taps.Layout([8], [4], [0])
    cl = paper_cluster(1, 4)
    assert taps.redistribution_costs([], [a], cl).shape == (0, 1)
    assert taps.redistribution_costs([a], [], cl).shape == (1, 0)


def test_bad_inputs_raise_taps_errors():
    cl = paper_cluster(2, 2)
    a = taps.Layout([8, 8], [4], [0, -1])
    wrong_devices = taps.Layout([8, 8], [8], [0, -1])
    wrong_size = taps.Layout([8, 4], [4], [0, -1])
    wrong_replicated = taps.Layout([8, 8], [8], [-1, -1])
    # a pair on different device counts is both a layout and a topology mismatch: either is fine
    either = (taps.TopologyError, taps.LayoutError)
    cases = [
        (([a], [wrong_devices], cl), {}, either),
        (([wrong_devices], [a], cl), {}, either),
        (([wrong_devices], [wrong_devices], cl), {}, taps.TopologyError),
        (([wrong_devices], [wrong_replicated], cl), {}, taps.TopologyError),
        (([wrong_replicated], [wrong_devices], cl), {}, taps.TopologyError),
        (([a], [wrong_size], cl), {}, taps.LayoutError),
        (([a], [a], cl), {"model": "bogus"}, taps.TopologyError),
    ]
    for args, kwargs, err in cases:
        try:
            taps.redistribution_costs(*args, **kwargs)
        except BaseException as exc:
            _not_a_panic(exc)
            assert isinstance(exc, err), repr(exc)
        else:
            raise AssertionError(f"no error for {args} {kwargs}")


def test_non_layouts_do_not_panic():
    cl = paper_cluster(2, 2)
    a = taps.Layout([8, 8], [4], [0, -1])
    for args in (([a], [42], cl), ([a], [a], "cluster"), (a, [a], cl)):
        try:
            taps.redistribution_costs(*args)
        except BaseException as exc:
            _not_a_panic(exc)
            assert isinstance(exc, TypeError | ValueError), repr(exc)
        else:
            raise AssertionError(f"no error for {args}")


@settings(max_examples=40)
@given(sg.layout_pairs(max_log2_devices=4))
def test_mismatched_plans_never_panic(pair):
    """Whatever two layouts, planning either works or raises a taps error."""
    ta, tb = pair
    a, b = sg.to_layout(ta), sg.to_layout(tb)
    bad = taps.Layout([prod_plus(ta[0])], [1], [-1])
    cl = paper_cluster(1, a.num_devices)
    for s, t in ((a, b), (a, bad), (bad, b)):
        try:
            taps.redistribution_costs([s], [t], cl)
        except BaseException as exc:
            _not_a_panic(exc)
            assert isinstance(exc, taps.TapsError), repr(exc)


def prod_plus(shape):
    return int(np.prod(shape)) + 1


@pytest.mark.parametrize("num_devices", [8, 16])
def test_matmul_strategy_matrix(num_devices):
    """A realistic batch: every MatMul strategy's output Y against every strategy's input X."""
    b, i, o = 32, 64, 32
    strategies = taps.enumerate_strategies([b, i, o], num_devices)
    ys = [s.tensor_layout([0, 2], [b, o]) for s in strategies]
    # the next MatMul's X has shape (b, o): its in-axis is this one's out-axis
    xs = [s.tensor_layout([0, 1], [b, o]) for s in strategies]
    cl = paper_cluster(num_devices // 4, 4)
    got = taps.redistribution_costs(ys, xs, cl)
    assert got.shape == (len(ys), len(xs))
    assert np.all(got >= 0)
    for r, y in enumerate(ys):
        for c, x in enumerate(xs):
            assert got[r, c] == pytest.approx(
                taps.plan_redistribution(y, x).cost(cl), rel=1e-12, abs=1e-300
            )
    # a layout to itself costs nothing
    same = taps.redistribution_costs(ys, ys, cl)
    assert np.all(np.diag(same) == 0)


@st.composite
def _high_rank_sets(draw, log2: int):
    """Sources and targets of one tensor of up to 6 dims on ``2**log2`` devices (many device dims
    and many unification cuts), a source among the targets so that equal pairs occur too."""
    base = draw(sg.atom_lists((2, 4, 2, 8, 2, 3, 4), max_atoms=11))

    def one():
        shape = draw(sg.groupings(base, max_rank=6))
        dm = draw(sg.device_matrices(log2))
        return shape, dm, draw(sg.tensor_maps(shape, dm))

    sources = [one() for _ in range(draw(st.integers(1, 4)))]
    targets = [one() for _ in range(draw(st.integers(0, 3)))]
    return sources, [*targets, sources[0]]


@settings(max_examples=60, deadline=None)
@given(st.integers(3, 10), st.data())
def test_high_rank_pairs_equal_the_reference(log2, data):
    """The paper path's kernel on high-rank pairs against the plain-Python reference
    (tests/reference.py), which shares none of its unification or planning code."""
    import reference as ref

    sources, targets = data.draw(_high_rank_sets(log2))
    per_node = data.draw(st.sampled_from([2**e for e in range(log2 + 1)]))
    cluster = paper_cluster(2**log2 // per_node, per_node)
    params = (2**log2 // per_node, per_node, cluster.intra_bandwidth, cluster.inter_bandwidth)
    srcs, tgts = [sg.to_layout(t) for t in sources], [sg.to_layout(t) for t in targets]
    for model in ("topology", "volume"):
        got = taps.redistribution_costs(srcs, tgts, cluster, 2, model)
        want = ref.redistribution_costs(sources, targets, params, 2, model)
        for (i, j), w in np.ndenumerate(want):
            assert got[i, j] == pytest.approx(w, rel=1e-12, abs=1e-300), (i, j, model)
        assert got[0, -1] == 0.0


def _distributions(shape: list[int], devices: int) -> list[taps.Layout]:
    """The distinct distributions of a tensor of ``shape`` over every strategy on ``devices``."""
    axes = list(range(len(shape)))
    layouts = (
        s.tensor_layout(axes, shape).normalized() for s in taps.enumerate_strategies(shape, devices)
    )
    return list(dict.fromkeys(layouts))


def test_a_batch_stops_when_its_time_limit_runs_out():
    """A batch of 505 x 505 distributions on 64 devices takes far longer than the 10 ms at which
    the kernel first looks at the clock; a limit of 0 stops it there."""
    layouts = _distributions([8, 16, 32, 64], 64)
    assert len(layouts) == 505
    cl = taps.Cluster(8, 8)
    with pytest.raises(
        taps.TimeLimitError,
        match=r"^the time limit ran out while pricing 505 x 505 redistributions$",
    ):
        taps.redistribution_costs(layouts, layouts, cl, time_limit=0.0)
    for bad in (-1.0, float("nan")):
        with pytest.raises(taps.TimeLimitError, match="must be a non-negative number of seconds"):
            taps.redistribution_costs(layouts, layouts, cl, time_limit=bad)


def test_a_watched_batch_equals_its_rows_priced_alone():
    """A batch of more than 4,096 pairs runs on a watched worker thread (under a time limit here);
    each row alone (100 pairs) runs on the calling thread: the same matrix."""
    layouts = _distributions([8, 16, 32, 64], 16)[:100]
    cl = taps.Cluster(2, 8)
    whole = taps.redistribution_costs(layouts, layouts, cl, time_limit=3600.0)
    rows = np.vstack([taps.redistribution_costs([a], layouts, cl) for a in layouts])
    assert whole.shape == (100, 100)
    np.testing.assert_array_equal(whole, rows)
    assert np.count_nonzero(whole) > 9000


@pytest.mark.parametrize(
    ("planner", "model", "count"), [("paper", "topology", 70), ("optimal", "volume", 12)]
)
def test_costs_written_into_out_are_the_returned_matrix(planner, model, count):
    """``out=``: the costs written into a caller's matrix (C order, or a block of rows and
    columns of a wider one; rows wider than a job, narrow ones, repeated layouts) are the matrix
    the kernel returns, bit for bit, and nothing outside the block is written."""
    layouts = _distributions([8, 16, 32, 64], 16)[:count]
    cl = taps.Cluster(2, 8)
    cases = [
        (layouts, layouts),
        (layouts[:3], layouts),
        (layouts, layouts[:2]),
        (layouts[:5] * 2, layouts[7:] + layouts[7:9]),
        ([], layouts),
        (layouts, []),
    ]
    for sources, targets in cases:
        want = taps.redistribution_costs(sources, targets, cl, 4, model, planner)
        out = np.full(want.shape, np.nan)
        assert taps.redistribution_costs(sources, targets, cl, 4, model, planner, out=out) is out
        assert out.tobytes() == want.tobytes()
        wide = np.full((len(sources) + 3, len(targets) + 5), np.nan)
        block = wide[2 : 2 + len(sources), 1 : 1 + len(targets)]
        taps.redistribution_costs(sources, targets, cl, 4, model, planner, out=block)
        assert np.ascontiguousarray(block).tobytes() == want.tobytes()
        block[...] = np.nan
        assert np.isnan(wide).all()


def test_a_bad_out_is_refused():
    """An ``out`` of another dtype, shape or number of dims, one whose rows are not contiguous,
    a read-only one, or no array at all: a one-line TapsError, nothing priced."""
    layouts = _distributions([8, 16], 4)[:3]
    cl = taps.Cluster(1, 4)
    read_only = np.zeros((3, 3))
    read_only.flags.writeable = False
    bad = [
        np.zeros((3, 3), np.float32),
        np.zeros((3, 4)),
        np.zeros(9),
        np.zeros((3, 3)).T,
        np.zeros((3, 6))[:, ::2],
        read_only,
        "costs",
    ]
    for out in bad:
        with pytest.raises(taps.TapsError, match=r"^out[^\n]*$"):
            taps.redistribution_costs(layouts, layouts, cl, out=out)
    assert not read_only.any()


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5), st.data())
def test_odd_counts_unified_by_masks_price_as_the_plans(log2, data):
    """Tensors whose element count has an odd factor (3, 5, 9, 15) in one dim or several: the
    kernel unifies a pair by masks where the odd factor's bits meet (else by cuts), and its cost
    is the single plan's (unified by cuts) bit for bit; the bounds stay under the optimal
    planner's costs (their pairs are lined up by masks as well)."""
    atoms = (2, 4, 2, 8, data.draw(st.sampled_from([3, 5, 9, 15, 6, 12])), 2, 4)
    sources, targets = data.draw(sg.layout_sets(log2, atoms=atoms))
    srcs = [sg.to_layout(t) for t in sources]
    tgts = [sg.to_layout(t) for t in targets]
    L = data.draw(st.sampled_from([2**e for e in range(log2 + 1)]))
    cl = paper_cluster(2**log2 // L, L)
    got = taps.redistribution_costs(srcs, tgts, cl, 2.0)
    for i, a in enumerate(srcs):
        for j, b in enumerate(tgts):
            assert got[i, j] == taps.plan_redistribution(a, b).cost(cl, 2.0), (a, b)
    bounds, exact = taps._core.redistribution_bounds(srcs, tgts, cl, 2.0)
    for i, a in enumerate(srcs):
        for j, b in enumerate(tgts):
            best = taps.plan_redistribution(a, b, cl, "optimal").cost(cl, 2.0)
            assert bounds[i, j] <= best * (1 + 1e-12), (a, b)
            if exact[i, j]:
                assert bounds[i, j] == pytest.approx(best, rel=1e-12), (a, b)
