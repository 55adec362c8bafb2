"""Topology: taps.inter_node_groups (ct) and Cluster.collective_cost against the paper's examples
and a brute-force oracle; Cluster validation."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import oracle
import sim
import strategies_gen as sg
import taps
from taps.reproduce.cases import paper_cluster

# --------------------------------------------------------------------------- the paper's examples


def _dw_layout(order):
    """dW (axes in, out) of a MatMul with (d, r, c) = (8, 2, 2) on 32 devices.

    ``order`` lists the axes b/in/out from the innermost device dim outwards.
    """
    degree = {"b": 8, "in": 2, "out": 2}
    dim = {axis: k for k, axis in enumerate(order)}
    dm = [degree[axis] for axis in reversed(order)]  # outermost first
    return taps.Layout([16, 32], dm, [dim["in"], dim["out"]])


@pytest.mark.parametrize(
    ("order", "ct"),
    [
        (("out", "in", "b"), 4),  # d outermost
        (("in", "out", "b"), 4),
        (("b", "in", "out"), 0),  # d innermost
        (("b", "out", "in"), 0),
        (("in", "b", "out"), 2),  # d in the middle
        (("out", "b", "in"), 2),
    ],
)
def test_paper_dw_all_reduce(order, ct):
    lay = _dw_layout(order)
    assert lay.num_devices == 32
    assert taps.inter_node_groups(lay, "all_reduce", 8) == ct
    assert oracle.inter_node_groups(lay, "all_reduce", 8) == ct


def test_paper_effective_bandwidth_example():
    # 2 nodes x 8 devices; groups (0, 8), (1, 9), ...: the outer device dim of [2, 8]
    cl = paper_cluster(2, 8, intra_bandwidth=100e9, inter_bandwidth=12.5e9)
    lay = taps.Layout([4, 16], [2, 8], [1, 0])  # all 8 groups hold distinct data
    assert taps.inter_node_groups(lay, "all_gather", 8, device_dim=1) == 8
    v = (2 - 1) * (2 * 2) * 2  # (g-1) * s elements * 2 bytes
    assert cl.collective_cost(lay, "all_gather", device_dim=1) == pytest.approx(
        v / (12.5e9 / 8), rel=1e-12
    )
    assert cl.collective_cost(lay, "all_gather", device_dim=1, model="volume") == pytest.approx(
        v, rel=1e-12
    )
    # the same along the inner axis: pairs (0, 1), (2, 3), ... stay in a node
    lay2 = taps.Layout([16, 4], [8, 2], [1, 0])
    assert lay2.shard_shape == [2, 2]
    assert taps.inter_node_groups(lay2, "all_gather", 8, device_dim=0) == 0
    assert cl.collective_cost(lay2, "all_gather", device_dim=0) == pytest.approx(
        v / 100e9, rel=1e-12
    )
    # all_reduce over the outer dim (map uses only the inner one): 8 distinct groups cross
    lay3 = taps.Layout([4, 16], [2, 8], [-1, 0])
    assert taps.inter_node_groups(lay3, "all_reduce", 8) == 8
    v3 = 2 * (2 - 1) / 2 * (4 * 2) * 4
    assert cl.collective_cost(lay3, "all_reduce", dtype_bytes=4) == pytest.approx(
        v3 / (12.5e9 / 8), rel=1e-12
    )


def test_replicas_count_once():
    # all_gather along the outer dim of [2, 4, 2] with the tensor split only along it: every
    # node-local group holds the same data, so the crossing groups count once.
    lay = taps.Layout([8], [2, 4, 2], [2])
    assert taps.inter_node_groups(lay, "all_gather", 8, device_dim=2) == 1
    # ... but for all_reduce every group is distinct
    lay2 = taps.Layout([8], [2, 4, 2], [-1])  # one group of all 16 ranks
    assert taps.inter_node_groups(lay2, "all_reduce", 4) == 1
    assert taps.inter_node_groups(lay2, "all_reduce", 8) == 1
    assert taps.inter_node_groups(lay2, "all_reduce", 16) == 0
    lay3 = taps.Layout([8], [2, 4, 2], [0])
    assert taps.inter_node_groups(lay3, "all_reduce", 4) == 2  # groups over dims 1, 2 cross


def test_all_to_all_partial_node_factor():
    # 16 devices, 4 per node, all_to_all along [16]: p = 16 members, k = 4 in a node
    cl = paper_cluster(4, 4, intra_bandwidth=60e9, inter_bandwidth=6e9)
    lay = taps.Layout([32, 16], [16], [0, -1])
    ct = taps.inter_node_groups(lay, "all_to_all", 4, device_dim=0)
    assert ct == oracle.inter_node_groups(lay, "all_to_all", 4, 0) == 1
    s = 2 * 16
    v = 15 / 16 * s * 2
    want = 4 * 12 / 15 * v / (6e9 / ct)
    assert cl.collective_cost(lay, "all_to_all", device_dim=0) == pytest.approx(want, rel=1e-12)


# --------------------------------------------------------------------------- properties


@st.composite
def collective_cases(draw):
    t = draw(sg.layouts())
    _, dm, tm = t
    used = [m for m in tm if m >= 0]
    kinds = ["all_reduce"] + (["all_gather", "all_to_all"] if used else [])
    kind = draw(st.sampled_from(kinds))
    k = None if kind == "all_reduce" else draw(st.sampled_from(used))
    n = sim.num_devices(dm)
    L = draw(st.sampled_from([2**e for e in range(n.bit_length()) if n % 2**e == 0]))
    return t, kind, k, L


@settings(max_examples=400)
@given(collective_cases())
def test_inter_node_groups_matches_brute_force(case):
    t, kind, k, L = case
    lay = sg.to_layout(t)
    got = taps.inter_node_groups(lay, kind, L, device_dim=k)
    assert type(got) is int
    assert got == oracle.inter_node_groups(t, kind, L, k), (t, kind, k, L)


@settings(max_examples=300)
@given(
    collective_cases(),
    st.sampled_from([1, 2, 4]),
    st.sampled_from([(60e9, 6e9), (100e9, 12.5e9), (1e9, 1e9)]),
)
def test_collective_cost_matches_oracle(case, dtype_bytes, bw):
    t, kind, k, L = case
    n = sim.num_devices(t[1])
    cl = paper_cluster(n // L, L, intra_bandwidth=bw[0], inter_bandwidth=bw[1])
    lay = sg.to_layout(t)
    for model in ("topology", "volume"):
        got = cl.collective_cost(lay, kind, device_dim=k, dtype_bytes=dtype_bytes, model=model)
        want = oracle.cluster_cost(cl, t, kind, device_dim=k, dtype_bytes=dtype_bytes, model=model)
        assert got == pytest.approx(want, rel=1e-9, abs=1e-300), (t, kind, k, L, model)


@settings(max_examples=100)
@given(collective_cases())
def test_single_node_never_crosses(case):
    t, kind, k, _ = case
    n = sim.num_devices(t[1])
    assert taps.inter_node_groups(sg.to_layout(t), kind, n, device_dim=k) == 0


# --------------------------------------------------------------------------- Cluster


def test_cluster_attributes():
    cl = taps.Cluster(2, 8)
    assert cl.nodes == 2
    assert cl.devices_per_node == 8
    assert cl.num_devices == 16
    assert cl.intra_bandwidth == 60e9
    assert cl.inter_bandwidth == 6e9
    # Engine-faithful defaults: the V100's memory, flat replicas, latency at every level.
    assert (cl.device_memory, cl.replicas, cl.device.name) == (32e9, "flat", "v100")
    assert all(latency > 0 for _, _, latency in cl.levels)
    assert paper_cluster(2, 8).device_memory is None  # the paper's model: no limit
    cl2 = taps.Cluster(4, 2, intra_bandwidth=1e9, inter_bandwidth=2e8, device_memory=2**30)
    assert (cl2.num_devices, cl2.intra_bandwidth, cl2.inter_bandwidth) == (8, 1e9, 2e8)
    assert cl2.device_memory == 2**30
    with pytest.raises((AttributeError, TypeError)):
        cl.nodes = 3
    assert cl.nodes == 2


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((0, 8), {}),
        ((2, 0), {}),
        ((-1, 8), {}),
        ((2, -8), {}),
        ((2, 8), {"intra_bandwidth": 0.0}),
        ((2, 8), {"inter_bandwidth": 0.0}),
        ((2, 8), {"intra_bandwidth": -1e9}),
        ((2, 8), {"inter_bandwidth": -6e9}),
    ],
)
def test_bad_cluster(args, kwargs):
    with pytest.raises(taps.TopologyError) as info:
        taps.Cluster(*args, **kwargs)
    assert isinstance(info.value, ValueError)


def test_bad_collective_inputs():
    cl = taps.Cluster(2, 4)
    lay = taps.Layout([8, 8], [2, 4], [1, 0])
    with pytest.raises(taps.TopologyError):
        cl.collective_cost(taps.Layout([8, 8], [4], [0, -1]), "all_gather", device_dim=0)
    with pytest.raises(taps.TopologyError):
        cl.collective_cost(lay, "broadcast", device_dim=0)
    with pytest.raises(taps.TopologyError):
        cl.collective_cost(lay, "all_gather", device_dim=0, model="bogus")
    with pytest.raises(taps.TopologyError):
        taps.inter_node_groups(lay, "broadcast", 4, device_dim=0)
    with pytest.raises(taps.TapsError):
        cl.collective_cost(lay, "all_reduce", device_dim=0)
    for kind in ("all_gather", "all_to_all"):
        with pytest.raises(taps.TapsError):
            cl.collective_cost(lay, kind)
        with pytest.raises(taps.TapsError):
            cl.collective_cost(lay, kind, device_dim=2)
    with pytest.raises(taps.TapsError):
        taps.inter_node_groups(lay, "all_reduce", 4, device_dim=0)
    with pytest.raises(taps.TapsError):
        taps.inter_node_groups(lay, "all_gather", 4, device_dim=5)
    with pytest.raises(taps.TapsError):
        taps.inter_node_groups(lay, "all_gather", 4)
    with pytest.raises(taps.TapsError):
        taps.inter_node_groups(lay, "all_gather", 0, device_dim=0)


def spec_closed_form_ct(t, kind, L, k):
    """The closed form of docs/conventions.md#ct (power-of-two layouts, node = first L ranks)."""
    _, dm, tm = t
    h = len(dm)
    e = []
    inner = 1
    for j in range(h):
        d = sim.dev_size(dm, j)
        e.append(min(d, max(1, L // inner)))
        inner *= d
    gdims = oracle.group_dims(t, kind, k)
    if all(e[j] == sim.dev_size(dm, j) for j in gdims):
        return 0
    if kind == "all_reduce":
        data = [j for j in range(h) if j not in gdims]
    else:
        data = [j for j in {m for m in tm if m >= 0} if j not in gdims]
    out = 1
    for j in data:
        out *= e[j]
    return out


@settings(max_examples=300)
@given(collective_cases())
def test_oracle_agrees_with_spec_closed_form(case):
    """The brute force and the closed form of docs/conventions.md agree (a check of the
    reference itself)."""
    t, kind, k, L = case
    assert oracle.inter_node_groups(t, kind, L, k) == spec_closed_form_ct(t, kind, L, k)


def test_cluster_pickle_and_equality():
    import pickle

    cl = taps.Cluster(4, 2, intra_bandwidth=1e9, inter_bandwidth=2e8, device_memory=2**30)
    back = pickle.loads(pickle.dumps(cl))
    assert back == cl
    assert back != taps.Cluster(4, 2)
    assert (back.nodes, back.devices_per_node, back.device_memory) == (4, 2, 2**30)


def test_negative_arguments_raise_taps_errors():
    """docs/core.md: every entry point validates its input and raises a taps error."""
    cl = taps.Cluster(2, 2)
    lay = taps.Layout([4], [4], [0])
    with pytest.raises(taps.TapsError):
        taps.inter_node_groups(lay, "all_gather", -8, device_dim=0)
    with pytest.raises(taps.TapsError):
        taps.inter_node_groups(lay, "all_gather", 2, device_dim=-1)
    with pytest.raises(taps.TapsError):
        cl.collective_cost(lay, "all_gather", device_dim=-1)
    with pytest.raises(taps.TapsError):
        cl.collective_cost(lay, "all_gather", device_dim=0, dtype_bytes=-1)
