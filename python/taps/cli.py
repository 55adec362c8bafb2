"""The ``taps`` command line: ``taps plan``, ``taps search`` and ``taps reproduce``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from rich.console import Console

from taps import models, reproduce
from taps._core import Cluster, GraphError, Layout, TapsError, plan_redistribution
from taps.graph import Graph
from taps.reports import (
    collectives_table,
    comparison_table,
    layout_text,
    plan_table,
    result_dict,
    strategy_table,
)
from taps.search import compare, search


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line on stderr and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def _ints(text: str) -> list[int]:
    """``"1024,1024"`` or ``"[1024, 1024]"`` -> ``[1024, 1024]``."""
    try:
        values = json.loads(text if text.strip().startswith("[") else f"[{text}]")
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of integers") from None
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of integers")
    return values


def _matrix_map(text: str) -> tuple[list[int], list[int]]:
    """``"[2,8]:[1,0]"`` -> device matrix and tensor map."""
    matrix, sep, tensor_map = text.partition(":")
    if not sep:
        raise argparse.ArgumentTypeError(
            f'{text!r} is not DEVICE_MATRIX:TENSOR_MAP, e.g. "[2,8]:[1,0]"'
        )
    return _ints(matrix), _ints(tensor_map)


def _add_cluster_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=int, required=True, help="number of nodes")
    p.add_argument("--devices-per-node", type=int, required=True, help="devices in one node")
    p.add_argument(
        "--intra-bandwidth", type=float, default=60e9, help="bytes/s inside a node (60e9)"
    )
    p.add_argument("--inter-bandwidth", type=float, default=6e9, help="bytes/s between nodes (6e9)")


def _cluster(args: argparse.Namespace, memory: float | None = None) -> Cluster:
    return Cluster(
        args.nodes, args.devices_per_node, args.intra_bandwidth, args.inter_bandwidth, memory
    )


def _plan(args: argparse.Namespace, console: Console) -> None:
    (dm_a, map_a), (dm_b, map_b) = args.source, args.target
    cluster = _cluster(args)
    a = Layout(args.shape, dm_a, map_a)
    b = Layout(args.target_shape or args.shape, dm_b, map_b)
    plan = plan_redistribution(a, b)
    console.print(f"from    {layout_text(a)}")
    console.print(f"to      {layout_text(b)}")
    console.print(f"unified {layout_text(plan.source)}")
    console.print(f"        {layout_text(plan.target)}")
    console.print(plan_table(plan, cluster, args.dtype_bytes))


_UNITS = {
    "": 1,
    "B": 1,
    "KB": 1e3,
    "MB": 1e6,
    "GB": 1e9,
    "TB": 1e12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}


def _bytes(text: str) -> float:
    """``"80GB"``, ``"16GiB"`` or ``"1.6e10"`` -> bytes."""
    t = text.strip().upper()
    number = t.rstrip("KMGTIB")
    unit = t[len(number) :]
    try:
        value = float(number) * _UNITS[unit]
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a memory size such as 80GB, 16GiB or 1.6e10"
        ) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"memory size {text!r} is not positive")
    return value


def load_model(name: str, batch: int | None) -> Graph:
    """A built-in model by name, or a graph JSON file."""
    if name.endswith(".json"):
        try:
            with open(name, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise GraphError(f"cannot read graph file {name!r}: {e.strerror}") from None
        return Graph.from_json(text)
    if name.lower() in models.names() or name.lower().startswith("megatron-"):
        return models.by_name(name, batch)
    raise GraphError(
        f"unknown model {name!r}: expected a graph JSON file or one of {', '.join(models.names())}"
    )


def _search(args: argparse.Namespace, console: Console) -> None:
    graph = load_model(args.model, args.batch)
    cluster = _cluster(args, args.memory)
    if args.cost_model == "both":
        comparison = compare(graph, cluster, time_limit=args.time_limit)
        results = [comparison.topology, comparison.volume]
    else:
        comparison = None
        results = [search(graph, cluster, args.cost_model, time_limit=args.time_limit)]
    for result in results:
        console.print(strategy_table(result))
        if args.collectives:
            console.print(collectives_table(result))
    if comparison is not None:
        console.print(comparison_table(comparison))
    if args.json:
        data = {r.cost_model: result_dict(r) for r in results}
        if comparison is not None:
            data["comparison"] = {
                "volume_under_topology": comparison.volume_under_topology,
                "topology_under_volume": comparison.topology_under_volume,
                "reduction_percent": comparison.reduction,
            }
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2)
        console.print(f"wrote {args.json}")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="taps",
        description="Topology-aware intra-operator parallelism strategy search.",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p = sub.add_parser(
        "plan",
        help="plan the redistribution of one tensor between two layouts",
        description="Plan the redistribution of a tensor between two layouts and price it.",
    )
    p.add_argument(
        "--from",
        dest="source",
        type=_matrix_map,
        required=True,
        metavar="DM:MAP",
        help='source device matrix and tensor map, e.g. "[2,8]:[1,0]"',
    )
    p.add_argument(
        "--to",
        dest="target",
        type=_matrix_map,
        required=True,
        metavar="DM:MAP",
        help="target device matrix and tensor map",
    )
    p.add_argument("--shape", type=_ints, required=True, help="tensor shape, e.g. 1024,1024")
    p.add_argument(
        "--target-shape",
        type=_ints,
        default=None,
        help="the consumer's shape if it reshapes the tensor (same element count)",
    )
    p.add_argument("--dtype-bytes", type=float, default=2, help="bytes per element (2)")
    _add_cluster_args(p)
    p.set_defaults(run=_plan)

    p = sub.add_parser(
        "search",
        help="search the strategy of every operator of a model",
        description="Search the best intra-operator strategy of every operator of MODEL on a "
        f"cluster. MODEL is one of {', '.join(models.names())} or a graph JSON file.",
    )
    p.add_argument("model", metavar="MODEL", help="built-in model name or graph JSON file")
    _add_cluster_args(p)
    p.add_argument("--batch", type=int, default=None, help="batch size (model default)")
    p.add_argument(
        "--memory", type=_bytes, default=None, help="device memory limit, e.g. 80GB or 16GiB (none)"
    )
    p.add_argument(
        "--cost-model",
        choices=("topology", "volume", "both"),
        default="topology",
        help="what the search minimises; both compares the two (topology)",
    )
    p.add_argument("--time-limit", type=float, default=None, help="SCIP time limit in seconds")
    p.add_argument(
        "--collectives",
        action="store_true",
        help="also list every collective of the chosen strategies",
    )
    p.add_argument("--json", metavar="FILE", default=None, help="write the result(s) as JSON")
    p.set_defaults(run=_search)
    reproduce.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # Wide enough for the tables when the output is a file or a pipe.
    console = Console(width=None if sys.stdout.isatty() else 160)
    try:
        args.run(args, console)
    except TapsError as e:
        sys.stderr.write(f"taps {args.command}: error: {e}\n")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
