"""Cluster models: levels with bandwidth and latency, replica models, presets and TOML files,
priced against closed forms written from docs/core.md."""

import pickle

import pytest

import taps
from taps.cli import main

LINE = taps.Layout([64, 64], [4, 8], [1, 0])  # 32 devices, both device dims split a tensor dim


def test_presets():
    v100 = taps.Cluster.preset("dgx-v100", nodes=4)
    assert v100 == taps.Cluster(4, 8)  # the paper's bandwidths: the constructor's defaults
    assert (v100.replicas, v100.device_memory, v100.device.name) == ("flat", 32e9, "v100")
    assert (v100.intra_bandwidth, v100.inter_bandwidth) == (60e9, 6e9)
    h100 = taps.Cluster.preset("dgx-h100", 2)
    assert (h100.nodes, h100.devices_per_node, h100.replicas) == (2, 8, "flat")
    assert h100.levels == [(8, 450e9, 2e-6), (2, 400e9, 5e-6)]
    assert h100.device_memory == 80e9
    assert taps.Cluster.preset("dgx-h100").num_devices == 8
    # Every device kind has its preset, and a Cluster of that kind takes its numbers.
    assert len(taps._core.PRESETS) == len(taps._core.DEVICES)
    for name in taps._core.PRESETS:
        p = taps.Cluster.preset(name, 2)
        assert p.device_memory == p.device.memory
        if len(p.levels) == 2:
            assert p == taps.Cluster(2, p.devices_per_node, device=p.device.name)
    with pytest.raises(taps.TopologyError, match="unknown cluster preset"):
        taps.Cluster.preset("dgx-a200")
    with pytest.raises(taps.TopologyError):
        taps.Cluster.preset("dgx-h100", 3)  # 24 devices
    for c in (v100, h100):
        assert pickle.loads(pickle.dumps(c)) == c


def test_latency_is_paid_once_per_ring_step_at_its_level():
    fast = taps.Cluster(4, 8, intra_latency=0.0, inter_latency=0.0)
    slow = taps.Cluster(4, 8, intra_latency=2e-6, inter_latency=7e-6)
    s = 16 * 8 * 2  # bytes of a shard
    inside = slow.collective_cost(LINE, "all_gather", 0)  # device dim 0: the 8 GPUs of a node
    # A ring all_gather over 8 takes 7 steps, an all_reduce 2 * 7.
    assert inside == pytest.approx(fast.collective_cost(LINE, "all_gather", 0) + 7 * 2e-6)
    assert inside == pytest.approx(7 * 2e-6 + 7 * s / 60e9)
    across = slow.collective_cost(LINE, "all_gather", 1)  # device dim 1: across the 4 nodes
    assert across == pytest.approx(fast.collective_cost(LINE, "all_gather", 1) + 3 * 7e-6)
    assert slow.collective_cost(LINE, "all_gather", 1, model="volume") == 3 * s


def test_three_levels():
    # 4 GPUs per node, 2 nodes per pod, 4 pods: 32 devices.
    c = taps.Cluster.hierarchy([(4, 100e9, 1e-6), (2, 20e9, 2e-6), (4, 5e9, 3e-6)], None, "shared")
    assert (c.nodes, c.devices_per_node, c.num_devices) == (8, 4, 32)
    assert (c.intra_bandwidth, c.inter_bandwidth) == (100e9, 20e9)
    layout = taps.Layout([32, 32], [4, 2, 4], [2, 1])  # dims: 4 GPUs, 2 nodes, 4 pods
    s = 8 * 16 * 2
    # Along the GPUs: inside a node.
    assert c.collective_cost(layout, "all_gather", 0) == pytest.approx(3 * 1e-6 + 3 * s / 100e9)
    # Along the nodes of a pod: out of each node, shared by the groups with distinct data that
    # leave it (the map splits nothing along dim 0, so its 4 replicas share one transfer).
    ct = taps.inter_node_groups(layout, "all_gather", 4, 1)
    assert ct == 1
    assert c.collective_cost(layout, "all_gather", 1) == pytest.approx(2e-6 + s / (20e9 / ct))
    # Along the pods: out of each pod of 8, whose 2 nodes hold distinct blocks (dim 1).
    assert c.collective_cost(layout, "all_gather", 2) == pytest.approx(3 * 3e-6 + 3 * s / (5e9 / 2))
    assert pickle.loads(pickle.dumps(c)) == c
    assert "hierarchy" in repr(c)


