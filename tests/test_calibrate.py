"""`taps calibrate`: measurements generated from a known cluster by the core's pricing of the whole
cluster (with noise) are fitted back; nccl-tests output parses; bad files are one line, exit 2."""

import json
import random
from pathlib import Path

import pytest

import taps
from taps.calibrate import Measurement, fit, read_nccl_tests
from taps.cli import main

#: What nccl-tests' all_reduce_perf prints (2.x; written in its format), on 2 nodes of 8 GPUs:
#: sizes in bytes, times in microseconds (out of place, then in place).
NCCL_TESTS = (Path(__file__).parent / "data" / "all_reduce_perf.txt").read_text()

TRUE = taps.Cluster.preset("dgx-h100", 4)


def _layout(kind: str, bytes_: int, devices: int) -> tuple[taps.Layout, float]:
    """A layout of all the devices of TRUE (4 nodes of 8) over which `kind` of `bytes_` (as
    nccl-tests counts them) runs along device dim 0 of `devices` consecutive ranks."""
    rest = TRUE.num_devices // devices
    matrix = [rest, devices]
    if kind in ("all_reduce", "reduce_scatter"):
        # The other device dim splits the tensor: its groups hold other data.
        return taps.Layout([rest, bytes_], matrix, [1, -1]), 1.0
    tensor_map = [1, 0]
    scale = 1.0 / devices if kind == "all_gather" else 1.0
    return taps.Layout([rest, bytes_ * devices], matrix, tensor_map), scale


def _measured(
    kind: str, nodes: int, bytes_: int, noise: random.Random, sigma: float = 0.03
) -> Measurement:
    """`kind` over the `nodes` first nodes' every device, priced by the core on TRUE, with 3%
    noise: on 4 nodes a group of 1 or 2 nodes runs beside 4 or 2 like it, alone on its nodes."""
    devices = 8 * nodes
    layout, dtype = _layout(kind, bytes_, devices)
    if kind == "all_reduce":
        # An all_reduce runs over the dims the map leaves unused: only the group's.
        seconds = TRUE.collective_cost(layout, "all_reduce", dtype_bytes=dtype)
    else:
        seconds = TRUE.collective_cost(layout, kind, 0, dtype)
    return Measurement(kind, nodes, 8, bytes_, seconds * (1 + noise.gauss(0, sigma)))


