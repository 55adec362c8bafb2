"""``taps verify``: search a model's plan, then run it on an engine and check it against taps'
prediction (exit code 1 on any mismatch)."""

from __future__ import annotations

import argparse

from rich.console import Console

from taps import models
from taps.cli.args import add_cluster_args, cluster, load_model
from taps.search import search
from taps.verify import VerifyResult, verify_graph
from taps.verify.gspmd import compare_gspmd
from taps.verify.program import TOLERANCE


def write_json(path: str, text: str, console: Console) -> None:
    """Write ``text`` to ``path`` whole (a file is never left half written)."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    console.print(f"wrote {path}")


def report(result: VerifyResult, console: Console, json_path: str | None, title: str) -> int:
    """Print a verification and write its JSON; the exit code: 1 if it failed."""
    console.print(result.table(title))
    for line in result.mismatches:
        console.print(f"[red]{line}[/]")
    if json_path:
        write_json(json_path, result.to_json(), console)
    return 0 if result.ok else 1


def run(args: argparse.Namespace, console: Console) -> int:
    graph = load_model(args.model, args.batch)
    c = cluster(args)
    result = search(graph, c)
    verified = verify_graph(graph, c, result.strategies, args.dtype)
    if args.gspmd:
        console.print(compare_gspmd(graph, c, result.strategies, args.dtype).table())
    return report(verified, console, args.json, f"{graph.name} on {c.nodes} x {c.devices_per_node}")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``taps verify`` to the CLI."""
    p = subparsers.add_parser(
        "verify",
        help="run a model's plan on an engine and check it against taps' prediction",
        description="Search MODEL's plan, run it on simulated XLA CPU devices exactly as taps "
        "plans it, and compare every collective with taps' prediction and the results with an "
        f"unsharded run. MODEL is one of {', '.join(models.names())} or a graph JSON file. "
        "Exit code 1 on any mismatch.",
    )
    p.add_argument("model", metavar="MODEL", help="built-in model name or graph JSON file")
    add_cluster_args(p)
    p.add_argument("--batch", type=int, default=None, help="batch size (model default)")
    p.add_argument("--engine", choices=("xla",), default="xla", help="the engine (xla)")
    p.add_argument(
        "--dtype", choices=sorted(TOLERANCE), default="float32", help="element type (float32)"
    )
    p.add_argument(
        "--gspmd",
        action="store_true",
        help="also compare with XLA's own partitioning of taps' layouts",
    )
    p.add_argument("--json", metavar="FILE", default=None, help="write the verification as JSON")
    p.set_defaults(run=run)
