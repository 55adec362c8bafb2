"""``taps search``: the strategy of every operator of a model."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console

from taps import models
from taps._core import COST_MODELS
from taps.cli.args import add_cluster_args, cluster, load_model, memory_size
from taps.reports import collectives_table, comparison_table, result_dict, strategy_table
from taps.search import compare, search


def run(args: argparse.Namespace, console: Console) -> None:
    graph = load_model(args.model, args.batch)
    c = cluster(args, args.memory)
    if args.cost_model == "both":
        comparison = compare(graph, c, time_limit=args.time_limit)
        results = [comparison.topology, comparison.volume]
    else:
        comparison = None
        results = [search(graph, c, args.cost_model, time_limit=args.time_limit)]
    for result in results:
        console.print(strategy_table(result))
        if args.collectives:
            console.print(collectives_table(result))
    if comparison is not None:
        console.print(comparison_table(comparison))
    if args.json:
        data: dict[str, Any] = {r.cost_model: result_dict(r) for r in results}
        if comparison is not None:
            data["comparison"] = {
                "volume_under_topology": comparison.volume_under_topology,
                "topology_under_volume": comparison.topology_under_volume,
                "saving_percent": comparison.saving,
            }
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2)
        console.print(f"wrote {args.json}")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``taps search`` to the CLI."""
    p = subparsers.add_parser(
        "search",
        help="search the strategy of every operator of a model",
        description="Search the best intra-operator strategy of every operator of MODEL on a "
        f"cluster. MODEL is one of {', '.join(models.names())} or a graph JSON file.",
    )
    p.add_argument("model", metavar="MODEL", help="built-in model name or graph JSON file")
    add_cluster_args(p)
    p.add_argument("--batch", type=int, default=None, help="batch size (model default)")
    p.add_argument(
        "--memory",
        type=memory_size,
        default=None,
        help="device memory limit, e.g. 80GB or 16GiB (none)",
    )
    p.add_argument(
        "--cost-model",
        choices=(*COST_MODELS, "both"),
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
    p.set_defaults(run=run)
