"""taps.unify: the paper's worked example, documented corner cases, and the distribution-preserving
property on random layout pairs (checked with the replay simulator's element sets)."""

from math import prod

import pytest
from hypothesis import given, settings

import sim
import strategies_gen as sg
import taps


def _sets(layout):
    return sim.element_sets(sim.shards(layout))


def _check_unified(a, b, ua, ub):
    """``ua``/``ub`` are a valid unification of ``a``/``b``."""
    assert ua.device_matrix == ub.device_matrix
    assert ua.shape == ub.shape
    assert prod(ua.device_matrix) == prod(a.device_matrix)
    assert prod(ua.shape) == prod(a.shape)
    if prod(a.device_matrix) > 1:
        assert 1 not in ua.device_matrix, ua.device_matrix
    # boundaries between adjacent device dims that neither map uses are dropped
    h = len(ua.device_matrix)
    unused = [k not in ua.tensor_map and k not in ub.tensor_map for k in range(h)]
    assert not any(unused[k] and unused[k + 1] for k in range(h - 1)), (ua, ub)
    # every rank holds exactly the same elements as before (flat row-major index)
    assert _sets(ua) == _sets(a)
    assert _sets(ub) == _sets(b)
    # the results are genuine, valid layouts
    assert taps.Layout(ua.shape, ua.device_matrix, ua.tensor_map) == ua
    assert taps.Layout(ub.shape, ub.device_matrix, ub.tensor_map) == ub


@pytest.mark.parametrize(("s0", "s1"), [(16, 32), (8, 8), (24, 8), (8, 40)])
def test_paper_example(s0, s1):
    a = taps.Layout([s0, s1], [2, 8], [1, 0])
    b = taps.Layout([s0, s1], [8, 2], [1, 0])
    ua, ub = taps.unify(a, b)
    assert ua.device_matrix == [2, 4, 2]
    assert ub.device_matrix == [2, 4, 2]
    assert ua.shape == [2, s0 // 2, 4, s1 // 4]
    assert ub.shape == [2, s0 // 2, 4, s1 // 4]
    assert ua.tensor_map == [2, -1, 1, 0]
    assert ub.tensor_map == [2, 1, 0, -1]
    _check_unified(a, b, ua, ub)


def test_identical_layouts_unify_to_themselves():
    a = taps.Layout([8, 4, 6], [2, 4], [0, 1, -1])
    ua, ub = taps.unify(a, a)
    assert ua == a
    assert ub == a


def test_size_one_device_dims_are_dropped():
    a = taps.Layout([8, 4], [1, 4, 1], [1, -1])
    b = taps.Layout([8, 4], [4], [-1, 0])
    ua, ub = taps.unify(a, b)
    assert ua.device_matrix == [4]
    assert ua.tensor_map == [0, -1]
    assert ub.tensor_map == [-1, 0]
    _check_unified(a, b, ua, ub)


def test_reshape_flatten():
    # [b, c, h, w] -> [b, c*h*w], both split along the batch dim
    a = taps.Layout([4, 3, 2, 2], [4], [0, -1, -1, -1])
    b = taps.Layout([4, 12], [4], [0, -1])
    ua, ub = taps.unify(a, b)
    _check_unified(a, b, ua, ub)
    assert ua.tensor_map == ub.tensor_map


@pytest.mark.parametrize(
    ("a", "b"),
    [
        # docs/core.md: [6, 16] split 16 ways along dim 1 against [96] split 16 ways
        (([6, 16], [16], [-1, 0]), ([96], [16], [0])),
        # [6, 8] split along dim 1 against [48] split 16 ways
        (([6, 8], [2, 8], [-1, 0]), ([48], [16], [0])),
    ],
)
def test_doc_unify_error_example(a, b):
    a, b = taps.Layout(*a), taps.Layout(*b)
    with pytest.raises(taps.UnifyError) as info:
        taps.unify(a, b)
    assert isinstance(info.value, taps.LayoutError)
    assert isinstance(info.value, ValueError)
    with pytest.raises(taps.UnifyError):
        taps.unify(b, a)


def test_doc_merge_example():
    a = taps.Layout([6, 4], [2], [-1, -1])
    b = taps.Layout([4, 6], [2], [-1, -1])
    ua, ub = taps.unify(a, b)
    # docs/core.md: both replicated, they unify to [4, 6] (the source merged to [24], then cut).
    assert ua.shape == ub.shape == [4, 6]
    assert ua.tensor_map == ub.tensor_map == [-1, -1]
    _check_unified(a, b, ua, ub)


def test_cut_then_merge():
    """[6, 4] and [4, 6], both split in two along dim 0: rank 0 holds elements 0..11 in both, so
    the distributions are identical. Cutting 6 = 2 * 3 (the split goes to the 2) and merging the
    unsplit [3, 4] lines the shapes up as [2, 12]."""
    a = taps.Layout([6, 4], [2], [0, -1])
    b = taps.Layout([4, 6], [2], [0, -1])
    assert _sets(a) == _sets(b)
    ua, ub = taps.unify(a, b)
    _check_unified(a, b, ua, ub)
    assert ua.tensor_map == ub.tensor_map


def test_mismatched_counts_raise():
    with pytest.raises(taps.LayoutError):
        taps.unify(taps.Layout([8, 4], [4], [0, -1]), taps.Layout([8, 8], [4], [0, -1]))
    with pytest.raises(taps.TapsError):
        taps.unify(taps.Layout([8, 4], [4], [0, -1]), taps.Layout([8, 4], [8], [0, -1]))


@settings(max_examples=300)
@given(sg.layout_pairs())
def test_unify_preserves_distribution(pair):
    ta, tb = pair
    a, b = sg.to_layout(ta), sg.to_layout(tb)
    try:
        ua, ub = taps.unify(a, b)
    except taps.UnifyError:
        return
    _check_unified(a, b, ua, ub)
    # unification is a fixpoint: unifying the unified pair changes nothing
    va, vb = taps.unify(ua, ub)
    assert va == ua
    assert vb == ub


@settings(max_examples=200)
@given(sg.layout_pairs(atoms=sg.POW2_ATOMS))
def test_unify_never_fails_on_powers_of_two(pair):
    ta, tb = pair
    a, b = sg.to_layout(ta), sg.to_layout(tb)
    ua, ub = taps.unify(a, b)
    _check_unified(a, b, ua, ub)


@settings(max_examples=100)
@given(sg.layout_pairs(reshape=False))
def test_unify_same_shape_never_fails(pair):
    """Same shape, power-of-two device matrices: a split along d divides the dim, so the shape can
    always be cut to match any refinement of d."""
    ta, tb = pair
    a, b = sg.to_layout(ta), sg.to_layout(tb)
    ua, ub = taps.unify(a, b)
    _check_unified(a, b, ua, ub)