def test_flat_replicas_send_one_transfer_per_copy():
    replicated = taps.Layout([64, 64], [4, 8], [1, -1])  # a copy on each GPU of a node
    shared = taps.Cluster(4, 8, replicas="shared", intra_latency=0.0, inter_latency=0.0)
    flat = taps.Cluster(4, 8, intra_latency=0.0, inter_latency=0.0)  # flat: the default
    assert flat.collective_cost(replicated, "all_gather", 1) == pytest.approx(
        8 * shared.collective_cost(replicated, "all_gather", 1)
    )
    # Distinct blocks on every GPU: the two models agree.
    assert flat.collective_cost(LINE, "all_gather", 1) == shared.collective_cost(
        LINE, "all_gather", 1
    )
    with pytest.raises(taps.TopologyError, match="replica"):
        taps.Cluster(4, 8, replicas="copies")


def test_bad_levels():
    for levels in ([], [(0, 1e9, 0.0)], [(3, 1e9, 0.0)], [(4, -1.0, 0.0)], [(4, 1e9, -1e-6)]):
        with pytest.raises(taps.TopologyError):
            taps.Cluster.hierarchy(levels)


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda: taps.Cluster(1, 8, 5e-320), "intra_bandwidth .* at least 1 byte per second"),
        (lambda: taps.Cluster(2, 8, inter_latency=1e308), "inter_latency .* 1e6, got 1e308$"),
        (lambda: taps.Cluster(1, 8, 5e-324), "at least 1 byte per second, got 5e-324$"),
        (lambda: taps.Cluster(1, 8, device_memory=1e-300), "at least 1 byte, got 1e-300$"),
        (lambda: taps.Cluster(2, 2**62), "more than 2\\^62 devices"),
    ],
)
def test_numbers_at_the_edge_are_refused_with_their_reason(make, why):
    """A subnormal bandwidth or a huge latency would price every plan at infinity (numpy
    overflow warnings, "inf s"); 2^63 devices do not fit the core's integers. The value is shown
    in exponent form, not as Rust's 309 digits."""
    with pytest.raises(taps.TopologyError, match=why):
        make()


