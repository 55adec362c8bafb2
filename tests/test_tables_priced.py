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
    for name in ("redistribution_costs", "redistribution_bounds"):
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
                want, exact = taps.redistribution_bounds(s, t, CLUSTER, 2.0, "topology")
                assert np.array_equal(priced.inexact(s, t, 2.0), ~exact)
            else:
                want = taps.redistribution_costs(s, t, CLUSTER, 2.0, "topology", planner)
            assert got.tobytes() == np.ascontiguousarray(want).tobytes()


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
    assert got.tobytes() == want.tobytes()
