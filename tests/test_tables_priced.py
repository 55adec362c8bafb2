"""The cost tables' memo of Algorithm 1's matrices (``taps.search.tables._Priced``): every
matrix it returns is the kernel's own for those lists, bit for bit, and an edge whose layouts
overlap an earlier edge's does not have the kernel price their shared pairs again."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import strategies_gen as sg
import taps
from taps._core import redistribution_table_bounds
from taps.search import tables

CLUSTER = taps.Cluster(2, 4)


@st.composite
def pools(draw: Any) -> tuple[list[taps.Layout], list[taps.Layout]]:
    """Distinct layouts of one tensor on the 8 devices of ``CLUSTER``: sources of one shape,
    targets of the same or another grouping of its elements (a view)."""
    atoms = draw(sg.atom_lists(sg.POW2_ATOMS))

    def side() -> list[taps.Layout]:
        shape = draw(sg.groupings(atoms))
        out = {}
        for _ in range(draw(st.integers(2, 10))):
            dm = draw(sg.device_matrices(3))
            layout = taps.Layout(shape, dm, draw(sg.tensor_maps(shape, dm)))
            out[layout] = None
        return list(out)

    return side(), side()


def _counted(monkeypatch: pytest.MonkeyPatch) -> list[tuple[taps.Layout, taps.Layout]]:
    """Every pair the tables' calls of the kernel price, in order."""
    asked: list[tuple[taps.Layout, taps.Layout]] = []
    for name in ("redistribution_costs", "redistribution_table_bounds"):
        kernel = getattr(tables, name)

        def count(s: Any, t: Any, *rest: Any, _kernel: Any = kernel, **kw: Any) -> Any:
            asked.extend((a, b) for a in s for b in t)
            return _kernel(s, t, *rest, **kw)

        monkeypatch.setattr(tables, name, count)
    return asked


@settings(max_examples=40, deadline=None)
@given(pools(), st.data(), st.sampled_from(["paper", "optimal", "bounds"]))
def test_every_matrix_the_kernels_and_shared_pairs_not_priced_again(pool, data, how):
    sources, targets = pool
    planner = "paper" if how == "bounds" else how
    priced = tables._Priced(bounds=how == "bounds")
    lists = []
    with pytest.MonkeyPatch.context() as monkeypatch:
        asked = _counted(monkeypatch)
        for n in range(data.draw(st.integers(1, 4))):
            # Some of each pool, in any order, repeats allowed (an edge's classes list them so).
            s = data.draw(st.lists(st.sampled_from(sources), min_size=1, max_size=12))
            t = data.draw(st.lists(st.sampled_from(targets), min_size=1, max_size=12))
            before = len(asked)
            got = priced(s, t, CLUSTER, 2.0, "topology", planner, None)
            if n == 1:
                # Against one earlier matrix: the pairs it does not hold, each once.
                (s0, t0), now = lists[0], asked[before:]
                assert len(now) == len(set(now))
                assert set(now) == {(a, b) for a in s for b in t} - {(a, b) for a in s0 for b in t0}
            lists.append((s, t))
            if how == "bounds":
                cheap = len(s) * len(t) >= tables.CHEAP_PAIRS
                want, exact, paper = redistribution_table_bounds(
                    s, t, CLUSTER, 2.0, "topology", cheap=cheap
                )
                planes = [
                    tables._gathered([(priced.reader(2.0, k)(s, t), False)]) for k in (1, 2, 3)
                ]
                assert np.array_equal(planes[0], ~exact)
                assert np.array_equal(planes[1], paper)
                assert np.array_equal(planes[2], ~exact & cheap)
            else:
                want = taps.redistribution_costs(s, t, CLUSTER, 2.0, "topology", planner)
            assert (
                tables._gathered([(got, False)]).tobytes() == np.ascontiguousarray(want).tobytes()
            )


