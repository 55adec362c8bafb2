"""``taps calibrate``: fit a cluster's per-level latency and bandwidth to measured collective
times and write the cluster TOML file (docs/calibrate.md)."""

from __future__ import annotations

import argparse
import re
from typing import cast

from rich.console import Console
from rich.table import Table

from taps._core import DEVICES, Cluster
from taps._support.outputs import Outputs
from taps.calibrate import Measurement, cluster_toml, fit, read_csv, read_nccl_tests
from taps.calibrate.measurements import KINDS, Kind
from taps.cli.args import integer
from taps.errors import ArgumentError, CalibrationError


def _read(name: str) -> str:
    try:
        with open(name, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise CalibrationError(f"cannot read {name!r}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise CalibrationError(f"{name!r} is not UTF-8 text") from None


def nccl_run(text: str) -> tuple[Kind, int, int, str]:
    """``all_reduce:2x8:FILE`` -> the collective, nodes, devices per node and file."""
    match = re.fullmatch(r"([a-z_]+):(\d+)x(\d+):(.+)", text)
    if not match or match[1] not in KINDS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not COLLECTIVE:NODESxDEVICES:FILE with a collective of "
            f"{', '.join(KINDS)}, e.g. all_reduce:2x8:allreduce.txt"
        )
    return cast(Kind, match[1]), int(match[2]), int(match[3]), match[4]


def _base(args: argparse.Namespace) -> Cluster:
    """The cluster whose structure, device and replica model the fit keeps."""
    if args.cluster is not None:
        if args.devices_per_node is not None or args.device is not None:
            raise ArgumentError(
                "--cluster gives the structure and device: leave out "
                "--devices-per-node and --device"
            )
        return Cluster.preset(args.cluster, 1)
    if args.devices_per_node is None:
        raise ArgumentError("give --devices-per-node (and --device), or --cluster")
    return Cluster(1, args.devices_per_node, device=args.device or "v100")


def run(args: argparse.Namespace, console: Console) -> None:
    base = _base(args)
    # Checked (a temporary file made beside each) before the fit, written after it.
    with Outputs(args.out, args.json) as out:
        measurements: list[Measurement] = []
        for name in args.measurements:
            measurements += read_csv(_read(name), name)
        for kind, nodes, per_node, name in args.nccl_tests:
            measurements += read_nccl_tests(_read(name), name, kind, nodes, per_node)
        if not measurements:
            raise ArgumentError("give a measurements CSV file or --nccl-tests runs")
        result = fit(measurements, base)
        if args.out:
            comment = (
                f"fitted by taps calibrate to {len(measurements)} measurements "
                f"(relative RMS error {result.relative_rms:.2%})"
            )
            out[args.out].write_text(cluster_toml(result.cluster, comment))
        if args.json:
            out[args.json].write_json(result.to_dict())
        out.commit()
    table = Table(title=f"fitted levels ({len(measurements)} measurements)")
    for column in ("level", "parts", "bandwidth (GB/s)", "latency (us)", "measurements"):
        table.add_column(column, justify="right")
    for j, ((parts, bandwidth, latency), n) in enumerate(
        zip(result.cluster.levels, result.measured, strict=True)
    ):
        table.add_row(
            str(j),
            str(parts),
            f"{bandwidth / 1e9:.4g}",
            f"{latency * 1e6:.4g}",
            str(n) if n else "none: kept",
        )
    console.print(table)
    console.print(f"relative error (RMS): {result.relative_rms:.2%}", markup=False)
    for path in (args.out, args.json):
        if path:
            console.print(f"wrote {path}", markup=False)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``taps calibrate`` to the CLI."""
    p = subparsers.add_parser(
        "calibrate",
        help="fit a cluster's latencies and bandwidths to measured collective times",
        description="Fit every level's latency and bandwidth of a cluster to measured "
        "collective times (a CSV file with the columns collective, nodes, devices_per_node, "
        "bytes, seconds; or nccl-tests output) by least squares on taps' own pricing, and "
        "write the cluster TOML file (docs/calibrate.md).",
    )
    p.add_argument("measurements", nargs="*", metavar="MEASUREMENTS.csv", help="CSV files")
    p.add_argument(
        "--nccl-tests",
        type=nccl_run,
        action="append",
        default=[],
        metavar="COLLECTIVE:NODESxDEVICES:FILE",
        help="the output of an nccl-tests run (e.g. all_reduce_perf) of COLLECTIVE on NODES "
        "nodes with DEVICES devices each; repeatable",
    )
    p.add_argument(
        "--devices-per-node",
        type=integer,
        default=None,
        help="devices in one node of the cluster fitted (two levels: the node, the network)",
    )
    p.add_argument(
        "--device",
        choices=DEVICES,
        default=None,
        help="the kind of device of the cluster fitted (v100)",
    )
    p.add_argument(
        "--cluster",
        metavar="NAME|FILE.toml",
        default=None,
        help="a preset or cluster file whose levels, device and replica model the fit keeps "
        "(the levels no measurement reaches keep their numbers)",
    )
    p.add_argument("--out", metavar="FILE.toml", default=None, help="write the cluster file")
    p.add_argument("--json", metavar="FILE", default=None, help="write the fit as JSON")
    p.set_defaults(run=run)