def test_a_cluster_file_of_too_many_devices_says_so(tmp_path, capsys):
    path = tmp_path / "big.toml"
    path.write_text(f"[[levels]]\ncount = {2**62}\nbandwidth = 1e9\n[[levels]]\nbandwidth = 1e9\n")
    argv = ["search", "mlp", "--cluster", str(path), "--nodes", "2"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "make more than 2^62 devices" in err


TOML = """
device_memory = 40e9
replicas = "flat"

[[levels]]
count = 4
bandwidth = 100e9
latency = 1e-6

[[levels]]
count = 2
bandwidth = 20e9

[[levels]]
bandwidth = 5e9
latency = 3e-6
"""


def test_toml_file(tmp_path):
    path = tmp_path / "pods.toml"
    path.write_text(TOML)
    c = taps.Cluster.preset(str(path), nodes=8)
    # The pod level gives no latency: the V100 preset's network latency, as Cluster(n, d) has.
    network = taps.Cluster(2, 8).levels[1][2]
    assert network > 0
    want = taps.Cluster.hierarchy(
        [(4, 100e9, 1e-6), (2, 20e9, network), (4, 5e9, 3e-6)], 40e9, "flat"
    )
    assert c == want
    with pytest.raises(taps.TopologyError, match="do not fill"):
        taps.Cluster.preset(str(path), nodes=3)
    bad = tmp_path / "bad.toml"
    for text, message in (
        ("levels = 3", "levels"),
        ("[[levels]]\ncount = 8\nbandwidth = 'fast'", "bandwidth"),
        ("[[levels]\n", "not valid TOML"),
    ):
        bad.write_text(text)
        with pytest.raises(taps.TopologyError, match=message):
            taps.Cluster.preset(str(bad))
    with pytest.raises(taps.TopologyError, match="cannot read"):
        taps.Cluster.preset(str(tmp_path / "missing.toml"))
    bad.write_bytes(b"[[levels]]\ncount = 8 # \xff\n")
    with pytest.raises(taps.TopologyError, match=r"bad\.toml.* is not UTF-8 text"):
        taps.Cluster.preset(str(bad))
    # One level is one node: its count is the devices per node.
    one = tmp_path / "one.toml"
    one.write_text("[[levels]]\ncount = 8\nbandwidth = 450e9\n")
    nvlink = taps.Cluster(2, 8).levels[0][2]
    assert taps.Cluster.preset(str(one)) == taps.Cluster.hierarchy([(8, 450e9, nvlink)])
    one.write_text("[[levels]]\ncount = 8\nbandwidth = 450e9\nlatency = 0\n")
    assert taps.Cluster.preset(str(one)) == taps.Cluster.hierarchy([(8, 450e9, 0.0)])
    with pytest.raises(taps.TopologyError, match="one level is one node, not 2"):
        taps.Cluster.preset(str(one), nodes=2)


def test_hierarchy_fills_the_outermost_level_from_the_nodes():
    """The rule of presets and cluster files, in one place (the core): the outermost level holds
    as many units as the nodes fill."""
    levels = [(4, 100e9, 0.0), (2, 20e9, 0.0), (99, 5e9, 0.0)]
    c = taps.Cluster.hierarchy(levels, nodes=8)
    assert c.levels == [(4, 100e9, 0.0), (2, 20e9, 0.0), (4, 5e9, 0.0)]
    assert (c.nodes, c.num_devices) == (8, 32)
    assert taps.Cluster.preset("dgx-h100", 4) == taps.Cluster.hierarchy(
        taps.Cluster.preset("dgx-h100").levels, 80e9, "flat", "h100", nodes=4
    )
    for nodes, message in ((3, "do not fill units of 2 nodes"), (0, "do not fill")):
        with pytest.raises(taps.TopologyError, match=message):
            taps.Cluster.hierarchy(levels, nodes=nodes)
    with pytest.raises(taps.TopologyError, match="one level is one node"):
        taps.Cluster.hierarchy([(8, 60e9, 0.0)], nodes=4)


def test_optimal_planner_prices_by_the_cluster():
    """Where the inter-node link is slow, the optimal plan of the same pair may change with the
    cluster, and it never costs more than Algorithm 1 there."""
    a = taps.Layout([96, 32, 96], [16, 2], [1, 0, -1])
    b = taps.Layout([96, 32, 96], [16, 2], [0, 1, -1])
    for c in (taps.Cluster(4, 8), taps.Cluster.preset("dgx-h100", 4), taps.Cluster(16, 2)):
        best = taps.plan_redistribution(a, b, c, planner="optimal")
        paper = taps.plan_redistribution(a, b, c, planner="paper")
        assert best.cost(c) <= paper.cost(c)
        got = taps.redistribution_costs([a], [b], c, planner="optimal")[0, 0]
        assert got == best.cost(c)


def test_device_kinds():
    assert taps._core.DEVICES == ("v100", "a100", "h100", "h200", "b200", "tpu-v5p")
    h100 = taps.Device("h100")
    # The H100 SXM datasheet's dense bf16 peak, HBM3 bandwidth and memory.
    assert (h100.name, h100.peak_flops, h100.memory_bandwidth, h100.memory) == (
        "h100",
        989e12,
        3.35e12,
        80e9,
    )
    assert h100 == taps.Device("h100") != taps.Device("h200")
    assert len({taps.Device(n) for n in taps._core.DEVICES}) == len(taps._core.DEVICES)
    assert pickle.loads(pickle.dumps(h100)) == h100
    assert repr(h100) == "Device('h100', peak_flops=9.89e14, memory_bandwidth=3.35e12, memory=8e10)"
    with pytest.raises(AttributeError):
        h100.memory = 1.0  # type: ignore[misc]
    with pytest.raises(taps.TopologyError, match=r'^unknown device kind "H100": expected "v100"'):
        taps.Device("H100")
    c = taps.Cluster(2, 8, device="b200")
    assert c.device == taps.Device("b200")
    assert c != taps.Cluster(2, 8, device="h100")
    assert pickle.loads(pickle.dumps(c)) == c
    assert eval(repr(c), {"Cluster": taps.Cluster}) == c
    deep = taps.Cluster.hierarchy([(4, 1e11, 1e-6), (2, 2e10, 0.0), (2, 5e9, 0.0)], device="a100")
    assert deep.device.name == "a100"
    assert pickle.loads(pickle.dumps(deep)) == deep
    assert eval(repr(deep), {"Cluster": taps.Cluster}) == deep
    with pytest.raises(taps.TopologyError, match="unknown device kind"):
        taps.Cluster(1, 8, device="k80")  # type: ignore[arg-type]
