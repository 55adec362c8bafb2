"""``taps reproduce``: the paper's evaluation, CSV, report and figures."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from taps.reproduce import FILES, reproduce


def run(args: argparse.Namespace, console: Console) -> None:
    reproduce(args.out, args.quick, console)


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
    p.set_defaults(run=run)
