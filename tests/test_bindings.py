"""The Rust bindings on numbers Python can hold and Rust cannot: 0, negatives, 2**63, 2**64 and ints
of thousands of bits, in every integer and float argument of every binding. Each call either
succeeds or raises the TapsError subclass of its domain (never PyO3's OverflowError, never a Rust
panic), and an out-of-range value is named in the message with the argument it was given for."""

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import taps
from taps import _core
from taps._core import allreduce_costs

I64_MIN, I64_MAX = -(2**63), 2**63 - 1

# Edge ints: the boundaries of i64 and u64, small values valid or not, and ints of any size.
EDGE_INTS = st.one_of(
    st.sampled_from([0, 1, -1, 2, 3, I64_MAX, I64_MAX + 1, I64_MIN, I64_MIN - 1, 2**64, 2**64 - 1]),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(min_value=0, max_value=6000).map(lambda b: 2**b),
    st.integers(min_value=0, max_value=6000).map(lambda b: -(2**b)),
)

LAYOUT = taps.Layout([8, 8], [2, 2], [0, -1])
TARGET = taps.Layout([8, 8], [2, 2], [-1, 1])
CLUSTER = taps.Cluster(2, 2)
PLAN = taps.plan_redistribution(LAYOUT, TARGET)
STRATEGY = taps.Strategy([2, 2], [1, 0])
ONE_ROW = np.array([[2, 2]], dtype=np.int64)
ONE_MAP = np.array([[1, 0]], dtype=np.int64)


def _allreduce(tensor: tuple[list[int], list[int], float]) -> object:
    return allreduce_costs(ONE_ROW, ONE_MAP, [tensor], CLUSTER)


# (binding and argument, a valid value, the error of its domain, the text naming the argument, the
# call with v)
INT_ARGS: list[tuple[str, int, type[taps.TapsError], str, Callable[[int], object]]] = [
    ("Layout shape", 8, taps.LayoutError, "shape", lambda v: taps.Layout([v, 8], [2], [-1, 0])),
    (
        "Layout device_matrix",
        2,
        taps.LayoutError,
        "device matrix",
        lambda v: taps.Layout([8], [v], [0]),
    ),
    (
        "Layout tensor_map",
        0,
        taps.LayoutError,
        "tensor map",
        lambda v: taps.Layout([8, 8], [2], [v, -1]),
    ),
    ("Layout.shard_index", 0, taps.LayoutError, "rank", LAYOUT.shard_index),
    ("Layout.device_dim_size", 0, taps.LayoutError, "k", LAYOUT.device_dim_size),
    (
        "Layout partial",
        1,
        taps.LayoutError,
        "partial",
        lambda v: taps.Layout([8, 8], [2, 2], [0, -1], [v]),
    ),
    ("Cluster nodes", 2, taps.TopologyError, "nodes", lambda v: taps.Cluster(v, 4)),
    (
        "Cluster.hierarchy parts",
        2,
        taps.TopologyError,
        "parts of level 1",
        lambda v: taps.Cluster.hierarchy([(2, 60e9, 0.0), (v, 6e9, 0.0)]),
    ),
    (
        "Cluster.hierarchy nodes",
        2,
        taps.TopologyError,
        "nodes",
        lambda v: taps.Cluster.hierarchy([(2, 60e9, 0.0), (1, 6e9, 0.0)], nodes=v),
    ),
    (
        "Cluster.preset nodes",
        1,
        taps.TopologyError,
        "nodes",
        lambda v: taps.Cluster.preset("dgx-v100", v),
    ),
    (
        "Cluster devices_per_node",
        2,
        taps.TopologyError,
        "devices_per_node",
        lambda v: taps.Cluster(2, v),
    ),
    (
        "Cluster.collective_cost device_dim",
        0,
        taps.TopologyError,
        "device_dim",
        lambda v: CLUSTER.collective_cost(LAYOUT, "all_gather", v),
    ),
    (
        "CommOp.inter_node_groups",
        2,
        taps.TopologyError,
        "devices_per_node",
        PLAN.all_ops[0].inter_node_groups,
    ),
    ("Strategy degrees", 2, taps.StrategyError, "degrees", lambda v: taps.Strategy([v, 2], [1, 0])),
    ("Strategy device_map", 0, taps.StrategyError, "device map", lambda v: taps.Strategy([2], [v])),
    (
        "Strategy.tensor_layout axes",
        0,
        taps.LayoutError,
        "axes",
        lambda v: STRATEGY.tensor_layout([v], [8]),
    ),
    (
        "Strategy.tensor_layout shape",
        8,
        taps.LayoutError,
        "shape",
        lambda v: STRATEGY.tensor_layout([0], [v]),
    ),
    (
        "inter_node_groups devices_per_node",
        2,
        taps.TopologyError,
        "devices_per_node",
        lambda v: taps.inter_node_groups(LAYOUT, "all_reduce", v),
    ),
    (
        "inter_node_groups device_dim",
        0,
        taps.TopologyError,
        "device_dim",
        lambda v: taps.inter_node_groups(LAYOUT, "all_gather", 2, v),
    ),
    (
        "enumerate_strategies axis_sizes",
        4,
        taps.StrategyError,
        "axis sizes",
        lambda v: taps.enumerate_strategies([v, 4], 4),
    ),
    (
        "enumerate_strategies num_devices",
        4,
        taps.StrategyError,
        "num_devices",
        lambda v: taps.enumerate_strategies([4], v),
    ),
    ("allreduce_costs axes", 0, taps.LayoutError, "axes", lambda v: _allreduce(([v], [8], 2.0))),
    ("allreduce_costs shape", 8, taps.LayoutError, "shape", lambda v: _allreduce(([0], [v], 2.0))),
]

