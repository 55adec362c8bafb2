"""The core's min-plus kernel (taps._core.min_plus, used by the series reductions) against numpy's
broadcast-and-reduce over the same sums: the least sum, and with two objectives the same choice
among ties of the first (within its relative tolerance), infinities and NaNs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import taps
from taps import _core
from taps.solve import reductions


def numpy_min_plus(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The product as one broadcast: every sum ``x[a, k] + y[k, b]``, reduced over ``k`` by numpy
    (``min`` for one objective, the reductions' lexicographic ``_lex_min`` for two)."""
    sums = x[:, :, None] + y[None]
    if x.shape[-1] == 1:
        return sums.min(axis=1)
    return reductions._lex_min(sums, axis=1)


# Few distinct values, so that ties are common; values a relative 1e-13 apart, tied within the
# tolerance but not equal; infinities of both signs; NaN.
VALUES = st.sampled_from([0.0, 1.0, 1.0 + 1e-13, 2.0, 3.5, -1.0, np.inf, -np.inf, np.nan])


@st.composite
def operands(draw, objectives: int, nan: bool) -> tuple[np.ndarray, np.ndarray]:
    rows, inner, cols = (draw(st.integers(lo, 6)) for lo in (0, 1, 0))
    elements = VALUES if nan else VALUES.filter(lambda v: not np.isnan(v))
    x = draw(hnp.arrays(np.float64, (rows, inner, objectives), elements=elements))
    y = draw(hnp.arrays(np.float64, (inner, cols, objectives), elements=elements))
    return x, y


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
@given(st.integers(1, 2).flatmap(lambda k: operands(k, nan=True)))
def test_equals_numpy_with_ties_infinities_and_nans(xy: tuple[np.ndarray, np.ndarray]) -> None:
    x, y = xy
    np.testing.assert_array_equal(_core.min_plus(x, y, reductions._TIE), numpy_min_plus(x, y))


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
@given(st.integers(1, 2).flatmap(lambda k: operands(k, nan=False)), st.data())
def test_reductions_product_equals_numpy(xy: tuple[np.ndarray, np.ndarray], data) -> None:
    """What the reductions call, on views the kernel must copy to contiguous arrays first, with a
    shift of ``x``'s columns (the kernel adds it as it packs ``x``; numpy adds it first)."""
    x, y = xy
    shift = data.draw(hnp.arrays(np.float64, x.shape[1:], elements=VALUES))
    want = numpy_min_plus(x + shift[None], y)
    xt = np.asfortranarray(x)
    got = reductions._min_plus(xt, shift, y, reductions.Products())
    np.testing.assert_array_equal(got, want)
    if x.shape[-1] == 1:
        got = reductions.min_plus_one(x[..., 0].T.copy().T, y[..., 0])
        np.testing.assert_array_equal(got, numpy_min_plus(x, y)[..., 0])
        got = reductions.min_plus_one(x[..., 0].T.copy().T, y[..., 0], shift[:, 0])
        np.testing.assert_array_equal(got, want[..., 0])


def test_tie_within_tolerance_goes_to_the_second_objective() -> None:
    # k = 0: first 1.0 + 1e-13, second 5; k = 1: first 1.0, second 7. The first objectives tie
    # within the tolerance, so the second decides: k = 0, though its first objective is larger.
    x = np.array([[[1.0 + 1e-13, 5.0], [1.0, 7.0]]])
    y = np.zeros((2, 1, 2))
    np.testing.assert_array_equal(_core.min_plus(x, y, 1e-12), [[[1.0 + 1e-13, 5.0]]])
    np.testing.assert_array_equal(_core.min_plus(x, y, 0.0), [[[1.0, 7.0]]])


def test_large_blocks_equal_numpy() -> None:
    """Sizes past one block of rows of the kernel, so that the jobs split the rows."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 50, size=(300, 40, 1)).astype(np.float64)
    y = rng.integers(0, 50, size=(40, 200, 1)).astype(np.float64)
    x[x == 7] = np.inf
    np.testing.assert_array_equal(_core.min_plus(x, y, 0.0), numpy_min_plus(x, y))


@pytest.mark.parametrize(
    ("xshape", "yshape"),
    [
        ((2, 3, 1), (4, 2, 1)),
        ((2, 3, 1), (3, 2, 2)),
        ((2, 0, 1), (0, 2, 1)),
        ((2, 3, 0), (3, 2, 0)),
    ],
)
def test_shapes_that_do_not_fit_are_a_taps_error(
    xshape: tuple[int, ...], yshape: tuple[int, ...]
) -> None:
    with pytest.raises(taps.TapsError, match="min-plus product"):
        _core.min_plus(np.zeros(xshape), np.zeros(yshape), 0.0)


def _in_turn(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``min_k x[a, k] + y[k, b]``, the sums in turn, each taken if less or NaN (numpy's
    ``minimum``, whose choice between equal zeros of two signs depends on its loop: here the
    earlier one stays)."""
    out = x[:, :1] + y[:1]
    for k in range(1, x.shape[1]):
        term = x[:, k : k + 1] + y[k : k + 1]
        out = np.where((term < out) | np.isnan(term), term, out)
    return out


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("nan", [False, True])
def test_one_objective_in_any_layout_equals_numpy_to_the_bit(nan: bool) -> None:
    """Shapes past the kernel's tiles (4 x 4) and passes (256 inner choices), zeros of both signs,
    infinities (and NaN sums), read in C order, Fortran order, sliced (copied) and reversed."""
    rng = np.random.default_rng(int(nan))
    values = np.array([0.0, -0.0, 1.0, 2.0, 3.0, np.inf] + ([np.nan, -np.inf] if nan else []))
    x = rng.choice(values, size=(9, 300))
    y = rng.choice(values, size=(300, 7))
    want = _in_turn(x, y).view(np.uint64)
    for xs, ys in [
        (x, y),
        (np.asfortranarray(x), np.asfortranarray(y)),
        (np.repeat(x, 2, axis=1)[:, ::2], y[::-1][::-1]),
        (x[::-1].copy()[::-1], y[:, ::-1].copy()[:, ::-1]),
    ]:
        np.testing.assert_array_equal(_core.min_plus_one(xs, ys).view(np.uint64), want)