def test_measurements_of_a_known_cluster_are_fitted_back():
    noise = random.Random(7)
    ms = [
        _measured(kind, nodes, 2**e, noise)
        for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
        for nodes in (1, 2, 4)
        for e in range(10, 31, 4)
    ]
    result = fit(ms, taps.Cluster(1, 8, device="h100"))
    assert result.measured == (len(ms) // 3, 2 * len(ms) // 3)
    for (_, bandwidth, latency), (_, want_bw, want_lat) in zip(
        result.cluster.levels, TRUE.levels, strict=True
    ):
        assert bandwidth == pytest.approx(want_bw, rel=0.05)
        assert latency == pytest.approx(want_lat, rel=0.15)
    assert 0.01 < result.relative_rms < 0.06  # the noise, not a bad model
    assert result.cluster.device == TRUE.device and result.cluster.replicas == "flat"
    # Without noise the fit is exact.
    exact = [_measured(m.collective, m.nodes, m.bytes, noise, 0.0) for m in ms]
    levels = fit(exact, taps.Cluster(1, 8, device="h100")).cluster.levels
    assert [x for level in levels for x in level[1:]] == pytest.approx(
        [x for level in TRUE.levels for x in level[1:]], rel=1e-9
    )


def test_a_level_no_measurement_reaches_keeps_its_numbers_and_an_undetermined_one_is_refused():
    ms = [_measured("all_gather", 1, 2**e, random.Random(e)) for e in (12, 20, 28)]
    base = taps.Cluster(1, 8, device="h100", inter_bandwidth=1e9, inter_latency=1e-3)
    result = fit(ms, base)
    assert result.measured == (3, 0)
    assert result.cluster.levels[1][1:] == (1e9, 1e-3)
    tiny = [Measurement("all_reduce", 1, 8, 8, 1e-5), Measurement("all_reduce", 1, 8, 16, 1e-5)]
    with pytest.raises(taps.TapsError, match="do not determine the bandwidth of level 0"):
        fit(tiny, base)


def test_nccl_tests_output_parses_and_fits(tmp_path, capsys):
    ms = read_nccl_tests(NCCL_TESTS, "ar.txt", "all_reduce", 2, 8)
    assert [m.bytes for m in ms] == [4**k * 2**20 for k in range(6)]
    assert ms[0].seconds == pytest.approx(31.52e-6)
    assert {(m.collective, m.nodes, m.devices_per_node) for m in ms} == {("all_reduce", 2, 8)}
    path = tmp_path / "ar.txt"
    path.write_text(NCCL_TESTS)
    intra = tmp_path / "intra.csv"
    intra.write_text(
        "collective,nodes,devices_per_node,bytes,seconds\n"
        # A ring all_reduce over 8 devices: 2 x 7 steps of 2 us each, 2 x 7/8 of the bytes.
        + "".join(
            f"all_reduce,1,8,{b},{14 * 2e-6 + 2 * 7 / 8 * b / 450e9}\n" for b in (2**16, 2**28)
        )
    )
    out, doc = tmp_path / "fitted.toml", tmp_path / "fit.json"
    argv = [
        "calibrate",
        str(intra),
        "--nccl-tests",
        f"all_reduce:2x8:{path}",
        "--devices-per-node",
        "8",
        "--device",
        "h100",
        "--out",
        str(out),
        "--json",
        str(doc),
    ]
    assert main(argv) == 0
    fitted = taps.Cluster.preset(str(out), 2)
    assert fitted.device.name == "h100" and fitted.device_memory == 80e9
    assert fitted.levels[0][1:] == pytest.approx((450e9, 2e-6))
    # The large all_reduces run at about 2 * (15/16) * 1 GiB / 4.88 ms out of each node.
    assert fitted.inter_bandwidth == pytest.approx(2 * 15 / 16 * 2**30 / 4882.1e-6, rel=0.05)
    data = json.loads(doc.read_text())
    assert len(data["measurements"]) == 8 and data["levels"][1]["measured"] == 6
    assert "relative error" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("text", "extra", "message"),
    [
        ("kind,bytes\n", [], "missing collective, nodes, devices_per_node, seconds"),
        (
            "collective,nodes,devices_per_node,bytes,seconds\nall_reduce,1,8,1e3,1\n",
            [],
            "m.csv, line 2: bytes must be a whole number, got '1e3'",
        ),
        (
            "collective,nodes,devices_per_node,bytes,seconds\nbroadcast,1,8,64,1\n",
            [],
            "m.csv, line 2: unknown collective 'broadcast'",
        ),
        (
            "collective,nodes,devices_per_node,bytes,seconds\nall_reduce,3,8,64,1\n",
            [],
            "nodes must be a power of two, got 3",
        ),
        (
            "collective,nodes,devices_per_node,bytes,seconds\nall_reduce,1,8,64,-1\n",
            [],
            "seconds must be a positive time",
        ),
        (
            "collective,nodes,devices_per_node,bytes,seconds\nall_reduce,1,8,64,1e-320\n",
            [],
            "seconds must be a positive time of a measured collective (1e-12 to 1e6 s)",
        ),
        (
            "collective,nodes,devices_per_node,bytes,seconds\nall_reduce,1,8,64,1e308\n",
            [],
            "seconds must be a positive time of a measured collective (1e-12 to 1e6 s)",
        ),
        (
            f"collective,nodes,devices_per_node,bytes,seconds\nall_reduce,1,8,{2**62},1\n",
            [],
            "bytes must be a positive count of at most 2**50",
        ),
        (
            "collective,nodes,devices_per_node,bytes,seconds\nall_reduce,1,8,64,1\n",
            ["--out", "/no/such/dir/c.toml"],
            "No such file or directory",
        ),
        ("collective,nodes,devices_per_node,bytes,seconds\n", [], "m.csv: no measurements"),
        (
            "collective,nodes,devices_per_node,bytes,seconds\nall_reduce,1,16,64,1\n",
            [],
            "a group of 16 devices per node does not fit nodes of 8",
        ),
        ("\xff", [], "is not UTF-8 text"),
    ],
)
def test_bad_files_are_one_line_and_exit_2(tmp_path, capsys, text, extra, message):
    path = tmp_path / "m.csv"
    path.write_bytes(text.encode("latin-1"))
    code = main(["calibrate", str(path), "--devices-per-node", "8", *extra])
    out, err = capsys.readouterr()
    # Nothing printed before the error: output paths are checked before the fit.
    assert code == 2 and out == "" and err.count("\n") == 1 and message in err, err


def test_bad_nccl_tests_arguments_are_one_line(tmp_path, capsys):
    path = tmp_path / "ar.txt"
    path.write_text("# only comments\n")
    with pytest.raises(SystemExit, match="2"):
        main(["calibrate", "--devices-per-node", "8", "--nccl-tests", "allreduce:2x8:x"])
    assert "is not COLLECTIVE:NODESxDEVICES:FILE" in capsys.readouterr().err
    for argv, message in [
        (["--nccl-tests", f"all_reduce:2x8:{path}"], "no nccl-tests result rows"),
        (["--nccl-tests", f"all_reduce:2x8:{tmp_path / 'none'}"], "cannot read"),
        ([], "give a measurements CSV file or --nccl-tests runs"),
    ]:
        assert main(["calibrate", "--devices-per-node", "8", *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
    assert main(["calibrate", "--nccl-tests", f"all_reduce:2x8:{path}"]) == 2
    assert "give --devices-per-node" in capsys.readouterr().err