def test_lists_sharing_layouts_price_only_the_new_pairs(monkeypatch):
    """Two edges from one producer into two consumers whose inputs share layouts (a linear layer
    into a layernorm and into an add): the second edge prices only the pairs of its new
    layouts."""
    shape = [8, 16]
    layouts = [taps.Layout(shape, [8], m) for m in ([0, -1], [-1, 0], [-1, -1])]
    layouts += [taps.Layout(shape, [2, 4], m) for m in ([0, 1], [1, 0], [-1, 1], [1, -1])]
    sources, first, second = layouts[:4], layouts[2:6], layouts[3:]
    asked = _counted(monkeypatch)
    priced = tables._Priced()
    priced(sources, first, CLUSTER, 2.0, "topology", "paper", None)
    got = priced(sources, second, CLUSTER, 2.0, "topology", "paper", None)
    new = [t for t in second if t not in first]
    assert asked[len(sources) * len(first) :] == [(s, t) for s in sources for t in new]
    want = taps.redistribution_costs(sources, second, CLUSTER, 2.0, "topology", "paper")
    assert tables._gathered([(got, False)]).tobytes() == want.tobytes()


@settings(max_examples=40, deadline=None)
@given(pools(), st.data(), st.sampled_from(["paper", "optimal"]), st.booleans())
def test_edges_costs_are_their_kernel_matrices_summed(pool, data, planner, threaded):
    """Edges' costs (``_edge_costs``: their directions' entries gathered from the memo and summed
    in one pass, some into the memo's matrices in place) are each the kernel's forward matrix
    plus its backward matrix transposed, bit for bit, whatever the memo held before (sets of
    either direction partly priced, in other orders) and whichever edges read one matrix; so
    are they with the memo's matrices filled by another thread (``_alongside``, as the search
    builds its tables)."""
    sources, targets = pool
    how = (CLUSTER, 2.0, "topology", planner)
    before = []
    for _ in range(data.draw(st.integers(0, 3))):
        a, b = (sources, targets) if data.draw(st.booleans()) else (targets, sources)
        s = data.draw(st.lists(st.sampled_from(a), min_size=1, max_size=8))
        t = data.draw(st.lists(st.sampled_from(b), min_size=1, max_size=8))
        before.append((s, t))

    def classes(pool: list[taps.Layout]) -> list[tuple[taps.Layout, ...]]:
        drawn = st.lists(st.tuples(st.sampled_from(pool), st.sampled_from(pool)), min_size=1)
        rows = list(dict.fromkeys(data.draw(drawn)))
        # An end's classes as the tables make them, or a block of rows of one.
        if not data.draw(st.booleans()):
            return rows
        return tables._End.of([r[0] for r in rows], [r[1] for r in rows])

    edges = [
        (classes(sources), classes(targets), data.draw(st.booleans()))
        for _ in range(data.draw(st.integers(1, 4)))
    ]

    def work(jobs: tables._Jobs) -> list[np.ndarray]:
        priced = tables._Priced(jobs=jobs)
        for s, t in before:
            priced(s, t, *how, None)
        sums = [tables._directions(lambda s, t: priced(s, t, *how, None), *edge) for edge in edges]
        return tables._edge_costs(sums, jobs)

    summed = tables._alongside(work) if threaded else work(tables._Jobs())
    for got, (src, dst, backward) in zip(summed, edges, strict=True):
        want = taps.redistribution_costs([s[0] for s in src], [d[0] for d in dst], *how)
        if backward:
            back = taps.redistribution_costs([d[1] for d in dst], [s[1] for s in src], *how)
            want = want + back.T
        assert got.tobytes() == want.tobytes()


