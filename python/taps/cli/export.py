"""``taps export``: a saved plan as a framework's sharding plan (JAX or DTensor), without
searching again."""

from __future__ import annotations

import argparse

from rich.console import Console

from taps._support.outputs import Outputs
from taps.cli.args import load_model
from taps.errors import PlanFileError
from taps.export import FRAMEWORKS, export
from taps.plan import Plan


def run(args: argparse.Namespace, console: Console) -> None:
    plan = load_model(args.plan, None)
    if not isinstance(plan, Plan):
        raise PlanFileError(f"{args.plan}: not a plan saved by taps search --save")
    with Outputs(args.out, args.json) as outputs:
        exported = export(plan, args.to)
        outputs[args.out].write_text(exported.to_json())
        if args.json:
            record = {"plan": args.plan, "to": args.to, "out": args.out, "graph": plan.graph.name}
            outputs[args.json].write_json(record)
        outputs.commit()
    console.print(f"wrote {args.out}: {plan.graph.name}, {args.to} plan", markup=False)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``taps export`` to the CLI."""
    p = subparsers.add_parser(
        "export",
        help="write a saved plan as a JAX or DTensor sharding plan",
        description="Read a plan saved by taps search --save and write it as a JAX mesh with a "
        "PartitionSpec per tensor, or a DeviceMesh shape with DTensor placements per tensor "
        "(JSON; docs/export.md).",
    )
    p.add_argument("plan", metavar="PLAN", help="a plan saved by taps search --save")
    p.add_argument("--to", choices=FRAMEWORKS, required=True, help="the framework")
    p.add_argument("out", metavar="FILE", help="the JSON file to write")
    p.add_argument(
        "--json", metavar="FILE", default=None, help="write a record of what was exported"
    )
    p.set_defaults(run=run)