FLOAT_ARGS: list[tuple[str, str, Callable[[object], object]]] = [
    ("Cluster intra_bandwidth", "intra_bandwidth", lambda v: taps.Cluster(2, 2, intra_bandwidth=v)),
    ("Cluster inter_bandwidth", "inter_bandwidth", lambda v: taps.Cluster(2, 2, inter_bandwidth=v)),
    ("Cluster device_memory", "device_memory", lambda v: taps.Cluster(2, 2, device_memory=v)),
    (
        "Cluster.hierarchy bandwidth",
        "bandwidth of level 2",
        lambda v: taps.Cluster.hierarchy([(2, 60e9, 0.0), (1, 6e9, 0.0), (2, v, 0.0)]),
    ),
    (
        "Cluster.hierarchy device_memory",
        "device_memory",
        lambda v: taps.Cluster.hierarchy([(4, 60e9, 0.0)], device_memory=v),
    ),
    (
        "plan_redistribution",
        "dtype_bytes",
        lambda v: taps.plan_redistribution(LAYOUT, TARGET, dtype_bytes=v),
    ),
    (
        "plan_redistribution optimal",
        "dtype_bytes",
        lambda v: taps.plan_redistribution(LAYOUT, TARGET, CLUSTER, "optimal", v),
    ),
    (
        "Cluster.collective_cost",
        "dtype_bytes",
        lambda v: CLUSTER.collective_cost(LAYOUT, "all_reduce", dtype_bytes=v),
    ),
    ("CommOp.cost", "dtype_bytes", lambda v: PLAN.all_ops[0].cost(CLUSTER, dtype_bytes=v)),
    ("Redistribution.cost", "dtype_bytes", lambda v: PLAN.cost(CLUSTER, dtype_bytes=v)),
    (
        "redistribution_costs",
        "dtype_bytes",
        lambda v: taps.redistribution_costs([LAYOUT], [TARGET], CLUSTER, dtype_bytes=v),
    ),
    (
        "redistribution_costs optimal",
        "dtype_bytes",
        lambda v: taps.redistribution_costs(
            [LAYOUT], [TARGET], CLUSTER, dtype_bytes=v, planner="optimal"
        ),
    ),
    ("allreduce_costs", "dtype_bytes", lambda v: _allreduce(([0], [8], v))),
]


def _out_of_i64(v: int) -> bool:
    return not I64_MIN <= v <= I64_MAX


def _named(v: int) -> str:
    """How a message names `v`: its digits, or its size when Python would not print them."""
    return str(v) if abs(v).bit_length() <= 128 else f"{abs(v).bit_length()} bits"