def test_an_edge_is_summed_into_a_matrix_only_when_nothing_later_reads_it():
    """Edges reading one forward matrix of the memo: one reading a column of it, then two between
    the same classes. Only the last is summed into that matrix (read whole, in its own order,
    and read by no later edge); each is the kernel's sum."""
    how = (CLUSTER, 2.0, "topology", "paper")
    layouts = [
        taps.Layout([8, 16], [2, 4], m, p)
        for m, p in [([1, 0], []), ([0, 1], []), ([-1, 0], [1]), ([-1, -1], []), ([1, -1], [])]
    ]
    # Partial sums only where the redistributions start.
    one, two, partial, whole, rows = layouts
    src = tables._End.of([one, two, partial], [two, whole, rows])
    dst = tables._End.of([two, whole, rows], [one, partial, whole])
    priced = tables._Priced()

    def price(s: list[taps.Layout], t: list[taps.Layout]) -> Any:
        return priced(s, t, *how, None)

    edges = [(src, [dst[0]], False), (src, dst, True), (src, dst, True)]
    sums = [tables._directions(price, *edge) for edge in edges]
    forward = sums[1][0][0][0]
    part, first, last = tables._edge_costs(sums, tables._Jobs())
    ahead = taps.redistribution_costs([one, two, partial], [two, whole, rows], *how)
    want = ahead + taps.redistribution_costs([one, partial, whole], [two, whole, rows], *how).T
    assert first.tobytes() == last.tobytes() == want.tobytes()
    assert not np.shares_memory(first, forward) and last is forward
    assert part.tobytes() == ahead[:, :1].tobytes() and not np.shares_memory(part, forward)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_gathered_sums_are_numpys_gathers_summed_in_order(data):
    """``gathered_sum`` against numpy's fancy indexing and ``+`` in the terms' order, on
    matrices in C order, Fortran order and neither (a strided view), across its tiles."""
    rows, cols = data.draw(st.integers(1, 140)), data.draw(st.integers(1, 140))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    terms, want = [], None
    for _ in range(data.draw(st.integers(1, 3))):
        transposed = data.draw(st.booleans())
        n, m = rng.integers(1, 150, size=2)
        matrix = rng.integers(0, 50, size=(n, 2 * m)) * 1.1e-3
        matrix = data.draw(
            st.sampled_from([matrix[:, :m].copy(), matrix[:, ::2], matrix.T.copy().T])
        )
        at_rows = rng.integers(0, matrix.shape[0], size=cols if transposed else rows)
        at_cols = rng.integers(0, matrix.shape[1], size=rows if transposed else cols)
        terms.append((matrix, at_rows, at_cols, transposed))
        part = matrix[np.ix_(at_rows, at_cols)]
        part = part.T if transposed else part
        want = part if want is None else want + part
    assert taps._core.gathered_sum(terms).tobytes() == np.ascontiguousarray(want).tobytes()
    # Added to a matrix in place: its entries first, then the terms in order.
    out = rng.integers(0, 50, size=(rows, cols)) * 1.3e-3
    summed = out.copy()
    for matrix, at_rows, at_cols, transposed in terms:
        part = matrix[np.ix_(at_rows, at_cols)]
        summed = summed + (part.T if transposed else part)
    got = taps._core.gathered_sum(terms, out, add=True)
    assert got is out and out.tobytes() == summed.tobytes()
    # Or written over whatever it held.
    out[...] = np.nan
    got = taps._core.gathered_sum(terms, out)
    assert got is out and out.tobytes() == np.ascontiguousarray(want).tobytes()


def test_gathered_sums_refuse_positions_outside_and_shapes_apart():
    matrix, at = np.zeros((2, 3)), np.array([0, 1])
    for terms in (
        [],
        [(matrix, np.array([2]), at, False)],
        [(matrix, np.array([-1]), at, False)],
        [(matrix, at, at, False), (matrix, np.array([0]), at, True)],
    ):
        with pytest.raises(taps.TapsError):
            taps._core.gathered_sum(terms)
    # A matrix to write to of another shape, not in C order, read-only, or one a term reads.
    term = [(matrix, at, at, False)]
    read_only = np.zeros((2, 2))
    read_only.flags.writeable = False
    for out in (np.zeros((2, 3)), np.zeros((2, 4))[:, ::2], read_only):
        with pytest.raises(taps.TapsError):
            taps._core.gathered_sum(term, out)
    square = np.zeros((2, 2))
    with pytest.raises(taps.TapsError):
        taps._core.gathered_sum([(square, at, at, False)], square)
    with pytest.raises(taps.TapsError):  # nothing to add to
        taps._core.gathered_sum(term, add=True)


@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (1340, 647), (0, 4)])
def test_fresh_matrices_are_c_order_writable_and_apart(shape):
    """The memo's partly priced matrices are allocated by ``_fresh`` (outside numpy): C order,
    writable, aligned float64 (so ``gathered_sum`` reads them in place), each in memory of its
    own."""
    a, b = tables._fresh(*shape), tables._fresh(*shape)
    for m in (a, b):
        assert m.shape == shape and m.dtype == np.float64
        assert m.flags.c_contiguous and m.flags.writeable and m.flags.aligned
    a[...], b[...] = 1.0, 2.0
    assert not np.shares_memory(a, b) and (a == 1.0).all()
