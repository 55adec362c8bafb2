"""``taps reproduce``: the paper's evaluation, CSV, report and figures."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from taps._support.outputs import Outputs, output_directory
from taps.reproduce import FILES, reproduce, write_files


def run(args: argparse.Namespace, console: Console) -> None:
    # Every file of the run, the JSON too, is checked up front and written all or none: an
    # interrupt or an error leaves the files of an earlier run as they were.
    with output_directory(args.out), Outputs(*(args.out / n for n in FILES), args.json) as outputs:
        rows, timing_rows = reproduce(args.quick, console)
        write_files(rows, timing_rows, args.quick, {n: outputs[args.out / n] for n in FILES})
        if args.json:
            doc = {
                "results": [r.csv_dict() for r in rows],
                "search_times": [t.csv_dict() for t in timing_rows],
            }
            outputs[args.json].write_json(doc)
        outputs.commit()
    console.print(f"wrote {', '.join(FILES)} into {args.out}", markup=False)
    if args.json:
        console.print(f"wrote {args.json}", markup=False)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``taps reproduce`` to the CLI."""
    p = subparsers.add_parser(
        "reproduce",
        help="reproduce the paper's evaluation: CSV, report and figures",
        description="Run the paper's evaluation (topology-aware vs volume-based search, the "
        "ratio sweeps, the search times) and write "
        f"{', '.join(FILES)} into DIR.",
    )
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="output directory")
    p.add_argument(
        "--quick", action="store_true", help="a few small cases only (well under a minute)"
    )
    p.add_argument(
        "--json", metavar="FILE", default=None, help="also write both tables' rows as JSON"
    )
    p.set_defaults(run=run)