@pytest.mark.parametrize(
    ("name", "valid", "error", "arg", "call"), INT_ARGS, ids=[a[0] for a in INT_ARGS]
)
@given(v=EDGE_INTS)
def test_int_arguments_raise_the_error_of_their_domain(name, valid, error, arg, call, v):
    try:
        call(v)
    except error as e:
        if _out_of_i64(v):
            assert arg in str(e) and _named(v) in str(e), str(e)
    else:
        assert not _out_of_i64(v), f"{name} accepted {v}"


@pytest.mark.parametrize(("name", "arg", "call"), FLOAT_ARGS, ids=[a[0] for a in FLOAT_ARGS])
@given(v=st.one_of(EDGE_INTS, st.floats(), st.sampled_from([-2.0, 0.0, 1e-300, float("inf")])))
def test_float_arguments_raise_topology_errors(name, arg, call, v):
    try:
        call(v)
    except taps.TopologyError as e:
        assert arg in str(e), str(e)
        if isinstance(v, int) and abs(v) >= 2**1024:
            assert _named(v) in str(e), str(e)
    else:
        # An infinite device memory is no limit (the paper's model); other infinities are refused.
        infinite_ok = arg == "device_memory" and v == float("inf")
        assert v > 0 and (v != float("inf") or infinite_ok), f"{name} accepted {v}"


LATENCY_ARGS: list[tuple[str, str, Callable[[object], object]]] = [
    ("Cluster intra_latency", "intra_latency", lambda v: taps.Cluster(2, 2, intra_latency=v)),
    ("Cluster inter_latency", "inter_latency", lambda v: taps.Cluster(2, 2, inter_latency=v)),
    (
        "Cluster.hierarchy latency",
        "latency of level 1",
        lambda v: taps.Cluster.hierarchy([(2, 60e9, 0.0), (2, 6e9, v)]),
    ),
]


@pytest.mark.parametrize(("name", "arg", "call"), LATENCY_ARGS, ids=[a[0] for a in LATENCY_ARGS])
@given(v=st.one_of(EDGE_INTS, st.floats(), st.sampled_from([-1e-9, 0.0, 1e-300, float("inf")])))
def test_latencies_are_finite_and_not_negative(name, arg, call, v):
    """As the float arguments above, but a latency of 0 is valid (none)."""
    try:
        call(v)
    except taps.TopologyError as e:
        assert arg in str(e), str(e)
        if isinstance(v, int) and abs(v) >= 2**1024:
            assert _named(v) in str(e), str(e)
    else:
        assert 0 <= v < float("inf"), f"{name} accepted {v}"


def test_valid_values_still_pass():
    """The same calls with ordinary values succeed, so the tests above reach the checks."""
    for _, valid, _, _, call in INT_ARGS:
        call(valid)
    for _, _, call in FLOAT_ARGS + LATENCY_ARGS:
        call(2.0)


@pytest.mark.parametrize(
    "call",
    [
        lambda: taps.Layout(["8"], [2], [0]),
        lambda: taps.Layout([8.0], [2], [0]),
        lambda: taps.Cluster("2", 2),
        lambda: taps.Cluster(2, 2, intra_bandwidth="fast"),
        lambda: taps.Layout([8], [2], [0], ["0"]),
        lambda: taps.Cluster.preset("dgx-v100", "2"),
        lambda: taps.Cluster.hierarchy([(2, "fast", 0.0)]),
        lambda: taps.enumerate_strategies("48", 4),
        lambda: allreduce_costs(np.array([[2**64]], dtype=object), ONE_MAP, [], CLUSTER),
        lambda: allreduce_costs(np.array([[2, 2]], dtype=np.uint64), ONE_MAP, [], CLUSTER),
    ],
)
def test_wrong_types_are_type_errors(call):
    with pytest.raises(TypeError):
        call()


