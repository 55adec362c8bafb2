"""taps.plan_redistribution: the paper's worked example and, on random layout pairs, exact replay
(numpy simulation), volumes counted from the moved data, and costs against the oracle."""

import math
import pickle
from math import prod

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import oracle
import sim
import strategies_gen as sg
import taps
from taps.reproduce.cases import paper_cluster


def _ops(plan):
    return [(op.kind, op.device_dim, op.tensor_dim, op.to_tensor_dim) for op in plan.ops]


def _cluster_for(n, data, **kw):
    """A cluster of ``n`` devices with a drawn node size (a power of two dividing ``n``)."""
    sizes = [2**e for e in range(n.bit_length()) if n % 2**e == 0]
    L = data.draw(st.sampled_from(sizes), label="devices_per_node")
    return paper_cluster(n // L, L, **kw)


# --------------------------------------------------------------------------- the paper's example

D3, D2, D1, D0 = 2, 2, 4, 2
PAPER_DM = [D3, D2, D1, D0]
PAPER_SHAPE = [8, 4, 6, 2, 2]
PAPER_SRC = [-1, 1, 2, -1, 3]
PAPER_TGT = [1, -1, -1, 0, 3]


def test_paper_example_ops_and_volume():
    a = taps.Layout(PAPER_SHAPE, PAPER_DM, PAPER_SRC)
    b = taps.Layout(PAPER_SHAPE, PAPER_DM, PAPER_TGT)
    plan = taps.plan_redistribution(a, b)
    assert plan.source == a
    assert plan.target == b
    assert plan.prelude == []
    assert plan.epilogue == []
    assert _ops(plan) == [
        ("slice", 0, 3, None),
        ("all_to_all", 1, 1, 0),
        ("all_gather", 2, 2, None),
    ]
    assert [op.group_size for op in plan.ops] == [D0, D1, D2]
    size = prod(PAPER_SHAPE)
    expect = (D1 * D2 - 1) * size // (D0 * D1**2 * D2 * D3)
    assert (D1 * D2 - 1) * size % (D0 * D1**2 * D2 * D3) == 0
    assert plan.volume == expect == 42
    s = size // (D1 * D2 * D3)  # source shard size
    assert [op.volume for op in plan.ops] == [0, (D1 - 1) * (s // D0) // D1, (D2 - 1) * s // D0]
    assert sum(op.volume for op in plan.all_ops) == plan.volume
    # the layouts the ops act on
    assert plan.ops[0].layout == a
    assert plan.ops[1].layout.tensor_map == [-1, 1, 2, 0, 3]
    assert plan.ops[2].layout.tensor_map == [1, -1, 2, 0, 3]
    rep = sim.replay_plan(plan, a, b)
    assert rep.received == [42] * prod(PAPER_DM)


@pytest.mark.parametrize("dims", [(2, 2, 2, 2), (4, 2, 2, 2), (2, 4, 2, 4), (2, 2, 4, 4)])
def test_paper_example_other_sizes(dims):
    d3, d2, d1, d0 = dims
    shape = [d1 * 2, d1, d2 * 3, d0, d3]
    a = taps.Layout(shape, list(dims), PAPER_SRC)
    b = taps.Layout(shape, list(dims), PAPER_TGT)
    plan = taps.plan_redistribution(a, b)
    assert _ops(plan) == [
        ("slice", 0, 3, None),
        ("all_to_all", 1, 1, 0),
        ("all_gather", 2, 2, None),
    ]
    assert plan.volume * (d0 * d1**2 * d2 * d3) == (d1 * d2 - 1) * prod(shape)
    sim.replay_plan(plan, a, b)


def test_identity_plan_is_empty():
    a = taps.Layout([8, 6], [2, 4], [0, -1])
    plan = taps.plan_redistribution(a, a)
    assert plan.ops == []
    assert plan.all_ops == []
    assert plan.volume == 0
    for model in ("topology", "volume"):
        cost = plan.cost(paper_cluster(2, 4), model=model)
        assert cost == 0
        assert math.copysign(1.0, cost) == 1.0, f"{model} cost of an empty plan is {cost!r}"
    with pytest.raises(taps.TopologyError):
        plan.cost(paper_cluster(1, 4))  # the layout spans 8 devices, the cluster 4


def test_op_attributes():
    a = taps.Layout([8, 8], [4], [0, -1])
    b = taps.Layout([8, 8], [4], [-1, 0])
    plan = taps.plan_redistribution(a, b)
    assert _ops(plan) == [("all_to_all", 0, 0, 1)]
    op = plan.ops[0]
    assert op.group_size == 4
    assert type(op.volume) is int
    assert op.volume == 12  # 3/4 of a 16-element shard
    assert type(plan.volume) is int
    assert plan.all_ops == plan.prelude + plan.ops + plan.epilogue
    sim.replay_plan(plan, a, b)


# --------------------------------------------------------------------------- the fallback


@pytest.mark.parametrize(
    ("src", "tgt"),
    [
        (([6, 8], [2, 8], [-1, 0]), ([48], [16], [0])),
        (([48], [16], [0]), ([6, 8], [2, 8], [-1, 0])),
        (([6, 4], [4], [-1, 0]), ([4, 6], [4], [0, -1])),
        (([6, 4], [2, 2], [0, 1]), ([4, 6], [2, 2], [1, 0])),
    ],
)
def test_fallback_plans_replay(src, tgt):
    a, b = sg.to_layout(src), sg.to_layout(tgt)
    with pytest.raises(taps.UnifyError):
        taps.unify(a, b)
    plan = taps.plan_redistribution(a, b)
    assert plan.prelude or plan.epilogue
    rep = sim.replay_plan(plan, a, b)
    assert rep.received == [plan.volume] * a.num_devices
    n = a.num_devices
    cl = paper_cluster(n // 2 if n > 1 else 1, 2 if n > 1 else 1)
    assert plan.cost(cl) == pytest.approx(oracle.plan_cost(rep.steps, cl), rel=1e-9, abs=0)
    assert plan.cost(cl, model="volume") == pytest.approx(2 * plan.volume, rel=1e-12)


# --------------------------------------------------------------------------- properties


def _check_plan(ta, tb, data):
    a, b = sg.to_layout(ta), sg.to_layout(tb)
    plan = taps.plan_redistribution(a, b)
    assert plan.all_ops == plan.prelude + plan.ops + plan.epilogue
    for op in plan.all_ops:
        assert op.kind in ("slice", "all_gather", "all_to_all")
    rep = sim.replay_plan(plan, a, b)
    n = a.num_devices
    # volume = what the replay actually moved, per device
    assert plan.volume == sum(op.volume for op in plan.all_ops)
    assert rep.received == [plan.volume] * n
    # dims already split the same way in the unified source and target are never touched
    src, tgt = plan.source.tensor_map, plan.target.tensor_map
    done = {i for i, (m, t) in enumerate(zip(src, tgt, strict=True)) if m == t and m >= 0}
    for op in plan.ops:
        assert op.tensor_dim not in done and op.to_tensor_dim not in done, (src, tgt, op)
    # never worse than gathering everything and slicing locally
    s = prod(a.shard_shape)
    assert plan.volume <= prod(a.shape) - s, (plan.volume, prod(a.shape), s)
    # costs
    dtype_bytes = data.draw(st.sampled_from([1, 2, 4]), label="dtype_bytes")
    cl = _cluster_for(
        n,
        data,
        intra_bandwidth=data.draw(st.sampled_from([60e9, 100e9]), label="intra"),
        inter_bandwidth=data.draw(st.sampled_from([6e9, 12.5e9]), label="inter"),
    )
    assert plan.cost(cl, dtype_bytes, "volume") == pytest.approx(
        plan.volume * dtype_bytes, rel=1e-12
    )
    assert plan.cost(cl, dtype_bytes=dtype_bytes, model="volume") == pytest.approx(
        plan.volume * dtype_bytes, rel=1e-12
    )
    want = oracle.plan_cost(rep.steps, cl, dtype_bytes=dtype_bytes)
    assert plan.cost(cl, dtype_bytes=dtype_bytes) == pytest.approx(want, rel=1e-9, abs=1e-300)
    total = 0.0
    for step in rep.steps:
        op = step.op
        got = op.cost(cl, dtype_bytes=dtype_bytes)
        if op.kind == "slice":
            assert got == 0
            continue
        want_op = oracle.cluster_cost(
            cl, step.layout, op.kind, device_dim=op.device_dim, dtype_bytes=dtype_bytes
        )
        assert got == pytest.approx(want_op, rel=1e-9, abs=1e-300), (op.kind, step.layout)
        total += got
        assert op.cost(cl, dtype_bytes=dtype_bytes, model="volume") == pytest.approx(
            op.volume * dtype_bytes, rel=1e-12
        )
        assert op.inter_node_groups(cl.devices_per_node) == oracle.inter_node_groups(
            step.layout, op.kind, cl.devices_per_node, op.device_dim
        )
    assert plan.cost(cl, dtype_bytes=dtype_bytes) == pytest.approx(total, rel=1e-9, abs=1e-300)
    return plan


@settings(max_examples=250)
@given(sg.layout_pairs(), st.data())
def test_random_plans_replay_exactly(pair, data):
    _check_plan(*pair, data)


@settings(max_examples=150)
@given(sg.layout_pairs(atoms=sg.POW2_ATOMS), st.data())
def test_random_power_of_two_plans(pair, data):
    plan = _check_plan(*pair, data)
    assert plan.prelude == []
    assert plan.epilogue == []


@settings(max_examples=100)
@given(sg.layout_pairs(atoms=sg.POW2_ATOMS), st.sampled_from(["paper", "optimal"]))
def test_plans_pickle(pair, planner):
    plan = taps.plan_redistribution(*map(sg.to_layout, pair), planner=planner)
    back = pickle.loads(pickle.dumps(plan))
    assert back == plan and repr(back) == repr(plan)
    assert back.all_ops == plan.all_ops and back.volume == plan.volume
    for op in plan.all_ops:
        assert pickle.loads(pickle.dumps(op)) == op


def test_op_parts_that_fit_no_step_are_refused():
    # What unpickling calls: parts from a damaged pickle are one-line errors, not a panic.
    lay = taps.Layout([4, 4], [2, 2], [0, 1])
    with pytest.raises(taps.LayoutError, match='unknown op kind "gather"'):
        taps.CommOp._from_parts("gather", 0, 0, None, None, lay)
    with pytest.raises(taps.LayoutError, match=r"all_gather\(device_dim=5.* 2 device dims"):
        taps.CommOp._from_parts("all_gather", 5, 0, None, None, lay)
    with pytest.raises(taps.LayoutError, match="not a step"):
        taps.CommOp._from_parts("collective_permute", 0, None, None, [0, 1], lay)
    # Dims of sizes 2 and 4 swapped: no permute of the devices does that.
    mixed = taps.Layout([8, 8], [2, 4], [0, 1])
    with pytest.raises(taps.LayoutError, match="not a step"):
        taps.CommOp._from_parts("collective_permute", 0, None, None, [1, 0], mixed)
    swap = taps.CommOp._from_parts("collective_permute", 0, None, None, [1, 0], lay)
    assert swap.permutation == [1, 0] and swap.group_size == 4


@settings(max_examples=100)
@given(sg.layouts(), st.data())
def test_pure_slicing_is_free(t, data):
    """A target that only splits more (same matrix and shape) needs slices only: volume 0."""
    shape, dm, tm = t
    h = len(dm)
    tgt = list(tm)
    for i in range(len(shape)):
        free = [k for k in range(h) if k not in tgt and shape[i] % dm[h - 1 - k] == 0]
        if tgt[i] == -1 and free and data.draw(st.booleans()):
            tgt[i] = data.draw(st.sampled_from(free))
    plan = _check_plan(t, (shape, dm, tgt), data)
    assert all(op.kind == "slice" for op in plan.all_ops), [op.kind for op in plan.all_ops]
    assert plan.volume == 0


@settings(max_examples=100)
@given(sg.layouts(), st.data())
def test_pure_gathering_gathers_only_what_is_needed(t, data):
    """A target that only replicates more needs all_gathers of exactly the dropped splits: the
    volume is s * (prod of their degrees - 1) whatever the order."""
    shape, dm, tm = t
    h = len(dm)
    tgt = [m if m < 0 or data.draw(st.booleans()) else -1 for m in tm]
    plan = _check_plan(t, (shape, dm, tgt), data)
    assert all(op.kind == "all_gather" for op in plan.all_ops), [op.kind for op in plan.all_ops]
    g = prod(dm[h - 1 - m] for m, n in zip(tm, tgt, strict=True) if m >= 0 and n < 0)
    assert plan.volume == prod(sim.shard_shape(t)) * (g - 1)


@settings(max_examples=300)
@given(sg.layout_pairs(), st.booleans(), st.data())
def test_no_communication_when_every_rank_already_holds_its_target(pair, replicate, data):
    """If every rank already holds all the elements its target shard needs, the redistribution is
    local slicing only: volume 0 (a replicated source makes this hold for any target)."""
    ta, tb = pair
    if replicate:
        ta = (ta[0], ta[1], [-1] * len(ta[0]))
    held = sim.element_sets(sim.shards(ta))
    need = sim.element_sets(sim.shards(tb))
    if not all(n <= h for h, n in zip(held, need, strict=True)):
        return
    plan = _check_plan(ta, tb, data)
    assert plan.volume == 0, [(op.kind, op.device_dim, op.tensor_dim) for op in plan.all_ops]


@settings(max_examples=200)
@given(sg.dense_pairs(), st.data())
def test_dense_plans_on_one_matrix(pair, data):
    """Same matrix and shape, most device dims used on both sides: Algorithm 1 proper."""
    ta, tb = pair
    plan = _check_plan(ta, tb, data)
    assert plan.prelude == [] and plan.epilogue == []
    a, b = sg.to_layout(ta), sg.to_layout(tb)
    if all(a.device_dim_size(k) == 1 or (k in ta[2] and k in tb[2]) for k in range(len(ta[1]))):
        # Both use every real device dim: unification only drops the size-1 dims.
        assert plan.source.shape == [s for s in a.shape if s > 1]
        assert plan.source.device_matrix == [d for d in a.device_matrix if d > 1]
        assert plan.source.normalized() == a.normalized()
        assert plan.target.normalized() == b.normalized()
