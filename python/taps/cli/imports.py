"""``taps import``: a graph JSON from a PyTorch model (a factory or a saved ``torch.export``)."""

from __future__ import annotations

import argparse

from rich.console import Console

from taps._support.outputs import Outputs
from taps.graph import Graph


def read_torch(source: str, unknown: str) -> Graph:
    """The graph of a ``.pt2`` archive or of a ``package.module:factory``."""
    from taps.frontends import torch as frontend

    if source.endswith(".pt2"):
        return frontend.load(source, unknown)
    return frontend.from_factory(source, unknown)


def run(args: argparse.Namespace, console: Console) -> None:
    # The output is checked before the (slow) conversion and written whole or not at all.
    with Outputs(args.out, args.json) as outputs:
        graph = read_torch(args.source, args.unknown)
        outputs[args.out].write_text(graph.to_json())
        if args.json:
            record = {
                "graph": graph.name,
                "out": args.out,
                "operators": len(graph.ops),
                "parameters": graph.num_parameters(),
                "tied_groups": len(graph.tied),
            }
            outputs[args.json].write_json(record)
        outputs.commit()
    console.print(
        f"wrote {args.out}: {graph.name}, {len(graph.ops)} operators, "
        f"{graph.num_parameters():,} parameters, {len(graph.tied)} tied groups",
        markup=False,
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``taps import`` to the CLI."""
    p = subparsers.add_parser(
        "import",
        help="write the graph JSON of a PyTorch model",
        description="Convert a PyTorch model into a taps graph JSON: SOURCE is "
        "package.module:factory (a callable returning (module, inputs); build them on the meta "
        "device) or a torch.export archive (.pt2). Needs pip install 'taps[torch]'.",
    )
    p.add_argument("source", metavar="SOURCE", help="package.module:factory or FILE.pt2")
    p.add_argument("out", metavar="OUT", help="the graph JSON file to write")
    p.add_argument(
        "--unknown",
        choices=("error", "replicate"),
        default="error",
        help="operators without a rule: list them and fail, or keep them whole (error)",
    )
    p.add_argument(
        "--json", metavar="FILE", default=None, help="write a record of what was converted"
    )
    p.set_defaults(run=run)
