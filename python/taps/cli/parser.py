"""The ``taps`` argument parser: one module per command (``search``, ``verify``, ``export``,
``redistribute``, ``import``, ``reproduce``, ``calibrate``), each with a
``register(subparsers)``."""

from __future__ import annotations

import argparse
import importlib.metadata

from taps.cli import calibrate, export, imports, redistribute, reproduce, search, verify
from taps.cli.args import Parser

COMMANDS = (search, verify, export, redistribute, imports, reproduce, calibrate)


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command."""
    parser = Parser(
        prog="taps",
        description="Topology-aware intra-operator parallelism strategy search.",
    )
    # The installed distribution's version: the package itself is a layer above the CLI.
    version = importlib.metadata.version("taps")
    parser.add_argument("--version", action="version", version=f"taps {version}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in COMMANDS:
        command.register(sub)
    # One parser per command (an alias names the same one).
    for command_parser in {id(p): p for p in sub.choices.values()}.values():
        command_parser.add_argument(
            "-v",
            "--verbose",
            action="store_true",
            help="show what torch, jax and XLA log while the command runs (hidden by default)",
        )
    return parser
