"""The ``taps`` command line: one module per command (``search``, ``verify``, ``export``,
``redistribute``, ``import``, ``reproduce``, ``calibrate``), each with a ``register(subparsers)``;
this module builds the parser and applies the one rule for errors (docs/errors.md): bad input or a
failed read or write is one line and exit code 2, Ctrl-C one line and 130, anything else one line
asking for a bug report (``TAPS_DEBUG=1`` shows the traceback)."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys
import traceback
from collections.abc import Sequence

from rich.console import Console

from taps._core import TapsError
from taps.cli import calibrate, export, imports, redistribute, reproduce, search, verify
from taps.cli.args import Parser, attach_values

COMMANDS = (search, verify, export, redistribute, imports, reproduce, calibrate)

#: Exit codes (docs/errors.md).
EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 70  # sysexits' EX_SOFTWARE
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for Ctrl-C


def build_parser() -> argparse.ArgumentParser:
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
    return parser


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _describe(error: BaseException) -> str:
    """An error as one line: an OSError by its file and reason, anything else by its message."""
    if isinstance(error, OSError) and error.strerror:
        where = f"{error.filename}: " if error.filename is not None else ""
        return f"{where}{error.strerror}"
    return _one_line(str(error)) or type(error).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``taps`` with ``argv`` (default: the command line); returns the exit code."""
    prog = "taps"
    try:
        parser = build_parser()
        args = parser.parse_args(attach_values(parser, sys.argv[1:] if argv is None else argv))
        prog = f"taps {args.command}"
        # Wide enough for the tables when the output is a file or a pipe.
        console = Console(width=None if sys.stdout.isatty() else 160)
        # A command returns nothing, or an exit code (``taps verify``: 1 on a mismatch).
        code = args.run(args, console)
    except KeyboardInterrupt:
        sys.stderr.write(f"{prog}: interrupted\n")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`taps search ... | head`): nothing left to say to it.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BAD_INPUT
    except (TapsError, OSError, MemoryError) as e:
        message = "out of memory" if isinstance(e, MemoryError) else _describe(e)
        if os.environ.get("TAPS_DEBUG"):
            traceback.print_exc()
        sys.stderr.write(f"{prog}: error: {message}\n")
        return EXIT_BAD_INPUT
    except Exception as e:
        if os.environ.get("TAPS_DEBUG"):
            traceback.print_exc()
        sys.stderr.write(
            f"{prog}: internal error ({type(e).__name__}: {_one_line(str(e))[:200]}); this is a "
            "bug in taps, please report it with the command line (TAPS_DEBUG=1 shows the "
            "traceback)\n"
        )
        return EXIT_INTERNAL
    return code or 0


def run() -> None:
    """The ``taps`` program: :func:`main` on the command line, then exit. After Ctrl-C the
    process ends at once: an interrupted solve leaves a large SCIP model whose teardown would
    take seconds, and every output file is already cleaned up."""
    code = main()
    if code == EXIT_INTERRUPTED:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    run()