def test_one_objective_refuses_inner_sizes_that_differ() -> None:
    with pytest.raises(taps.TapsError):
        _core.min_plus_one(np.zeros((2, 3)), np.zeros((4, 2)))
    with pytest.raises(taps.TapsError):
        _core.min_plus_one(np.zeros((2, 0)), np.zeros((0, 2)))


def test_products_are_computed_once_per_pair_of_values() -> None:
    """The memo of one-objective products (repeated layers' equal operands): equal values in other
    arrays, in another layout too, give the first result itself; a value one bit apart in either
    operand, or an operand of another layout, gives its own product, numpy's."""
    rng = np.random.default_rng(7)
    # Work (rows x inner x columns) far above MEMO_RATIO times the entries: remembered.
    x, y = rng.random((300, 60)), rng.random((60, 300))
    products = reductions.Products()
    first = products(x, y)
    np.testing.assert_array_equal(first, numpy_min_plus(x[..., None], y[..., None])[..., 0])
    assert products(x.copy(), y.copy()) is first
    # Shared between steps, so read-only: an in-place write would change another step's result.
    assert not first.flags.writeable
    assert products(np.asfortranarray(x).T.T, y.copy()) is not first  # another layout: own key
    for changed in (x.copy(), y.copy()):
        changed[3, 5] = np.nextafter(changed[3, 5], 2.0)
        xs, ys = (changed, y) if changed.shape == x.shape else (x, changed)
        got = products(xs, ys)
        assert got is not first
        np.testing.assert_array_equal(got, numpy_min_plus(xs[..., None], ys[..., None])[..., 0])
    # A transposed view (as variable elimination passes) is keyed by its values in its order.
    xt = np.ascontiguousarray(x.T)
    assert products(xt.T, y) is products(np.ascontiguousarray(x.T).T, y.copy())


def test_small_products_are_not_remembered() -> None:
    """Below MEMO_RATIO times the entries' work the product is computed, not hashed."""
    x, y = np.ones((2, 3)), np.ones((3, 2))
    products = reductions.Products()
    assert products(x, y) is not products(x, y)


@given(
    hnp.arrays(np.float64, (4, 3), elements=st.sampled_from([0.0, -0.0, 1.0, 2.0, np.nan])),
    hnp.arrays(np.float64, (3, 5), elements=st.sampled_from([0.0, -0.0, 1.0, 2.0, np.nan])),
    hnp.arrays(np.float64, 3, elements=st.sampled_from([0.0, -0.0, 1.0, np.inf])),
    st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3), st.integers(0, 2)), max_size=6),
)
def test_products_found_by_fingerprint_are_those_of_equal_operands(x, y, shift, changes):
    """Every product met in a round, with every fingerprint equal (so that only the check of
    the values tells operands apart), is the kernel's product of its own operands to the bit:
    taken only for operands equal to the bit (-0.0 is not 0.0, NaN is NaN), else computed."""
    products = reductions.Products()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reductions, "MEMO_RATIO", 0)
        patch.setattr(reductions, "_fingerprint", lambda a: a.shape)
        for which, i, j in changes:
            x, y, shift = x.copy(), y.copy(), shift.copy()
            changed = (x, y, shift)[which]
            changed[(i % changed.shape[0], j % changed.shape[-1])[: changed.ndim]] = -0.0
            for s in (shift, None):
                got = products(x, y, s)
                want = reductions.min_plus_one(x, y, s)
                assert got.tobytes() == want.tobytes()


def test_next_round_keys_the_products_by_the_operands_then():
    """The round's products are kept by their operands' values when ``next_round`` is called:
    an operand changed in place afterwards (the optimal search's rounds settle pair costs in
    place) does not take the product of its old values, whatever the fingerprints."""
    x, y = np.arange(12.0).reshape(3, 4), np.arange(20.0).reshape(4, 5)
    products = reductions.Products()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reductions, "MEMO_RATIO", 0)
        patch.setattr(reductions, "_fingerprint", lambda a: a.shape)
        first = products(x, y)
        products.next_round()
        assert products(x.copy(), y.copy()) is first
        products.next_round()
        x[1, 2] = -5.0
        got = products(x, y)
    assert got is not first
    np.testing.assert_array_equal(got, reductions.min_plus_one(x, y))
