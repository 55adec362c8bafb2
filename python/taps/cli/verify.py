"""``taps verify``: search a model's plan, then run it on an engine and check it against taps'
prediction (exit code 1 on any mismatch)."""

from __future__ import annotations

import argparse

from rich.console import Console

from taps import models
from taps.cli.args import add_cluster_args, cluster, integer, load_model
from taps.outputs import Outputs
from taps.search import search
from taps.verify import VerifyResult, compare_gspmd, verify_graph
from taps.verify.program import TOLERANCE


def report(result: VerifyResult, console: Console, title: str) -> int:
    """Print a verification; the exit code: 1 if it failed."""
    console.print(result.table(title))
    for line in result.mismatches:
        console.print(f"[red]{line}[/]")
    return 0 if result.ok else 1


def run(args: argparse.Namespace, console: Console) -> int:
    # Checked (a temporary file made beside it) before the work, written after it.
    with Outputs(args.json) as outputs:
        graph = load_model(args.model, args.batch)
        c = cluster(args)
        result = search(graph, c)
        verified = verify_graph(graph, c, result.strategies, args.dtype)
        against = compare_gspmd(graph, c, result.strategies, args.dtype) if args.gspmd else None
        if args.json:
            outputs[args.json].write_text(verified.to_json())
        outputs.commit()
    if against is not None:
        console.print(against.table())
    code = report(verified, console, f"{graph.name} on {c.nodes} x {c.devices_per_node}")
    if args.json:
        console.print(f"wrote {args.json}")
    return code


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
    p.add_argument("--batch", type=integer, default=None, help="batch size (model default)")
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
