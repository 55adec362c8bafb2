"""The optimal planner (planner="optimal"): the examples of issue 12, every plan replayed on
per-rank shards (partial sums included), never dearer than Algorithm 1 under either cost model,
and equal to a plain brute-force shortest path over the steps docs/core.md lists."""

import heapq
import itertools
from math import prod

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import sim
import strategies_gen as sg
import taps


def _plan(a, b, cluster=None):
    return taps.plan_redistribution(a, b, cluster, planner="optimal")


ISSUE = [
    # (source, target, Algorithm 1's volume, the optimal volume)
    (([96, 32, 96], [16, 2], [1, 0, -1]), ([96, 32, 96], [16, 2], [0, 1, -1]), 211_968, 17_280),
    (([16, 48], [8, 2], [0, -1]), ([16, 48], [16], [0, -1]), 192, 48),
    (
        ([32, 96, 96], [2, 2, 4, 2], [2, -1, -1]),
        ([32, 96, 96], [8, 4], [0, -1, -1]),
        147_456,
        73_728,
    ),
    (([256, 256], [4, 4], [1, 0]), ([256, 256], [4, 4], [0, 1]), 6 * 4096, 4096),
    (([64, 4, 8, 16], [4, 4], [-1, 1, 0, -1]), ([64, 32, 16], [16], [0, -1, -1]), 3072, 1920),
    # Issue 23: dim 1 sliced along the device dim the target uses for dim 0, then one
    # collective_permute of the smaller shard (what XLA moves).
    (([256, 1024], [4, 4], [0, -1]), ([256, 1024], [4, 4], [1, 0]), 49_152, 16_384),
]


@pytest.mark.parametrize(("src", "tgt", "paper", "optimal"), ISSUE)
def test_issue_examples(src, tgt, paper, optimal):
    a, b = sg.to_layout(src), sg.to_layout(tgt)
    old = taps.plan_redistribution(a, b, planner="paper")
    new = _plan(a, b)
    assert (old.volume, new.volume) == (paper, optimal)
    assert sim.replay_plan(new, a, b).received  # replays exactly
    sim.replay_plan(old, a, b)


def test_collective_permute_swaps_mesh_dims():
    a = taps.Layout([256, 256], [4, 4], [1, 0])
    b = taps.Layout([256, 256], [4, 4], [0, 1])
    plan = _plan(a, b)
    (op,) = plan.ops
    assert (op.kind, op.permutation, op.tensor_dim, op.group_size) == (
        "collective_permute",
        [1, 0],
        None,
        16,
    )
    rep = sim.replay_plan(plan, a, b)
    # The 4 devices on the diagonal keep their block; the 12 others receive one shard each.
    assert sorted(rep.received) == [0] * 4 + [4096] * 12
    cl = taps.Cluster(4, 4)
    assert op.cost(cl, model="volume") == 2 * 4096
    assert op.inter_node_groups(4) > 0


def test_partial_sums_reduce_scatter_and_all_reduce():
    a = taps.Layout([64, 8], [4, 2], [-1, 0], partial=[1])
    split = taps.Layout([64, 8], [4, 2], [1, 0])
    whole = taps.Layout([64, 8], [4, 2], [-1, 0])
    rs = _plan(a, split)
    assert [op.kind for op in rs.ops] == ["reduce_scatter"]
    assert rs.volume == 3 * 256 // 4
    paper = taps.plan_redistribution(a, split, planner="paper")
    assert [op.kind for op in paper.ops] == ["all_reduce", "slice"]
    assert paper.volume == 2 * rs.volume
    ar = _plan(a, whole)
    assert [op.kind for op in ar.ops] == ["all_reduce"]
    assert ar.volume == 2 * 3 * 256 // 4
    for plan, b in ((rs, split), (paper, split), (ar, whole)):
        sim.replay_plan(plan, a, b)
    with pytest.raises(taps.LayoutError, match="partial"):
        _plan(whole, a)
    with pytest.raises(taps.LayoutError, match="planner"):
        taps.plan_redistribution(a, whole, planner="best")


def test_one_distribution_one_plan():
    b = taps.Layout([64, 32, 16], [16], [0, -1, -1])
    one = _plan(taps.Layout([64, 32, 16], [16], [-1, 0, -1]), b)
    other = _plan(taps.Layout([64, 4, 8, 16], [4, 4], [-1, 1, 0, -1]), b)
    assert one == other
    assert [op.kind for op in one.ops] == ["all_to_all"]


