"""The cheap lower bounds (``redistribution_table_bounds(cheap=True)``) against the full ones and
the optimal planner's costs, and the pair bounds (``redistribution_pair_bounds``) against the
tables': on drawn layout sets, and on the bounded tables of an optimal search of a model."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import strategies_gen as sg
import taps
from taps._core import redistribution_pair_bounds, redistribution_table_bounds
from taps.search import tables


def _check_tables(sources: list, targets: list, cluster: taps.Cluster, dtype: float) -> tuple:
    """The cheap and full tables of one call, checked against each other, ``redistribution_bounds``
    and Algorithm 1's costs (the cheap tables work out only some: each bound lies under it all
    the same); returned for more checks."""
    cheap, cheap_exact, some = redistribution_table_bounds(
        sources, targets, cluster, dtype, cheap=True
    )
    full, full_exact, paper = redistribution_table_bounds(sources, targets, cluster, dtype)
    want, want_exact = taps.redistribution_bounds(sources, targets, cluster, dtype)
    assert np.array_equal(full, want) and np.array_equal(full_exact, want_exact)
    assert np.array_equal(paper, taps.redistribution_costs(sources, targets, cluster, dtype))
    known = ~np.isnan(some)
    assert np.array_equal(some[known], paper[known])
    assert (cheap >= 0).all() and (cheap <= full).all() and (cheap <= paper).all()
    # Exact only where the full bound is, at the same value.
    assert full_exact[cheap_exact].all()
    assert np.array_equal(cheap[cheap_exact], full[cheap_exact])
    return cheap, full, full_exact


@settings(max_examples=40, deadline=None)
@given(st.integers(3, 5), st.data())
def test_cheap_bounds_lie_below_the_full_ones_and_the_optimal_cost(log2, data):
    sources, targets = data.draw(sg.layout_sets(log2, max_count=4))
    sources, targets = [sg.to_layout(t) for t in sources], [sg.to_layout(t) for t in targets]
    per_node = data.draw(st.sampled_from([1, 2, 4]))
    cluster = taps.Cluster(2**log2 // per_node, per_node)
    _, full, _ = _check_tables(sources, targets, cluster, 2.0)
    optimal = taps.redistribution_costs(sources, targets, cluster, planner="optimal")
    assert (full <= optimal).all()


def _recorded_tables(graph: taps.Graph, cluster: taps.Cluster) -> list[tuple[Any, ...]]:
    """The arguments of every bounded table an optimal search of ``graph`` asks for."""
    calls: list[tuple[Any, ...]] = []
    kernel = tables.redistribution_table_bounds

    def kept(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return kernel(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tables, "redistribution_table_bounds", kept)
        taps.search(graph, cluster, taps.Pricing(planner="optimal"))
    return calls


def test_cheap_bounds_on_a_models_tables():
    # A GPT layer's bounded tables on two nodes: every entry cheap <= full, a sample of them
    # full <= the optimal planner's cost, and a scattered sample of pairs across the tables
    # bounded in one call as each table bounds it.
    cluster = taps.Cluster(2, 4)
    calls = _recorded_tables(taps.models.gpt(hidden=256, heads=4, seq=64, batch=8), cluster)
    assert len(calls) >= 3
    rng = np.random.default_rng(0)
    moved, equal, ratios = 0, 0, []
    pairs: list[tuple[Any, Any, float, float, bool]] = []
    for sources, targets, _, dtype, *_ in calls:
        cheap, full, exact = _check_tables(sources, targets, cluster, dtype)
        some = rng.choice(full.size, size=min(full.size, 40), replace=False)
        for k in some:
            i, j = divmod(int(k), len(targets))
            optimal = taps.redistribution_costs(
                [sources[i]], [targets[j]], cluster, dtype, planner="optimal"
            )[0, 0]
            assert full[i, j] <= optimal
            pairs.append((sources[i], targets[j], dtype, full[i, j], exact[i, j]))
        nonzero = full > 0
        moved += int(nonzero.sum())
        equal += int((cheap[nonzero] >= full[nonzero] * (1 - 1e-9)).sum())
        ratios.append(cheap[nonzero] / full[nonzero])
    # Not vacuous: nine in ten equal the full bound (to its hair), the mean ratio 0.976.
    assert moved > 1000 and equal > 0.85 * moved, (equal, moved)
    assert np.concatenate(ratios).mean() > 0.95
    order = rng.permutation(len(pairs))
    sources, targets, dtypes, want, want_exact = zip(*[pairs[k] for k in order], strict=True)
    got, got_exact = redistribution_pair_bounds(list(sources), list(targets), list(dtypes), cluster)
    assert np.array_equal(got, np.array(want)) and np.array_equal(got_exact, np.array(want_exact))


def test_bounds_refuse_the_volume_model_and_mismatched_lists():
    layout = taps.Layout([8, 8], [4], [0, -1])
    cluster = taps.Cluster(1, 4)
    with pytest.raises(taps.TopologyError):
        redistribution_table_bounds([layout], [layout], cluster, model="volume", cheap=True)
    with pytest.raises(taps.TopologyError):
        redistribution_pair_bounds([layout], [layout], [2.0], cluster, model="volume")
    with pytest.raises(taps.TapsError):
        redistribution_pair_bounds([layout], [layout], [2.0, 2.0], cluster)


def test_pair_bounds_stop_when_their_time_limit_runs_out():
    """40,000 pairs of distributions on 64 devices take far longer than the 10 ms at which the
    call first looks at the clock (Algorithm 1's costs, then the bounds a part at a time); a
    limit of 0 stops it there, and a limit that is no number of seconds is refused."""
    shape = [8, 16, 32, 64]
    strategies = taps.enumerate_strategies(shape, 64)
    layouts = list(dict.fromkeys(s.tensor_layout([0, 1, 2, 3], shape) for s in strategies))
    sources = [a for a in layouts[:200] for _ in range(200)]
    targets = layouts[-200:] * 200
    cluster = taps.Cluster(8, 8)
    with pytest.raises(
        taps.TimeLimitError,
        match=r"^the time limit ran out while bounding 40000 redistributions$",
    ):
        redistribution_pair_bounds(sources, targets, [2.0] * 40_000, cluster, time_limit=0.0)
    for bad in (-1.0, float("nan")):
        with pytest.raises(taps.TimeLimitError, match="must be a non-negative number of seconds"):
            redistribution_pair_bounds(sources[:1], targets[:1], [2.0], cluster, time_limit=bad)