def test_hierarchy_levels_are_any_sequence_of_three_numbers():
    """A saved plan's JSON gives a level as a list, `Cluster.levels` as a tuple: both are the
    same cluster; another length is the core's error, not a plain ValueError."""
    levels = [(4, 60e9, 2e-6), (2, 6e9, 5e-6)]
    assert taps.Cluster.hierarchy([list(x) for x in levels]) == taps.Cluster.hierarchy(levels)
    for level in [(4, 60e9), [4, 60e9, 2e-6, 1], ()]:
        with pytest.raises(taps.TopologyError, match=r"a level is three numbers .* value\(s\)"):
            taps.Cluster.hierarchy([level])


def test_negative_degree_rows_are_strategy_errors():
    with pytest.raises(taps.StrategyError, match="degrees"):
        allreduce_costs(np.array([[-2, 2]], dtype=np.int64), ONE_MAP, [], CLUSTER)


def test_getters_have_docstrings():
    """Every property and method of the Rust classes documents itself (help(), IDEs)."""
    for cls in (taps.Layout, taps.Cluster, taps.CommOp, taps.Redistribution, taps.Strategy):
        assert cls.__doc__, cls
        for name, member in vars(cls).items():
            if not name.startswith("_"):
                assert member.__doc__, f"{cls.__name__}.{name}"


def test_option_names_come_from_the_core():
    """COST_MODELS, COLLECTIVE_KINDS, PLANNERS and REPLICA_MODELS are the names the core parses,
    and no others."""
    assert _core.COST_MODELS == ("topology", "volume")
    assert _core.COLLECTIVE_KINDS == (
        "all_reduce",
        "all_gather",
        "all_to_all",
        "reduce_scatter",
        "collective_permute",
    )
    assert _core.PLANNERS == ("optimal", "paper")
    assert _core.REPLICA_MODELS == ("shared", "flat")
    for model in _core.COST_MODELS:
        for kind in _core.COLLECTIVE_KINDS[:-1]:
            dim = None if kind == "all_reduce" else 0
            assert CLUSTER.collective_cost(LAYOUT, kind, dim, model=model) >= 0
        # A permute is priced by its pairs, which a device dim does not give.
        with pytest.raises(taps.TopologyError, match="priced by the pairs"):
            CLUSTER.collective_cost(LAYOUT, "collective_permute", 0, model=model)
    for planner in _core.PLANNERS:
        assert taps.plan_redistribution(LAYOUT, TARGET, CLUSTER, planner).volume > 0
    for replicas in _core.REPLICA_MODELS:
        assert taps.Cluster(2, 2, replicas=replicas).replicas == replicas
    with pytest.raises(taps.TopologyError, match='expected "topology" or "volume"'):
        CLUSTER.collective_cost(LAYOUT, "all_reduce", model="bytes")
    with pytest.raises(taps.TopologyError, match='"reduce_scatter" or "collective_permute"'):
        CLUSTER.collective_cost(LAYOUT, "broadcast")
    with pytest.raises(taps.LayoutError, match='expected "optimal" or "paper"'):
        taps.plan_redistribution(LAYOUT, TARGET, planner="best")
    with pytest.raises(taps.TopologyError, match='expected "shared" or "flat"'):
        taps.Cluster(2, 2, replicas="copies")


def test_the_constructor_defaults_are_the_device_presets():
    """What the signature (and the stub) leaves None is the device's preset's, stated in the
    core: by default the dgx-v100's, with flat replicas."""
    import inspect

    params = inspect.signature(taps.Cluster).parameters
    assert params["intra_bandwidth"].default is None
    assert (params["replicas"].default, params["device"].default) == ("flat", "v100")
    assert taps.Cluster(2, 8) == taps.Cluster.preset("dgx-v100", 2)
    assert taps.Cluster(2, 8, device="h100") == taps.Cluster.preset("dgx-h100", 2)


def test_degrees_beyond_64_bits_of_devices_are_strategy_errors():
    """Each degree fits, their product does not: refused, not wrapped around."""
    with pytest.raises(taps.StrategyError, match="64 bits"):
        taps.Strategy([2**39, 2**25], [1, 0])
    with pytest.raises(taps.StrategyError, match="64 bits"):
        allreduce_costs(np.array([[2**39, 2**25]], dtype=np.int64), ONE_MAP, [], CLUSTER)
    assert taps.Strategy([2**39, 2**24], [1, 0]).num_devices == 2**63