@st.composite
def partial_pairs(draw, max_log2_devices=5):
    """A layout pair whose source holds partial sums along some dims its map leaves unused; the
    target keeps some of them when it has the same device matrix."""
    (shape, dm, tm), (shape_b, dm_b, tm_b) = draw(
        sg.layout_pairs(max_log2_devices=max_log2_devices)
    )
    free = [k for k in range(len(dm)) if k not in tm and dm[len(dm) - 1 - k] > 1]
    partial = sorted(draw(st.sets(st.sampled_from(free))) if free else set())
    keep: list[int] = []
    if dm_b == dm:
        keep = [k for k in partial if k not in tm_b and draw(st.booleans())]
    return (shape, dm, tm, partial), (shape_b, dm_b, tm_b, keep)


def _layout(t):
    return taps.Layout(*t)


def _cluster(n, data):
    sizes = [2**e for e in range(n.bit_length()) if n % 2**e == 0]
    per_node = data.draw(st.sampled_from(sizes), label="devices_per_node")
    return taps.Cluster(n // per_node, per_node)


@settings(max_examples=150, deadline=None)
@given(partial_pairs(), st.data())
def test_optimal_plans_replay_and_never_lose_to_algorithm_1(pair, data):
    a, b = _layout(pair[0]), _layout(pair[1])
    cl = _cluster(a.num_devices, data)
    paper = taps.plan_redistribution(a, b, planner="paper")
    by_volume = _plan(a, b)
    by_time = _plan(a, b, cl)
    for plan in (paper, by_volume, by_time):
        sim.replay_plan(plan, a, b)
        assert sum(op.volume for op in plan.all_ops) == plan.volume
    assert by_volume.volume <= paper.volume
    assert by_time.cost(cl) <= paper.cost(cl) * (1 + 1e-12)
    assert by_volume.cost(cl, model="volume") <= paper.cost(cl, model="volume")
    # The kernel prices each pair as its plan, bit for bit.
    for model, plan in (("topology", by_time), ("volume", by_volume)):
        got = taps.redistribution_costs([a], [b], cl, model=model, planner="optimal")[0, 0]
        assert got == plan.cost(cl, model=model)


# --------------------------------------------------------------------------- brute force


def _brute_force(source, target):
    """The least volume from the unified ``source`` to ``target`` (4-tuples), by Dijkstra over
    every layout the steps of docs/core.md reach, each priced by its documented formula, with a
    permute handing a split the target does not keep to any free dim of its size."""
    shape, dm, src, src_partial = source
    tgt, keep = target[2], frozenset(target[3])
    h = len(dm)
    d = [sim.dev_size(dm, k) for k in range(h)]
    goal = {k: tgt.index(k) if k in tgt else None for k in range(h)}
    fixed = {k for k in range(h) if goal[k] is not None and k in src and src.index(k) == goal[k]}
    allowed = {}
    for k in range(h):
        # A dim that splits nothing at either end (and sums nothing) only replicates; the others
        # may split any dim they divide.
        may = k in src or goal[k] is not None or k in src_partial
        allowed[k] = {i for i in range(len(shape)) if may and shape[i] % d[k] == 0}

    def shard(tm):
        return prod(s // (d[m] if m >= 0 else 1) for s, m in zip(shape, tm))

    def steps(tm, partial):
        s = shard(tm)
        used = {m for m in tm if m >= 0}
        free = [k for k in range(h) if k not in used and k not in partial]
        unsplit = {i for i, m in enumerate(tm) if m < 0}
        for k in free:
            if goal[k] is not None and goal[k] in unsplit:
                yield 0, tuple(k if j == goal[k] else m for j, m in enumerate(tm)), partial
                return
        for k in free:
            for i in allowed[k] & unsplit:
                yield 0, tuple(k if j == i else m for j, m in enumerate(tm)), partial
        for k in sorted(partial - keep):
            rest = partial - {k}
            yield -(-2 * (d[k] - 1) * s // d[k]), tm, rest
            for i in allowed[k] & unsplit:
                yield (
                    (d[k] - 1) * s // d[k],
                    tuple(k if j == i else m for j, m in enumerate(tm)),
                    rest,
                )
        for i, k in enumerate(tm):
            if k < 0 or k in fixed:
                continue
            yield (d[k] - 1) * s, tuple(-1 if j == i else m for j, m in enumerate(tm)), partial
            for j in allowed[k] & unsplit:
                moved = tuple(k if x == j else -1 if x == i else m for x, m in enumerate(tm))
                yield (d[k] - 1) * s // d[k], moved, partial
        # A permute hands each moving split to a dim of its size that splits its tensor dim in
        # the target or, if the target leaves that tensor dim unsplit, to any free one (the
        # planner takes only the one where the final all-gather is cheapest).
        movable = [(i, k) for i, k in enumerate(tm) if k >= 0 and k not in fixed]
        taken = (used | partial) - {k for _, k in movable}
        options = [
            [k]
            + [
                x
                for x in range(h)
                if x != k
                and d[x] == d[k]
                and (goal[x] == i or tgt[i] < 0)
                and x not in fixed | taken
            ]
            for i, k in movable
        ]
        for dest in itertools.product(*options):
            if len(set(dest)) < len(dest) or all(x == k for x, (_, k) in zip(dest, movable)):
                continue
            new = list(tm)
            for x, (i, _) in zip(dest, movable):
                new[i] = x
            yield s, tuple(new), partial

    start = (tuple(src), frozenset(src_partial))
    best = {start: 0}
    heap = [(0, 0, start)]
    count = itertools.count(1)
    while heap:
        cost, _, state = heapq.heappop(heap)
        if cost > best[state]:
            continue
        if state == (tuple(tgt), keep):
            return cost
        for price, tm, partial in steps(*state):
            nxt = (tm, partial)
            if cost + price < best.get(nxt, float("inf")):
                best[nxt] = cost + price
                heapq.heappush(heap, (cost + price, next(count), nxt))
    raise AssertionError("the target is unreachable")


# A permute hands the split of tensor dim 0 to a dim the target leaves free, and one all-gather
# there ends it: 8 elements, where handing splits only to the target's dims moves 10.
@settings(max_examples=120, deadline=None)
@given(partial_pairs(max_log2_devices=4))
@example((([4, 16], [4, 2, 2], [0, 2], []), ([4, 16], [2, 4, 2], [1, 0], [])))
def test_optimal_equals_brute_force(pair):
    a, b = _layout(pair[0]), _layout(pair[1])
    plan = _plan(a, b)
    if plan.prelude or plan.epilogue:
        return
    want = _brute_force(sim.layout4(plan.source), sim.layout4(plan.target))
    paper = taps.plan_redistribution(a, b, planner="paper").volume
    assert plan.volume == min(want, paper), (pair, plan, want, paper)


# The same on a 4 x 4 mesh: one permute and one all-gather, 4 elements (6 without it).
@settings(max_examples=60, deadline=None)
@given(sg.dense_pairs(max_log2_devices=4))
@example((([4, 4], [4, 4], [0, 1]), ([4, 4], [4, 4], [1, -1])))
def test_dense_pairs_against_brute_force(pair):
    a, b = sg.to_layout(pair[0]), sg.to_layout(pair[1])
    plan = _plan(a, b)
    sim.replay_plan(plan, a, b)
    want = _brute_force(sim.layout4(plan.source), sim.layout4(plan.target))
    assert plan.volume == want
    assert plan.volume <= taps.plan_redistribution(a, b, planner="paper").volume


@settings(max_examples=40, deadline=None)
@given(st.integers(3, 6), st.data())
def test_batch_of_many_pairs_prices_each_as_its_plan(log2, data):
    """The batch kernel searches once per pattern (unified pairs whose tensor dims differ only in
    order share a search) and remembers paths across calls: every entry of a batch, in either
    order of the lists, is still the cost of that pair's own plan, bit for bit."""
    sources, targets = data.draw(sg.layout_sets(log2, max_count=5))
    sources, targets = [sg.to_layout(t) for t in sources], [sg.to_layout(t) for t in targets]
    cl = _cluster(2**log2, data)
    for order in (1, -1):
        srcs, tgts = sources[::order], targets[::order]
        got = taps.redistribution_costs(srcs, tgts, cl, planner="optimal")
        for i, a in enumerate(srcs):
            for j, b in enumerate(tgts):
                assert got[i, j] == _plan(a, b, cl).cost(cl)
