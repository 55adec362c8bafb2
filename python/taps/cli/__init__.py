"""The ``taps`` command line: one module per command (``plan``, ``search``, ``reproduce``,
``verify``), each
with a ``register(subparsers)``; this module builds the parser and turns errors into one line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rich.console import Console

from taps._core import TapsError
from taps.cli import plan, reproduce, search, verify
from taps.cli.args import Parser

COMMANDS = (plan, search, reproduce, verify)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="taps",
        description="Topology-aware intra-operator parallelism strategy search.",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in COMMANDS:
        command.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # Wide enough for the tables when the output is a file or a pipe.
    console = Console(width=None if sys.stdout.isatty() else 160)
    try:
        # A command returns nothing, or an exit code (``taps verify``: 1 on a mismatch).
        code = args.run(args, console)
    except TapsError as e:
        sys.stderr.write(f"taps {args.command}: error: {e}\n")
        return 2
    return code or 0


if __name__ == "__main__":
    raise SystemExit(main())
